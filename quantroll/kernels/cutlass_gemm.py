"""CUTLASS 3.x warp-specialized blockwise-scaled FP8 GEMMs on Hopper (sm_90a), the kernels
vLLM and SGLang run for 1x128 activation / 128x128 weight scales: TMA loads, wgmma, FP32
promotion of the accumulator at every 128-wide K block where the scales are applied.

``cutlass_fp8_gemm(aq, a_s, wq, w_s, out_dtype, config)`` takes the engine's operands as
they are (fp8_activation.py's outer-dim-major activation scales, the checkpoint's row-major
weight_scale_inv) and launches on torch's current stream, so CUDA graph capture records it.
The configurations (``CONFIGS``) are tiles for decode and prefill; which one a product
takes is for the GEMM plan to decide from measurements (bench/gemm_cutlass.py).

The library is built at first use (cutlass_build.py). Nothing here falls back silently:
``available(device)`` / ``unavailable_reason(device)`` say whether it runs (an sm_90 GPU,
nvcc and CUTLASS's headers, or a prebuilt library), and a failed launch raises
``CutlassGemmError`` with CUTLASS's status.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass

import torch

from quantroll.kernels import cutlass_build
from quantroll.kernels.cuda_jit import CompileError, early_launch_accepted

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CutlassGemmConfig:
    """One compiled kernel (the ``Config<id>`` of cutlass_fp8_gemm.cu). ``swap``: it computes
    y^T = W A^T, weight rows on the 128-row MMA side and tokens on the narrow side;
    ``token_tile`` x ``weight_tile`` rows per output tile; ``stream_k``: K may be split
    (``splits`` at the call: 0 CUTLASS's heuristic, 1 none, s > 1 split-K into s);
    ``tma_scales``: its activation-scale tile is loaded by TMA, which needs the scales'
    leading dimension to be a multiple of 4 (others get a padded copy, see ``_scales``)."""

    id: int
    name: str
    swap: bool
    token_tile: int
    weight_tile: int
    stream_k: bool

    @property
    def tma_scales(self) -> bool:
        return self.token_tile >= 32


# ptxas (nvcc 13.0.88, sm_90a, CUTLASS 4.2.0; bench/build_cutlass_gemm.py): every kernel, bf16 and
# float32 output, 168 registers (the cap of a 384-thread warp-specialized block; consumers raise
# theirs with setmaxnreg), 0 bytes spilled, 0 stack, no warning (no C7510). Pipeline stages
# (bf16 / float32 output): 128x16 12/11, 128x32 10/10, 128x64 8/7, swap 128x128 6/5,
# 64x128 ping-pong 8/8, 128x128 c1x2 6/5. Build on the 2-core CPU machine: 35-36 min with 2 jobs
# (about 5 min per object on the shared cores; 77 s of CPU time each), the 13 run in parallel.
CONFIGS = (
    CutlassGemmConfig(0, "swap-128x16-sk", True, 16, 128, True),
    CutlassGemmConfig(1, "swap-128x32-sk", True, 32, 128, True),
    CutlassGemmConfig(2, "swap-128x64-sk", True, 64, 128, True),
    CutlassGemmConfig(3, "swap-128x128-sk", True, 128, 128, True),
    CutlassGemmConfig(4, "64x128-pingpong", False, 64, 128, False),
    CutlassGemmConfig(5, "128x128-c1x2-sk", False, 128, 128, True),
)
BY_NAME = {c.name: c for c in CONFIGS}
OUT_DTYPES = {torch.bfloat16: 0, torch.float32: 1}  # QR_OUT of the kernels (cutlass_build.OUT_TYPES)


class CutlassGemmError(RuntimeError):
    """A CUTLASS GEMM refused or failed a launch: the config, the shape and CUTLASS's status."""


def config(which: int | str | CutlassGemmConfig) -> CutlassGemmConfig:
    if isinstance(which, CutlassGemmConfig):
        return which
    if isinstance(which, str):
        if which not in BY_NAME:
            raise ValueError(f"unknown CUTLASS GEMM config {which!r}; known: {', '.join(BY_NAME)}")
        return BY_NAME[which]
    if not 0 <= which < len(CONFIGS):
        raise ValueError(f"CUTLASS GEMM config id {which} out of range 0-{len(CONFIGS) - 1}")
    return CONFIGS[which]


_library: cutlass_build.Library | None = None
_library_error: str | None = None
_lock = threading.Lock()


def library() -> cutlass_build.Library:
    """The loaded library (built at the first call; the failure, if any, is kept and raised again)."""
    global _library, _library_error
    with _lock:
        if _library is None and _library_error is None:
            try:
                _library = cutlass_build.load_library()
                if _library.lib.qr_cutlass_num_configs() != len(CONFIGS):
                    raise cutlass_build.CutlassUnavailable(f"{_library.path} holds "
                                                           f"{_library.lib.qr_cutlass_num_configs()} configs, "
                                                           f"this module lists {len(CONFIGS)}")
            except (cutlass_build.CutlassUnavailable, CompileError, OSError) as err:
                _library = None
                if "\n" in str(err):  # a compiler's output: logged whole, reported as one line
                    log.warning("CUTLASS GEMM library: %s", err)
                _library_error = " ".join(f"{type(err).__name__}: {err}".split())[:400]
        if _library is None:
            raise cutlass_build.CutlassUnavailable(_library_error)
        return _library


def unavailable_reason(device: torch.device | str | None = None) -> str | None:
    """None when the CUTLASS GEMMs run on ``device`` (building them now if needed), else
    why not, in one line."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    device = torch.device(device if device is not None else "cuda")
    if device.type != "cuda":
        return f"{device} is not a CUDA device"
    capability = torch.cuda.get_device_capability(device)
    if capability != (9, 0):
        return f"the kernels are compiled for sm_90a (Hopper); this GPU is sm_{capability[0]}{capability[1]}"
    try:
        library()
    except cutlass_build.CutlassUnavailable as err:
        return str(err)
    return None


_answers: dict[str, bool] = {}


def available(device: torch.device | str | None = None) -> bool:
    """Whether unavailable_reason(device) is None: decided once per device and logged then
    (the GEMM table asks at every product it routes; the answer cannot change in a process,
    the library being loaded or refused once)."""
    key = str(device)
    if key not in _answers:
        reason = unavailable_reason(device)
        _answers[key] = reason is None
        if reason is None:
            log.info("CUTLASS blockwise FP8 GEMMs: %s on %s", library().path.name, device)
        else:
            log.warning("CUTLASS blockwise FP8 GEMMs unavailable on %s: %s", device, reason)
    return _answers[key]


def _check_operands(aq, a_s, wq, w_s) -> tuple[int, int, int]:
    if aq.dtype != torch.float8_e4m3fn or wq.dtype != torch.float8_e4m3fn:
        raise ValueError(f"CUTLASS FP8 GEMM: codes must be float8_e4m3fn, got {aq.dtype} and {wq.dtype}")
    if a_s.dtype != torch.float32 or w_s.dtype != torch.float32:
        raise ValueError(f"CUTLASS FP8 GEMM: scales must be float32, got {a_s.dtype} and {w_s.dtype}")
    m, k = aq.shape
    n = wq.shape[0]
    kb = (k + 127) // 128
    if wq.shape[1] != k or tuple(a_s.shape) != (m, kb) or tuple(w_s.shape) != ((n + 127) // 128, kb):
        raise ValueError(f"CUTLASS FP8 GEMM: shapes aq {tuple(aq.shape)}, a_s {tuple(a_s.shape)}, "
                         f"wq {tuple(wq.shape)}, w_s {tuple(w_s.shape)} do not fit 1x128 activation and 128x128 "
                         "weight scales")
    if aq.stride(1) != 1 or wq.stride(1) != 1 or w_s.stride(1) != 1 or (m > 1 and a_s.stride(0) != 1):
        raise ValueError("CUTLASS FP8 GEMM: codes and weight scales must be row-major, activation scales "
                         "outer-dim-major (stride (1, M), fp8_activation_buffers)")
    if len({t.device for t in (aq, a_s, wq, w_s)}) != 1 or aq.device.type != "cuda":
        raise ValueError("CUTLASS FP8 GEMM: all operands must be on one CUDA device")
    if aq.data_ptr() % 16 or wq.data_ptr() % 16:
        raise ValueError("CUTLASS FP8 GEMM: TMA needs the codes 16-byte aligned")
    return m, n, k


def _scales(a_s: torch.Tensor, cfg: CutlassGemmConfig) -> tuple[torch.Tensor, int, int]:
    """(scales, leading dimension, rows the kernel's scale layout covers). A TMA-loaded
    scale tile needs both a multiple of 4 and 16-byte aligned scales; otherwise (M not a
    multiple of 4: decode's odd batches) the scales are copied into a [K/128, round4(M)]
    buffer: one small copy (4 * round4(M) * K/128 bytes), the only copy this path makes."""
    m = a_s.shape[0]
    ld = a_s.stride(1) if m > 1 else max(a_s.stride(1), 1)
    if not cfg.tma_scales or (m % 4 == 0 and ld % 4 == 0 and a_s.data_ptr() % 16 == 0):
        return a_s, ld, m
    rows = -(-m // 4) * 4
    padded = torch.ones(a_s.shape[1], rows, dtype=torch.float32, device=a_s.device)
    padded[:, :m].copy_(a_s.t())
    return padded, rows, rows


def _problem(cfg, out_code, m, n, k, aq, scales, ld_as, as_rows, wq, w_s, y, splits, device):
    ptr = (lambda t: ctypes.c_void_p(t.data_ptr())) if isinstance(aq, torch.Tensor) else ctypes.c_void_p
    return (cfg.id, out_code, m, n, k, ptr(aq), aq.stride(0) if isinstance(aq, torch.Tensor) else k,
            ptr(scales), ld_as, as_rows, ptr(wq), wq.stride(0) if isinstance(wq, torch.Tensor) else k,
            ptr(w_s), w_s.stride(0) if isinstance(w_s, torch.Tensor) else (k + 127) // 128,
            ptr(y), n, splits, device)


def can_implement(m: int, n: int, k: int, which=0, out_dtype=torch.bfloat16, splits: int = 0,
                  device: int = 0) -> int:
    """CUTLASS's verdict on an M x N x K product with contiguous operands (0: runs; else a
    status, ``library().status_string``); the scales of an M the config cannot load are
    counted padded, as ``cutlass_fp8_gemm`` pads them."""
    cfg = config(which)
    rows = -(-m // 4) * 4 if cfg.tma_scales and m % 4 else m
    aligned = 1 << 12  # pointers only checked for alignment
    args = _problem(cfg, OUT_DTYPES[out_dtype], m, n, k, aligned, aligned, rows, rows, aligned, aligned, aligned,
                    splits, device)
    return library().lib.qr_cutlass_can_implement(*args)


def cutlass_fp8_gemm(aq, a_s, wq, w_s, out_dtype=torch.bfloat16, which=0, splits: int = 0,
                     out: torch.Tensor | None = None, early: bool = False) -> torch.Tensor:
    """y [M, N] = (aq * a_s) @ (wq * w_s)^T in ``out_dtype`` (bf16, or float32 for checks)
    by CUTLASS config ``which`` (id, name or CutlassGemmConfig); ``splits`` for stream-K
    configs: 0 CUTLASS's heuristic (stream-K where it pays), 1 none, s > 1 split-K.
    ``out``: a contiguous [M, N] tensor of ``out_dtype`` to write (else a new one). ``early``:
    a programmatic dependent launch (EngineKernels.early_launch) where the device and driver
    take one (cuda_jit.early_launch_accepted): the kernel may be scheduled while the kernel
    before it finishes, its loads waiting for that kernel's writes."""
    cfg = config(which)
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"CUTLASS FP8 GEMM: out_dtype {out_dtype} not built (bfloat16 or float32)")
    if splits < 0 or (splits > 1 and not cfg.stream_k):
        raise ValueError(f"CUTLASS FP8 GEMM: config {cfg.name} takes no splits={splits}")
    m, n, k = _check_operands(aq, a_s, wq, w_s)
    if out is None:
        y = torch.empty(m, n, dtype=out_dtype, device=aq.device)
    elif (out.shape != (m, n) or out.dtype != out_dtype or not out.is_contiguous() or out.device != aq.device
          or out.data_ptr() % 16):
        raise ValueError(f"CUTLASS FP8 GEMM: out must be a contiguous, 16-byte aligned [{m}, {n}] {out_dtype} "
                         f"tensor on {aq.device}")
    else:
        y = out
    if m == 0:
        return y
    lib = library()
    scales, ld_as, as_rows = _scales(a_s, cfg)
    device = aq.device.index if aq.device.index is not None else torch.cuda.current_device()
    args = _problem(cfg, OUT_DTYPES[out_dtype], m, n, k, aq, scales, ld_as, as_rows, wq, w_s, y, splits, device)
    need = ctypes.c_size_t(0)
    status = lib.lib.qr_cutlass_workspace_size(cfg.id, OUT_DTYPES[out_dtype], m, n, k, aq.stride(0), ld_as, as_rows,
                                               wq.stride(0), w_s.stride(0), n, splits, device, ctypes.byref(need))
    if status == 0:
        workspace = torch.empty(max(need.value, 1), dtype=torch.uint8, device=aq.device)
        stream = torch.cuda.current_stream(aq.device).cuda_stream
        status = lib.lib.qr_cutlass_fp8_gemm(*args, ctypes.c_void_p(workspace.data_ptr()), need.value,
                                             ctypes.c_void_p(stream), int(early and early_launch_accepted(device)))
    if status != 0:
        raise CutlassGemmError(f"CUTLASS FP8 GEMM {cfg.name} on M={m} N={n} K={k} (splits {splits}): "
                               f"{lib.status_string(status)} (status {status})")
    return y
