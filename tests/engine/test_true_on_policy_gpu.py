"""True on-policy on the GPU (for the device; skipped on CPU machines): the engine with the
batch-invariant kernels (one launch shape per op: the Triton GEMM, the row-wise norm and
log-softmax kernels, attention through the paged prefill kernel, which the trainer's
forward runs too; no fused kernels; decode replayed as CUDA graphs over padded buckets, and
eager) and the trainer's forward give bitwise-equal logprobs for batches of 1 to 256
sequences and contexts up to 4K, in BF16 and in mode 2 (emulated FP8 on both sides).

These tests are what must pass on the H200 for ``quantroll train --true-on-policy-mode
--device cuda`` (rl/true_on_policy.config_refusal); they check invariance, not the speed
(bench/true_on_policy_gpu.py measures that)."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from quantroll.engine import CacheConfig, Engine, SamplingParams  # noqa: E402
from quantroll.model.kernel_config import INVARIANT_KERNELS  # noqa: E402
from quantroll.trainer.policy import load_policy, response_logprobs  # noqa: E402

DEV = "cuda"


def _gap_and_bits(engine, policy, prompts, params):
    results = engine.generate(prompts, params)
    with torch.no_grad():
        logp, mask = response_logprobs(policy, [r.prompt_tokens for r in results], [r.tokens for r in results],
                                       params.temperature, chunk_rows=512)
    unequal = 0
    for i, r in enumerate(results):
        unequal += int((logp[i, :len(r.logprobs)].cpu() != torch.tensor(r.logprobs)).sum())
    return unequal, int(mask.sum())


@pytest.fixture(scope="module")
def long_ckpt(tiny_checkpoint):
    return tiny_checkpoint(max_position_embeddings=8192)


# the tiny model (head_dim 96: the heads' norms by the RMSNorm row kernel, rotary as torch ops),
# head_dim 128 (the Triton norm + rotary kernel), and widths that are not whole 64-column tiles (the engine cannot fuse q/k/v
# and gate/up, so it runs them apart like the trainer)
SHAPES = {"tiny": {}, "head128": dict(head_dim=128, num_key_value_heads=1), "unfused": dict(intermediate_size=360)}


# top_p 1 (RL's default) samples in the log-softmax kernel's own pass; top_p < 1 in torch ops
@pytest.mark.parametrize("batch,graphs,shape,top_p", [
    (1, True, "tiny", 1.0), (7, True, "tiny", 1.0), (7, False, "tiny", 1.0), (7, True, "tiny", 0.95),
    (64, True, "tiny", 1.0), (64, True, "tiny", 0.95), (256, True, "tiny", 1.0), (64, True, "head128", 1.0),
    (64, True, "unfused", 1.0)])
def test_bitwise_equal_for_batches_of_1_to_256(tiny_checkpoint, batch, graphs, shape, top_p):
    ckpt = tiny_checkpoint(**SHAPES[shape])
    engine = Engine(ckpt, device=DEV, kernels=INVARIANT_KERNELS, cache=CacheConfig(memory_gb=4), cuda_graphs=graphs)
    assert engine.fused_projections == (shape != "unfused")
    policy = load_policy(ckpt, device=DEV, kernels=INVARIANT_KERNELS)
    gen = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, 300, (int(n),), generator=gen).tolist()
               for n in torch.randint(3, 60, (batch,), generator=gen)]
    params = SamplingParams(temperature=1.0, top_p=top_p, max_new_tokens=16, seed=batch, stop_token_ids=())
    unequal, tokens = _gap_and_bits(engine, policy, prompts, params)
    assert tokens > 0 and unequal == 0
    assert (engine.last_stats["graph_captures"] > 0) == graphs


def test_row_kernels_in_bf16_are_batch_invariant_and_round_to_nearest():
    """The row kernels compiled (the interpreter truncates BF16 casts, so only here): RMSNorm,
    norm + rotary and silu * up within their BF16 roundings of float64, log-softmax against
    float64, and a row's bits the same alone and among many rows."""
    from quantroll.kernels.invariant_rows import log_softmax, rms_norm

    gen = torch.Generator(device=DEV).manual_seed(0)
    for h in (128, 2048, 4096):
        w = (1 + 0.1 * torch.randn(h, device=DEV, generator=gen)).to(torch.bfloat16)
        x = (3 * torch.randn(4096, h, device=DEV, generator=gen)).to(torch.bfloat16)
        got = rms_norm(x, w, 1e-6)
        normed = (x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6))
        ref = w.double() * normed
        assert ((got.double() - ref).abs() <= 2 ** -7 * ref.abs() + 1e-30).all(), h  # <= 2 half-ulps
        assert torch.equal(rms_norm(x[1234:1235], w, 1e-6)[0], got[1234])
    from quantroll.kernels.invariant_rows import norm_rope, silu_mul

    x = (2 * torch.randn(64, 3, 16, 128, device=DEV, generator=gen)).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(128, device=DEV, generator=gen)).to(torch.bfloat16)
    emb = torch.rand(64, 3, 64, device=DEV, generator=gen) * 100
    cos, sin = torch.cat([emb, emb], -1).cos().to(torch.bfloat16), torch.cat([emb, emb], -1).sin().to(torch.bfloat16)
    got = norm_rope(x, w, 1e-6, cos, sin)
    n = w.double() * x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    ref = n * cos.double()[:, :, None] + torch.cat([-n[..., 64:], n[..., :64]], -1) * sin.double()[:, :, None]
    assert ((got.double() - ref).abs() <= 2 ** -5 * n.abs().amax(-1, keepdim=True)).all()  # 5 BF16 roundings
    assert torch.equal(norm_rope(x[7:8, 1:2], w, 1e-6, cos[7:8, 1:2], sin[7:8, 1:2])[0, 0], got[7, 1])
    gate, up = (3 * torch.randn(2, 300, 6144, device=DEV, generator=gen)).to(torch.bfloat16)
    y = silu_mul(gate, up)
    ref = torch.nn.functional.silu(gate.double()) * up.double()
    assert ((y.double() - ref).abs() <= 2 ** -7 * ref.abs() + 1e-30).all()  # 2 BF16 roundings
    assert torch.equal(silu_mul(gate[123:124], up[123:124])[0], y[123])
    logits = 5 * torch.randn(512, 151936, device=DEV, generator=gen)
    lp = log_softmax(logits)
    assert torch.allclose(lp.double(), torch.log_softmax(logits.double(), -1), atol=5e-5, rtol=0)
    assert torch.equal(log_softmax(logits[300:301])[0], lp[300])
    from quantroll.kernels.invariant_rows import sample

    broken = logits[:2].clone()
    broken[0, 10] = float("nan")  # a NaN logit: the reported logprob is NaN, as the trainer's (the
    tokens, token_lp = sample(broken, False, torch.tensor([1, 2], device=DEV),  # interpreter cannot run it)
                              torch.tensor([5, 5], device=DEV))
    assert torch.isnan(token_lp[0]) and torch.equal(token_lp[1], log_softmax(broken)[1, tokens[1]])


def test_fused_projection_columns_equal_their_parts():
    """What lets the engine fuse q/k/v and gate/up while the trainer runs them apart: on the
    Qwen3-1.7B widths, every column of the one-tile GEMM of the fused weight has the bits of
    its part's own GEMM, for a decode step's rows and a trainer chunk's."""
    from quantroll.kernels.invariant_gemm import invariant_gemm

    tiles = INVARIANT_KERNELS.invariant_gemm
    gen = torch.Generator(device=DEV).manual_seed(3)
    for widths, k in (((2048, 1024, 1024), 2048), ((6144, 6144), 2048)):
        parts = [torch.randn(n, k, device=DEV, generator=gen).to(torch.bfloat16) for n in widths]
        for m in (1, 7, 128, 4099):
            x = torch.randn(m, k, device=DEV, generator=gen).to(torch.bfloat16)
            fused = invariant_gemm(x, torch.cat(parts), tiles).split(list(widths), -1)
            for got, w in zip(fused, parts):
                assert torch.equal(got, invariant_gemm(x, w, tiles)), (widths, m)


@pytest.mark.parametrize("context", [1024, 4096])
def test_bitwise_equal_at_contexts_up_to_4k_with_preemption(long_ckpt, context):
    probe = Engine(long_ckpt, device=DEV, kernels=INVARIANT_KERNELS)
    gib = 2.5 * (context + 64) * probe.kv_bytes_per_token() / 2**30  # ~2 sequences' worth: preempts the rest
    engine = Engine(long_ckpt, device=DEV, kernels=INVARIANT_KERNELS, cache=CacheConfig(memory_gb=gib))
    policy = load_policy(long_ckpt, device=DEV, kernels=INVARIANT_KERNELS)
    gen = torch.Generator().manual_seed(context)
    prompts = [torch.randint(0, 300, (context - 16 - i,), generator=gen).tolist() for i in range(4)]
    params = SamplingParams(temperature=0.7, max_new_tokens=16, seed=1, stop_token_ids=())
    unequal, tokens = _gap_and_bits(engine, policy, prompts, params)
    assert tokens == 64 and unequal == 0


def _mode2(engine_ckpt, policy_ckpt):
    """The engine on the converted block FP8 checkpoint, the trainer on the BF16 one with the same
    format on the engine's quantized layers (emulated on both sides: train_real_fp8 False)."""
    from quantroll.formats import get_format

    from quantroll.model.kernel_config import TrainFormat

    engine = Engine(engine_ckpt, device=DEV, kernels=INVARIANT_KERNELS, cache=CacheConfig(memory_gb=2))
    names = frozenset(engine.quantized_layers())
    assert names
    policy = load_policy(policy_ckpt, device=DEV, kernels=INVARIANT_KERNELS,
                         train=TrainFormat(get_format("fp8"), names))
    return engine, policy


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_mode2_bitwise_equal(tiny_checkpoint, tmp_path, moe):
    from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint

    bf16, fp8 = tiny_checkpoint(moe=moe), tmp_path / "fp8"
    convert_checkpoint(bf16, fp8, ConvertConfig(format="fp8", progress=False, allow_partial_blocks=True))
    engine, policy = _mode2(fp8, bf16)
    prompts = [[5 + i, 6, 7, 8][: 1 + i % 4] for i in range(32)]
    unequal, tokens = _gap_and_bits(engine, policy, prompts, SamplingParams(max_new_tokens=12, seed=2))
    assert tokens > 0 and unequal == 0


@pytest.mark.parametrize("batch", [1, 48])
def test_moe_bitwise_equal_and_same_experts(tiny_checkpoint, batch):
    """Qwen3-MoE in BF16: the invariant router (tree-sum softmax, argmax top-k) and the
    per-expert invariant GEMMs give the engine's logprobs bit for bit, and the engine's
    recorded experts are the ones the trainer chooses (routing replay would be a no-op)."""
    from quantroll.metrics.mismatch import routing_agreement
    from quantroll.model.moe import RecordRouting
    from quantroll.rl.step import _per_sequence_routes

    ckpt = tiny_checkpoint(moe=True)
    engine = Engine(ckpt, device=DEV, kernels=INVARIANT_KERNELS, cache=CacheConfig(memory_gb=2))
    policy = load_policy(ckpt, device=DEV, kernels=INVARIANT_KERNELS)
    gen = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, 300, (int(n),), generator=gen).tolist()
               for n in torch.randint(3, 40, (batch,), generator=gen)]
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=batch, stop_token_ids=())
    results = engine.generate(prompts, params)
    record = RecordRouting()
    with torch.no_grad():
        logp, _ = response_logprobs(policy, prompts, [r.tokens for r in results], 1.0, routing=record)
    unequal = sum(int((logp[i, :len(r.logprobs)].cpu() != torch.tensor(r.logprobs)).sum())
                  for i, r in enumerate(results))
    assert sum(len(r.tokens) for r in results) > 0 and unequal == 0
    trainer = torch.cat(_per_sequence_routes(record, prompts, [r.tokens for r in results], policy.config.moe_layers))
    engine_routes = torch.cat([r.routed_experts.long() for r in results])
    assert routing_agreement(trainer, engine_routes) == [1.0] * len(policy.config.moe_layers)
