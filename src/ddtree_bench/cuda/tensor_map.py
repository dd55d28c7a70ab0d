"""TMA tensor maps: the descriptor with which a Hopper kernel's Tensor Memory Accelerator copies tiles of a
global array into shared memory (``cuTensorMapEncodeTiled`` of the CUDA driver, called through ctypes).

A map names one array (its address is in it), so it is encoded per call and copied to the device, where the
kernel reads it from global memory.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np

TENSOR_MAP_BYTES = 128  # CUtensorMap: 16 x 64-bit words, 64-byte aligned
_BFLOAT16 = 9  # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
_SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}  # CU_TENSOR_MAP_SWIZZLE_NONE, _32B, _64B, _128B
_L2_PROMOTION_256B = 3
_MAX_COORD = 2**31 - 1  # box coordinates are signed 32-bit


def check_tiled_2d(rows: int, cols: int, box_rows: int, box_cols: int, swizzle: int) -> None:
    """The driver's constraints on a 2-D bf16 map, as one-line ValueErrors (before anything is encoded)."""
    if swizzle not in _SWIZZLE:
        raise ValueError(f"tensor map: swizzle must be one of {sorted(_SWIZZLE)} bytes, got {swizzle}")
    if rows < 1 or cols < 1 or rows > _MAX_COORD:
        raise ValueError(f"tensor map: {rows} x {cols} elements is outside 1 .. 2^31 - 1 rows")
    if (cols * 2) % 16:
        raise ValueError(f"tensor map: a row of {cols} bf16 ({cols * 2} bytes) is not a multiple of 16 bytes")
    if not (1 <= box_rows <= 256 and 1 <= box_cols <= 256):
        raise ValueError(f"tensor map: a box of {box_rows} x {box_cols} is outside 1 .. 256 a side")
    if swizzle and box_cols * 2 > swizzle:
        raise ValueError(
            f"tensor map: a box row of {box_cols * 2} bytes is wider than the {swizzle}-byte swizzle"
        )


@lru_cache(maxsize=1)
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    fn.argtypes = [
        ctypes.c_void_p,  # CUtensorMap*
        ctypes.c_int,  # data type
        ctypes.c_uint32,  # rank
        ctypes.c_void_p,  # global address
        ctypes.POINTER(ctypes.c_uint64),  # global dims
        ctypes.POINTER(ctypes.c_uint64),  # global strides (bytes, rank - 1)
        ctypes.POINTER(ctypes.c_uint32),  # box dims
        ctypes.POINTER(ctypes.c_uint32),  # element strides
        ctypes.c_int,  # interleave
        ctypes.c_int,  # swizzle
        ctypes.c_int,  # L2 promotion
        ctypes.c_int,  # out-of-bounds fill
    ]
    return fn


def encode_tiled_2d(
    address: int, rows: int, cols: int, box_rows: int, box_cols: int, swizzle: int = 128
) -> bytes:
    """The tensor map of a row-major ``[rows, cols]`` bf16 array at device ``address``, copied in boxes of
    ``box_rows`` x ``box_cols`` (rows past the end read as zeros), ``swizzle``-byte swizzled in shared
    memory. RuntimeError with the driver's code where it refuses."""
    check_tiled_2d(rows, cols, box_rows, box_cols, swizzle)
    if address % 16:
        raise ValueError(f"tensor map: the array's address {address:#x} is not 16-byte aligned")
    out = np.zeros(TENSOR_MAP_BYTES // 8, np.uint64)
    dims = (ctypes.c_uint64 * 2)(cols, rows)
    strides = (ctypes.c_uint64 * 1)(cols * 2)
    box = (ctypes.c_uint32 * 2)(box_cols, box_rows)
    steps = (ctypes.c_uint32 * 2)(1, 1)
    err = _driver()(
        out.ctypes.data,
        _BFLOAT16,
        2,
        address,
        dims,
        strides,
        box,
        steps,
        0,
        _SWIZZLE[swizzle],
        _L2_PROMOTION_256B,
        0,
    )
    if err != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {err}")
    return out.tobytes()
