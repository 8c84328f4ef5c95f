"""Inputs and bitwise comparisons shared by the kernel tests (GPU and interpreter)."""

from __future__ import annotations

import torch

from quantroll.formats import QuantizedTensor, get_format

# (name, scale_rule) for every format the GPU path covers
FORMATS = [("fp8", None), ("mxfp8", "ceil"), ("mxfp8", "ocp"), ("nvfp4", None)]
FORMAT_IDS = ["fp8", "mxfp8-ceil", "mxfp8-ocp", "nvfp4"]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def fmt_of(spec: tuple[str, str | None]):
    return get_format(spec[0], scale_rule=spec[1])


def _bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8)


def assert_bitwise_equal(ref: QuantizedTensor, got: QuantizedTensor) -> None:
    """Codes, scales and global scale byte for byte; shapes, dtypes, block and format."""
    assert got.format == ref.format
    assert tuple(got.shape) == tuple(ref.shape)
    assert tuple(got.block) == tuple(ref.block)
    for what, a, b in (("data", ref.data, got.data), ("scale", ref.scale, got.scale)):
        assert b.dtype == a.dtype, f"{what} dtype {b.dtype} != {a.dtype}"
        assert tuple(b.shape) == tuple(a.shape), f"{what} shape {tuple(b.shape)} != {tuple(a.shape)}"
        ab, bb = _bytes(a), _bytes(b)
        if not torch.equal(ab, bb):
            bad = (ab != bb).reshape(-1)
            n = int(bad.sum())
            i = int(bad.nonzero()[0, 0]) // a.element_size()
            idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), a.shape))
            raise AssertionError(
                f"{what}: {n} byte(s) differ; first at element {idx}: ref {a.reshape(-1)[i]!r} got {b.detach().cpu().reshape(-1)[i]!r}"
            )
    if ref.global_scale is None:
        assert got.global_scale is None
    else:
        assert got.global_scale is not None and got.global_scale.dtype == torch.float32
        assert tuple(got.global_scale.shape) == tuple(ref.global_scale.shape)
        assert torch.equal(_bytes(ref.global_scale), _bytes(got.global_scale)), (
            f"global scale {float(got.global_scale)} != {float(ref.global_scale)}"
        )


def mixed_weight(shape: tuple[int, int], dtype: torch.dtype, seed: int = 0, lo: float = -6.0, hi: float = 4.0) -> torch.Tensor:
    """Random weight whose magnitude varies by row and by column chunk over 10**lo..10**hi,
    with a zero row, a zero 16-group and negative zeros sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    n, k = shape
    if dtype == torch.float16:
        hi = min(hi, 3.0)  # keep 4 * 10**hi far below float16's 65504
    w = torch.randn(n, k, generator=g).clamp(-4, 4)
    row = 10 ** (torch.rand(n, 1, generator=g) * (hi - 1 - lo) + lo)
    col = 10 ** (torch.rand(1, (k + 31) // 32, generator=g) * 2 - 1).repeat_interleave(32, dim=1)[:, :k]
    w = w * row * col
    if n > 2:
        w[n // 2] = 0.0
        w[1, : min(k, 16)] = 0.0
    flat = w.view(-1)
    m = flat.numel()
    idx = torch.randint(0, m, (max(1, m // 50),), generator=g)
    flat[idx] = -0.0
    return w.to(dtype)


def uniform_weight(shape: tuple[int, int], dtype: torch.dtype, scale: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g).clamp(-4, 4) * scale).to(dtype)


def e4m3_table() -> torch.Tensor:
    """All non-negative finite E4M3 values in code order (float32)."""
    return torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)


def e4m3_tie_weight(dtype: torch.dtype, seed: int = 0, exp_shift: int = 0) -> torch.Tensor:
    """[256, 256]: each 128x128 block (and each 1x32 group) holds 448 * 2**shift, so the FP8
    and MXFP8 scales are exact powers of two and every other element is an E4M3 value or
    the exact midpoint of two neighbours (ties to even), with random signs."""
    g = torch.Generator().manual_seed(seed)
    t = e4m3_table()
    mids = (t[:-1] + t[1:]) / 2
    pool = torch.cat([t, mids, mids, mids])
    w = pool[torch.randint(0, pool.numel(), (256, 256), generator=g)]
    w = w * torch.where(torch.rand(256, 256, generator=g) < 0.5, -1.0, 1.0)
    w[:, ::32] = 448.0
    # MXFP8 'ceil' boundary: amax with mantissa just above 1.75 (next bf16 value) in a few groups
    w[0:8, 1] = 450.0
    w = w * 2.0**exp_shift
    return w.to(dtype)


def e2m1_tie_weight(dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """[64, 256] for NVFP4 with global scale exactly 1 (amax 2688): most 1x16 groups have
    amax 6 (group scale 1), the rest hold E2M1 midpoints; some groups have amax 6 * m for
    an E4M3 midpoint m, so the group scale itself rounds on a tie."""
    g = torch.Generator().manual_seed(seed)
    vals = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    w = vals[torch.randint(0, vals.numel(), (64, 256), generator=g)]
    w = w * torch.where(torch.rand(64, 256, generator=g) < 0.5, -1.0, 1.0)
    w[:, ::16] = 6.0
    w[0, 0] = 2688.0
    t = e4m3_table()
    mids = ((t[:-1] + t[1:]) / 2)[40:100]  # normal-range E4M3 midpoints
    for r in range(1, 64, 3):
        w[r, 16:32] = w[r, 16:32].clamp(-1, 1) * 0.5
        w[r, 16] = 6.0 * float(mids[r % mids.numel()])
    return w.to(dtype)
