"""Hugging Face safetensors checkpoints: read, plan, quantize, write atomically, read back.

    reader.py          CheckpointReader: a validated HF directory, tensors one at a time
    safetensors_header.py  shapes and dtypes from file headers, without loading
    writer.py          StreamingSafetensorsWriter: header first, then tensor bytes
    atomic.py          atomic_directory: output appears complete or not at all
    plan.py            plan(): kept-vs-quantized per tensor (shared with the weight sync)
    bf16_rule.py       kept_by_name(): the modules that stay BF16 by name (the model builder asks it too)
    quantize.py        quantize_for_checkpoint(): NVFP4 siblings share a global scale
    layout.py          stored tensor names/dtypes/shapes per format
    quant_config.py    quantization_config in config.json, written and read back
    convert.py         convert_checkpoint(): the whole conversion
    loader.py          QuantizedCheckpoint: format + QuantizedTensors by module name
    stats.py           inspect_checkpoint(): counts, bytes, SQNR against a BF16 source
"""

from quantroll.checkpoint.atomic import atomic_directory
from quantroll.checkpoint.convert import ConvertConfig, ConvertResult, convert_checkpoint
from quantroll.checkpoint.loader import QuantizedCheckpoint, load_quantized_checkpoint
from quantroll.checkpoint.plan import Decision, Plan, PlanRules, plan
from quantroll.checkpoint.quant_config import QuantSpec, build_quantization_config, read_quantization_config
from quantroll.checkpoint.quantize import quantize_for_checkpoint
from quantroll.checkpoint.reader import CheckpointReader
from quantroll.checkpoint.writer import PlannedTensor, StreamingSafetensorsWriter

__all__ = [
    "CheckpointReader",
    "ConvertConfig",
    "ConvertResult",
    "Decision",
    "Plan",
    "PlanRules",
    "PlannedTensor",
    "QuantSpec",
    "QuantizedCheckpoint",
    "StreamingSafetensorsWriter",
    "atomic_directory",
    "build_quantization_config",
    "convert_checkpoint",
    "load_quantized_checkpoint",
    "plan",
    "quantize_for_checkpoint",
    "read_quantization_config",
]
