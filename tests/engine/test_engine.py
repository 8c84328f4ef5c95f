"""Engine generation against teacher-forced forward passes of the same model, batching
invariance, seeds, stops, routed experts and in-place weight loading."""

import shutil

import pytest
import torch

from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.engine import Engine, SamplingParams
from quantroll.errors import QuantrollError
from quantroll.model.moe import RecordRouting
from tests.conftest import copy_editing_config


@pytest.fixture(scope="module")
def dense_engine(tiny_qwen3_dir):
    return Engine(tiny_qwen3_dir, dtype=torch.float32)


@pytest.fixture(scope="module")
def fp8_dir(tiny_qwen3_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("fp8") / "fp8"
    convert_checkpoint(tiny_qwen3_dir, out, ConvertConfig(format="fp8", progress=False))
    return out


PROMPTS = [[5, 9, 17], [3, 1, 4, 1, 5, 9, 2, 6], [42]]


def _teacher_forced(model, prompt, tokens, temperature, routing=None):
    ids = torch.tensor([prompt + tokens[:-1]])
    with torch.no_grad():
        logits = model(ids, routing=routing)[0, len(prompt) - 1:].float()
    t = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / t, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_reported_logprobs_equal_a_full_forward_over_the_response(dense_engine, temperature):
    params = SamplingParams(temperature=temperature, top_p=0.9, max_new_tokens=12, seed=11)
    for res in dense_engine.generate(PROMPTS, params):
        assert len(res.tokens) == len(res.logprobs) == 12 and res.finish_reason == "length"
        want = _teacher_forced(dense_engine.model, res.prompt_tokens, res.tokens, temperature)
        assert torch.allclose(torch.tensor(res.logprobs), want, atol=2e-5), (res.logprobs, want)


def test_batch_of_mixed_lengths_equals_one_prompt_at_a_time(dense_engine):
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=5)
    together = dense_engine.generate(PROMPTS, params)
    for i, p in enumerate(PROMPTS):
        alone = dense_engine.generate([p], SamplingParams(temperature=1.0, max_new_tokens=10, seed=5 + i))[0]
        assert alone.tokens == together[i].tokens
        assert alone.logprobs == pytest.approx(together[i].logprobs, abs=2e-5)


def test_greedy_deterministic_and_seeds_reproduce(dense_engine):
    g = SamplingParams(temperature=0, max_new_tokens=8)
    assert dense_engine.generate(PROMPTS, g)[1].tokens == dense_engine.generate(PROMPTS, g)[1].tokens
    s1 = SamplingParams(temperature=1.0, max_new_tokens=16, seed=1)
    s2 = SamplingParams(temperature=1.0, max_new_tokens=16, seed=2)
    a, b, c = (dense_engine.generate(PROMPTS, s)[0].tokens for s in (s1, s1, s2))
    assert a == b and a != c


def test_stop_token_ends_a_sequence_and_is_included(dense_engine):
    free = dense_engine.generate([PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=8))[0]
    stop_at = free.tokens[2]
    first = free.tokens.index(stop_at)
    res = dense_engine.generate([PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=8, stop_token_ids=(stop_at,)))[0]
    assert res.finish_reason == "stop" and res.tokens == free.tokens[: first + 1]


def test_routed_experts_cover_every_trainer_position(tiny_qwen3_moe_dir):
    engine = Engine(tiny_qwen3_moe_dir, dtype=torch.float32)
    cfg = engine.config
    results = engine.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=7, seed=3))
    for res in results:
        p, r = len(res.prompt_tokens), len(res.tokens)
        assert res.routed_experts.dtype == torch.int16
        assert res.routed_experts.shape == (p + r - 1, len(cfg.moe_layers), cfg.num_experts_per_tok)
        rec = RecordRouting()
        _teacher_forced(engine.model, res.prompt_tokens, res.tokens, 1.0, routing=rec)
        want = torch.stack([rec.chosen[layer] for layer in cfg.moe_layers], dim=1)
        # top-k order may differ only where probabilities tie: compare as sets per row
        assert torch.equal(res.routed_experts.long().sort(-1).values, want.sort(-1).values)


def test_load_weights_in_place_matches_a_fresh_engine(tiny_qwen3_dir, fp8_dir, tmp_path):
    # perturb the BF16 checkpoint, convert it, and load its quantized tensors into an engine built on the original
    other = tmp_path / "other"
    shutil.copytree(tiny_qwen3_dir, other)
    src = Engine(tiny_qwen3_dir, dtype=torch.float32)
    engine = Engine(fp8_dir, dtype=torch.float32)
    layer = engine._linears["model.layers.0.mlp.up_proj"]
    ptr_before = (layer.weight.data_ptr(), layer.weight_scale.data_ptr())
    new = {n: p.detach() * 1.5 for n, p in src.model.named_parameters()}
    version = engine.load_weights(new.items())
    assert version == 1 and (layer.weight.data_ptr(), layer.weight_scale.data_ptr()) == ptr_before
    q = engine.format.quantize_weight(new["model.layers.0.mlp.up_proj.weight"])
    assert torch.equal(layer.weight.view(torch.uint8), q.data.view(torch.uint8)) and torch.equal(layer.weight_scale, q.scale)
    # a pre-quantized tensor loads as is
    engine.load_weights([("model.layers.0.mlp.up_proj.weight", q)])
    assert engine.generate([[1, 2]], SamplingParams(max_new_tokens=2))[0].weight_version == 2
    with pytest.raises(QuantrollError, match="no weight named"):
        engine.load_weights([("model.layers.0.mlp.nothing.weight", torch.zeros(1))])


def test_load_weights_is_all_or_nothing_and_refuses_bad_values(fp8_dir):
    """A wrong entry anywhere in an update (unknown name, NaN/Inf, a non-floating dtype, a
    malformed pair) raises before any tensor is written, and the version stays."""
    from quantroll.errors import NonFiniteError

    engine = Engine(fp8_dir, dtype=torch.float32)
    norm = "model.layers.0.input_layernorm.weight"
    up = "model.layers.0.mlp.up_proj.weight"
    layer = engine._linears["model.layers.0.mlp.up_proj"]
    before = (engine._params[norm].clone(), layer.weight.view(torch.uint8).clone())

    def unchanged():
        return (engine.weight_version == 0 and torch.equal(engine._params[norm], before[0])
                and torch.equal(layer.weight.view(torch.uint8), before[1]))

    w_up = torch.randn(layer.out_features, layer.in_features)
    ones = torch.full_like(engine._params[norm], 5.0)
    with pytest.raises(QuantrollError, match="no weight named 'bogus.weight'"):
        engine.load_weights([(norm, ones), (up, w_up), ("bogus.weight", torch.zeros(1))])
    assert unchanged()
    nan_up = w_up.clone()
    nan_up[3, 5] = float("nan")
    with pytest.raises(NonFiniteError, match=f"'{up}' holds NaN/Inf value.s.; nothing was loaded"):
        engine.load_weights([(norm, ones), (up, nan_up)])
    assert unchanged()
    with pytest.raises(NonFiniteError, match=f"'{norm}'"):
        engine.load_weights([(norm, torch.full_like(ones, float("inf")))])
    for bad in (torch.ones_like(ones, dtype=torch.int64), torch.ones_like(ones, dtype=torch.bool),
                ones.to(torch.float8_e4m3fn)):
        with pytest.raises(QuantrollError, match=f"'{norm}' is torch.{str(bad.dtype)[6:]}; .* takes a floating"):
            engine.load_weights([(norm, bad)])
    with pytest.raises(QuantrollError, match=f"'{up}' must be a floating tensor or a fp8 QuantizedTensor"):
        engine.load_weights([(up, w_up.to(torch.int32))])
    with pytest.raises(QuantrollError, match="takes .name, tensor. pairs or a dict"):
        engine.load_weights([ones])
    assert unchanged()
    # a dict works, float64 values are cast, and both entries land together
    assert engine.load_weights({norm: ones.double(), up: w_up}) == 1
    assert torch.equal(engine._params[norm], ones)
    assert torch.equal(layer.weight.view(torch.uint8), engine.format.quantize_weight(w_up).data.view(torch.uint8))


def test_fp8_engine_labels_emulation(fp8_dir):
    assert Engine(fp8_dir).precision == "fp8 (emulated)"


def test_prompt_longer_than_context_is_refused(dense_engine):
    with pytest.raises(QuantrollError, match="context is 256"):
        dense_engine.generate([[1] * 250], SamplingParams(max_new_tokens=10))
    with pytest.raises(QuantrollError, match="empty"):
        dense_engine.generate([[]], SamplingParams())


def test_malformed_requests_are_refused_in_one_line(dense_engine):
    vocab = dense_engine.config.vocab_size
    cases = [
        (torch.tensor([[1, 2]]), "pass tensor.tolist"),
        ([[1.5, 2]], "prompt 0 must be a list of integer token ids"),
        ([[1, 2], ["a", 2]], "prompt 1 must be a list of integer token ids"),
        ([[1, 2], 3], "prompt 1 must be a list"),
        ([[1, True]], "prompt 0 must be a list of integer token ids"),
    ]
    for prompts, message in cases:
        with pytest.raises(QuantrollError, match=message):
            dense_engine.generate(prompts, SamplingParams(max_new_tokens=2))
    with pytest.raises(QuantrollError, match=rf"stop_token_ids \[-1, {vocab}\] are outside the vocabulary"):
        dense_engine.generate([[1, 2]], SamplingParams(max_new_tokens=2, stop_token_ids=(-1, vocab, 3)))
    with pytest.raises(QuantrollError, match="takes a SamplingParams"):
        dense_engine.generate([[1, 2]], {"max_new_tokens": 2})
    import numpy as np

    assert len(dense_engine.generate([[np.int64(1), 2]], SamplingParams(max_new_tokens=2))[0].tokens) == 2


def test_unknown_model_type_lists_supported(tiny_qwen3_dir, tmp_path):
    bad = copy_editing_config(tiny_qwen3_dir, tmp_path / "gpt2", lambda cfg: cfg.update(model_type="gpt2"))
    with pytest.raises(QuantrollError, match="model_type 'gpt2' is not supported; supported model_type values: "
                                             "qwen3, qwen3_moe, llama, qwen2"):
        Engine(bad)


def test_tensor_that_does_not_match_config_is_named(tiny_qwen3_dir, tmp_path):
    bad = copy_editing_config(tiny_qwen3_dir, tmp_path / "wide", lambda cfg: cfg.update(intermediate_size=512))
    with pytest.raises(QuantrollError, match=r"mlp\.(gate|up|down)_proj\.weight' has shape"):
        Engine(bad)


def test_fused_projections_compute_the_same_and_follow_weight_loads(tiny_qwen3_dir):
    from quantroll.model.loader import load_model

    plain, _ = load_model(tiny_qwen3_dir, dtype=torch.float32)
    engine = Engine(tiny_qwen3_dir, dtype=torch.float32)  # fuses q/k/v and gate/up
    attn = engine.model.model.layers[0].self_attn
    assert attn.qkv_proj is not None and engine.model.model.layers[0].mlp.gate_up_proj is not None
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        assert torch.allclose(engine.model(ids), plain(ids), atol=1e-5)
        new_v = torch.randn_like(attn.v_proj.weight)
        engine.load_weights([("model.layers.0.self_attn.v_proj.weight", new_v)])
        plain.model.layers[0].self_attn.v_proj.weight.copy_(new_v)
        assert torch.allclose(engine.model(ids), plain(ids), atol=1e-5)


def test_fp8_fused_layer_drops_its_dequantized_cache_on_load(tiny_qwen3_dir, tmp_path):
    out = tmp_path / "fp8p"
    convert_checkpoint(tiny_qwen3_dir, out, ConvertConfig(format="fp8", allow_partial_blocks=True, progress=False))
    engine = Engine(out, dtype=torch.float32)
    mlp = engine.model.model.layers[1].mlp
    assert mlp.gate_up_proj is not None and mlp.gate_up_proj.quantized  # 384-row parts: whole 128-row blocks
    ids = torch.tensor([[2, 7, 1, 8]])
    with torch.no_grad():
        before = engine.model(ids)
        w = torch.randn(mlp.up_proj.out_features, mlp.up_proj.in_features)
        engine.load_weights([("model.layers.1.mlp.up_proj.weight", w)])
        after = engine.model(ids)
    assert not torch.allclose(before, after)
    q = engine.format.quantize_weight(w)
    assert torch.equal(mlp.gate_up_proj.weight[mlp.gate_proj.out_features:].view(torch.uint8), q.data.view(torch.uint8))


def test_engine_and_sampling_params_are_exported_from_the_package():
    import quantroll

    assert quantroll.Engine is Engine and quantroll.SamplingParams is SamplingParams
