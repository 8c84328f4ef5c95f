"""One training step on one rollout batch, as the algorithm reads:

old logprobs (trainer, no grad) -> mismatch metrics -> advantages -> for each
minibatch: for each micro-batch: logprobs -> PPO loss -> correction -> KL -> aggregate
(over the minibatch's denominators) -> backward; then one optimizer step.

``--micro-batch-size`` bounds the sequences in one forward pass (memory at long
responses); the minibatch's loss and gradient do not depend on it, beyond float rounding.

Across ranks (quantroll/distributed/trainer_rows.py) each rank takes its share of every
minibatch's rows and the gradients sum over ranks (FSDP2); the old logprobs, routes and
per-minibatch statistics are gathered, so every rank sees the whole batch's numbers and
the metrics are those of one process. ``WholeBatch`` is the one-process case.
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
from quantroll.trainer.corrections import correct
from quantroll.trainer.losses import aggregate, denominators, kl_penalty, ppo_policy_loss
from quantroll.trainer.policy import response_logprobs, response_logprobs_and_entropy


def _per_sequence_routes(record: RecordRouting, prompts, responses, moe_layers) -> list[torch.Tensor]:
    """A pass's recorded [B * L, k] tables -> per sequence [P + R - 1, layers, k] (the engine's layout)."""
    b, length = len(prompts), max(len(p) + len(r) - 1 for p, r in zip(prompts, responses))
    return [torch.stack([record.chosen[layer].view(b, length, -1)[i, : len(p) + len(r) - 1] for layer in moe_layers], 1)
            .cpu() for i, (p, r) in enumerate(zip(prompts, responses))]


def _advantages(cfg: TrainConfig, rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if cfg.optimizer.advantage_estimator == "grpo":
        return broadcast_to_tokens(grpo_advantages(rewards, cfg.rollout.n_samples_per_prompt), mask)
    return reinforce_plus_plus_advantages(rewards, mask)


class _Batch:
    """The rollout's sequences and their routes, cut into any group of rows."""

    def __init__(self, batch: RolloutBatch, model_cfg):
        self.prompts, self.responses = batch.prompts, batch.responses
        self.moe_layers, self.top_k = model_cfg.moe_layers, model_cfg.num_experts_per_tok

    def rows(self, rows):
        return [self.prompts[i] for i in rows], [self.responses[i] for i in rows]

    def replay(self, routes: list[torch.Tensor] | None, rows) -> ReplayRouting | None:
        if routes is None:
            return None
        prompts, responses = self.rows(rows)
        return replay_from_engine([routes[i] for i in rows], prompts, responses, self.moe_layers, self.top_k)


class WholeBatch:
    """One process: every row is this process's own and there is nothing to gather."""

    lockstep = False  # a rank may stop a minibatch early (no collective waits for it)

    def mine(self, rows: list[int]) -> list[int]:
        return rows

    def gather_rows(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def gather_routes(self, routes: list[torch.Tensor]) -> list[torch.Tensor]:
        return routes

    def sum(self, values: list[float]) -> list[float]:
        return values

    def all_true(self, flag: bool) -> bool:
        return flag

    def share(self, tokens: torch.Tensor) -> float:
        return float(tokens.mean()) if tokens.numel() else 0.0


def _parts(rows: list[int], size: int | None) -> list[list[int]]:
    return [rows[i: i + size] for i in range(0, len(rows), size)] if size else [rows]


def _logprobs_no_grad(model, data: _Batch, temperature: float, parts, routes=None, record=False,
                      entropy=False):
    """(logp [B, R], mask [B, R], the routes the model chose itself or None, the entropy
    [B, R] at each position or None), micro-batch by micro-batch."""
    width = max(len(r) for r in data.responses)
    logps, masks, natural, entropies = [], [], [], []

    def padded(x):
        return torch.nn.functional.pad(x.cpu(), (0, width - x.shape[1]))

    with torch.no_grad():
        for rows in parts:
            rec = RecordRouting() if record else None
            prompts, responses = data.rows(rows)
            routing = data.replay(routes, rows) or rec
            if entropy:
                lp, ent, m = response_logprobs_and_entropy(model, prompts, responses, temperature, routing)
                entropies.append(padded(ent))
            else:
                lp, m = response_logprobs(model, prompts, responses, temperature, routing)
            logps.append(padded(lp))
            masks.append(padded(m))
            if rec is not None:
                natural += _per_sequence_routes(rec, prompts, responses, data.moe_layers)
    return (torch.cat(logps), torch.cat(masks), (natural if record else None),
            torch.cat(entropies) if entropy else None)


def train_on_batch(cfg: TrainConfig, policy, ref_policy, optimizer, batch: RolloutBatch, rows=None) -> dict:
    """``rows``: which rows are this process's and how to gather (WholeBatch by default)."""
    rows_of = rows or WholeBatch()
    model_cfg = policy.config
    data = _Batch(batch, model_cfg)
    n = len(data.prompts)
    moe = bool(model_cfg.moe_layers)
    metrics: dict = {}
    t0 = time.perf_counter()
    micro = _parts(rows_of.mine(list(range(n))), cfg.optimizer.micro_batch_size)
    # -- old logprobs: the trainer's own, before any update of this step ------------------
    engine_routes = [r.routed_experts for r in batch.results] if moe else None
    replayed = engine_routes if moe and cfg.correction.rollout_routing_replay else None
    old_logp, mask, natural, entropy = _logprobs_no_grad(policy, data, cfg.rollout.rollout_temperature, micro,
                                                         replayed, record=moe and replayed is None, entropy=True)
    old_logp, mask, entropy = rows_of.gather_rows(old_logp), rows_of.gather_rows(mask), rows_of.gather_rows(entropy)
    if mask.sum():  # the policy's mean per-token entropy where it is measured (nats, at the sampling temperature)
        metrics["entropy"] = float((entropy * mask).sum() / mask.sum())
    if moe:
        if natural is None:  # the old logprobs replayed the engine's choices: the trainer's own, for the metric
            natural = _logprobs_no_grad(policy, data, cfg.rollout.rollout_temperature, micro, record=True)[2]
        natural = rows_of.gather_routes(natural)
        for j, share in enumerate(routing_agreement(torch.cat(natural), torch.cat([r.long() for r in engine_routes]))):
            metrics[f"routing_agreement_layer{model_cfg.moe_layers[j]}"] = share
        if cfg.correction.routing_replay and replayed is None:
            replayed = natural
    ref_logp = None
    if cfg.optimizer.use_kl_loss and ref_policy is not None:
        ref_logp = rows_of.gather_rows(_logprobs_no_grad(ref_policy, data, cfg.rollout.rollout_temperature, micro, replayed)[0])
    rollout_logp = batch.rollout_logprobs()
    metrics.update(mismatch_metrics(old_logp, rollout_logp, mask))
    metrics["by_response_len"] = mismatch_by_length(old_logp, rollout_logp, mask)
    advantages = _advantages(cfg, batch.rewards, mask)
    # -- updates, one per minibatch, gradients accumulated over its micro-batches ---------
    correction = cfg.correction
    size = cfg.optimizer.global_batch_size or n
    losses, clipfracs, kls, norms, corr = [], [], [], [], []
    first_diff = [0.0, 0.0]  # the first minibatch's |logp - old logp| summed over its tokens, and its tokens
    for start in range(0, n, size):
        minibatch = list(range(start, min(start + size, n)))
        over = denominators(mask[minibatch])
        optimizer.zero_grad()
        loss_value, kl_value, finite, clipped_tokens = 0.0, 0.0, True, []
        if rows_of.lockstep and correction.enabled:  # the correction's statistics of the whole minibatch
            whole = mask[minibatch]
            corr.append(correct(torch.zeros_like(whole), old_logp[minibatch], rollout_logp[minibatch], whole,
                                correction)[2])
        for rows in _parts(rows_of.mine(minibatch), cfg.optimizer.micro_batch_size):
            prompts, responses = data.rows(rows)
            logp, sub_mask = response_logprobs(policy, prompts, responses, cfg.rollout.rollout_temperature,
                                               data.replay(replayed, rows))
            width = logp.shape[1]
            sub_old, sub_roll = old_logp[rows, :width].to(logp.device), rollout_logp[rows, :width].to(logp.device)
            if start == 0:
                first_diff[0] += float(((logp.detach() - sub_old).abs() * sub_mask).sum())
                first_diff[1] += float(sub_mask.sum())
            sub_adv = advantages[rows, :width].to(logp.device)
            pg, clipped = ppo_policy_loss(logp, sub_old, sub_adv, cfg.optimizer.eps_clip, cfg.optimizer.eps_clip_high)
            pg, numerator_mask, corr_metrics = correct(pg, sub_old, sub_roll, sub_mask, correction)
            loss = aggregate(pg, numerator_mask, cfg.optimizer.loss_agg, denom_mask=sub_mask, over=over)
            if ref_logp is not None and cfg.optimizer.kl_loss_coef:
                kl = aggregate(kl_penalty(logp, ref_logp[rows, :width].to(logp.device), cfg.optimizer.kl_loss_type), sub_mask,
                               cfg.optimizer.loss_agg, over=over)
                loss = loss + cfg.optimizer.kl_loss_coef * kl
                kl_value += float(kl.detach())
            if not math.isfinite(float(loss.detach())):
                finite = False
                if not rows_of.lockstep:
                    break
            loss.backward()  # across ranks a non-finite loss still runs its backward: FSDP2's collectives wait for it
            optimizer.accumulate()
            loss_value += float(loss.detach())
            clipped_tokens.append(clipped[sub_mask.bool()].float())
            if not rows_of.lockstep:
                corr.append(corr_metrics)
        finite = rows_of.all_true(finite)
        if not finite or not math.isfinite(optimizer.grad_norm()):
            optimizer.zero_grad()
            metrics["skipped_nonfinite"] = metrics.get("skipped_nonfinite", 0) + 1
            continue
        norms.append(optimizer.step(cfg.optimizer.max_grad_norm))
        loss_value, kl_value = rows_of.sum([loss_value, kl_value])
        losses.append(loss_value)
        if ref_logp is not None and cfg.optimizer.kl_loss_coef:
            kls.append(kl_value)
        clipfracs.append(rows_of.share(torch.cat(clipped_tokens)))
    metrics.update({
        "loss": _mean(losses), "pg_clipfrac": _mean(clipfracs), "grad_norm": _mean(norms),
        "train_time": time.perf_counter() - t0,
    })
    if kls:
        metrics["kl"] = _mean(kls)
    if cfg.precision.true_on_policy_mode and first_diff[1]:
        metrics["train_first_forward_logprob_abs_diff"] = first_diff[0] / first_diff[1]
    for key in (corr[0] if corr else {}):  # extremes stay extremes across minibatches, the rest are means
        values = [c[key] for c in corr]
        metrics[key] = min(values) if key.endswith("_min") else max(values) if key.endswith("_max") else _mean(values)
    return metrics


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")
