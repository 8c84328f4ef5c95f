"""The pure reference formats give the same bits on CUDA as on CPU (device test)."""

import pytest
import torch

from quantroll.formats import get_format

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


@pytest.mark.parametrize("name,rule", [("fp8", None), ("mxfp8", "ceil"), ("mxfp8", "ocp"), ("nvfp4", None)])
def test_reference_on_cuda_equals_cpu(name, rule):
    fmt = get_format(name, rule)
    g = torch.Generator().manual_seed(0)
    for shape, mag in [((300, 520), 1.0), ((128, 4096), 1e-3), ((77, 33), 1e3)]:
        w = (torch.randn(*shape, generator=g) * mag).to(torch.bfloat16)
        cpu, gpu = fmt.quantize_weight(w), fmt.quantize_weight(w.cuda())
        assert torch.equal(cpu.data.view(torch.uint8), gpu.data.cpu().view(torch.uint8))
        assert torch.equal(cpu.scale.view(torch.uint8), gpu.scale.cpu().view(torch.uint8))
        if cpu.global_scale is not None:
            assert torch.equal(cpu.global_scale, gpu.global_scale.cpu())
        a_cpu, a_gpu = fmt.quantize_activation(w.float()), fmt.quantize_activation(w.float().cuda())
        assert torch.equal(a_cpu.data.view(torch.uint8), a_gpu.data.cpu().view(torch.uint8))
        assert torch.equal(fmt.dequantize(cpu), fmt.dequantize(gpu).cpu())
