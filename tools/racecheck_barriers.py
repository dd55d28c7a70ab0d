"""What compute-sanitizer racecheck reports on the attention kernels' barrier protocols, stripped of
everything else: a probe kernel whose shared-memory hand-overs are all ordered by construction (but the
control's).

One block of 256 threads = two warpgroups, as in the Hopper attention kernels. Every iteration warpgroup 0
writes a[row] (one lane of four a row, after a warp sync) and hands it to warpgroup 1 through named barrier 1;
warpgroup 1 reads it, writes b[row] and hands that back through named barrier 2, where warpgroup 0 reads it:
the seesaw kernel's exchange of the running max and the rescale factors (``vs_update_max`` and its readers).
Each variant is its own kernel, ``probe_<mode>``, so racecheck's reports name it. Mode bits:

- ``SYNC``: both sides of a hand-over ``bar.sync``; ``ARRIVE``: the producer ``bar.arrive``, the consumer
  ``bar.sync`` (the kernels' protocol; PTX's memory model has an arrive synchronize with a sync on the same
  barrier); neither: no barriers at all (the control, a real race racecheck must report);
- ``WG_BAR_ONE``: in the last iteration warpgroup 1 passes a barrier of its own 128 threads between the two
  hand-overs and warpgroup 0 passes its own after them (the seesaw kernel's tail zeroing, ``vs_zero_tail``,
  where only the second tile of the last pair is partial); ``WG_BAR_BOTH``: both at the same point;
- ``ONE_WAY``: after the loop, one more hand-over from warpgroup 0 to warpgroup 1 (the last pair's P0);
- ``EPILOGUE``: then each warpgroup writes its row sums, ``__syncthreads()``, every thread reads both (the
  kernels' epilogue; the in-kernel split merge's weights and sums follow the same pattern).

    compute-sanitizer --tool racecheck python tools/racecheck_barriers.py

Needs a CUDA GPU, nvcc and CuPy; run from the repository root with PYTHONPATH=src. racecheck's reports name
the kernel (``probe_<mode>``) and the probe's source line.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import cupy as cp

from ddtree_bench.cuda import loader as cuda

SYNC, ARRIVE, WG_BAR_ONE, WG_BAR_BOTH, ONE_WAY, EPILOGUE = 1, 2, 4, 8, 16, 32
VARIANTS = {
    "no barriers (control)": 0,
    "sync": SYNC,
    "arrive": ARRIVE,
    "sync, warpgroup barrier on one side": SYNC | WG_BAR_ONE,
    "sync, warpgroup barriers on both sides": SYNC | WG_BAR_BOTH,
    "sync, one-way hand-over, epilogue": SYNC | ONE_WAY | EPILOGUE,
    "arrive, one-way hand-over, epilogue": ARRIVE | ONE_WAY | EPILOGUE,
    "arrive, epilogue": ARRIVE | EPILOGUE,
}
ITERATIONS = 3

SOURCE = r"""
#define SYNC 1
#define ARRIVE 2
#define WG_BAR_ONE 4
#define WG_BAR_BOTH 8
#define ONE_WAY 16
#define EPILOGUE 32
__device__ __forceinline__ void bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ int row_of(int h) {
    return ((threadIdx.x & 127) >> 5) * 16 + ((threadIdx.x & 31) >> 2) + 8 * h;
}
template <int MODE>
__device__ __forceinline__ void hand_over(int id) {
    if (MODE & ARRIVE) bar_arrive(id, 256);
    else if (MODE & SYNC) bar_sync(id, 256);
}
template <int MODE>
__device__ __forceinline__ void take_over(int id) {
    if (MODE & (ARRIVE | SYNC)) bar_sync(id, 256);
}
template <int MODE>
__device__ __forceinline__ void probe(int iterations, float* out) {
    __shared__ float a[64], b[64], c[64], l[2][64];
    const int wg = threadIdx.x >> 7;
    const bool writer = (threadIdx.x & 3) == 0;
    if (threadIdx.x < 64) a[threadIdx.x] = b[threadIdx.x] = 0.f;
    __syncthreads();
    float acc[2] = {0.f, 0.f};
    for (int i = 0; i < iterations; ++i) {
        const bool last = i + 1 == iterations;
        if (wg == 0) {
            float x[2];
            for (int h = 0; h < 2; ++h) x[h] = a[row_of(h)] + 1.f;
            __syncwarp();
            if (writer) for (int h = 0; h < 2; ++h) a[row_of(h)] = x[h];
            hand_over<MODE>(1);
            if ((MODE & WG_BAR_BOTH) && last) bar_sync(5, 128);
            take_over<MODE>(2);
            for (int h = 0; h < 2; ++h) acc[h] += b[row_of(h)];
            if ((MODE & WG_BAR_ONE) && last) bar_sync(5, 128);
        } else {
            take_over<MODE>(1);
            float x[2];
            for (int h = 0; h < 2; ++h) x[h] = a[row_of(h)] * 2.f;
            if ((MODE & (WG_BAR_ONE | WG_BAR_BOTH)) && last) bar_sync(6, 128);
            __syncwarp();
            if (writer) for (int h = 0; h < 2; ++h) b[row_of(h)] = x[h];
            hand_over<MODE>(2);
            for (int h = 0; h < 2; ++h) acc[h] += x[h];
        }
    }
    if (MODE & ONE_WAY) {
        if (wg == 0) {
            if (writer) for (int h = 0; h < 2; ++h) c[row_of(h)] = acc[h];
            hand_over<MODE>(3);
        } else {
            take_over<MODE>(3);
            for (int h = 0; h < 2; ++h) acc[h] += c[row_of(h)];
        }
    }
    if (MODE & EPILOGUE) {
        if (writer) for (int h = 0; h < 2; ++h) l[wg][row_of(h)] = acc[h];
        __syncthreads();
        for (int h = 0; h < 2; ++h) acc[h] = l[0][row_of(h)] + l[1][row_of(h)];
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc[0] + acc[1];
}
"""


def kernel_name(mode: int) -> str:
    return f"probe_{mode}"


def source() -> str:
    wrappers = "".join(
        f'extern "C" __global__ void {kernel_name(m)}(int n, float* out) {{ probe<{m}>(n, out); }}\n'
        for m in VARIANTS.values()
    )
    return SOURCE + wrappers


def main() -> None:
    out = cp.zeros(256, cp.float32)
    with tempfile.TemporaryDirectory() as tmp:
        cu, fatbin = Path(tmp) / "racecheck_probe.cu", Path(tmp) / "racecheck_probe.fatbin"
        cu.write_text(source())
        cuda.build_fatbin(cu, fatbin, (f"sm_{cp.cuda.Device().compute_capability}",), ptx=False)
        module = cp.RawModule(path=str(fatbin))
        for name, mode in VARIANTS.items():
            module.get_function(kernel_name(mode))((1,), (256,), (cp.int32(ITERATIONS), out))
            cp.cuda.Device().synchronize()
            print(f"racecheck probe: probe_{mode} = {name}: done", flush=True)


if __name__ == "__main__":
    main()
