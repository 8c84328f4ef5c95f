"""The engine on a Qwen2 checkpoint (q/k/v biases, fused into qkv_proj on load): its state
holds exactly the checkpoint's tensors (no fused name), and a weight update of the biases
reaches the fused projection, giving the logits of a model loaded with those biases."""

import dataclasses

import pytest
import torch

from quantroll.bench.shapes import shape_config
from quantroll.checkpoint.reader import CheckpointReader
from quantroll.engine import Engine, SamplingParams
from quantroll.model.loader import load_model
from quantroll.model.random_checkpoint import write_random_checkpoint


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    cfg = dataclasses.replace(shape_config("qwen2.5-1.5b", 2), vocab_size=128, hidden_size=96, intermediate_size=160,
                              num_attention_heads=6, num_key_value_heads=1, head_dim=16)
    return write_random_checkpoint(cfg, tmp_path_factory.mktemp("qwen2") / "ckpt", seed=3)


def test_state_is_the_checkpoint_and_bias_updates_reach_the_fused_projection(qwen2_dir):
    engine = Engine(qwen2_dir, dtype=torch.float32)
    attn = engine.model.model.layers[0].self_attn
    assert attn.qkv_proj is not None and attn.qkv_proj.bias is not None
    with CheckpointReader(qwen2_dir) as reader:
        names = set(reader.tensors)
    assert set(engine.state()) == names
    prompts, params = [[5, 9, 30, 2]], SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=())
    before = engine.generate(prompts, params)[0]
    g = torch.Generator().manual_seed(0)
    biases = {n: torch.randn(t.shape, generator=g) for n, t in engine.state().items() if n.endswith(".bias")}
    assert len(biases) == 3 * 2  # q, k, v of 2 layers
    engine.load_weights(biases)
    after = engine.generate(prompts, params)[0]
    # the reference: the unfused model loaded from the checkpoint, the new biases copied in, greedy by full forwards
    ref, _ = load_model(qwen2_dir, dtype=torch.float32)
    with torch.no_grad():
        for name, t in biases.items():
            dict(ref.named_parameters())[name].copy_(t)
        seq, logprobs = list(prompts[0]), []
        for _ in range(6):
            logp = torch.log_softmax(ref(torch.tensor([seq]))[0, -1], -1)
            seq.append(int(logp.argmax()))
            logprobs.append(float(logp.max()))
    assert after.tokens == seq[len(prompts[0]):]
    assert after.logprobs == pytest.approx(logprobs, abs=1e-5)
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
