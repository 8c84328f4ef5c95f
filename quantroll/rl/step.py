"""One training step on one rollout batch, as the algorithm reads:

old logprobs (trainer, no grad) -> mismatch metrics -> advantages -> for each
minibatch: logprobs -> PPO loss -> correction -> KL -> aggregate -> backward -> step.
"""

from __future__ import annotations

import math
import time

import torch

from quantroll.metrics.by_length import mismatch_by_length
from quantroll.metrics.mismatch import mismatch_metrics, routing_agreement
from quantroll.model.moe import RecordRouting, ReplayRouting
from quantroll.rl.config import TrainConfig
from quantroll.rl.rollout import RolloutBatch
from quantroll.rl.routing import replay_from_engine
from quantroll.trainer.advantages import broadcast_to_tokens, grpo_advantages, reinforce_plus_plus_advantages
from quantroll.trainer.corrections import CorrectionConfig, correct
from quantroll.trainer.losses import aggregate, kl_penalty, ppo_policy_loss
from quantroll.trainer.policy import response_logprobs


def _routing_rows(record: RecordRouting, prompts, responses, moe_layers, batch_len) -> torch.Tensor:
    """Recorded [B * L, k] tables -> per valid position [N, layers, k]."""
    rows = []
    for i, (p, r) in enumerate(zip(prompts, responses)):
        n = len(p) + len(r) - 1
        rows.append(torch.stack([record.chosen[layer].view(len(prompts), batch_len, -1)[i, :n] for layer in moe_layers], 1))
    return torch.cat(rows).cpu()


def _advantages(cfg: TrainConfig, rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if cfg.advantage_estimator == "grpo":
        return broadcast_to_tokens(grpo_advantages(rewards, cfg.n_samples_per_prompt), mask)
    return reinforce_plus_plus_advantages(rewards, mask)


def _slice_routing(replay: ReplayRouting | None, rows: list[int], batch: int, length: int) -> ReplayRouting | None:
    """The replay tables of a minibatch, cut to the minibatch's own padded length."""
    if replay is None:
        return None
    out = {}
    for layer, table in replay.chosen.items():
        per_row = table.view(batch, -1, table.shape[-1])
        out[layer] = per_row[rows, :length].reshape(-1, table.shape[-1])
    return ReplayRouting(out)


def train_on_batch(cfg: TrainConfig, policy, ref_policy, optimizer, batch: RolloutBatch) -> dict:
    model_cfg = policy.config
    prompts, responses = batch.prompts, batch.responses
    moe = bool(model_cfg.moe_layers)
    metrics: dict = {}
    t0 = time.perf_counter()
    # -- old logprobs: the trainer's own, before any update of this step ------------------
    replay = None
    if moe and cfg.use_rollout_routing_replay:
        replay = replay_from_engine([r.routed_experts for r in batch.results], prompts, responses,
                                    model_cfg.moe_layers, model_cfg.num_experts_per_tok)
    record = RecordRouting() if moe else None
    with torch.no_grad():
        old_logp, mask = response_logprobs(policy, prompts, responses, cfg.rollout_temperature, replay or record)
        if moe:
            natural = record if replay is None else RecordRouting()
            if replay is not None:
                response_logprobs(policy, prompts, responses, cfg.rollout_temperature, natural)
            length = max(len(p) + len(r) - 1 for p, r in zip(prompts, responses))
            trainer_routes = _routing_rows(natural, prompts, responses, model_cfg.moe_layers, length)
            engine_routes = torch.cat([r.routed_experts.long() for r in batch.results])
            for j, share in enumerate(routing_agreement(trainer_routes, engine_routes)):
                metrics[f"routing_agreement_layer{model_cfg.moe_layers[j]}"] = share
            if cfg.use_routing_replay and replay is None:
                replay = ReplayRouting(dict(natural.chosen))
        ref_logp = None
        if cfg.use_kl_loss and ref_policy is not None:
            ref_logp, _ = response_logprobs(ref_policy, prompts, responses, cfg.rollout_temperature, replay)
    old_logp, mask = old_logp.cpu(), mask.cpu()
    rollout_logp = batch.rollout_logprobs()
    metrics.update(mismatch_metrics(old_logp, rollout_logp, mask))
    metrics["by_response_len"] = mismatch_by_length(old_logp, rollout_logp, mask)
    advantages = _advantages(cfg, batch.rewards, mask)
    # -- updates, one per minibatch -----------------------------------------------------
    correction = CorrectionConfig(enabled=cfg.use_tis, mode=cfg.tis_mode, level=cfg.tis_level, clip=cfg.tis_clip,
                                  clip_low=cfg.tis_clip_low)
    size = cfg.global_batch_size or len(prompts)
    losses, clipfracs, kls, norms, corr = [], [], [], [], []
    for start in range(0, len(prompts), size):
        rows = list(range(start, min(start + size, len(prompts))))
        length = max(len(prompts[i]) + len(responses[i]) - 1 for i in rows)
        sub_routing = _slice_routing(replay, rows, len(prompts), length)
        logp, sub_mask = response_logprobs(policy, [prompts[i] for i in rows], [responses[i] for i in rows],
                                           cfg.rollout_temperature, sub_routing)
        width = logp.shape[1]
        sub_old, sub_roll = old_logp[rows, :width].to(logp.device), rollout_logp[rows, :width].to(logp.device)
        sub_adv = advantages[rows, :width].to(logp.device)
        pg, clipped = ppo_policy_loss(logp, sub_old, sub_adv, cfg.eps_clip, cfg.eps_clip_high)
        pg, numerator_mask, corr_metrics = correct(pg, sub_old, sub_roll, sub_mask, correction)
        loss = aggregate(pg, numerator_mask, cfg.loss_agg, denom_mask=sub_mask)
        if ref_logp is not None and cfg.kl_loss_coef:
            kl = aggregate(kl_penalty(logp, ref_logp[rows, :width].to(logp.device), cfg.kl_loss_type), sub_mask, cfg.loss_agg)
            loss = loss + cfg.kl_loss_coef * kl
            kls.append(float(kl))
        if not math.isfinite(float(loss.detach())):
            optimizer.zero_grad()
            metrics["skipped_nonfinite"] = metrics.get("skipped_nonfinite", 0) + 1
            continue
        optimizer.zero_grad()
        loss.backward()
        norm = optimizer.step(cfg.max_grad_norm) if math.isfinite(optimizer.grad_norm()) else float("nan")
        if not math.isfinite(norm):
            metrics["skipped_nonfinite"] = metrics.get("skipped_nonfinite", 0) + 1
            continue
        losses.append(float(loss.detach()))
        norms.append(norm)
        m = sub_mask.bool()
        clipfracs.append(float(clipped[m].float().mean()) if m.any() else 0.0)
        corr.append(corr_metrics)
    metrics.update({
        "loss": _mean(losses), "pg_clipfrac": _mean(clipfracs), "grad_norm": _mean(norms),
        "train_time": time.perf_counter() - t0,
    })
    if kls:
        metrics["kl"] = _mean(kls)
    for key in (corr[0] if corr else {}):  # extremes stay extremes across minibatches, the rest are means
        values = [c[key] for c in corr]
        metrics[key] = min(values) if key.endswith("_min") else max(values) if key.endswith("_max") else _mean(values)
    return metrics


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")
