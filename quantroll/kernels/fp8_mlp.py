"""The block-FP8 MLP of a decode step in two overlapping CUDA kernels (cuda/fp8_mlp.cu).

down(q(bf16(silu(gate)) * up)) for M <= ``fp8_gemv.MAX_M`` token rows, with the bits of
the unfused path (fp8_gemv's gate_up GEMM, the silu * up kernel quantizing its output,
fp8_gemv's down GEMM): the gate/up kernel applies silu * up to its own sums and
quantizes each 128-wide group as its last block finishes; the down kernel, launched early
behind it, streams its weights from the start and waits per K group for a flag instead
of for the whole gate/up grid. It saves the silu launch and lets down's weight stream
fill gate_up's last wave (see the source for the protocol).

``fused.mlp`` takes it where ``takes`` holds (``ENABLED``, real FP8 linears without bias,
shapes whole in 128-wide groups, a batch the CUDA decode GEMM takes, the kernels built).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantroll.kernels import cuda_jit, fp8_gemv
from quantroll.kernels.counters import counters
from quantroll.kernels.fp8_gemv import GemvConfig
from quantroll.kernels.fp8_linear import fp8_activation_buffers

SOURCE = "fp8_mlp.cu"
COUNTERS = "fused MLP groups"  # counters.py kind: [down blocks done, arrivals per group, flags per group]
MIN_COUNTERS = 1 + 2 * 1024  # allocated once for intermediate sizes up to 131072 (no reallocation under graphs)

# Every variant cuda/fp8_mlp.cu instantiates (a test keeps the lists equal). For the
# gate/up kernel ``row_tiles`` counts tiles of 8 gate rows over their 8 up rows (8 * row
# tiles intermediate columns per block).
GATE_UP_VARIANTS = tuple(GemvConfig(*v) for v in (
    (1, 2, 8, 1, 1), (2, 1, 4, 1, 1), (2, 2, 4, 1, 1), (2, 1, 8, 1, 1), (1, 1, 8, 1, 1)))
DOWN_VARIANTS = tuple(GemvConfig(*v) for v in ((2, 1, 8, 1, 1), (1, 2, 8, 1, 1), (2, 1, 4, 1, 1), (1, 1, 8, 1, 1)))

# Decode MLPs of at most fp8_gemv.MAX_M rows take the two kernels while this is True.
ENABLED = False


@dataclass(frozen=True)
class MlpConfig:
    """The variants of the two kernels (``GATE_UP_VARIANTS``, ``DOWN_VARIANTS``)."""

    gate_up: GemvConfig
    down: GemvConfig

    @property
    def gate_up_kernel(self) -> str:
        return self.gate_up.kernel.replace("fp8_gemv_", "fp8_gate_up_silu_")

    @property
    def down_kernel(self) -> str:
        return self.down.kernel.replace("fp8_gemv_", "fp8_down_after_flags_")

    @property
    def columns(self) -> int:
        """Intermediate columns per gate/up block."""
        return 8 * self.gate_up.row_tiles


def default_config(m: int, hidden: int, inter: int) -> MlpConfig | None:
    """The variants fp8_gemv would run the two GEMMs on (same warps, hence the same K
    order and bits as the unfused path), or None where this file has no such variant."""
    cfg = MlpConfig(fp8_gemv.default_config(m, 2 * inter, hidden), fp8_gemv.default_config(m, hidden, inter))
    return cfg if cfg.gate_up in GATE_UP_VARIANTS and cfg.down in DOWN_VARIANTS else None


def supports_shape(m: int, hidden: int, inter: int) -> bool:
    """Batches of the CUDA decode GEMM, hidden and intermediate sizes whole in 128-wide
    groups (the groups the kernels quantize and flag)."""
    return 1 <= m <= fp8_gemv.MAX_M and hidden % 128 == 0 and inter % 128 == 0 and hidden > 0 and inter > 0


def _shapes_ok(aq: torch.Tensor, gu_w: torch.Tensor, down_w: torch.Tensor) -> bool:
    m, hidden = aq.shape
    inter = down_w.shape[1]
    return (supports_shape(m, hidden, inter) and tuple(gu_w.shape) == (2 * inter, hidden)
            and down_w.shape[0] == hidden and fp8_gemv.rows_loadable(aq, gu_w) and fp8_gemv.rows_loadable(aq, down_w))


def takes(aq: torch.Tensor, gate_up_layer, down_layer) -> bool:
    """Whether an MLP whose gate_up and down_proj are these QLinears runs on the two
    kernels for codes ``aq``: ``ENABLED``, both real block-FP8 linears without bias, the
    shapes (``supports_shape``), a variant (``default_config``) and a CUDA device where
    both the decode GEMM and these kernels build."""
    if not ENABLED or aq.device.type != "cuda":
        return False
    for layer in (gate_up_layer, down_layer):
        if layer.backend != "fp8" or layer.format is None or layer.format.name != "fp8" or layer.bias is not None:
            return False
    if not _shapes_ok(aq, gate_up_layer.weight, down_layer.weight):
        return False
    m, hidden = aq.shape
    return (default_config(m, hidden, down_layer.weight.shape[1]) is not None and fp8_gemv.usable(aq.device)
            and usable(aq.device))


def fp8_mlp(aq, a_s, gu_w, gu_s, down_w, down_s, cfg: MlpConfig | None = None, early: bool | None = None
            ) -> torch.Tensor:
    """y [M, H] bf16 = down(q(bf16(silu(gate)) * up)) for codes aq [M, H] with 1x128 scales
    a_s; gate_up codes [2I, H] (gate rows first), down codes [H, I], both with 128x128
    scales. ``early`` (default fp8_gemv.EARLY_LAUNCH): the gate/up kernel launched early
    behind the kernel that wrote aq; the down kernel always is, behind the gate/up kernel,
    where the GPU has programmatic dependent launch (Hopper and newer)."""
    m, hidden = aq.shape
    inter = down_w.shape[1]
    if not _shapes_ok(aq, gu_w, down_w):
        raise ValueError(f"fp8_mlp: codes {tuple(aq.shape)}, gate_up {tuple(gu_w.shape)}, down {tuple(down_w.shape)}: "
                         f"needs 1-{fp8_gemv.MAX_M} rows, gate_up [2I, H], down [H, I], H and I multiples of 128, "
                         "rows contiguous and 16-byte aligned")
    cfg = cfg or default_config(m, hidden, inter)
    if cfg is None or m > 8 * min(cfg.gate_up.token_tiles, cfg.down.token_tiles) or hidden % cfg.down.rows:
        raise ValueError(f"fp8_mlp: no variant for {m} rows, H {hidden}, I {inter} ({cfg})")
    device = aq.device
    hopper = torch.cuda.get_device_capability(device)[0] >= 9
    silu_out = torch.empty(m, inter, dtype=torch.bfloat16, device=device)  # bf16(silu(gate)) * up, before quantizing
    q, s = fp8_activation_buffers(m, inter, device)
    flags = counters(COUNTERS, device, max(MIN_COUNTERS, 1 + 2 * (inter // 128)))
    y = torch.empty(m, hidden, dtype=torch.bfloat16, device=device)
    module = cuda_jit.load(SOURCE, device)
    module.launch(cfg.gate_up_kernel, (inter // cfg.columns, 1, 1), (32 * cfg.gate_up.warps, 1, 1),
                  aq, aq.stride(0), a_s, a_s.stride(0), a_s.stride(1), gu_w, gu_w.stride(0), gu_s, gu_s.stride(0),
                  gu_s.stride(1), silu_out, silu_out.stride(0), q, q.stride(0), s, s.stride(0), s.stride(1), flags,
                  m, hidden, inter, early=(fp8_gemv.EARLY_LAUNCH if early is None else early) and hopper)
    module.launch(cfg.down_kernel, (hidden // cfg.down.rows, 1, 1), (32 * cfg.down.warps, 1, 1),
                  q, q.stride(0), s, s.stride(0), s.stride(1), down_w, down_w.stride(0), down_s, down_s.stride(0),
                  down_s.stride(1), y, y.stride(0), flags, m, inter, early=hopper)
    return y


def usable(device: torch.device) -> bool:
    """Whether the two kernels can run on ``device`` (built and loaded once, logged)."""
    return cuda_jit.usable(SOURCE, device, "FP8 decode MLP", "gate_up GEMM, silu kernel, down GEMM")
