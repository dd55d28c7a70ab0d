"""The GPU's measured peaks, taken in the same run as the benchmarks they put in scale: ``run``.

Three calls are timed, each by CUDA events recorded on one stream around a single call that is queued
behind a short spin kernel (``kernels/bench_util/bench_util.cu``), as ``stages.build_gpu`` times the tree
build, so that the events time the GPU's work rather than the host's launch overhead. Every sample is
``cache = "warm"`` (run back to back); warm-up calls are kept as rows with ``phase = "warmup"``.

- ``floor``: one launch of the empty kernel: the smallest time any event-timed launch can show here;
- ``bf16-gemm``: ``torch.matmul(a, b, out=c)`` of bf16 ``[n, n]`` matrices (unit-normal values), one call;
  ``flops = 2 n^3``, ``bytes = 3 n^2 * 2`` (both operands read and the product written once);
- ``device-copy``: one device-to-device ``cudaMemcpyAsync`` (CuPy) of ``copy_bytes`` bytes;
  ``bytes = 2 * copy_bytes`` (every byte is read once and written once).

Rows are ``timing.records`` rows with ``stage = "peak"``, ``batch = budget = 0``, ``timing = "cuda-events"``.
Where there is no GPU, every peak is one ``status = "unavailable"`` row with the reason (no timings); where
PyTorch is missing, only the GEMM is. A peak that raises while it runs is one ``status = "failed"`` row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ddtree_bench.cuda import loader as cuda
from ddtree_bench.environment import collect_environment
from ddtree_bench.ops import attention_peers
from ddtree_bench.paths import layout
from ddtree_bench.timing.gpu import EVENT_CLOCK, EventTimer
from ddtree_bench.timing.policy import TimingPolicy
from ddtree_bench.timing.records import STAGE_COLUMNS, stage_frame

IMPLS = ("floor", "bf16-gemm", "device-copy")


def _describe(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Job:
    """The peaks of this machine: ``timing`` holds ``timing.policy.TimingPolicy``'s keywords (each peak gets
    its own ``samples``); ``util_fatbin``: a fatbin of ``kernels/bench_util/bench_util.cu`` (None: built into
    the cache on first use); a bf16 GEMM of ``gemm_n``³ and a device copy of ``copy_bytes`` bytes."""

    timing: dict
    machine: str | None = None
    util_fatbin: str | None = None
    gemm_n: int = 8192
    copy_bytes: int = 2**30

    @classmethod
    def grid(cls, settings) -> list[dict]:
        return [{}]

    @classmethod
    def from_settings(cls, settings, *, results=None):
        return cls(
            timing=settings.step_options()["timing"],
            machine=settings.machine,
            util_fatbin=layout(settings, results).artefact("bench_util"),
        )

    @property
    def inputs(self) -> dict[str, str]:
        return {"util": self.util_fatbin}


def _unavailable(base: dict, impl: str, reason: str, status: str = "unavailable") -> dict:
    return {
        **base,
        "impl": impl,
        "repetition": 0,
        "phase": "timed",
        "seconds": math.nan,
        "status": status,
        "status_reason": " ".join(str(reason).split()),
    }


def run(job: Job) -> pd.DataFrame:
    """Time the empty-kernel floor, the bf16 GEMM and the device copy (module docstring); one row per call,
    as ``timing.records.stage_frame``."""
    policy = TimingPolicy(**job.timing)
    gemm_n = _positive_int(job.gemm_n, "gemm_n")
    copy_bytes = _positive_int(job.copy_bytes, "copy_bytes")
    env = collect_environment(job.machine)
    base = {
        **{k: v for k, v in env.items() if k in STAGE_COLUMNS},
        "stage": "peak",
        "batch": 0,
        "budget": 0,
        "timing": "cuda-events",
        "cache": "warm",
        "clock": EVENT_CLOCK,
    }
    reason = cuda.gpu_unavailable_reason()
    if reason is not None:
        return stage_frame([_unavailable(base, impl, reason) for impl in IMPLS])
    try:
        peaks = _Peaks(policy, job.util_fatbin, gemm_n, copy_bytes)
    except Exception as exc:  # no nvcc to build the fatbin, or it does not load on this device
        reason = f"benchmark utility kernels (kernels/bench_util/bench_util.cu) unavailable: {_describe(exc)}"
        return stage_frame([_unavailable(base, impl, reason) for impl in IMPLS])
    measures = {"floor": peaks.floor, "bf16-gemm": peaks.gemm, "device-copy": peaks.copy}
    rows = []
    for impl in IMPLS:
        if impl == "bf16-gemm":
            reason = attention_peers.torch_unavailable_reason()
            if reason is not None:
                rows.append(_unavailable(base, impl, reason))
                continue
        try:
            samples, flops, nbytes = measures[impl]()
        except Exception as exc:  # recorded, not raised: the other peaks still get measured
            rows.append(_unavailable(base, impl, f"{impl} raised {_describe(exc)}", status="failed"))
            continue
        finally:
            peaks.release(impl)
        rows.extend(
            {
                **base,
                "impl": impl,
                "repetition": rep,
                "phase": phase,
                "seconds": seconds,
                "flops": flops,
                "bytes": nbytes,
                "status": "ok",
            }
            for phase, rep, seconds in samples
        )
    return stage_frame(rows)


class _Peaks:
    """Each peak's samples on one stream, as (samples, flops, bytes) of one call."""

    def __init__(self, policy: TimingPolicy, util_fatbin, gemm_n: int, copy_bytes: int):
        import cupy as cp  # noqa: PLC0415

        self.cp, self.policy, self.gemm_n, self.copy_bytes = cp, policy, gemm_n, copy_bytes
        util = cp.RawModule(path=str(util_fatbin or cuda.cached_fatbin(cuda.BENCH_UTIL_SOURCE)))
        self.empty = util.get_function("ddtree_empty_kernel")
        spin_kernel = util.get_function("ddtree_spin_kernel")
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.event_time = EventTimer(self.stream, spin_kernel)

    def floor(self):
        stream = self.stream
        return (
            self.policy.samples(lambda: self.event_time(lambda: self.empty((1,), (1,), (), stream=stream))),
            None,
            None,
        )

    def copy(self):
        cp, stream, copy_bytes = self.cp, self.stream, self.copy_bytes
        with stream:
            src = cp.empty(copy_bytes, cp.uint8)
            dst = cp.empty(copy_bytes, cp.uint8)
            src.fill(1)
        stream.synchronize()

        def copy():
            dst.data.copy_from_device_async(src.data, copy_bytes, stream=stream)

        return self.policy.samples(lambda: self.event_time(copy)), None, 2.0 * copy_bytes

    def gemm(self):
        import torch  # noqa: PLC0415

        cp, stream, n = self.cp, self.stream, self.gemm_n
        device = torch.device("cuda", cp.cuda.Device().id)
        torch_stream = torch.cuda.ExternalStream(stream.ptr, device=device)
        with torch.cuda.device(device), torch.cuda.stream(torch_stream):  # torch launches on `stream`
            generator = torch.Generator(device=device).manual_seed(0)
            a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=generator)
            b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=generator)
            c = torch.empty(n, n, device=device, dtype=torch.bfloat16)
            stream.synchronize()
            samples = self.policy.samples(lambda: self.event_time(lambda: torch.matmul(a, b, out=c)))
        return samples, 2.0 * n**3, 3.0 * n * n * 2

    def release(self, impl: str) -> None:
        """Give the peak's buffers back (the benchmarks in this process need the memory)."""
        self.stream.synchronize()
        self.cp.get_default_memory_pool().free_all_blocks()
        if impl == "bf16-gemm":
            import torch  # noqa: PLC0415

            torch.cuda.empty_cache()


def _timed_ok(df: pd.DataFrame, impl: str) -> pd.DataFrame:
    rows = df[
        (df["stage"] == "peak")
        & (df["impl"] == impl)
        & (df["phase"] == "timed")
        & (df["status"] == "ok")
        & (df["seconds"] > 0)
    ]
    return rows[np.isfinite(rows["seconds"].to_numpy(dtype="float64"))]


def _median(values: pd.Series) -> float | None:
    values = values.astype("float64")
    values = values[np.isfinite(values.to_numpy())]
    return float(values.median()) if len(values) else None


def peak_rates(df: pd.DataFrame) -> dict:
    """``{"gemm_tflops", "copy_tbps", "floor_seconds"}`` from the peaks' rows: the median over the timed
    "ok" calls of each call's rate (``flops / seconds / 1e12``, ``bytes / seconds / 1e12``) or seconds;
    ``None`` where that peak has no such call (unavailable, failed, or absent)."""
    gemm = _timed_ok(df, "bf16-gemm")
    copy = _timed_ok(df, "device-copy")
    floor = _timed_ok(df, "floor")
    tflops = _median(gemm["flops"] / gemm["seconds"])
    tbps = _median(copy["bytes"] / copy["seconds"])
    return {
        "gemm_tflops": None if tflops is None else tflops / 1e12,
        "copy_tbps": None if tbps is None else tbps / 1e12,
        "floor_seconds": _median(floor["seconds"]),
    }
