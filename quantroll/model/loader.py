"""Build a model from an HF checkpoint directory, BF16 or any ``quantroll convert`` output.

config.json decides the architecture; its quantization_config decides the format;
which modules are quantized is read off the tensors themselves (a module with a
stored scale is quantized), so a checkpoint with BF16 layers at the start or end, or
with modules kept for their shape, loads as it was written. Every stored tensor must
land on a model tensor of the same shape, and every model tensor must be filled.
"""

from __future__ import annotations

from pathlib import Path

import torch

from quantroll.checkpoint.loader import QuantizedCheckpoint
from quantroll.checkpoint.reader import CheckpointReader
from quantroll.errors import NonFiniteError, QuantrollError
from quantroll.formats import Format, invalid_values
from quantroll.model.causal_lm import CausalLM
from quantroll.model.config import config_from_dict


def _open(path: Path) -> tuple[CheckpointReader, QuantizedCheckpoint | None]:
    reader = CheckpointReader(path)
    if isinstance(reader.config.get("quantization_config"), dict):
        reader.close()
        ckpt = QuantizedCheckpoint(path)
        return ckpt.reader, ckpt
    return reader, None


def load_model(checkpoint_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16,
               ) -> tuple[CausalLM, Format | None]:
    """(model in eval mode, the checkpoint's format or None for BF16)."""
    path = Path(checkpoint_dir)
    reader, ckpt = _open(path)
    try:
        cfg = config_from_dict(reader.config, str(path / "config.json"))
        quantized = set(ckpt.quantized) if ckpt else set()
        fmt = ckpt.format if ckpt else None
        model = CausalLM(cfg, lambda name: fmt if name in quantized else None, dtype=dtype, device=device)
        _fill(model, reader, ckpt, quantized, path)
    finally:
        reader.close()
    return model.eval(), fmt


def _fill(model: CausalLM, reader: CheckpointReader, ckpt: QuantizedCheckpoint | None,
          quantized: set[str], path: Path) -> None:
    """Every stored tensor onto its model tensor (names in sorted order, so that the first
    problem reported is the same on every run); NaN/Inf values, NaN codes or bad scales,
    float8 without a scale, and a wrong shape are one-line errors naming the tensor."""
    targets = dict(model.named_parameters())
    targets.update({n: b for n, b in model.named_buffers() if "rotary" not in n})
    filled: set[str] = set()
    linears = model.quantized_linears()
    for module in sorted(quantized):
        if module not in linears:
            raise QuantrollError(f"{path}: quantized tensor '{module}.weight' matches no linear layer of this "
                                 f"{model.config.model_type} model; the checkpoint and config.json disagree")
        q = ckpt.quantized_tensor(module)
        layer = linears[module]
        if q.shape != (layer.out_features, layer.in_features):
            raise QuantrollError(f"{path}: tensor '{module}.weight' has shape {q.shape}, the config implies "
                                 f"{(layer.out_features, layer.in_features)}")
        if (problem := invalid_values(q)) is not None:
            raise NonFiniteError(f"{path}: tensor '{module}.weight' holds {problem}; the checkpoint is corrupt "
                                 "(convert it again from its BF16 source)", tensor=f"{module}.weight")
        layer.load_quantized_(q.to(layer.weight.device))
        filled.update(n for n in targets if n.startswith(module + ".weight"))
    owned = sorted(ckpt.plain_tensors() if ckpt else reader.tensors)
    tied = model.config.tie_word_embeddings
    stored_head = None
    for name in owned:
        target = targets.get(name)
        if tied and name == "lm_head.weight":
            target = targets.get("model.embed_tokens.weight")
        if target is None:
            if ckpt is None and ("_scale" in name.rsplit(".", 1)[-1]):
                raise QuantrollError(f"{path}: tensor '{name}' is a quantization scale but config.json has no "
                                     "quantization_config; restore it (quantroll convert writes it)")
            raise QuantrollError(f"{path}: tensor '{name}' matches nothing in a {model.config.model_type} model "
                                 "with this config.json; is it the right checkpoint?")
        tensor = reader.load(name)
        if tuple(tensor.shape) != tuple(target.shape):
            raise QuantrollError(f"{path}: tensor '{name}' has shape {tuple(tensor.shape)}, the config implies "
                                 f"{tuple(target.shape)}")
        if not tensor.is_floating_point() or tensor.element_size() == 1:
            hint = (" (config.json has no quantization_config: a quantized checkpoint needs it)"
                    if ckpt is None and tensor.element_size() == 1 else "")
            raise QuantrollError(f"{path}: tensor '{name}' is stored as {tensor.dtype} without a scale; "
                                 f"a plain tensor must be float (16 bits or more){hint}")
        value = tensor.to(target.dtype)
        if not bool(torch.isfinite(value).all()):
            raise NonFiniteError(f"{path}: tensor '{name}' holds NaN/Inf values (or values beyond "
                                 f"{str(target.dtype).replace('torch.', '')}'s range); fix the checkpoint",
                                 tensor=name)
        if tied and name == "lm_head.weight":
            stored_head = value  # compared with the embedding once that is loaded
            continue
        with torch.no_grad():
            target.copy_(value)
        filled.add(name)
    if tied:
        filled.add("lm_head.weight")
        embed = targets.get("model.embed_tokens.weight")
        if stored_head is not None and embed is not None and not torch.equal(stored_head.to(embed.device), embed):
            raise QuantrollError(f"{path}: config.json ties lm_head to the embedding (tie_word_embeddings true) but "
                                 "the stored lm_head.weight differs from model.embed_tokens.weight; set "
                                 "tie_word_embeddings to false in config.json if the head is its own")
    missing = sorted(set(targets) - filled)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise QuantrollError(f"{path}: no tensor for {', '.join(missing[:3])}{more}; the checkpoint is incomplete")
