"""``--check-weight-update-equal``: prove the first weight update reaches every engine tensor.

Before training: snapshot the engine's weights as loaded from ``--hf-checkpoint``,
overwrite them all with noise, apply the first update from the trainer, and compare
every tensor with the snapshot. Without ``allow_quant_error`` they must be bitwise
equal (codes and scales). With it, dequantized values are compared and each element
may differ by one ULP of its format per side: the reference checkpoint's ULP at its
block scale plus the update's ULP at its own. NaN always fails. A failure names the
tensor and its worst error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from quantroll.errors import NonFiniteError, QuantrollError
from quantroll.formats import QuantizedTensor


class WeightUpdateMismatch(QuantrollError):
    """The first weight update did not reproduce the engine's checkpoint."""


def _noise_(t: torch.Tensor, g: torch.Generator) -> None:
    """Overwrite in place with random bits (a float dtype gets finite random values)."""
    if t.is_floating_point() and t.element_size() >= 2:
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype) * 3 + 1)
    else:
        t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, generator=g, dtype=torch.uint8))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def _dequantized(engine, module: str, state: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    layer = engine.quantized_layers()[module]
    q = QuantizedTensor(state[f"{module}.weight"], state[f"{module}.weight_scale"], layer.format.name,
                        (layer.out_features, layer.in_features), layer.quantized_weight().block,
                        state.get(f"{module}.weight_global"))
    return layer.format.dequantize(q), layer.format.ulp(q)


@torch.no_grad()
def check_weight_update(engine, push: Callable[[], object], allow_quant_error: bool, seed: int = 0) -> dict[str, float]:
    """Run ``push()`` (the first update) between a noise fill and a full comparison.

    Returns {tensor: worst error} (all zeros when bitwise); raises WeightUpdateMismatch.
    """
    reference = {name: t.clone() for name, t in engine.state().items()}
    g = torch.Generator().manual_seed(seed)
    for t in engine.state().values():
        _noise_(t, g)
    for layer in engine.quantized_layers().values():
        layer.invalidate()
    try:
        push()
    except NonFiniteError as err:  # the engine refused an update holding NaN/Inf: a mismatch to name
        _fail(err.tensor or "?", f"the update holds NaN/Inf ({err}), so the engine loaded none of it")
    after = engine.state()
    errors: dict[str, float] = {}
    quantized = engine.quantized_layers()
    for name, ref in reference.items():
        module = name.rsplit(".", 1)[0]
        if module in quantized:
            if not name.endswith(".weight"):
                continue  # scales are compared with their weight
            errors[name] = _compare_quantized(engine, module, reference, after, allow_quant_error)
        else:
            errors[name] = _compare_plain(name, ref, after[name])
    return errors


def _fail(name: str, what: str) -> None:
    raise WeightUpdateMismatch(f"weight update check failed at '{name}': {what}; the weight sync does not "
                               "reproduce the engine's checkpoint (the run is stopped)")


def _compare_plain(name: str, ref: torch.Tensor, new: torch.Tensor) -> float:
    if torch.isnan(new).any():
        _fail(name, "the updated tensor holds NaN")
    if torch.equal(ref, new):
        return 0.0
    worst = (ref.float() - new.float()).abs().max().item()
    _fail(name, f"differs from the checkpoint, worst |diff| {worst:.3g}")
    return worst


def _compare_quantized(engine, module: str, ref: Mapping, new: Mapping, allow_quant_error: bool) -> float:
    parts = [p for p in ("weight", "weight_scale", "weight_global") if f"{module}.{p}" in ref]
    name = f"{module}.weight"
    deq_new, ulp_new = _dequantized(engine, module, new)
    if torch.isnan(deq_new).any() or any(torch.isnan(new[f"{module}.{p}"].float()).any() for p in parts[1:]):
        _fail(name, "the updated weight or its scale holds NaN")
    if all(_same_bits(ref[f"{module}.{p}"], new[f"{module}.{p}"]) for p in parts):
        return 0.0
    deq_ref, ulp_ref = _dequantized(engine, module, ref)
    err = (deq_new - deq_ref).abs()
    worst_i = int(err.argmax())
    worst = err.view(-1)[worst_i].item()
    if not allow_quant_error:
        differing = [p for p in parts if not _same_bits(ref[f"{module}.{p}"], new[f"{module}.{p}"])]
        _fail(name, f"{'/'.join(differing)} not bitwise equal (worst dequantized |diff| {worst:.3g}; "
                    "pass --check-weight-update-allow-quant-error to compare within the format's rounding)")
    allowed = ulp_ref + ulp_new
    if bool((err > allowed).any()):
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst_i), err.shape))
        _fail(name, f"dequantized values differ beyond one ULP per side, worst |diff| {worst:.3g} at {idx} "
                    f"(allowed {allowed.view(-1)[worst_i].item():.3g})")
    return worst
