"""A new format needs one module and one registration: the toy block INT8 (toy_int8.py),
registered here, converts a tiny checkpoint, loads and generates in the CPU engine,
syncs weights (push + the first-update check) and gets its report labels, with no
other file edited."""

import json

import pytest
import torch

from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.checkpoint.loader import QuantizedCheckpoint
from quantroll.checkpoint.reader import CheckpointReader
from quantroll.checkpoint.stats import inspect_checkpoint
from quantroll.compare.labels import display, mode_label
from quantroll.engine import Engine, SamplingParams
from quantroll.errors import QuantrollError
from quantroll.formats import display_name, format_names, get_format, recipe_args, registered
from quantroll.sync import WeightSync, check_weight_update
from tests.formats.toy_int8 import BlockInt8

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def toy():
    with registered(BlockInt8):
        yield get_format("int8_b32")


@pytest.fixture(scope="module")
def toy_dir(toy, tiny_checkpoint, tmp_path_factory):
    dst = tmp_path_factory.mktemp("toy") / "int8"
    convert_checkpoint(tiny_checkpoint(), dst, ConvertConfig(format="int8_b32", progress=False))
    return dst


def test_registration_is_scoped_and_the_format_round_trips(toy):
    assert "int8_b32" in format_names() and display_name("int8_b32") == "block INT8"
    w = torch.randn(64, 96)
    q = toy.quantize_weight(w)
    assert q.data.dtype == torch.int8 and tuple(q.scale.shape) == (64, 3)
    assert (toy.dequantize(q) - w).abs().le(toy.ulp(q) / 2 + 1e-7).all()
    with pytest.raises(QuantrollError, match="no train recipe"):
        recipe_args("int8_b32")


def test_registration_ends_with_its_block_and_refuses_duplicates(toy):
    class Other(BlockInt8):
        name, quant_method = "int8_other", "quantroll_int8_other"

    with registered(Other):
        assert get_format("int8_other").name == "int8_other"
        with pytest.raises(QuantrollError, match="already registered"):
            with registered(Other):
                pass
    assert "int8_other" not in format_names()
    with pytest.raises(QuantrollError, match="unknown format 'int8_other'"):
        get_format("int8_other")


def test_convert_writes_the_declared_layout_and_config(toy, toy_dir):
    qc = json.loads((toy_dir / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "quantroll_int8" and qc["quantroll"]["format"] == "int8_b32"
    with QuantizedCheckpoint(toy_dir) as ckpt:
        assert ckpt.format.name == "int8_b32" and ckpt.quantized
        module = ckpt.quantized[0]
        info = ckpt.reader.tensors
        assert info[f"{module}.weight"].dtype == "I8" and info[f"{module}.weight_scale"].dtype == "F32"
        q = ckpt.quantized_tensor(module)
        assert q.format == "int8_b32" and q.block == (1, 32)
    report = inspect_checkpoint(toy_dir)
    assert report.format == "int8_b32"


def test_engine_loads_generates_and_syncs(toy, toy_dir, tiny_checkpoint):
    engine = Engine(toy_dir)
    assert engine.format.name == "int8_b32" and engine.quantized_layers()
    out = engine.generate([[5, 9, 17], [42]], SamplingParams(temperature=0.0, max_new_tokens=4, seed=1))
    assert all(len(r.tokens) == 4 and all(torch.isfinite(torch.tensor(r.logprobs))) for r in out)
    assert engine.precision == "int8_b32 (emulated)"
    with CheckpointReader(tiny_checkpoint()) as reader:
        weights = dict(reader.iter_tensors())
    sync = WeightSync(engine)
    errors = check_weight_update(engine, lambda: sync.push(weights), allow_quant_error=False)
    assert errors and all(v == 0.0 for v in errors.values())
    assert set(errors) >= {f"{m}.weight" for m in sync.quantizer.quantized}


def test_report_labels_name_the_format(toy):
    assert mode_label("int8_b32", unified=False) == "mode 1: int8_b32 rollout, BF16 train"
    assert mode_label("int8_b32", unified=True) == "unified block INT8"
    assert display(mode_label("int8_b32", False), emulated=True).endswith("(emulated)")
