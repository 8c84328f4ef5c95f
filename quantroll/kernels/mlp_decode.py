"""One persistent launch for a block-FP8 MLP at decode (mlp_decode_triton.py).

Experimental: ``FUSE_MLP_DECODE`` is off until a device run shows the same outputs as
the three-launch path and a shorter decode step (tests/engine/test_mlp_decode.py,
``bash bench/engine_gpu.sh`` with MLP_DECODE_AB=1). Written 2026-12-01 without device time:
only Triton's interpreter (the phases as three launches) and the sm_90 compile test have
run it.
"""

from __future__ import annotations

import os

import torch

from quantroll.kernels.fp8_linear import Fp8Activation, _tile_counters, decode_config, fp8_activation_buffers

FUSE_MLP_DECODE = False
MAX_ROWS = 16  # one 16-row token tile (decode batches up to 16)
BLOCK_G = 16  # intermediate columns per phase-1 item (gate and up rows each)
QBLOCK = 1024  # columns per phase-2 (quantization) item
# Programs per SM. The grid barrier needs every program resident at once: a 2-warp program
# holds at most 2 x 32 x 255 registers (4 fit in an SM's 65,536); compiled for sm_90 by
# Triton 3.8 it takes 115 registers and 12 KB of shared memory, so three per SM are
# resident whatever the compiler picks.
CTAS_PER_SM = 3
_BARRIERS: dict[torch.device, torch.Tensor] = {}


def applies(x, gate_up, down) -> bool:
    """The switch is on and this MLP call can take the one-launch path: an Fp8Activation
    of <= 16 rows on the GPU, block-FP8 gate_up and down on the fp8 backend, dims in whole
    128-groups."""
    if not FUSE_MLP_DECODE or not isinstance(x, Fp8Activation) or x.codes.shape[0] > MAX_ROWS:
        return False
    return all(layer.format is not None and layer.format.name == "fp8" and layer.backend == "fp8"
               for layer in (gate_up, down)) and down.in_features % QBLOCK == 0 and down.out_features % 128 == 0


def _barrier(device: torch.device) -> torch.Tensor:
    """[arrivals, programs done] per device; zero between calls (the kernel resets them)."""
    if device not in _BARRIERS:
        _BARRIERS[device] = torch.zeros(2, dtype=torch.int32, device=device)
    return _BARRIERS[device]


def mlp_decode(x: Fp8Activation, wgu: torch.Tensor, wgu_s: torch.Tensor, wd: torch.Tensor, wd_s: torch.Tensor,
               out_dtype=torch.bfloat16, phased: bool | None = None, split: int | None = None,
               ctas_per_sm: int = CTAS_PER_SM) -> torch.Tensor:
    """down(quantize(silu(gate) * up)) of the FP8 activation x [M, H], with gate_up [2I, H]
    (gate rows first) and down [H, I] block-FP8 weights -> [M, H]. ``phased`` runs the
    three phases as three launches (default: under Triton's interpreter only). ``split``
    (K splits of the down GEMM; default: the three-launch path's, whose bits it then
    gives) and ``ctas_per_sm`` are for bench/mlp_decode.py's sweep."""
    from quantroll.kernels.mlp_decode_triton import mlp_decode_kernel

    m, hdim = x.codes.shape
    inter = wgu.shape[0] // 2
    if m > MAX_ROWS or wgu.shape != (2 * inter, hdim) or wd.shape != (hdim, inter) or inter % QBLOCK or hdim % 128:
        raise ValueError(f"mlp_decode: M={m} (max {MAX_ROWS}), gate_up {tuple(wgu.shape)}, down {tuple(wd.shape)}: "
                         f"needs I a multiple of {QBLOCK} and H of 128")
    dev = x.codes.device
    if phased is None:
        phased = os.environ.get("TRITON_INTERPRET") == "1"
    h = torch.empty(m, inter, dtype=out_dtype, device=dev)
    hq, hs = fp8_activation_buffers(m, inter, dev)
    split = split or decode_config(hdim, inter, m).split_k  # default: the three-launch down GEMM's
    kb_down = (inter // 128 + split - 1) // split
    split = (inter // 128 + kb_down - 1) // kb_down
    y = torch.empty(m, hdim, dtype=out_dtype, device=dev)
    tiles = (hdim + 31) // 32
    partials = torch.empty(tiles * split * 32 * MAX_ROWS, dtype=torch.float32, device=dev)
    args = (x.codes, x.scales, wgu, wgu_s, wd, wd_s, h, hq, hs, partials, y, _tile_counters(dev), _barrier(dev),
            m, hdim, inter, x.codes.stride(0), x.scales.stride(0), x.scales.stride(1), wgu.stride(0),
            wgu_s.stride(0), wgu_s.stride(1), wd.stride(0), wd_s.stride(0), wd_s.stride(1), h.stride(0),
            hq.stride(0), hs.stride(0), hs.stride(1), y.stride(0))
    consts = dict(BLOCK_M=MAX_ROWS, BLOCK_G=BLOCK_G, BLOCK_N=32, BLOCK_K=128, KB_UP=hdim // 128, SPLIT=split,
                  KB_DOWN=kb_down, QBLOCK=QBLOCK, num_warps=2, num_stages=3)
    if phased:
        for phase in (1, 2, 3):
            mlp_decode_kernel[(min(64, inter // BLOCK_G),)](*args, PHASE=phase, **consts)
    else:
        programs = torch.cuda.get_device_properties(dev).multi_processor_count * ctas_per_sm
        mlp_decode_kernel[(programs,)](*args, PHASE=0, **consts)
    return y
