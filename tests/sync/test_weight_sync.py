"""Weight sync and the first-update check on tiny checkpoints, with injected faults."""

import pytest
import torch

from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.checkpoint.reader import CheckpointReader
from quantroll.engine import Engine
from quantroll.sync import WeightSync, WeightUpdateMismatch, check_weight_update

SQUARE = dict(num_attention_heads=4, head_dim=64, num_key_value_heads=2)  # q/o 256x256: a transpose keeps the shape


@pytest.fixture(scope="module")
def bf16_dir(tiny_checkpoint):
    return tiny_checkpoint(**SQUARE)


@pytest.fixture(scope="module")
def converted(bf16_dir, tmp_path_factory):
    out = {}
    for fmt in ("fp8", "mxfp8", "nvfp4"):
        out[fmt] = tmp_path_factory.mktemp(fmt) / fmt
        convert_checkpoint(bf16_dir, out[fmt], ConvertConfig(format=fmt, allow_partial_blocks=True, progress=False))
    return out


def trainer_weights(bf16_dir):
    with CheckpointReader(bf16_dir) as reader:
        return dict(reader.iter_tensors())


@pytest.mark.parametrize("fmt", ["fp8", "mxfp8", "nvfp4"])
def test_honest_update_of_unchanged_weights_is_bitwise_equal(bf16_dir, converted, fmt):
    engine = Engine(converted[fmt])
    sync = WeightSync(engine)
    assert sync.quantizer.quantized, "the converted checkpoint must hold quantized layers"
    weights = trainer_weights(bf16_dir)
    errors = check_weight_update(engine, lambda: sync.push(weights), allow_quant_error=False)
    assert errors and all(v == 0.0 for v in errors.values())
    assert set(errors) >= {f"{m}.weight" for m in sync.quantizer.quantized}


def test_push_times_quantize_and_load_separately(bf16_dir, converted):
    engine = Engine(converted["fp8"])
    timing = WeightSync(engine).push(trainer_weights(bf16_dir))
    assert timing.version == 1 and timing.quantize_s > 0 and timing.load_s > 0


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4", None], ids=["fp8", "nvfp4", "bf16"])
def test_push_reports_one_copy_of_the_engine_bytes_as_its_unit(bf16_dir, converted, fmt):
    """The update's unit (compare's "update / copy"): measured once, reported with every
    update, and over the bytes the engine holds: every tensor of its checkpoint, the
    quantized codes and scales at their stored size, the BF16 ones at the dtype the engine
    computes in (float32 on a CPU), counted here from the checkpoint file itself."""
    from safetensors import safe_open

    from quantroll.sync.copy_reference import engine_weight_bytes

    directory = bf16_dir if fmt is None else converted[fmt]
    engine = Engine(directory)
    expected = 0
    for f in sorted(directory.glob("*.safetensors")):
        with safe_open(str(f), "pt") as handle:
            for name in handle.keys():
                if name.endswith(".input_scale"):  # NVFP4's static activation scale: written 1.0, not held
                    continue
                t = handle.get_tensor(name)
                size = engine.dtype.itemsize if t.dtype == torch.bfloat16 else t.element_size()
                expected += t.numel() * size
    assert engine_weight_bytes(engine) == expected
    sync = WeightSync(engine)
    first, second = sync.push(trainer_weights(bf16_dir)), sync.push(trainer_weights(bf16_dir))
    assert first.copy_s > 0 and second.copy_s == first.copy_s
    assert first.metrics()["weight_copy_time"] == first.copy_s


def test_a_changed_weight_passes_only_with_the_allowance(bf16_dir, converted):
    engine = Engine(converted["fp8"])
    sync = WeightSync(engine)
    weights = trainer_weights(bf16_dir)
    name = "model.layers.1.mlp.down_proj.weight"
    nudged = dict(weights)
    nudged[name] = (weights[name].float() * (1 + 2**-7)).to(torch.bfloat16)  # a trainer-side rounding difference
    with pytest.raises(WeightUpdateMismatch, match="down_proj.weight.*not bitwise equal"):
        check_weight_update(engine, lambda: sync.push(nudged), allow_quant_error=False)
    engine = Engine(converted["fp8"])
    errors = check_weight_update(engine, lambda: WeightSync(engine).push(nudged), allow_quant_error=True)
    assert errors[name] > 0


def _faulty(sync, corrupt):
    clean = sync.quantize

    def quantize(named):
        return corrupt(clean(named))

    sync.quantize = quantize
    return sync


def flip_code_bit(update):
    q = update["model.layers.0.mlp.up_proj.weight"]
    q.data.view(torch.uint8)[3, 5] ^= 0x40  # an exponent bit of one E4M3 code
    return update


def double_a_scale(update):
    q = update["model.layers.2.self_attn.o_proj.weight"]
    q.scale[0, 0] *= 2
    return update


def transpose_square(update):
    q = update["model.layers.1.self_attn.q_proj.weight"]
    update["model.layers.1.self_attn.q_proj.weight"] = type(q)(q.data.t().contiguous(), q.scale.t().contiguous(),
                                                                 q.format, q.shape, q.block, q.global_scale)
    return update


def drop_one(update):
    del update["model.layers.3.mlp.gate_proj.weight"]
    return update


def nan_in_norm(update):
    update["model.layers.2.post_attention_layernorm.weight"] = torch.full_like(
        update["model.layers.2.post_attention_layernorm.weight"], float("nan"))
    return update


def nan_in_scale(update):
    update["model.layers.0.self_attn.k_proj.weight"].scale[0, 0] = float("nan")
    return update


@pytest.mark.parametrize("allow", [False, True])
@pytest.mark.parametrize("corrupt, tensor", [
    (flip_code_bit, "model.layers.0.mlp.up_proj.weight"),
    (double_a_scale, "model.layers.2.self_attn.o_proj.weight"),
    (transpose_square, "model.layers.1.self_attn.q_proj.weight"),
    (drop_one, "model.layers.3.mlp.gate_proj.weight"),
    (nan_in_norm, "model.layers.2.post_attention_layernorm.weight"),
    (nan_in_scale, "model.layers.0.self_attn.k_proj.weight"),
], ids=["flipped-bit", "wrong-scale", "transposed", "missing", "nan-plain", "nan-scale"])
def test_injected_faults_are_caught_and_named(bf16_dir, converted, corrupt, tensor, allow):
    engine = Engine(converted["fp8"])
    assert engine.model.model.layers[1].self_attn.q_proj.in_features == engine.model.model.layers[1].self_attn.q_proj.out_features
    sync = _faulty(WeightSync(engine), corrupt)
    weights = trainer_weights(bf16_dir)
    with pytest.raises(WeightUpdateMismatch, match=tensor.replace(".", r"\.")):
        check_weight_update(engine, lambda: sync.push(weights), allow_quant_error=allow)


def test_nvfp4_sync_shares_the_global_scale_within_fused_groups(bf16_dir, converted):
    engine = Engine(converted["nvfp4"])
    update = WeightSync(engine).quantize(trainer_weights(bf16_dir))
    p = "model.layers.0.self_attn."
    g = {n: update[f"{p}{n}.weight"].global_scale.item() for n in ("q_proj", "k_proj", "v_proj")}
    assert len(set(g.values())) == 1
    assert update["model.layers.0.mlp.gate_proj.weight"].global_scale == update["model.layers.0.mlp.up_proj.weight"].global_scale


@pytest.mark.parametrize("fmt", ["fp8", "mxfp8", "nvfp4"])
def test_an_engine_described_on_the_meta_device_quantizes_the_same_bits(bf16_dir, converted, fmt):
    """The cross-process broadcast's source holds its engine on the meta device and
    quantizes on its own device: the same update, bit for bit, as an engine that holds
    its weights (NVFP4's shared global scales included)."""
    from quantroll.sync.update_quantizer import UpdateQuantizer

    weights = trainer_weights(bf16_dir)
    described = Engine(converted[fmt], device="meta")
    assert all(t.is_meta for t in described.state().values())
    got = UpdateQuantizer(described, "cpu").quantize(weights)
    want = WeightSync(Engine(converted[fmt])).quantize(weights)
    assert set(got) == set(want)
    quantized = 0
    for name, w in want.items():
        if hasattr(w, "data") and hasattr(w, "scale") and not isinstance(w, torch.Tensor):
            quantized += 1
            assert torch.equal(got[name].data.view(torch.uint8), w.data.view(torch.uint8)), name
            assert torch.equal(got[name].scale, w.scale), name
            assert (got[name].global_scale is None) == (w.global_scale is None), name
            if w.global_scale is not None:
                assert torch.equal(got[name].global_scale, w.global_scale), name
        else:
            assert torch.equal(got[name], w), name
    assert quantized > 0
    # and, independently of the update path, the checkpoint the converter wrote from these
    # same weights, as an engine loads it from its files: the update reproduces it bit for bit
    stored = Engine(converted[fmt]).quantized_layers()
    for module, layer in stored.items():
        q, ref = got[f"{module}.weight"], layer.quantized_weight()
        assert torch.equal(q.data.view(torch.uint8), ref.data.view(torch.uint8)), module
        assert torch.equal(q.scale.view(torch.uint8), ref.scale.view(torch.uint8)), module
        if ref.global_scale is not None:
            assert torch.equal(q.global_scale, ref.global_scale), module
    with pytest.raises(ValueError, match="meta device"):
        UpdateQuantizer(described)
