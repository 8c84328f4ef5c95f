"""One persistent launch for a block-FP8 MLP at decode (mlp_decode_triton.py).

Experimental: ``FUSE_MLP_DECODE`` is off until a device run shows the same outputs as
the three-launch path and a shorter decode step (tests/engine/test_mlp_decode.py,
``bash bench/engine_gpu.sh`` with MLP_DECODE_AB=1). Written 2026-12-01 without device time:
only Triton's interpreter (the phases as three launches) and the sm_90 compile test have
run it.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from quantroll.errors import QuantrollError
from quantroll.kernels.counters import counters, device_key, existing
from quantroll.kernels.fp8_linear import (Fp8Activation, _tile_counters, decode_config, decode_grid,
                                          fp8_activation_buffers)

# Off: measured on the H200 (2026-12-01), same bits as the three launches, but its grid
# barriers cost more than the launches they replace (one 8B MLP: 75.7 us at best against
# 46.7 us at M = 1; 81.3 against 52.9 at M = 16; docs/PERFORMANCE.md).
FUSE_MLP_DECODE = False
MAX_ROWS = 16  # one 16-row token tile (decode batches up to 16)
BLOCK_G = 16  # intermediate columns per phase-1 item (gate and up rows each)
QBLOCK = 1024  # columns per phase-2 (quantization) item
# Programs per SM. The grid barrier needs every program resident at once: a 2-warp program
# holds at most 2 x 32 x 255 registers (4 fit in an SM's 65,536); compiled for sm_90 by
# Triton 3.8 it takes 115 registers and 12 KB of shared memory, so three per SM are
# resident whatever the compiler picks. mlp_decode checks the compiled kernel's shared
# memory against the SM's before the first launch (resident_programs_per_sm).
CTAS_PER_SM = 3
BARRIER = "mlp grid barrier"  # counters.py kind
_RESIDENT: dict[tuple, int] = {}


def applies(x, gate_up, down) -> bool:
    """The switch is on and this MLP call can take the one-launch path: an Fp8Activation
    of <= 16 rows on the GPU, block-FP8 gate_up and down on the fp8 backend without
    biases, dims in whole 128-groups, and a gate_up shape the three-launch path computes
    unsplit (Qwen3-8B's is; 0.6B's and 1.7B's split K, and the one launch would differ
    from them in last bits)."""
    if not FUSE_MLP_DECODE or not isinstance(x, Fp8Activation) or x.codes.shape[0] > MAX_ROWS:
        return False
    if gate_up.bias is not None or down.bias is not None:
        return False
    if not (all(layer.format is not None and layer.format.name == "fp8" and layer.backend == "fp8"
                for layer in (gate_up, down)) and down.in_features % QBLOCK == 0 and down.out_features % 128 == 0):
        return False
    # phase 1 sums all of K in one pass on the 2-warp mma.sync tiles: the three launches'
    # bits only where their gate_up GEMM does the same (no K split, no warpgroup MMA)
    cfg = decode_config(gate_up.out_features, gate_up.in_features, x.codes.shape[0])
    return cfg.split_k == 1 and not cfg.dot_f16 and cfg.num_warps == 2


def _barrier(device: torch.device) -> torch.Tensor:
    """[arrivals, programs done, timeout flag] (counters.py); the first two are zero between
    calls (the kernel resets them), the flag is set by a barrier that gave up waiting."""
    return counters(BARRIER, device, 3)


def raise_on_barrier_timeout(device) -> None:
    """Raise if a one-launch MLP on ``device`` gave up at a grid barrier since the last
    check (its outputs are wrong): a host sync, so callers check once per generate."""
    bar = existing(BARRIER, device)
    if bar is not None and int(bar[2]):
        bar.zero_()
        raise QuantrollError(
            "the one-launch decode MLP timed out at a grid barrier: not all of its programs were resident at once "
            "(another kernel running concurrently, or too many programs per SM); its outputs are wrong. Set "
            "quantroll.kernels.mlp_decode.FUSE_MLP_DECODE = False")


def resident_programs_per_sm(shared_bytes: int, num_warps: int, regs_per_thread: int = 255,
                             sm_shared_bytes: int = 233_472, sm_regs: int = 65_536, sm_threads: int = 2048,
                             sm_blocks: int = 32) -> int:
    """How many programs of a kernel fit on one SM at once (the CUDA occupancy rules for
    sm_80/sm_90): registers are allocated per warp in 256-register units from four
    16,384-register quarters, shared memory per block plus 1 KB the driver reserves.
    The default register count is the most a thread can hold, so the answer holds
    whatever the compiler chose."""
    per_warp = -(-regs_per_thread * 32 // 256) * 256
    warps = 4 * ((sm_regs // 4) // per_warp)
    by_regs = warps // num_warps
    by_shared = sm_shared_bytes // (shared_bytes + 1024)
    return min(by_regs, by_shared, sm_threads // (32 * num_warps), sm_blocks)


def mlp_decode(x: Fp8Activation, wgu: torch.Tensor, wgu_s: torch.Tensor, wd: torch.Tensor, wd_s: torch.Tensor,
               out_dtype=torch.bfloat16, phased: bool | None = None, split: int | None = None,
               ctas_per_sm: int = CTAS_PER_SM, programs: int | None = None, max_spins: int = 1 << 20) -> torch.Tensor:
    """down(quantize(silu(gate) * up)) of the FP8 activation x [M, H], with gate_up [2I, H]
    (gate rows first) and down [H, I] block-FP8 weights -> [M, H]. ``phased`` runs the
    three phases as three launches (default: under Triton's interpreter only). ``split``
    (K splits of the down GEMM; default: the three-launch path's, whose bits it then
    gives) and ``ctas_per_sm`` are for bench/mlp_decode.py's sweep; ``programs`` (the grid)
    and ``max_spins`` (polls before a barrier gives up) for tests, which run the one-launch
    form under the interpreter with one program (the barriers pass at once) or several
    (the first program's barrier times out: the interpreter runs programs in turn)."""
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
    down_cfg = decode_config(hdim, inter, m)  # default: the three-launch down GEMM's split
    down_cfg = dataclasses.replace(down_cfg, split_k=split or down_cfg.split_k)
    _, kb_down, (_, _, split) = decode_grid(m, hdim, inter, down_cfg)
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
        if programs is None:
            props = torch.cuda.get_device_properties(dev)
            programs = props.multi_processor_count * _resident(mlp_decode_kernel, args, consts, ctas_per_sm, dev)
        mlp_decode_kernel[(programs,)](*args, PHASE=0, MAX_SPINS=max_spins, **consts)
    return y


def _resident(kernel, args, consts, wanted: int, device) -> int:
    """``wanted`` programs per SM, or fewer if the compiled kernel's shared memory does not
    let that many be resident (checked once per device and configuration); an error if
    not even one fits."""
    key = (device_key(device), tuple(sorted(consts.items())), wanted)
    if key not in _RESIDENT:
        compiled = kernel.warmup(*args, grid=(1,), PHASE=0, **consts)
        props = torch.cuda.get_device_properties(device)
        sm_shared = getattr(props, "shared_memory_per_multiprocessor", 233_472)
        fits = resident_programs_per_sm(compiled.metadata.shared, consts["num_warps"], sm_shared_bytes=sm_shared)
        if fits < 1:
            raise QuantrollError(f"mlp_decode: one program needs {compiled.metadata.shared} bytes of shared memory, "
                                 f"more than an SM's {sm_shared}; set FUSE_MLP_DECODE = False")
        _RESIDENT[key] = min(wanted, fits)
    return _RESIDENT[key]
