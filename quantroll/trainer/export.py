"""Export a trained policy as a Hugging Face BF16 checkpoint directory.

The output is what ``quantroll convert``, the engine, the trainer's ``--ref-load`` and
transformers all read: ``model.safetensors`` (BF16, the model's parameter names, which
are the checkpoint's names), config.json without any quantization_config, and the
source's generation_config.json and tokenizer files. Inference-only tensors are left
out: the fused ``qkv_proj`` / ``gate_up_proj`` weights an engine builds (their parts are
exported under their own names) and the rotary tables. A tied ``lm_head.weight`` is not
written (transformers re-ties it from ``model.embed_tokens.weight``). The directory
appears complete or not at all (checkpoint.atomic).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from quantroll.checkpoint.atomic import atomic_directory
from quantroll.errors import QuantrollError
from quantroll.inputs import read_json

WEIGHTS_FILE = "model.safetensors"
# Suffixes of tensors that exist only inside a running model, never in a checkpoint.
_INFERENCE_ONLY = ("qkv_proj.weight", "gate_up_proj.weight", "qkv_proj.bias", "gate_up_proj.bias")
# Non-weight files copied from the source besides config.json (rewritten).
_COPIED = ("generation_config.json", "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json",
           "chat_template.jinja", "chat_template.json")


def export_state_dict(model: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of ``model`` by name, as contiguous CPU ``dtype`` copies."""
    quantized = [n for n, m in model.named_modules() if getattr(m, "quantized", False)]
    if quantized:
        raise QuantrollError(f"cannot export a model with quantized layers ({quantized[0]}, ...) as a BF16 "
                             "checkpoint; export the trainer's BF16 policy instead")
    tie = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    out: dict[str, torch.Tensor] = {}
    tensors = list(model.named_parameters(remove_duplicate=False))
    tensors += [(n, b) for n, b in model.named_buffers() if "rotary" not in n]
    for name, tensor in tensors:
        if name.endswith(_INFERENCE_ONLY) or (tie and name == "lm_head.weight") or name in out:
            continue
        if not tensor.is_floating_point():
            raise QuantrollError(f"cannot export tensor '{name}' of dtype {tensor.dtype} as {dtype}")
        out[name] = tensor.detach().to("cpu", dtype).contiguous().clone()
    return out


def export_config(src_config: dict, model: torch.nn.Module, dtype: torch.dtype) -> dict:
    """The source config.json for a BF16 checkpoint of ``model``: no quantization_config,
    the exported dtype recorded; refuses a source whose shape disagrees with the model."""
    cfg = dict(src_config)
    cfg.pop("quantization_config", None)
    mc = getattr(model, "config", None)
    if mc is not None:
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "tie_word_embeddings"):
            if key in cfg and getattr(mc, key, cfg[key]) != cfg[key]:
                raise QuantrollError(f"config.json of the source has {key}={cfg[key]!r} but the model has "
                                     f"{getattr(mc, key)!r}; pass the directory the model was loaded from")
    name = str(dtype).replace("torch.", "")
    if "dtype" in cfg:
        cfg["dtype"] = name
    cfg["torch_dtype"] = name
    return cfg


def save_hf_checkpoint(model: torch.nn.Module, src_dir: str | Path, out_dir: str | Path, *, force: bool = False,
                       dtype: torch.dtype = torch.bfloat16, extra_files: dict[str, str] | None = None,
                       what: str | None = None) -> Path:
    """Write ``model`` as an HF checkpoint at ``out_dir``, taking config.json,
    generation_config.json and the tokenizer files from ``src_dir``. An existing
    ``out_dir`` is replaced (atomically) only with ``force`` and only when quantroll wrote
    all of it (quantroll/outputs.py); ``what`` names it in messages ("--save-hf DIR").
    ``extra_files`` (file name -> text) are written beside them. Returns ``out_dir``."""
    src = Path(src_dir)
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise QuantrollError(f"{src}: config.json not found; the export takes config and tokenizer from there")
    config = export_config(read_json(cfg_path, "config", fix="fix or re-download it"), model, dtype)
    state = export_state_dict(model, dtype)
    with atomic_directory(out_dir, force=force, what=what) as tmp:
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for f in sorted(src.iterdir()):
            if f.is_file() and (f.name in _COPIED or f.name.startswith("tokenizer")):
                shutil.copy2(f, tmp / f.name)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
    return Path(out_dir)
