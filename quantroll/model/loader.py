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
from quantroll.errors import QuantrollError
from quantroll.formats import Format
from quantroll.model.config import config_from_dict
from quantroll.model.qwen3 import Qwen3ForCausalLM


def _open(path: Path) -> tuple[CheckpointReader, QuantizedCheckpoint | None]:
    reader = CheckpointReader(path)
    if isinstance(reader.config.get("quantization_config"), dict):
        reader.close()
        ckpt = QuantizedCheckpoint(path)
        return ckpt.reader, ckpt
    return reader, None


def load_model(checkpoint_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16,
               ) -> tuple[Qwen3ForCausalLM, Format | None]:
    """(model in eval mode, the checkpoint's format or None for BF16)."""
    path = Path(checkpoint_dir)
    reader, ckpt = _open(path)
    try:
        cfg = config_from_dict(reader.config, str(path / "config.json"))
        quantized = set(ckpt.quantized) if ckpt else set()
        fmt = ckpt.format if ckpt else None
        model = Qwen3ForCausalLM(cfg, lambda name: fmt if name in quantized else None, dtype=dtype, device=device)
        _fill(model, reader, ckpt, quantized, path)
    finally:
        reader.close()
    return model.eval(), fmt


def _fill(model: Qwen3ForCausalLM, reader: CheckpointReader, ckpt: QuantizedCheckpoint | None,
          quantized: set[str], path: Path) -> None:
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
        layer.load_quantized_(q.to(layer.weight.device))
        filled.update(n for n in targets if n.startswith(module + ".weight"))
    owned = set(ckpt.plain_tensors()) if ckpt else set(reader.tensors)
    for name in owned:
        target = targets.get(name)
        if target is None:
            raise QuantrollError(f"{path}: tensor '{name}' matches nothing in a {model.config.model_type} model "
                                 "with this config.json; is it the right checkpoint?")
        tensor = reader.load(name)
        if tuple(tensor.shape) != tuple(target.shape):
            raise QuantrollError(f"{path}: tensor '{name}' has shape {tuple(tensor.shape)}, the config implies "
                                 f"{tuple(target.shape)}")
        if not tensor.is_floating_point() or tensor.dtype == torch.float8_e4m3fn:
            raise QuantrollError(f"{path}: tensor '{name}' is stored as {tensor.dtype} without a scale; "
                                 "a plain tensor must be float")
        with torch.no_grad():
            target.copy_(tensor.to(target.dtype))
        filled.add(name)
    if model.config.tie_word_embeddings:
        filled.add("lm_head.weight")
    missing = sorted(set(targets) - filled)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise QuantrollError(f"{path}: no tensor for {', '.join(missing[:3])}{more}; the checkpoint is incomplete")
