"""TMA tensor maps: the driver's constraints are refused as one-line ValueErrors before it is called, and a
map encodes on a GPU (the seesaw attention's tests run the kernel that reads it)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ddtree_bench.cuda.loader import gpu_unavailable_reason
from ddtree_bench.cuda.tensor_map import TENSOR_MAP_BYTES, check_tiled_2d, encode_tiled_2d


def test_the_attentions_kv_map_is_allowed():
    check_tiled_2d(64 * 33000, 576, 64, 64, 128)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((100, 576, 64, 64, 96), "swizzle must be one of"),
        ((0, 576, 64, 64, 128), "outside 1 .. 2^31 - 1 rows"),
        ((2**31, 576, 64, 64, 128), "outside 1 .. 2^31 - 1 rows"),
        ((100, 575, 64, 64, 128), "not a multiple of 16 bytes"),
        ((100, 576, 257, 64, 128), "outside 1 .. 256 a side"),
        ((100, 576, 64, 128, 128), "wider than the 128-byte swizzle"),
    ],
)
def test_bad_maps_are_one_line_errors(args, message):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        check_tiled_2d(*args)
    assert "\n" not in str(info.value)


def test_a_misaligned_address_is_refused_before_the_driver():
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        encode_tiled_2d(0x1008, 100, 576, 64, 64)


@pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=f"no usable GPU: {gpu_unavailable_reason()}")
def test_a_map_encodes_on_a_gpu():
    import cupy as cp  # noqa: PLC0415

    kv = cp.zeros((300, 576), cp.int16)
    raw = encode_tiled_2d(int(kv.data.ptr), 300, 576, 64, 64)
    assert len(raw) == TENSOR_MAP_BYTES and np.frombuffer(raw, np.uint8).any()
