"""Rounding float32 to bfloat16 (the bf16 traces and the drafter's bf16 variant share it)."""

from __future__ import annotations

import numpy as np


def bf16_round(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), returned as float32 (exactly
    representable in bf16). Finite inputs only (NaN/inf are not special-cased)."""
    x = np.asarray(x, dtype=np.float32)
    if out is None:
        out = np.array(x, dtype=np.float32, order="C", copy=True)
    elif out is not x:
        np.copyto(out, x)
    bits = out.view(np.uint32)
    bias = np.right_shift(bits, np.uint32(16))
    np.bitwise_and(bias, np.uint32(1), out=bias)
    np.add(bias, np.uint32(0x7FFF), out=bias)
    np.add(bits, bias, out=bits)
    np.bitwise_and(bits, np.uint32(0xFFFF0000), out=bits)
    return out
