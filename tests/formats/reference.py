"""Independent float64 references for the element formats, built from the bit layouts
(sign, exponent, mantissa) rather than from torch's casts: round to the nearest
representable value, ties to the value with an even code."""

from __future__ import annotations

import numpy as np


def e4m3_values() -> np.ndarray:
    """All non-negative finite E4M3 (fn) values, indexed by their 7-bit code (0x7F is NaN)."""
    vals = []
    for code in range(0x7F):
        exp, man = code >> 3, code & 0x7
        vals.append(man / 8 * 2.0**-6 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7))
    return np.array(vals)


E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def round_to_table(x: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest table magnitude to |x| (ties to the even code), saturating at the top.

    Returns (signed rounded values, magnitude codes)."""
    a = np.minimum(np.abs(x.astype(np.float64)), table[-1])
    dist = np.abs(a[..., None] - table[None, :])
    best = dist.min(axis=-1, keepdims=True)
    candidates = dist == best
    codes = np.arange(len(table))
    # among equally near codes, prefer the even one
    pref = np.where(candidates, np.where(codes % 2 == 0, 0, 1), 2)
    idx = pref.argmin(axis=-1)
    return np.copysign(table[idx], x), idx
