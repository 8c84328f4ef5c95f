"""Convert a BF16 Hugging Face checkpoint into a quantized one (fp8, mxfp8, nvfp4).

Reads the source headers, checks everything that can be checked without weights,
plans every tensor (plan.py), then streams: one source tensor in, its stored tensors
out (writer.py), into a temporary directory that becomes the destination only when
complete (atomic.py). Output shards mirror the input's: same file names, same split,
with each quantized weight's scales beside it, and a rewritten index.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from quantroll.checkpoint.atomic import atomic_directory, check_destination
from quantroll.checkpoint.layout import stored_tensors, to_stored
from quantroll.checkpoint.plan import (KEEP, QUANTIZE, Plan, PlanRules, layer_index, plan,
                                       refuse_skipping_everything, refuse_unmatched_skips)
from quantroll.checkpoint.quant_config import build_quantization_config
from quantroll.checkpoint.quantize import quantize_for_checkpoint, tensor_amax
from quantroll.checkpoint.reader import CONFIG, INDEX_FILE, CheckpointReader
from quantroll.checkpoint.safetensors_header import QUANTIZED_DTYPES, SOURCE_FLOAT_DTYPES
from quantroll.checkpoint.writer import PlannedTensor, StreamingSafetensorsWriter
from quantroll.errors import NonFiniteError, QuantrollError
from quantroll.formats import Format, get_format

HF_QUANT_CONFIG = "hf_quant_config.json"
# Files of other weight formats are not copied: they would hold stale BF16 weights.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".npz")
_QUANTIZED_SUFFIXES = (".weight_scale_inv", ".weight_scale", ".weight_scale_2", ".input_scale", ".qweight", ".scales")


@dataclass(frozen=True)
class ConvertConfig:
    """Everything ``convert`` is asked to do (mirrors the CLI flags).

    Kept tensors are written unchanged, in their source dtype (BF16 for every Qwen3
    release), and config.json's ``dtype`` is left as it was: the engine computes in
    that dtype, with the quantized weights dequantized or fed to FP8 kernels.
    """

    format: str
    scale_rule: str | None = None  # MXFP8 only; None means the format's default ("ceil")
    skip: tuple[str, ...] = ()
    num_layers_at_start_in_bf16: int = 0
    num_layers_at_end_in_bf16: int = 0
    allow_partial_blocks: bool = False
    force: bool = False
    progress: bool = True

    @property
    def rules(self) -> PlanRules:
        return PlanRules(
            tuple(self.skip), self.num_layers_at_start_in_bf16, self.num_layers_at_end_in_bf16, self.allow_partial_blocks
        )


@dataclass(frozen=True)
class ConvertResult:
    save_dir: Path
    plan: Plan
    quantization_config: dict
    bytes_in: int
    bytes_out: int


def num_hidden_layers(config: dict) -> int | None:
    """The decoder layer count from config.json (top level or text_config)."""
    for c in (config, config.get("text_config") or {}):
        if isinstance(c.get("num_hidden_layers"), int):
            return c["num_hidden_layers"]
    return None


def _checked_layer_count(reader: CheckpointReader, shapes: dict) -> int | None:
    """config.json's decoder layer count, checked against the weights: a count the weights
    fall short of (a damaged config.json or a partial copy) made --num-layers-at-end-in-bf16
    keep layers that do not exist, so every real layer was quantized, silently; a count that
    is not an integer was ignored. Weights beyond it (extra predictor layers) are allowed."""
    for c in (reader.config, reader.config.get("text_config") or {}):
        value = c.get("num_hidden_layers") if isinstance(c, dict) else None
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise QuantrollError(f"{reader.path / CONFIG}: 'num_hidden_layers' must be an integer >= 1, got {value!r}")
    count = num_hidden_layers(reader.config)
    indices = [i for i in map(layer_index, shapes) if i is not None]
    if count is not None and indices and max(indices) + 1 < count:
        raise QuantrollError(f"{reader.path / CONFIG} says num_hidden_layers {count} but the weights hold layers "
                             f"0..{max(indices)}; the checkpoint is damaged or incomplete")
    return count


def check_source(reader: CheckpointReader) -> None:
    """Refuse checkpoints that are already quantized or hold dtypes we cannot convert."""
    qc = reader.config.get("quantization_config") or reader.config.get("compression_config")
    if qc:
        method = qc.get("quant_method", "?") if isinstance(qc, dict) else "?"
        raise QuantrollError(
            f"{reader.path} is already quantized (config.json has quantization_config, quant_method {method!r}); "
            "convert needs the BF16 checkpoint"
        )
    if (reader.path / HF_QUANT_CONFIG).exists():
        raise QuantrollError(f"{reader.path} is already quantized (it has {HF_QUANT_CONFIG}); convert needs the BF16 checkpoint")
    for info in reader.tensors.values():
        if info.name.endswith(_QUANTIZED_SUFFIXES) or (info.name.endswith(".weight") and info.dtype in QUANTIZED_DTYPES):
            raise QuantrollError(
                f"{reader.path} is already quantized (tensor '{info.name}' is {info.dtype}); convert needs the BF16 checkpoint"
            )
        if info.name.endswith(".weight") and info.dtype not in SOURCE_FLOAT_DTYPES:
            raise QuantrollError(
                f"tensor '{info.name}' in {info.file.name} has dtype {info.dtype}; convert reads weights in "
                f"{', '.join(SOURCE_FLOAT_DTYPES)}"
            )


def _check_paths(src: Path, dst: Path, what: str) -> None:
    s, d = src.resolve(), dst.resolve()
    if s == d or s in d.parents or d in s.parents:
        raise QuantrollError(f"{what} overlaps the source checkpoint {src}; write the output to a separate directory")


def _output_layout(reader: CheckpointReader, the_plan: Plan, fmt: Format) -> dict[str, list[PlannedTensor]]:
    """Per output shard, the tensors in the order they will be written."""
    layout = {}
    for shard in reader.shards:
        planned: list[PlannedTensor] = []
        for info in reader.shard_tensors(shard):
            d = the_plan.decisions[info.name]
            if d.action == QUANTIZE:
                planned += stored_tensors(fmt, d.module, info.shape)
            else:
                planned.append(PlannedTensor(info.name, info.torch_dtype, info.shape))
        layout[shard] = planned
    return layout


def _check_finite(t: torch.Tensor, name: str) -> None:
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise NonFiniteError(f"tensor '{name}' holds NaN/Inf values; fix the weights before converting")


def shared_amaxes(reader: CheckpointReader, the_plan: Plan) -> dict[str, float]:
    """For NVFP4 scale groups: tensor name -> amax over its group (a pre-pass over them)."""
    shared = {}
    for group in the_plan.scale_groups:
        amaxes = []
        for name in group:
            t = reader.load(name)
            _check_finite(t, name)
            amaxes.append(tensor_amax(t))
        shared.update({name: max(amaxes) for name in group})
    return shared


def convert_checkpoint(src: str | Path, dst: str | Path, cfg: ConvertConfig, what: str | None = None) -> ConvertResult:
    """Write the quantized checkpoint of ``src`` to ``dst``; nothing is left at ``dst`` on error.
    ``what`` names ``dst`` in messages (default: ``--save-dir DST``, convert's flag)."""
    src, dst = Path(src), Path(dst)
    what = what or f"--save-dir {dst}"
    fmt = get_format(cfg.format, cfg.scale_rule)
    rules = cfg.rules
    _check_paths(src, dst, what)
    check_destination(dst.absolute(), cfg.force, what)
    with CheckpointReader(src) as reader:
        check_source(reader)
        shapes = {name: info.shape for name, info in reader.tensors.items()}
        the_plan = plan(shapes, fmt, rules, _checked_layer_count(reader, shapes))
        refuse_unmatched_skips(the_plan, rules.skip)
        refuse_skipping_everything(the_plan)
        layout = _output_layout(reader, the_plan, fmt)
        qc = build_quantization_config(fmt, the_plan, rules)
        with atomic_directory(dst, cfg.force, what) as tmp:
            shared = shared_amaxes(reader, the_plan) if fmt.shared_global_scale else {}
            _write_shards(reader, the_plan, fmt, layout, shared, tmp, cfg.progress)
            _write_metadata(reader, fmt, layout, qc, tmp)
        bytes_in = sum(i.nbytes for i in reader.tensors.values())
    bytes_out = sum(p.nbytes for planned in layout.values() for p in planned)
    return ConvertResult(dst, the_plan, qc, bytes_in, bytes_out)


def _write_shards(reader, the_plan, fmt, layout, shared, out: Path, progress: bool) -> None:
    bar = tqdm(total=len(reader.tensors), desc=f"convert -> {fmt.name}", unit="tensor", disable=None if progress else True)
    with bar:
        for shard, planned in layout.items():
            with StreamingSafetensorsWriter(out / shard, planned) as writer:
                for info in reader.shard_tensors(shard):
                    d = the_plan.decisions[info.name]
                    t = reader.load(info.name)
                    if d.action == QUANTIZE:
                        q = quantize_for_checkpoint(fmt, t, info.name, shared.get(info.name))
                        for name, stored in to_stored(fmt, d.module, q).items():
                            writer.write(name, stored)
                    else:
                        if d.action == KEEP:
                            _check_finite(t, info.name)
                        writer.write(info.name, t)
                    del t
                    bar.update(1)


def _write_metadata(reader: CheckpointReader, fmt: Format, layout: dict[str, list[PlannedTensor]], qc: dict,
                    out: Path) -> None:
    config = dict(reader.config)
    config["quantization_config"] = qc
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    if reader.sharded:
        index = {
            "metadata": {"total_size": sum(p.nbytes for planned in layout.values() for p in planned)},
            "weight_map": dict(sorted((p.name, shard) for shard, planned in layout.items() for p in planned)),
        }
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    sidecars = fmt.sidecar_files(qc)  # NVFP4: ModelOpt's hf_quant_config.json
    for name, content in sidecars.items():
        (out / name).write_text(json.dumps(content, indent=2) + "\n")
    for f in sorted(reader.path.iterdir()):
        if (f.is_file() and f.name not in (CONFIG, INDEX_FILE, HF_QUANT_CONFIG, *sidecars)
                and not f.name.endswith(_WEIGHT_SUFFIXES)):
            shutil.copy2(f, out / f.name)
