"""Llama 3.x and Qwen2.5 against transformers on random checkpoints of odd sizes, in float32
on CPU: logits within 1e-4 (the model), and through the engine (paged KV cache, chunked
decode) greedy tokens equal to transformers' argmax decoding with every reported logprob
within 1e-3 of transformers' log-softmax at that position.

Biases and norms are drawn at random (transformers initialises biases to zero and norms to
one, which would hide a bias on the wrong projection or a missing norm)."""

import pytest
import torch

from quantroll.engine import Engine, SamplingParams
from quantroll.model.loader import load_model

transformers = pytest.importorskip("transformers")

LLAMA = dict(vocab_size=301, hidden_size=168, intermediate_size=290, num_hidden_layers=3, num_attention_heads=6,
             num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
             rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64, "rope_theta": 500000.0}
# GQA groups of 7 and 6 query heads a k/v head; head_dim 14 and 18
QWEN2_G7 = dict(vocab_size=293, hidden_size=196, intermediate_size=330, num_hidden_layers=3, num_attention_heads=14,
                num_key_value_heads=2, max_position_embeddings=512,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
QWEN2_G6 = {**QWEN2_G7, "hidden_size": 216, "num_attention_heads": 12, "num_key_value_heads": 2}

CASES = {
    "llama": (transformers.LlamaConfig, LLAMA),
    "llama-rope-llama3": (transformers.LlamaConfig, {**LLAMA, "rope_parameters": LLAMA3_ROPE}),
    "llama-biases-tied": (transformers.LlamaConfig, {**LLAMA, "attention_bias": True, "mlp_bias": True,
                                                     "tie_word_embeddings": True}),
    "qwen2-gqa7": (transformers.Qwen2Config, QWEN2_G7),
    "qwen2-gqa6-tied": (transformers.Qwen2Config, {**QWEN2_G6, "tie_word_embeddings": True}),
}


def write_random(path, config_cls, fields, seed=0):
    """A random float32 checkpoint of ``config_cls(**fields)`` at ``path``; returns transformers' model."""
    torch.manual_seed(seed)
    config = config_cls(**fields, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    hf = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
    hf.save_pretrained(str(path))
    return hf


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    config_cls, fields = CASES[request.param]
    path = tmp_path_factory.mktemp(request.param)
    hf = write_random(path, config_cls, fields)
    return request.param, hf, path


def test_logits_match_transformers(pair):
    case, hf, path = pair
    ours, fmt = load_model(path, dtype=torch.float32)
    assert fmt is None
    block = ours.config.block
    assert block.qk_norm is False
    assert block.qkv_bias == (case.startswith("qwen2") or "biases" in case)
    assert block.o_bias == block.mlp_bias == ("biases" in case)
    ids = torch.randint(0, hf.config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (hf(ids).logits - ours(ids)).abs().max().item()
    assert diff <= 1e-4, f"{case}: max |logit diff| {diff:.3g} > 1e-4"


def _reference_greedy(hf, prompt, steps):
    """transformers' argmax decoding, one full forward a step (no cache): (tokens, logprobs)."""
    seq, tokens, logprobs = list(prompt), [], []
    with torch.no_grad():
        for _ in range(steps):
            logp = torch.log_softmax(hf(torch.tensor([seq])).logits[0, -1].float(), dim=-1)
            tok = int(logp.argmax())
            tokens.append(tok)
            logprobs.append(float(logp[tok]))
            seq.append(tok)
    return tokens, logprobs


def test_engine_greedy_tokens_and_logprobs_match_transformers(pair):
    case, hf, path = pair
    prompts = [[3, 17, 40, 9, 100], [250, 7], list(range(20, 41))]
    steps = 12
    engine = Engine(path, dtype=torch.float32)
    results = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=steps, stop_token_ids=()))
    for prompt, result in zip(prompts, results):
        want_tokens, want_logprobs = _reference_greedy(hf, prompt, steps)
        assert result.tokens == want_tokens, f"{case}: prompt {prompt[:3]}..."
        worst = max(abs(a - b) for a, b in zip(result.logprobs, want_logprobs))
        assert worst <= 1e-3, f"{case}: logprob off by {worst:.3g}"
