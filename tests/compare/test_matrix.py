"""The compare matrix: which runs, with which train flags."""

import pytest

from quantroll.compare.matrix import RunSpec, build_matrix
from quantroll.errors import QuantrollError


def ids(specs):
    return [s.run_id for s in specs]


def test_default_matrix_is_bf16_baseline_then_each_correction_of_fp8():
    specs = build_matrix("bf16,fp8", "none,tis", "1", "1", 8, moe=False)
    assert ids(specs) == ["bf16-baseline-none-seed1", "fp8-rollout-none-seed1", "fp8-rollout-tis-seed1"]
    assert all(not s.unified and not s.sweep and s.response_len == 8 for s in specs)


def test_modes_seeds_moe_and_sweep():
    specs = build_matrix("bf16,fp8,nvfp4", "none,mask", "1,2", "1,2", 16, moe=True, sweep_lens="64,128")
    main = [s for s in specs if not s.sweep]
    # bf16: 2 seeds; fp8 mode 1 and mode 2, nvfp4 mode 1 (mode 4 not asked): 3 variants x 3 corrections x 2 seeds
    assert len(main) == 2 + 3 * 3 * 2
    assert {s.correction for s in main if s.precision != "bf16"} == {"none", "mask", "r3"}
    assert {(s.precision, s.unified) for s in main} == {("bf16", False), ("fp8", False), ("fp8", True),
                                                         ("nvfp4", False)}
    sweep = [s for s in specs if s.sweep]
    assert len(sweep) == 4 * 2 * 2 and {s.response_len for s in sweep} == {64, 128}
    assert all(s.correction == "none" for s in sweep)
    assert len(set(ids(specs))) == len(specs)


def test_train_args_carry_the_correction_the_recipe_and_the_sweep():
    assert RunSpec("fp8", True, "mask", 3, 32).train_args() == [
        "--seed", "3", "--rollout-max-response-len", "32", "--use-tis", "--tis-mode", "mask", "--fp8-recipe",
        "blockwise"]
    assert RunSpec("nvfp4", True, "r3", 1, 8).train_args()[-3:] == ["--use-rollout-routing-replay", "--fp4-recipe",
                                                                     "nvfp4"]
    assert RunSpec("bf16", False, "none", 1, 1024, sweep=True).train_args()[-1] == "--rollout-ignore-eos"


@pytest.mark.parametrize("kwargs, words", [
    (dict(precisions="bf16,fp9"), "--precisions"),
    (dict(corrections="none,magic"), "--corrections"),
    (dict(corrections="none,r3"), "MoE"),
    (dict(modes="5"), "--modes"),
    (dict(precisions="bf16,mxfp8", modes="2"), "applies to none"),
    (dict(seeds="1,x"), "--seeds"),
])
def test_bad_lists_are_refused_with_the_flag_named(kwargs, words):
    args = dict(precisions="bf16,fp8", corrections="none", modes="1", seeds="1", response_len=8, moe=False)
    with pytest.raises(QuantrollError, match=words):
        build_matrix(**{**args, **kwargs})


def test_kv_cache_dtypes_repeat_the_matrix_and_name_each_share():
    from quantroll.compare.groups import spec_key
    from quantroll.compare.labels import BASELINE_MODE

    specs = build_matrix("bf16,fp8", "none,tis", "1,2", "1", 8, moe=False, kv_cache_dtypes="bf16,fp8")
    kv = [s for s in specs if s.kv_cache_dtype == "fp8"]
    # bf16 weights + fp8 KV is a low-precision rollout with every correction; fp8 weights in modes 1 and 2 too
    assert {(s.precision, s.unified, s.correction) for s in kv} == {
        ("bf16", False, "none"), ("bf16", False, "tis"), ("fp8", False, "none"), ("fp8", False, "tis"),
        ("fp8", True, "none"), ("fp8", True, "tis")}
    assert all(s.run_id.startswith(s.precision + "-kvfp8-") for s in kv)
    assert all(s.train_args()[-2:] == ["--kv-cache-dtype", "fp8_e4m3"] for s in kv)
    labels = {spec_key({"precision": s.precision, "unified": s.unified, "kv_cache_dtype": s.kv_cache_dtype})[0]
              for s in specs}
    assert labels == {BASELINE_MODE, "fp8 KV rollout, BF16 train", "mode 1: fp8 rollout, BF16 train",
                      "mode 1: fp8 + fp8 KV rollout, BF16 train", "mode 2: block FP8",
                      "mode 2: block FP8, fp8 KV in the engine"}
    with pytest.raises(QuantrollError, match="--kv-cache-dtypes"):
        build_matrix("bf16,fp8", "none", "1", "1", 8, moe=False, kv_cache_dtypes="int8")
