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


@pytest.mark.parametrize("batch,graphs", [(1, True), (7, True), (7, False), (64, True), (256, True)])
def test_bitwise_equal_for_batches_of_1_to_256(tiny_qwen3_dir, batch, graphs):
    engine = Engine(tiny_qwen3_dir, device=DEV, kernels=INVARIANT_KERNELS, cache=CacheConfig(memory_gb=4),
                    cuda_graphs=graphs)
    policy = load_policy(tiny_qwen3_dir, device=DEV, kernels=INVARIANT_KERNELS)
    gen = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, 300, (int(n),), generator=gen).tolist()
               for n in torch.randint(3, 60, (batch,), generator=gen)]
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=16, seed=batch, stop_token_ids=())
    unequal, tokens = _gap_and_bits(engine, policy, prompts, params)
    assert tokens > 0 and unequal == 0
    assert (engine.last_stats["graph_captures"] > 0) == graphs


def test_row_kernels_in_bf16_are_batch_invariant_and_round_to_nearest():
    """The row kernels compiled (the interpreter truncates BF16 casts, so only here): RMSNorm
    within one BF16 rounding of each of its two steps against float64, log-softmax against
    float64, and a row's bits the same alone and among 4096 rows."""
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
    logits = 5 * torch.randn(512, 151936, device=DEV, generator=gen)
    lp = log_softmax(logits)
    assert torch.allclose(lp.double(), torch.log_softmax(logits.double(), -1), atol=5e-5, rtol=0)
    assert torch.equal(log_softmax(logits[300:301])[0], lp[300])


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


def test_mode2_bitwise_equal(tiny_qwen3_dir, tmp_path):
    from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
    from quantroll.formats import get_format

    fp8 = tmp_path / "fp8"
    convert_checkpoint(tiny_qwen3_dir, fp8, ConvertConfig(format="fp8", progress=False, allow_partial_blocks=True))
    engine = Engine(fp8, device=DEV, kernels=INVARIANT_KERNELS, cache=CacheConfig(memory_gb=2))
    policy = load_policy(tiny_qwen3_dir, device=DEV, kernels=INVARIANT_KERNELS)
    names = set(engine.quantized_layers())
    for module in policy.modules():
        if getattr(module, "name", None) in names:
            module.train_format = get_format("fp8")  # emulated on both sides (train_real_fp8 False)
    prompts = [[5 + i, 6, 7, 8][: 1 + i % 4] for i in range(32)]
    unequal, tokens = _gap_and_bits(engine, policy, prompts, SamplingParams(max_new_tokens=12, seed=2))
    assert tokens > 0 and unequal == 0
