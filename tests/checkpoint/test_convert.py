"""convert_checkpoint: stored layout per format, exact round trip, shards, config, read-back."""

import json
import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from quantroll.checkpoint import (
    CheckpointReader,
    ConvertConfig,
    convert_checkpoint,
    load_quantized_checkpoint,
    plan,
    read_quantization_config,
)
from quantroll.formats import get_format

FORMATS = ("fp8", "mxfp8", "nvfp4")


@pytest.fixture(scope="module")
def converted(tmp_path_factory, tiny_checkpoint):
    """(model, sharded, format[, scale_rule]) -> (src, dst, ConvertResult), cached per module."""
    cache = {}

    def get(moe=False, sharded=False, fmt="fp8", **kw):
        key = (moe, sharded, fmt, tuple(sorted(kw.items())))
        if key not in cache:
            src = tiny_checkpoint(moe=moe, sharded=sharded)
            dst = tmp_path_factory.mktemp("conv") / "out"
            cache[key] = (src, dst, convert_checkpoint(src, dst, ConvertConfig(fmt, progress=False, **kw)))
        return cache[key]

    return get


def all_tensors(d):
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out |= load_file(f)
    return out


def expected_quantized(fmt, src_tensors, the_plan, name):
    """What quantroll's formats give for one source weight (NVFP4: with its scale group's global)."""
    group = the_plan.scale_group_of(name)
    if fmt.name == "nvfp4" and len(group) > 1:
        # quantize the stacked group: rows are independent in 1x16 blocks, the global is the group's
        stacked = torch.cat([src_tensors[n] for n in group])
        q = fmt.quantize_weight(stacked, name)
        start = sum(src_tensors[n].shape[0] for n in group[: group.index(name)])
        rows = src_tensors[name].shape[0]
        return q.data[start : start + rows], q.scale[start : start + rows], q.global_scale
    q = fmt.quantize_weight(src_tensors[name], name)
    return q.data, q.scale, q.global_scale


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
@pytest.mark.parametrize("fmt_name", FORMATS)
def test_layout_and_exact_round_trip(converted, moe, fmt_name):
    src, dst, result = converted(moe=moe, fmt=fmt_name)
    fmt = get_format(fmt_name)
    src_t, out = all_tensors(src), all_tensors(dst)
    quantized = result.plan.quantized()
    assert quantized, "the fixture must quantize something"
    for name in quantized:
        m = name[: -len(".weight")]
        n, k = src_t[name].shape
        data, scale, gscale = expected_quantized(fmt, src_t, result.plan, name)
        if fmt_name == "fp8":
            assert out[name].dtype == torch.float8_e4m3fn and out[name].shape == (n, k)
            assert out[m + ".weight_scale_inv"].dtype == torch.float32
            assert out[m + ".weight_scale_inv"].shape == (math.ceil(n / 128), math.ceil(k / 128))
            assert torch.equal(out[m + ".weight_scale_inv"], scale)
        elif fmt_name == "mxfp8":
            assert out[name].dtype == torch.float8_e4m3fn and out[name].shape == (n, k)
            assert out[m + ".weight_scale_inv"].dtype == torch.uint8 and out[m + ".weight_scale_inv"].shape == (n, k // 32)
            assert torch.equal(out[m + ".weight_scale_inv"], scale)
        else:
            assert out[name].dtype == torch.uint8 and out[name].shape == (n, k // 2)
            assert out[m + ".weight_scale"].dtype == torch.float8_e4m3fn and out[m + ".weight_scale"].shape == (n, k // 16)
            assert out[m + ".weight_scale_2"].dtype == torch.float32 and out[m + ".weight_scale_2"].shape == ()
            assert out[m + ".input_scale"].dtype == torch.float32 and float(out[m + ".input_scale"]) == 1.0
            assert torch.equal(out[m + ".weight_scale"].view(torch.uint8), scale.view(torch.uint8))
            assert torch.equal(out[m + ".weight_scale_2"], gscale.reshape(()))
        assert torch.equal(out[name].view(torch.uint8), data.view(torch.uint8)), name
    # kept and copied tensors: bit-identical, same dtype (BF16)
    for name, d in result.plan.decisions.items():
        if d.action != "quantize":
            assert out[name].dtype == torch.bfloat16 and torch.equal(out[name], src_t[name]), name
    stored = set(out) - set(src_t)
    assert all(s.rsplit(".", 1)[1] in ("weight_scale_inv", "weight_scale", "weight_scale_2", "input_scale") for s in stored)


@pytest.mark.parametrize("fmt_name", FORMATS)
def test_loader_reads_back_and_dequantizes(converted, fmt_name):
    src, dst, result = converted(moe=True, fmt=fmt_name)
    fmt = get_format(fmt_name)
    src_t = all_tensors(src)
    with load_quantized_checkpoint(dst) as ck:
        assert ck.format.name == fmt_name
        assert sorted(ck.quantized) == sorted(n[: -len(".weight")] for n in result.plan.quantized())
        for module, q in ck.iter_quantized():
            name = module + ".weight"
            assert q.shape == tuple(src_t[name].shape) and q.format == fmt_name
            data, scale, gscale = expected_quantized(fmt, src_t, result.plan, name)
            ref = type(q)(data, scale, fmt_name, q.shape, q.block, gscale)
            assert torch.equal(ck.dequantized(module), fmt.dequantize(ref))
        assert set(ck.plain_tensors()) == {n for n, d in result.plan.decisions.items() if d.action != "quantize"}


def test_nvfp4_siblings_share_global_scale(converted):
    src, dst, result = converted(moe=True, fmt="nvfp4")
    src_t, out = all_tensors(src), all_tensors(dst)
    assert result.plan.scale_groups
    for group in result.plan.scale_groups:
        amax = max(float(src_t[n].float().abs().max()) for n in group)
        for n in group:
            g = out[n[: -len(".weight")] + ".weight_scale_2"]
            assert float(g) == pytest.approx(amax / 2688, rel=1e-7)
        assert len({float(out[n[: -len(".weight")] + ".weight_scale_2"]) for n in group}) == 1


@pytest.mark.parametrize("fmt_name", FORMATS)
def test_quantization_config(converted, fmt_name):
    src, dst, result = converted(moe=True, fmt=fmt_name)
    cfg = json.loads((dst / "config.json").read_text())
    src_cfg = json.loads((src / "config.json").read_text())
    qc = cfg.pop("quantization_config")
    assert cfg == src_cfg  # everything else unchanged, dtype stays bfloat16
    assert src_cfg["dtype"] == "bfloat16"
    skipped = result.plan.modules_to_not_convert()
    assert {"lm_head", "model.embed_tokens", "model.norm", "model.layers.0.mlp.gate"} <= set(skipped)
    assert ("model.layers.1.mlp.gate_proj" in skipped) == (fmt_name == "fp8")  # 320 rows: not 128-aligned
    assert not any(m.endswith(".weight") for m in skipped)
    if fmt_name == "fp8":
        assert {k: qc[k] for k in ("quant_method", "fmt", "activation_scheme", "weight_block_size")} == {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
        }
        assert qc["modules_to_not_convert"] == skipped
    elif fmt_name == "mxfp8":
        assert qc["quant_method"] == "mxfp8" and qc["weight_block_size"] == [1, 32] and qc["scale_fmt"] == "ue8m0"
        assert qc["scale_rule"] == "ceil" and qc["modules_to_not_convert"] == skipped
    else:
        assert {k: qc[k] for k in ("quant_method", "quant_algo", "group_size")} == {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4",
            "group_size": 16,
        }
        assert qc["exclude_modules"] == skipped
        hf = json.loads((dst / "hf_quant_config.json").read_text())
        assert hf["quantization"]["quant_algo"] == "NVFP4" and hf["quantization"]["exclude_modules"] == skipped
        assert "input_scale" in qc["quantroll"]["note"]
    assert qc["quantroll"]["version"] and qc["quantroll"]["format"] == fmt_name
    spec = read_quantization_config(qc)
    assert spec.format.name == fmt_name


def test_ocp_rule_recorded_and_read_back(converted):
    src, dst, _ = converted(fmt="mxfp8", scale_rule="ocp")
    with load_quantized_checkpoint(dst) as ck:
        assert ck.format.scale_rule == "ocp"
        module = ck.quantized[0]
        w = CheckpointReader(src).load(module + ".weight")
        assert torch.equal(ck.quantized_tensor(module).scale, get_format("mxfp8", "ocp").quantize_weight(w).scale)


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_sharded_in_sharded_out(converted, moe):
    src, dst, result = converted(moe=moe, sharded=True, fmt="fp8")
    src_index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    assert sorted(p.name for p in dst.glob("*.safetensors")) == sorted(set(src_index.values()))
    total = 0
    for name, shard in index["weight_map"].items():
        with safe_open(str(dst / shard), "pt") as f:
            assert name in f.keys()
            t = f.get_tensor(name)
            total += t.numel() * t.element_size()
    assert index["metadata"]["total_size"] == total == result.bytes_out
    for name, shard in src_index.items():  # every tensor stays in its source shard, scales beside their weight
        assert index["weight_map"][name] == shard
        m = name[: -len(".weight")]
        if m + ".weight_scale_inv" in index["weight_map"]:
            assert index["weight_map"][m + ".weight_scale_inv"] == shard
    # sharded output equals the single-file conversion of the same weights
    _, dst_single, _ = converted(moe=moe, sharded=False, fmt="fp8")
    a, b = all_tensors(dst), all_tensors(dst_single)
    assert a.keys() == b.keys() and all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a if a[k].dim())


def test_non_weight_files_copied(converted):
    src, dst, _ = converted(fmt="fp8")
    for f in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (dst / f).read_bytes() == (src / f).read_bytes()
    assert not (dst / "model.safetensors.index.json").exists()
    assert sorted(p.name for p in dst.parent.iterdir()) == ["out"]  # no temp dirs left beside it


def test_kept_lists_first_last_skip(tmp_path, tiny_qwen3_moe_dir):
    cfg = ConvertConfig(
        "fp8", skip=("mlp.experts.0.up_proj",), num_layers_at_start_in_bf16=0, num_layers_at_end_in_bf16=1, progress=False
    )
    res = convert_checkpoint(tiny_qwen3_moe_dir, tmp_path / "o", cfg)
    kept = {m: d.reason for m, d in res.plan.kept().items()}
    assert kept["model.layers.0.mlp.experts.0.up_proj"] == "skip-pattern"
    assert kept["model.layers.0.mlp.experts.3.down_proj"] == "fused-sibling"
    assert kept["model.layers.2.self_attn.o_proj"] == "last-layers"
    # left quantized: attention of layers 0 and 1 (layer 1's dense 320-wide MLP is not 128-aligned)
    assert {n.rsplit(".", 2)[0] for n in res.plan.quantized()} == {"model.layers.0.self_attn", "model.layers.1.self_attn"}
    qc = json.loads((tmp_path / "o" / "config.json").read_text())["quantization_config"]
    assert "model.layers.0.mlp.experts" in qc["modules_to_not_convert"]
    assert qc["quantroll"]["skip"] == ["mlp.experts.0.up_proj"] and qc["quantroll"]["num_layers_at_end_in_bf16"] == 1


@pytest.mark.parametrize("fmt_name", FORMATS)
def test_allow_partial_blocks_quantizes_ragged_shapes(tmp_path, tiny_checkpoint, fmt_name):
    src = tiny_checkpoint(intermediate_size=300, head_dim=100)  # q 400x256, k/v 200x256, o 256x400, mlp 300x256 / 256x300
    fmt = get_format(fmt_name)
    default = convert_checkpoint(src, tmp_path / "a", ConvertConfig(fmt_name, progress=False))
    ragged = [n for n, d in default.plan.decisions.items() if d.reason in ("partial-blocks", "fused-sibling")]
    assert ragged
    res = convert_checkpoint(src, tmp_path / "b", ConvertConfig(fmt_name, allow_partial_blocks=True, progress=False))
    assert set(ragged) <= set(res.plan.quantized())
    src_t = all_tensors(src)
    with load_quantized_checkpoint(tmp_path / "b") as ck:
        assert ck.spec.rules.allow_partial_blocks
        for name in ragged:
            m = name[: -len(".weight")]
            data, scale, g = expected_quantized(fmt, src_t, res.plan, name)
            ref = type(ck.quantized_tensor(m))(data, scale, fmt_name, tuple(src_t[name].shape), fmt.weight_block, g)
            assert torch.equal(ck.dequantized(m), fmt.dequantize(ref)), name


def test_tied_embeddings_checkpoint(tmp_path, tiny_checkpoint):
    src = tiny_checkpoint(tie_word_embeddings=True)
    res = convert_checkpoint(src, tmp_path / "o", ConvertConfig("fp8", progress=False))
    assert "lm_head" not in res.plan.modules_to_not_convert() and "model.embed_tokens" in res.plan.modules_to_not_convert()


def test_plan_is_reproducible_from_the_checkpoint(converted):
    """The weight sync reruns plan() on BF16 names/shapes: it must give what convert did."""
    src, dst, result = converted(moe=True, fmt="nvfp4")
    with load_quantized_checkpoint(dst) as ck, CheckpointReader(src) as r:
        again = plan({n: i.shape for n, i in r.tensors.items()}, ck.format, ck.spec.rules, r.config["num_hidden_layers"])
    assert again == result.plan
