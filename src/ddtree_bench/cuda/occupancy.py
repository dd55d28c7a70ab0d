"""How many thread block clusters of a kernel the GPU holds at once (``cuOccupancyMaxActiveClusters`` of the
CUDA driver, through ctypes): a cluster's blocks run on one GPC together, so with one block an SM fewer of
them may be resident than SMs / cluster size."""

from __future__ import annotations

import ctypes
from functools import lru_cache


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.c_void_p),
        ("num_attrs", ctypes.c_uint),
    ]


@lru_cache(maxsize=1)
def _driver():
    fn = ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveClusters
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.POINTER(_LaunchConfig)]
    return fn


def max_active_clusters(function, cluster: int, threads: int, shared_mem: int) -> int:
    """Clusters of ``cluster`` blocks of ``threads`` threads and ``shared_mem`` bytes of dynamic shared memory
    of ``function`` resident at once: a ``cupy.RawModule`` function (``.kernel.ptr`` its CUfunction) whose
    cluster size is compiled in. RuntimeError with the driver's code where it refuses."""
    if cluster < 1 or threads < 1 or shared_mem < 0:
        raise ValueError(f"max_active_clusters: cluster {cluster}, {threads} threads, {shared_mem} bytes")
    config = _LaunchConfig((cluster, 1, 1), (threads, 1, 1), shared_mem, None, None, 0)
    count = ctypes.c_int(0)
    err = _driver()(ctypes.byref(count), ctypes.c_void_p(function.kernel.ptr), ctypes.byref(config))
    if err:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters: CUDA driver error {err}")
    return count.value
