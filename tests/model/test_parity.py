"""Logits of quantroll's Qwen3 / Qwen3-MoE against transformers' on the same random
checkpoint, in float32 on CPU: max |diff| <= 1e-4."""

import pytest
import torch

from quantroll.model.causal_lm import CausalLM
from quantroll.model.config import config_from_dict
from quantroll.model.moe import RecordRouting, ReplayRouting

transformers = pytest.importorskip("transformers")


def _pair(hf_config):
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(hf_config).float().eval()
    # random norms too, so that a wrong norm placement shows
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    cfg = config_from_dict(hf_config.to_dict())
    ours = CausalLM(cfg, dtype=torch.float32).eval()
    state = hf.state_dict()
    if any(hasattr(layer.mlp, "experts") for layer in hf.model.layers):
        state = _unfuse_experts(hf, state)
    missing, unexpected = ours.load_state_dict(state, strict=False)
    assert not [m for m in missing if "rotary" not in m], missing
    assert not [u for u in unexpected if "rotary" not in u], unexpected
    return hf, ours


def _unfuse_experts(hf, state):
    """transformers 5 keeps experts fused in memory ([E, 2I, H]); checkpoints name them one by one."""
    out = {}
    for name, t in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            p = name[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                gate, up = t[e].chunk(2, dim=0)
                out[f"{p}{e}.gate_proj.weight"], out[f"{p}{e}.up_proj.weight"] = gate, up
        elif name.endswith("mlp.experts.down_proj"):
            p = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{p}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return out


def _compare(hf, ours, seq=13, batch=2):
    ids = torch.randint(0, hf.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids).logits
        got = ours(ids)
    diff = (want - got).abs().max().item()
    assert diff <= 1e-4, f"max |logit diff| {diff:.3g} > 1e-4"
    return got


DENSE = dict(vocab_size=320, hidden_size=192, intermediate_size=320, num_hidden_layers=3, num_attention_heads=6,
             num_key_value_heads=2, head_dim=40, max_position_embeddings=512)


@pytest.mark.parametrize("extra", [
    {},
    {"tie_word_embeddings": True},
    {"attention_bias": True},
    {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}},
    {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 1e6}},
    {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64, "rope_theta": 500000.0}},
], ids=["plain", "tied", "bias", "rope-linear", "rope-yarn", "rope-llama3"])
def test_dense_qwen3_matches_transformers(extra):
    hf, ours = _pair(transformers.Qwen3Config(**DENSE, **extra))
    _compare(hf, ours)


MOE = dict(vocab_size=300, hidden_size=160, intermediate_size=288, moe_intermediate_size=96, num_hidden_layers=4,
           num_attention_heads=4, num_key_value_heads=2, head_dim=48, num_experts=8, num_experts_per_tok=2,
           max_position_embeddings=512)


@pytest.mark.parametrize("extra", [
    {"norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []},
    {"norm_topk_prob": False, "decoder_sparse_step": 2, "mlp_only_layers": [3]},
], ids=["norm-topk-all-moe", "no-norm-sparse-step-2-mlp-only"])
def test_moe_qwen3_matches_transformers(extra):
    hf, ours = _pair(transformers.Qwen3MoeConfig(**MOE, **extra))
    cfg = ours.config
    expected = [i for i in range(cfg.num_hidden_layers)
                if i not in extra["mlp_only_layers"] and (i + 1) % extra["decoder_sparse_step"] == 0]
    assert list(cfg.moe_layers) == expected
    _compare(hf, ours)


def test_routing_replay_reproduces_recorded_choice_and_router_gets_gradient():
    hf, ours = _pair(transformers.Qwen3MoeConfig(**MOE, norm_topk_prob=True))
    ids = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(2))
    rec = RecordRouting()
    with torch.no_grad():
        base = ours(ids, routing=rec)
    assert set(rec.chosen) == set(ours.config.moe_layers)
    # replay someone else's choices (rolled by one expert): outputs change, router still learns
    forced = {k: (v + 1) % ours.config.num_experts for k, v in rec.chosen.items()}
    replay = ReplayRouting(forced)
    out = ours(ids, routing=replay)
    assert not torch.allclose(out, base)
    out.sum().backward()
    router = ours.model.layers[0].mlp.gate.weight
    assert router.grad is not None and router.grad.abs().sum() > 0
    # the replayed run used exactly the forced experts
    rec2 = RecordRouting()
    with torch.no_grad():
        ours(ids, routing=rec2)
    assert all(torch.equal(rec.chosen[k], rec2.chosen[k]) for k in rec.chosen)
