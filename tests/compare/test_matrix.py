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
