import torch
from quantroll.formats import get_format
from quantroll.kernels import fp8_wgmma
from quantroll.kernels.fp8_linear import quantize_activation_fp8
FP8 = get_format("fp8")
n, k = 24576, 4096
wq = FP8.quantize_weight((torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16))
aq, a_s = quantize_activation_fp8(torch.randn(64, k, device="cuda").to(torch.bfloat16))
for _ in range(3):
    fp8_wgmma.fp8_wgmma(aq, a_s, wq.data, wq.scale, fp8_wgmma.WgmmaConfig(1, 3, 3, 1))
torch.cuda.synchronize()
