"""What every number format shares: the quantized-tensor record, the block helpers,
and the input checks.

All three formats are block-scaled: one scale per block of a 2-D weight (128x128,
1x32 or 1x16) and one per group of an activation row (1x128, 1x32, 1x16). Blocks at
the right or bottom edge may be partial; their scale comes from the elements that
exist (padding is zero and cannot raise an amax).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from quantroll.errors import NonFiniteError, QuantrollError
from quantroll.formats.stored import CONSTANT, DATA, GLOBAL_SCALE, SCALE, StoredLayout, StoredTensor


@dataclass(frozen=True)
class QuantizedTensor:
    """A tensor in a block-scaled format.

    data:   element codes (float8_e4m3fn; for NVFP4 uint8, two codes a byte)
    scale:  one scale per block (float32, E8M0 uint8 or float8_e4m3fn by format)
    format: the registry name of the format that made it
    shape:  the logical shape of the dequantized tensor
    block:  the (rows, cols) each scale covers in the [M, K] view of the tensor
    global_scale: NVFP4's per-tensor float32 scale (None for the others)
    """

    data: torch.Tensor
    scale: torch.Tensor
    format: str
    shape: tuple[int, ...]
    block: tuple[int, int]
    global_scale: torch.Tensor | None = field(default=None)

    def to(self, device: torch.device | str) -> "QuantizedTensor":
        gs = None if self.global_scale is None else self.global_scale.to(device)
        return QuantizedTensor(self.data.to(device), self.scale.to(device), self.format, self.shape, self.block, gs)

    @property
    def nbytes(self) -> int:
        n = self.data.numel() * self.data.element_size() + self.scale.numel() * self.scale.element_size()
        if self.global_scale is not None:
            n += self.global_scale.numel() * self.global_scale.element_size()
        return n


FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _no_nan_codes(t: torch.Tensor) -> torch.Tensor | None:
    """A 0-dim bool tensor, True where a code tensor holds none of its dtype's NaN codes
    (e4m3fn 0x7F / 0xFF); None for codes without NaN (NVFP4's packed uint8 data)."""
    if t.dtype == torch.float8_e4m3fn:
        return ~((t.view(torch.uint8) & 0x7F) == 0x7F).any()
    return None


def validity_flags(q: QuantizedTensor, codes: bool = True) -> list[tuple[str, torch.Tensor]]:
    """(what would be wrong, 0-dim bool tensor True where it is not) for a stored quantized
    tensor, on its device and without a host sync (callers batch the syncs): no NaN
    element codes; float scales finite and >= 0 (a zero scale is a block of zeros), E8M0
    scales not 0xFF (NaN), e4m3 scales without NaN codes; a finite positive global scale.
    ``codes=False`` leaves out the element codes (the one check that reads every byte)."""
    flags = []
    if codes and (ok := _no_nan_codes(q.data)) is not None:
        flags.append(("NaN element codes", ok))
    scale = q.scale
    if scale.dtype == torch.uint8:  # E8M0 exponents: 0xFF is NaN
        flags.append(("NaN (0xFF) E8M0 scales", ~(scale == 0xFF).any()))
    else:
        if (ok := _no_nan_codes(scale)) is not None:
            flags.append(("NaN scales", ok))
        values = scale.float()
        flags.append(("NaN/Inf scales", torch.isfinite(values).all()))
        flags.append(("negative scales", ~(values < 0).any()))
    if q.global_scale is not None:
        g = q.global_scale.float()
        flags.append(("a non-finite or non-positive global scale", (torch.isfinite(g) & (g > 0)).all()))
    return flags


def invalid_values(q: QuantizedTensor) -> str | None:
    """What makes a stored quantized tensor unusable (``validity_flags``), or None."""
    flags = validity_flags(q)
    if not flags:
        return None
    ok = torch.stack([flag for _, flag in flags]).cpu()
    return None if bool(ok.all()) else flags[int((~ok).nonzero()[0])][0]


def check_input(x: torch.Tensor, name: str, *, weight: bool) -> None:
    """Refuse what no format can hold: wrong rank, non-float dtype, NaN or Inf.

    Checked before any clamp, so that saturation can never hide a bad value.
    """
    if x.dtype not in FLOAT_DTYPES:
        raise QuantrollError(f"tensor '{name}' has dtype {x.dtype}; quantization needs float32, bfloat16 or float16 input")
    if weight and x.dim() != 2:
        raise QuantrollError(f"tensor '{name}' has shape {tuple(x.shape)}; a weight to quantize must be 2-D [out, in]")
    if not weight and x.dim() < 1:
        raise QuantrollError(f"tensor '{name}' is a scalar; an activation needs a last dimension to group along")
    if x.numel() == 0:
        raise QuantrollError(f"tensor '{name}' has shape {tuple(x.shape)} with no elements; nothing to quantize")
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise NonFiniteError(
            f"tensor '{name}' holds {int(bad.sum())} NaN/Inf value(s) (first at index {idx}); fix the weights before quantizing"
        )


def num_blocks(shape: tuple[int, int], block: tuple[int, int]) -> tuple[int, int]:
    """Blocks per dimension, counting a partial edge block as one."""
    return math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1])


def _pad_to_blocks(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    rows, cols = x.shape
    nr, nc = num_blocks((rows, cols), block)
    pad_r, pad_c = nr * block[0] - rows, nc * block[1] - cols
    if pad_r or pad_c:
        x = torch.nn.functional.pad(x, (0, pad_c, 0, pad_r))
    return x


def block_amax(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """max |x| over each block of a 2-D float32 tensor -> [ceil(R/br), ceil(C/bc)]."""
    nr, nc = num_blocks(tuple(x.shape), block)
    padded = _pad_to_blocks(x.abs(), block)
    return padded.view(nr, block[0], nc, block[1]).amax(dim=(1, 3))


def expand_blocks(per_block: torch.Tensor, block: tuple[int, int], shape: tuple[int, int]) -> torch.Tensor:
    """Broadcast one value per block back to every element of a [R, C] tensor."""
    out = per_block.repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)
    return out[: shape[0], : shape[1]]


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """View an activation [..., K] as float32 rows [M, K] (tokens x features)."""
    return x.reshape(-1, x.shape[-1]).to(torch.float32)


class Format:
    """A block-scaled number format. Subclasses define the scale and element rules, and
    carry the facts the rest of quantroll asks of a format (so that no caller tests a
    format's name): how it is stored, how config.json names it, how fused siblings share
    scales, what a reader calls it and whether hardware runs it.

    weight_block: block shape of a weight's scales, (rows, cols) of [out, in].
    act_group:    group size along K of an activation's dynamic scales.
    stored:       the stored tensors' rules (formats/stored.py)
    display_name: the name reports print ("block FP8")
    recipe_flag:  the train flag and value that quantize the trainer's forward in it
                  (None: no unified mode)
    unified_mode: the number ``compare --modes`` calls its unified mode by (mode 1 is any
                  low-precision rollout with a BF16 trainer; None: none)
    quant_method: config.json's quantization_config.quant_method
    reads_as:     what an error names when a checkpoint's quant_method is not known
    scale_rules:  the scale rules it takes (the first is the default; () for none)
    shared_global_scale: fused siblings (q/k/v, gate/up) share one per-tensor scale
    fused_gemm:   fused siblings' weights stack into one GEMM when each part's rows fill
                  whole scale blocks (per-tensor scales never stack)
    emulated_only: no tensor-core GEMM serves it on Hopper (the emulated path runs it)
    batch_dependent_activations: an activation's quantization reads the whole tensor (a
                  per-tensor scale), so a token's codes depend on what else is in its batch
    """

    name: str = ""
    weight_block: tuple[int, int] = (1, 1)
    act_group: int = 1
    stored: StoredLayout
    display_name: str = ""
    recipe_flag: tuple[str, str] | None = None
    unified_mode: str | None = None
    quant_method: str = ""
    reads_as: str = ""
    scale_rules: tuple[str, ...] = ()
    shared_global_scale: bool = False
    fused_gemm: bool = False
    emulated_only: bool = True
    batch_dependent_activations: bool = False

    # -- facts: storage and config.json -----------------------------------------------
    def stored_tensors(self, shape: tuple[int, int]) -> list[StoredTensor]:
        """The tensors that store a weight of logical ``shape``, in the order written."""
        return self.stored.tensors(tuple(shape), self.weight_block)

    def to_stored(self, q: QuantizedTensor) -> dict[str, torch.Tensor]:
        """The tensors to write for ``q``, keyed by suffix, in stored_tensors order."""
        values = {DATA: lambda: q.data, SCALE: lambda: q.scale,
                  GLOBAL_SCALE: lambda: q.global_scale.reshape(()).to(torch.float32)}
        return {t.suffix: values[t.role]() if t.role != CONSTANT else torch.tensor(t.value, dtype=t.dtype)
                for t in self.stored_tensors(q.shape)}

    def from_stored(self, tensors: dict[str, torch.Tensor], module: str) -> QuantizedTensor:
        """Rebuild a QuantizedTensor from its stored tensors (by suffix), checking dtypes and shapes."""
        data, scale = tensors["weight"], tensors[self.stored.scale_suffix]
        expect = [self.stored.data_dtype, self.stored.scale_dtype]
        if data.dim() != 2 or [data.dtype, scale.dtype] != expect:
            raise QuantrollError(
                f"module '{module}' stores {data.dtype}/{scale.dtype}, not the {self.name} layout {expect[0]}/{expect[1]}"
            )
        shape = self.stored.logical_shape(tuple(data.shape))
        if tuple(scale.shape) != num_blocks(shape, self.weight_block):
            raise QuantrollError(
                f"module '{module}': scale shape {tuple(scale.shape)} does not match weight {shape} in "
                f"{self.weight_block[0]}x{self.weight_block[1]} blocks"
            )
        g = self.stored.global_suffix
        gscale = None if g is None else tensors[g].to(torch.float32).reshape(())
        return QuantizedTensor(data, scale, self.name, shape, self.weight_block, gscale)

    def quantization_config(self, skipped: list[str], provenance: dict) -> dict:
        """config.json's quantization_config for a checkpoint in this format; ``skipped``
        are the modules kept in BF16, ``provenance`` quantroll's own record."""
        raise NotImplementedError

    def sidecar_files(self, qc: dict) -> dict[str, dict]:
        """Extra JSON files (name -> content) some readers of this format expect beside
        config.json; ``qc`` is the quantization_config written."""
        return {}

    @classmethod
    def from_quantization_config(cls, qc: dict, ours: dict, where: str) -> "Format":
        """The format a quantization_config with this quant_method describes (checked)."""
        return cls()

    def can_stack(self, rows: list[int]) -> bool:
        """True when parts with these output rows can run as one GEMM over stacked weights."""
        return self.fused_gemm and all(r % self.weight_block[0] == 0 for r in rows)

    def quantize_weight(self, w: torch.Tensor, name: str = "weight") -> QuantizedTensor:
        check_input(w, name, weight=True)
        return self._quantize_2d(w.to(torch.float32), self.weight_block)

    def quantize_activation(self, x: torch.Tensor, name: str = "activation") -> QuantizedTensor:
        """Dynamic per-token quantization in groups of ``act_group`` along the last dim."""
        check_input(x, name, weight=False)
        q = self._quantize_2d(as_rows(x), (1, self.act_group))
        lead = tuple(x.shape[:-1])
        return QuantizedTensor(
            q.data.reshape(*lead, q.data.shape[-1]),
            q.scale.reshape(*lead, q.scale.shape[-1]),
            q.format,
            tuple(x.shape),
            q.block,
            q.global_scale,
        )

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._dequantize_2d(self._as_2d(q)).reshape(q.shape).to(dtype)

    def ulp(self, q: QuantizedTensor) -> torch.Tensor:
        """One unit in the last place of every element, at its stored scale (float32)."""
        return self._ulp_2d(self._as_2d(q)).reshape(q.shape)

    def divides(self, shape: tuple[int, ...]) -> bool:
        """True when a weight of this shape splits into whole blocks (no partial edges)."""
        return len(shape) == 2 and shape[0] % self.weight_block[0] == 0 and shape[1] % self.weight_block[1] == 0

    # -- helpers shared by the subclasses ---------------------------------------------
    @staticmethod
    def _as_2d(q: QuantizedTensor) -> QuantizedTensor:
        """Flatten an activation's leading dims so that every format works on [M, K]."""
        if len(q.shape) == 2:
            return q
        rows = math.prod(q.shape[:-1])
        return QuantizedTensor(
            q.data.reshape(rows, q.data.shape[-1]),
            q.scale.reshape(rows, q.scale.shape[-1]),
            q.format,
            (rows, q.shape[-1]),
            q.block,
            q.global_scale,
        )

    def _quantize_2d(self, x: torch.Tensor, block: tuple[int, int]) -> QuantizedTensor:
        raise NotImplementedError

    def _dequantize_2d(self, q: QuantizedTensor) -> torch.Tensor:
        raise NotImplementedError

    def _ulp_2d(self, q: QuantizedTensor) -> torch.Tensor:
        raise NotImplementedError
