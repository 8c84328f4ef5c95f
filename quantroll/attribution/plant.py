"""A layer made sensitive to block quantization on purpose: the attribution's positive control.

Scaling a whole layer does not change its relative FP8 error (the scales scale with it). An
outlier inside a 128x128 block does: the block's scale is amax / 448, so one element
``factor`` times the block's largest pushes every other element of the block toward (or
into) E4M3's subnormals, where it keeps few bits or none. To change what the error does and
not what the BF16 model computes, each outlier sits in an input column that is exactly zero:

- attention and MLP inputs: the layer's two norms get a zero weight at one channel per
  128 (so q/k/v and gate/up read exact zeros there, and the outliers go in those columns);
- o_proj: v_proj's row ``d`` of every KV head is zeroed, so every head's attention output is
  zero at ``d`` and o_proj's column ``h * head_dim + d`` is dead for every head h;
- down_proj: up_proj's row ``j`` (one per 128) is zeroed, so silu(gate) * up is zero there.

An outlier times an exact zero is an exact zero in BF16 and in the quantized forward alike,
so the BF16 model's function changes only by the few channels zeroed, and the planted layer's
quantization error grows from the coarser scales alone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

BLOCK = 128
FACTOR = 2.0**16  # the outlier, relative to its block's largest element


def _outliers(w: torch.Tensor, cols: list[int], factor: float) -> None:
    """One outlier per 128x128 block of ``w`` that holds a column of ``cols`` (in place)."""
    for r0 in range(0, w.shape[0], BLOCK):
        for c in cols:
            c0 = (c // BLOCK) * BLOCK
            amax = w[r0: r0 + BLOCK, c0: c0 + BLOCK].float().abs().max()
            w[min(r0 + 7, w.shape[0] - 1), c] = (amax * factor).to(w.dtype)


def plant_weights(weights: dict[str, torch.Tensor], config: dict, layer: int, factor: float = FACTOR) -> None:
    """Plant the outliers of the module docstring into layer ``layer`` of ``weights`` (in place)."""
    p = f"model.layers.{layer}."
    hidden, head_dim = config["hidden_size"], config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dead_in = [5 + BLOCK * b for b in range(max(1, hidden // BLOCK))]
    for norm in ("input_layernorm", "post_attention_layernorm"):
        weights[p + norm + ".weight"][dead_in] = 0
    for proj in ("q_proj", "k_proj", "v_proj"):
        _outliers(weights[p + f"self_attn.{proj}.weight"], dead_in, factor)
    d = 11
    weights[p + "self_attn.v_proj.weight"][[g * head_dim + d for g in range(config["num_key_value_heads"])]] = 0
    _outliers(weights[p + "self_attn.o_proj.weight"], [h * head_dim + d for h in range(config["num_attention_heads"])],
              factor)
    mlps = sorted({n[: -len("up_proj.weight")] for n in weights if n.startswith(p + "mlp.") and n.endswith("up_proj.weight")})
    for m in mlps:
        _outliers(weights[m + "gate_proj.weight"], dead_in, factor)
        _outliers(weights[m + "up_proj.weight"], dead_in, factor)
        inter = weights[m + "up_proj.weight"].shape[0]
        dead_mid = [3 + BLOCK * b for b in range(max(1, inter // BLOCK))]
        weights[m + "up_proj.weight"][dead_mid] = 0
        _outliers(weights[m + "down_proj.weight"], dead_mid, factor)


def plant_checkpoint(source: str | Path, target: str | Path, layer: int, factor: float = FACTOR) -> Path:
    """A copy of the single-file BF16 checkpoint ``source`` with layer ``layer`` planted."""
    source, target = Path(source), Path(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((source / "config.json").read_text())
    weights = load_file(str(source / "model.safetensors"))
    plant_weights(weights, config, layer, factor)
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target
