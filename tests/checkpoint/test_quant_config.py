"""quantization_config read back into a format; refusals; SQNR edge cases."""

import math

import pytest
import torch

from quantroll.checkpoint import read_quantization_config
from quantroll.checkpoint.stats import sqnr_db
from quantroll.errors import QuantrollError


def test_foreign_checkpoints_read_with_defaults():
    # Qwen3-8B-FP8 style (no quantroll provenance)
    spec = read_quantization_config({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"})
    assert spec.format.name == "fp8" and spec.producer == "unknown" and spec.rules.skip == ()
    # an MXFP8 checkpoint that does not record its rule: Miles/TE/SGLang round up
    assert read_quantization_config({"quant_method": "mxfp8"}).format.scale_rule == "ceil"
    assert read_quantization_config({"quant_method": "mxfp8", "scale_rule": "ocp"}).format.scale_rule == "ocp"
    assert read_quantization_config({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}).format.name == "nvfp4"


@pytest.mark.parametrize(
    "qc",
    [
        {"quant_method": "fp8", "weight_block_size": [1, 128]},
        {"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": "e5m2"},
        {"quant_method": "modelopt", "quant_algo": "FP8"},
        {"quant_method": "awq"},
        {},
    ],
)
def test_unsupported_configs_refused(qc):
    with pytest.raises(QuantrollError) as e:
        read_quantization_config(qc, "x/config.json")
    assert "x/config.json" in str(e.value) and "\n" not in str(e.value)


def test_sqnr_edge_cases():
    x = torch.tensor([3.0, 4.0])
    assert sqnr_db(x, x) == math.inf
    assert math.isnan(sqnr_db(torch.zeros(2), torch.zeros(2)))
    assert sqnr_db(x, torch.tensor([3.0, 3.0])) == pytest.approx(10 * math.log10(25.0))
