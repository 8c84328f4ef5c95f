"""What the multi-process tests run, written once for both sides: the one-process
reference (called in the test's own process) and the ranks (called by worker.py under
torchrun or Ray). Every function takes a ``place`` (OneProcess or Ranks) and nothing else
decides how it runs.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from quantroll.builtin import builtin_checkpoint
from quantroll.engine import Engine, GenerationResult, SamplingParams
from quantroll.rl.config import TrainConfig
from quantroll.rl.rollout import RolloutBatch
from quantroll.rl.step import train_on_batch
from quantroll.trainer.policy import load_policy

DTYPE = torch.float32  # CPU compute (quantroll/compute.py): float32 on BF16 values
STEPS = 3
# Adam divides each gradient by its own magnitude, so an element whose gradient is at rounding level
# (a sum that cancels) moves by up to +-lr whichever way the rounding falls, in one process and across
# ranks alike: weight differences scale with lr, not with rounding. Small steps keep them below 1e-5
# of each tensor's scale; the gradient norms are compared exactly (1e-5), whatever lr is.
LR = 5e-6
PROMPTS, SAMPLES = 4, 2  # 8 rows: equal shares over 2 and 4 ranks

# (name, model, TrainConfig overrides, trainer forward format)
TRAIN_CASES = (
    ("dense", "dense", {}, None),
    ("dense-minibatches", "dense", {"global_batch_size": 4, "micro_batch_size": 1, "use_tis": True}, None),
    ("mode2-fp8", "dense", {}, "fp8"),
    # R3: the engine's routes replayed (the batch's). --use-routing-replay records the trainer's own routes
    # instead, where a top-k near-tie flips under 1e-7 differences of the weights by step 3: chaos, not error
    ("moe-replay", "moe", {"use_rollout_routing_replay": True}, None),
)


def batches(model_cfg, seed: int) -> list[RolloutBatch]:
    """STEPS fixed rollout batches of random tokens (as an engine would report them)."""
    rng = random.Random(seed)
    layers, k = len(model_cfg.moe_layers), model_cfg.num_experts_per_tok
    out = []
    for _ in range(STEPS):
        prompts, results = [], []
        for _ in range(PROMPTS):
            for _ in range(SAMPLES):
                # every row its own prompt: a GRPO group's advantages sum to zero, so on a shared prompt the
                # prompt's gradients cancel to rounding noise, which Adam turns into lr-sized steps of either
                # sign (in one process and across ranks alike, but not alike)
                prompt = [rng.randrange(model_cfg.vocab_size) for _ in range(rng.randint(3, 7))]
                tokens = [rng.randrange(model_cfg.vocab_size) for _ in range(rng.randint(1, 6))]
                logprobs = [-rng.random() * 3 for _ in tokens]
                routes = None
                if layers:
                    rows = len(prompt) + len(tokens) - 1
                    routes = torch.tensor([[rng.sample(range(model_cfg.num_experts), k) for _ in range(layers)]
                                           for _ in range(rows)], dtype=torch.int16)
                prompts.append(prompt)
                results.append(GenerationResult(prompt, tokens, logprobs, "length", routes, 0))
        rewards = torch.tensor([float(rng.random() < 0.5) for _ in results])
        out.append(RolloutBatch(prompts, [""] * len(results), results, rewards, 0.0))
    return out


def train_case(place, name: str) -> dict:
    """Three steps of one case; returns the losses and the whole FP32 masters / BF16 weights."""
    _, model, overrides, fmt = next(c for c in TRAIN_CASES if c[0] == name)
    torch.manual_seed(0)
    train = None
    if fmt is not None:  # every decoder linear computes its forward in fmt (part of the policy's plan)
        from quantroll.formats import get_format
        from quantroll.model.kernel_config import TrainFormat
        from quantroll.model.linear import QLinear

        names = frozenset(m.name for m in load_policy(builtin_checkpoint(model), dtype=DTYPE).modules()
                          if isinstance(m, QLinear) and m.name.startswith("model.layers."))
        train = TrainFormat(get_format(fmt), names)
    policy = load_policy(builtin_checkpoint(model), dtype=DTYPE, train=train)
    cfg = TrainConfig.of(rollout_batch_size=PROMPTS, n_samples_per_prompt=SAMPLES, lr=LR, **overrides)
    place.shard(policy)
    optimizer = place.optimizer(policy, cfg.optimizer.lr)
    losses, norms = [], []
    for batch in batches(policy.config, seed=1):
        metrics = train_on_batch(cfg, policy, None, optimizer, batch, place.rows)
        losses.append(metrics["loss"])
        norms.append(metrics["grad_norm"])
    masters, _ = optimizer.export()
    weights = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
               for n, p in policy.named_parameters()}
    return {"losses": losses, "grad_norms": norms, "masters": masters, "weights": weights}


def generate_case(place, engine_dir: Path) -> dict:
    """Greedy and sampled generations of 10 prompts (uneven shares over 4 engines)."""
    local = Engine(engine_dir, dtype=DTYPE)
    engine = place.engines(local)
    rng = random.Random(3)
    vocab = local.config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(2, 9))] for _ in range(10)]
    out = {}
    for label, temperature in (("greedy", 0.0), ("sampled", 1.0)):
        results = engine.generate(prompts, SamplingParams(temperature=temperature, max_new_tokens=8, seed=11,
                                                          stop_token_ids=()))
        out[label] = [(r.tokens, r.logprobs, r.finish_reason) for r in results]
    return out


def perturbed_policy(seed: int = 5, device="cpu", dtype=DTYPE):
    """The built-in policy with every weight moved off the checkpoint (still BF16 values),
    so that an update changes every engine tensor."""
    policy = load_policy(builtin_checkpoint("dense"), device="cpu", dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(1 + 0.05 * torch.randn(p.shape, generator=g)).copy_(p.to(torch.bfloat16).to(dtype))
    return policy.to(device)


def sync_case(place, engine_dir: Path, check: bool, device="cpu", dtype=DTYPE) -> dict:
    """One weight update of ``engine_dir``'s engine from the perturbed policy: the engine's
    tensors afterwards (on the CPU), and the timing (for the bytes on the wire). With
    engines on ranks of their own, run by the trainer ranks: the engine ranks serve it, and
    the tensors that count are theirs (worker.py collects them)."""
    engine = Engine(engine_dir, device=device, dtype=dtype)
    result = {}
    if check:  # the first-update check, on the unperturbed policy: bitwise
        policy = load_policy(builtin_checkpoint("dense"), device=device, dtype=dtype)
        place.shard(policy)
        push = place.sync(engine, policy)
        result["check_worst"] = place.check_weight_update(engine, push, allow_quant_error=False)
    policy = perturbed_policy(device=device, dtype=dtype)
    place.shard(policy)
    timing = place.sync(engine, policy)()
    result["state"] = {n: t.cpu().clone() for n, t in engine.state().items()}
    result["version"] = timing.version
    result["timing"] = timing.metrics()
    return result
