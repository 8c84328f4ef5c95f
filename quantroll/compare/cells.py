"""The cells every report table is built from: the legend of each metric and column, the
names a reader sees for metrics (never raw JSONL keys), and how a stats dict prints.

Shared by tables.py (the data tables) and answer.py (the recommendation and the lines
that open the report), so that both say the same thing the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quantroll.compare.perrun import MAIN_GAP

LEGEND = {
    "train_rollout_logprob_abs_diff": "mean over response tokens of |logp_train - logp_rollout| (the main gap)",
    "train_rollout_kl": "mean of exp(r) - 1 - r, r = logp_train - logp_rollout: k3 estimate of KL(rollout || train)",
    "log_ppl_diff": "mean over sequences of log ppl_train - log ppl_rollout",
    "ppl_ratio": "mean over sequences of ppl_train / ppl_rollout",
    "chi2_token": ("mean(exp(2r)) - 1 over the sampled tokens: the unbiased sample estimate of the chi-square "
                   "divergence (the variance of the token importance weights); see the note on negative values"),
    "chi2_seq": "the same over per-sequence ratio products: the sequence-level weights",
    "train_rollout_prob_abs_diff_max": "max |p_train - p_rollout| of the sampled tokens",
    "train_rollout_prob_abs_diff_mean": "mean |p_train - p_rollout| of the sampled tokens",
    "train_rollout_prob_pearson": "Pearson correlation of p_train and p_rollout over tokens",
    "n": "seeds (runs) aggregated; values are mean ± std over seeds (ddof=1)",
    "entropy": ("the trainer's mean per-token entropy over the sampled responses (nats, at the sampling temperature; "
                "metrics.jsonl key entropy): a gap is read beside it, more entropy, more room for the two "
                "precisions to part"),
    "reward": "mean reward over all steps of a run (a built-in task's reward is 1 for a right answer, 0 otherwise)",
    "reward, last k steps": ("mean reward over the last k steps of a run (k in the header; one step's batch "
                             "reward is too noisy to compare), then mean ± std over seeds"),
    "reward - bf16": "mean reward over steps minus the bf16 baseline's, with its significance",
    "eval engine / trainer": ("held-out greedy accuracy (problems outside the training pool) of the engine's "
                              "(rollout precision) and the trainer's policy, at step 0 and at the last eval step"),
    "reward step 0": "reward at step 0 (initial weights)",
    "rollout / train / quantize / load": "seconds per step of generation, training, weight re-quantization and weight loading",
    "update / copy": ("weight update (quantize + load) over one device copy of the engine's weight bytes, as held "
                      "(the memory system's limit for an update; the one-GPU floor is 2x)"),
    "tokens/s": "tokens generated per second of rollout",
    "speedup": "bf16 rollout time / this rollout time (tokens/s ratio: this / bf16)",
    "saved / extra sync / net": "rollout seconds saved vs bf16, extra sync seconds vs bf16 per update, saved - extra",
    "break-even len": "response-length limit at which saved = extra sync (linear extrapolation, see the assumption)",
    "routing agreement": "share of tokens whose top-k expert set is the same in trainer and engine (1 = identical), "
                         "from the trainer's own router: what R3 replays away",
    "peak memory": "peak memory in GiB, max over steps: GPU memory allocated on CUDA, the process's resident set on CPU",
    "KV capacity": "tokens the engine's KV cache can hold",
    "engine weights": ("GiB of every weight the engine holds (codes, scales, BF16 parts), at the dtype its checkpoint "
                       "stores them in, not the float32 copy a CPU computes with"),
    "trainer weights": "GiB of the trainer's weights as stored (BF16)",
    "trainer optimizer": "GiB the optimizer holds: FP32 master weights and AdamW's two moments",
    "response len": "bucket b-(2b-1) of response lengths in tokens (b a power of two), over all steps of every run",
    "tokens": "response tokens in the bucket, summed over the group's runs",
    "held-out acc": "held-out greedy accuracy of the trainer's policy at the last eval step",
}
SHORT = {
    "train_rollout_logprob_abs_diff": "|logp diff|", "train_rollout_kl": "KL (k3)", "log_ppl_diff": "log ppl diff",
    "ppl_ratio": "ppl ratio", "chi2_token": "chi2 token", "chi2_seq": "chi2 seq",
    "train_rollout_prob_abs_diff_max": "|p diff| max", "train_rollout_prob_abs_diff_mean": "|p diff| mean",
    "train_rollout_prob_pearson": "p pearson",
}
COMPACT_GAP = (MAIN_GAP, "train_rollout_kl", "chi2_seq")
SEE_ABOVE = "columns as in the gap-at-step-0 table; values are mean ± std over seeds"
CHI2_NEGATIVE = ("chi2 values below 0: chi2 = E[w^2] - 1 (w = p_train / p_rollout) cannot be negative, but its "
                 "estimate mean(w^2) - 1 over the tokens sampled can, when the true value is small against the "
                 "sampling noise (BF16 vs BF16: float rounding only). The estimate is unbiased, so it is reported as "
                 "it is: clipping it at 0 would bias it upward exactly where the gap is smallest. A negative value "
                 "reads: not distinguishable from 0 with these samples.")


@dataclass
class Table:
    key: str
    title: str
    headers: list[str]
    rows: list[list[str]]
    legend: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def num(x, spec: str = ".3g") -> str:
    return "n/a" if x is None else format(x, spec)


def cell(s: dict | None) -> str:
    """'mean ± std' of a stats dict ('mean' alone with one seed)."""
    if not s or s.get("mean") is None:
        return "n/a"
    return f"{s['mean']:.3g}" + (f" ± {s['std']:.3g}" if s.get("std") is not None else "")


def diff_cell(d: dict | None) -> str:
    if not d or d.get("diff") is None:
        return "n/a"
    spread = f", spread {d['spread']:.3g}" if d.get("spread") is not None else ""
    return f"{d['diff']:+.3g} ({d['note']}{spread})"


def legend(*keys: str) -> list[tuple[str, str]]:
    """(the name a reader sees, its meaning); a metric's JSONL key is named in the meaning, not as the name."""
    return [(SHORT[k], f"{LEGEND[k]} (metrics.jsonl key {k})") if k in SHORT else (k, LEGEND[k]) for k in keys]


def k_header(summary: dict) -> str:
    """'reward, last 5 steps': the k of the groups (one k, or the range of them)."""
    ks = sorted({g["reward"].get("last_k") for g in summary["groups"]} - {None})
    return "reward, last " + ("k" if not ks else str(ks[0]) if len(ks) == 1 else f"{ks[0]}-{ks[-1]}") + " steps"


def chi2_negative(summary: dict, field_name: str) -> bool:
    return any((g[field_name].get(m) or {}).get("mean") is not None and g[field_name][m]["mean"] < 0
               for g in summary["groups"] for m in ("chi2_token", "chi2_seq"))
