"""Does low-precision rollout pay for itself? Time saved in rollout vs time spent syncing.

A quantized engine generates faster (fewer bytes per weight read), but every weight
update now re-quantizes the trainer's BF16 weights before loading them. Per step:

  saved       = rollout_bf16 - rollout_this                  (s/step)
  extra_sync  = (quantize + load)_this - (quantize + load)_bf16   (s/update, one update per step)
  net         = saved - extra_sync; it pays when saved > extra_sync.

Break-even response length, under two stated assumptions: rollout time is linear in the
tokens generated (at the per-token cost measured in each run: rollout_time / tokens), and
the tokens of a step scale in proportion to the response-length limit (same number of
sequences, same fill of the limit); sync cost is fixed per update. Then at limit L

  saved(L) = (c_bf16 - c_this) * tokens_this * L / L_this,   L* = extra_sync * L_this / ((c_bf16 - c_this) * tokens_this)

L* = 0 when syncing costs no more than BF16's; None (never) when the quantized engine is
not faster per token. All inputs are group means over seeds (times exclude warm-up).
"""

from __future__ import annotations

ASSUMPTION = ("break-even assumes rollout time is linear in the tokens generated (per-token cost measured "
              "in each run), that tokens per step scale with the response-length limit, and that the "
              "weight-sync cost (quantize + load) is fixed per update")
WARMUP_NOTE = "per-step times are means over the steps after step 0 (warm-up excluded) when a run has more than one step"


def _m(group: dict, key: str) -> float | None:
    return group["time"][key]["mean"]


def _sync(group: dict) -> float | None:
    q, load = _m(group, "weight_quantize_time"), _m(group, "weight_load_time")
    if q is None and load is None:
        return None
    return (q or 0.0) + (load or 0.0)


def update_over_copy(group: dict) -> float | None:
    """The weight update (quantize + load) in units of one device copy of the engine's weight
    bytes (sync/copy_reference.py): how far the update is from the memory system's limit."""
    return _ratio(_sync(group), _m(group, "weight_copy_time"))


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b not in (None, 0.0) else None


def break_even(group: dict, base: dict) -> dict:
    """The speed block of a group against the bf16 baseline group (JSON-safe)."""
    r_base, r_this = _m(base, "rollout_time"), _m(group, "rollout_time")
    s_base, s_this = _sync(base), _sync(group)
    out = {
        "baseline": base["id"],
        "speedup": _ratio(r_base, r_this),
        "tokens_per_s_ratio": _ratio(_m(group, "rollout_tokens_per_s"), _m(base, "rollout_tokens_per_s")),
        "saved_s": None, "extra_sync_s": None, "net_s": None, "pays": None,
        "response_len": group.get("response_len"), "break_even_response_len": None, "break_even_note": "no data",
    }
    if None in (r_base, r_this, s_base, s_this):
        return out
    saved, extra = r_base - r_this, s_this - s_base
    out.update(saved_s=saved, extra_sync_s=extra, net_s=saved - extra, pays=saved > extra)
    c_base, c_this = _m(base, "s_per_token"), _m(group, "s_per_token")
    tokens, length = _m(group, "tokens_per_step"), group.get("response_len")
    if extra <= 0:
        out.update(break_even_response_len=0.0, break_even_note="sync costs no more than bf16: pays at any length")
    elif None in (c_base, c_this, tokens, length) or not tokens:
        out["break_even_note"] = "no per-token data"
    elif c_base <= c_this:
        out["break_even_note"] = "never: rollout is not faster per token than bf16"
    else:
        out.update(break_even_response_len=extra * length / ((c_base - c_this) * tokens),
                   break_even_note="linear extrapolation")
    return out


def verdict(group: dict) -> str:
    """One line: saved vs sync cost, pays or not, at which length it would."""
    sp = group.get("speed") or {}
    if sp.get("pays") is None:
        return f"{group['label']}: no timing data to compare with bf16"
    saved, extra, length = sp["saved_s"], sp["extra_sync_s"], sp["response_len"]
    rollout = f"saves {saved:.3g} s/step" if saved >= 0 else f"is {-saved:.3g} s/step slower"
    sync = f"re-quantizing costs {extra:.3g} s/update" if extra >= 0 else f"syncing is {-extra:.3g} s/update cheaper"
    at = f" at response length {length}" if length is not None else ""
    be = sp["break_even_response_len"]
    where = f"break-even at ~{be:.0f} tokens" if be is not None else sp["break_even_note"]
    pays = "pays" if sp["pays"] else "does not pay"
    warn = "measured" if sp["pays"] else "small-model warning, measured"
    line = (f"{group['label']} - rollout {rollout}, {sync}: {pays} on this model{at} "
            f"(net {sp['net_s']:+.3g} s/step; {where}; {warn})")
    if group.get("emulated"):
        line += "; emulated: the times measure the emulation, not the format's hardware speed"
    return line
