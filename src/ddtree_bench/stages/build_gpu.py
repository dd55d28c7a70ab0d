"""Timing the GPU builder: ``run_gpu_benchmark(job)`` (a ``stages.timing_job.TimingJob``, as
``stages.build.run_benchmark``; the same columns).

Per repetition, in the same run and on the same inputs (the first ``batch`` requests of the trace, copied to
the device once):

- ``floor``: the empty kernel (``kernels/bench_util/bench_util.cu``), timed like the build below;
- ``kernel-events``: the whole TreeBatch built on the device (tree kernel plus the bool-mask expansion), by
  CUDA events recorded around the launches; ``kernel-events-packed``: the tree kernel alone (packed-bit
  mask only, what attention kernels consume);
- ``graph-replay``: the same launches captured once in a CUDA graph, one replay timed by CUDA events;
- ``host-inclusive`` (secondary): wall clock (``time.perf_counter_ns``) for copying the inputs in from
  pinned host memory (one transfer), building, copying the whole TreeBatch out to pinned host memory (one
  transfer: the device buffers are laid out contiguously) and synchronising, as a CPU-side consumer pays
  (copies a decode round never makes: see the in-situ rows).

With ``job.in_situ`` (``stages.insitu``: what the decode round pays, inputs already on the device and the
outputs left there), also:

- ``in-situ``: the build's time on the stream, CUDA events around one replay of the CUDA graph of the build
  (bool mask written); ``in-situ-packed``: the same with the packed-bit mask only;
- ``in-situ-launch-sync`` / ``in-situ-launch-sync-packed`` (secondary): wall clock for one call of the
  device-array entry point (``builders.gpu_device.DeviceTreeBuilder``: its Python and launch overhead) and a
  stream synchronisation, which a real round does not need (the verify launches behind the build).

Event-timed launches are queued behind a short spin kernel, so that the events time the GPU's work rather
than the host's launch overhead (nvbench's approach). ``cache = "warm"`` samples run back to back;
``cache = "cold"`` samples first overwrite a buffer twice the L2's size. Warm-up launches are kept as rows
with ``phase = "warmup"``.
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np
import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.builders import get_builder
from ddtree_bench.builders.gpu import STAT_NAMES, DeviceTrees, GpuBuilder, device_layout, device_views
from ddtree_bench.builders.gpu_device import DeviceTreeBuilder
from ddtree_bench.catalog import IN_SITU
from ddtree_bench.stages.build import call_rows, frame, start_run
from ddtree_bench.timing.gpu import EVENT_CLOCK, EventTimer, pinned
from ddtree_bench.tree import first_difference

#: The GPU timings measured by wall clock (the others: CUDA events).
WALL_TIMINGS = ("host-inclusive", "in-situ-launch-sync", "in-situ-launch-sync-packed")


def run_gpu_benchmark(job) -> pd.DataFrame:
    """Time the gpu builder (module docstring; ``job.in_situ`` adds the in-situ series): one row per launch,
    series by series, or one "unavailable" row with the reason."""
    policy, prepared = start_run(job)
    if isinstance(prepared, pd.DataFrame):
        return prepared  # unavailable here, with the reason
    gpu, lp, ids, budget, base = prepared
    if not isinstance(gpu, GpuBuilder):
        raise ValueError(f"run_gpu_benchmark times the gpu builder, not {base['builder']!r}")
    device = DeviceRun(gpu, lp, ids, budget)
    samples = [
        (timing, cache, policy.samples(measure)) for timing, cache, measure in device.series(job.in_situ)
    ]
    return _rows(device, base, samples, job.correct)


class DeviceRun:
    """The device side of one gpu timing job, on one stream: the inputs in one device buffer (log-probs,
    then token ids) filled from one pinned host buffer, the output and a pinned host buffer for it, a buffer
    to flush the L2 with, a CUDA graph of the full build, and the event timer; ``series`` its measures."""

    def __init__(self, gpu: GpuBuilder, lp: np.ndarray, ids: np.ndarray, budget: int):
        import cupy as cp  # noqa: PLC0415

        self.gpu, self.lp, self.ids, self.budget = gpu, lp, ids, budget
        self.kernels = gpu.kernels
        self.plan = gpu.plan(lp.shape[0], lp.shape[1], lp.shape[-1], budget)
        self.stream = cp.cuda.Stream(non_blocking=True)
        with self.stream:
            in_offsets, in_bytes = device_layout([("lp", lp.shape, lp.dtype), ("ids", ids.shape, ids.dtype)])
            self.d_in = cp.zeros(in_bytes, cp.uint8)
            self.d_lp, self.d_ids = (device_views(self.d_in, in_offsets)[k] for k in ("lp", "ids"))
            self.pinned_in = pinned(in_bytes)
            host_in = device_views(self.pinned_in, in_offsets)
            host_in["lp"][...] = lp
            host_in["ids"][...] = ids
            self.d_in.set(self.pinned_in)
            self.out = DeviceTrees(lp.shape[0], budget)
            self.pinned_out = pinned(self.out.tree_bytes)
            self.flush_words = 2 * self.kernels.l2_bytes // 4
            self.flush_buf = cp.empty(self.flush_words, cp.uint32)
        self.graph = self.capture(self.build_full)  # one graph replaying the full build
        self.event_time = EventTimer(self.stream, self.kernels.spin, flush=self.flush)

    def flush(self) -> None:
        grid = (4 * self.kernels.sm_count,)
        args = (self.flush_buf, np.int64(self.flush_words), np.uint32(7))
        self.kernels.flush_l2(grid, (1024,), args, stream=self.stream)

    def build_full(self) -> None:
        self.gpu.launch(self.plan, self.d_lp, self.d_ids, self.out, stream=self.stream, bool_visibility=True)

    def build_packed(self) -> None:
        self.gpu.launch(self.plan, self.d_lp, self.d_ids, self.out, stream=self.stream, bool_visibility=False)

    def empty(self) -> None:
        self.kernels.empty((1,), (1,), (), stream=self.stream)

    def capture(self, build):
        """A CUDA graph of one ``build()`` (run once first, outside the capture)."""
        build()
        self.stream.synchronize()
        self.stream.begin_capture()
        build()
        return self.stream.end_capture()

    def series(self, in_situ: bool) -> list:
        """``(timing, cache, measure)`` of every series, in the rows' order (``measure()``: seconds)."""
        series = [*self.kernel_series(), *self.graph_series(), *self.host_series()]
        return series + self.in_situ_series() if in_situ else series

    def kernel_series(self) -> list:
        """The empty kernel (the floor) and the build, full and packed bits only, by CUDA events, warm and
        after an L2 flush."""
        timed = self.event_time
        return [
            ("floor", "warm", partial(timed, self.empty, False)),
            ("kernel-events", "warm", partial(timed, self.build_full, False)),
            ("kernel-events", "cold", partial(timed, self.build_full, True)),
            ("kernel-events-packed", "warm", partial(timed, self.build_packed, False)),
            ("kernel-events-packed", "cold", partial(timed, self.build_packed, True)),
        ]

    def graph_series(self) -> list:
        """One replay of the full build's CUDA graph, by CUDA events."""
        return [
            ("graph-replay", "warm", partial(self.event_time, partial(self.graph.launch, self.stream), False))
        ]

    def host_series(self) -> list:
        """Copy in, build, copy the whole TreeBatch out, synchronise: by wall clock."""
        return [("host-inclusive", "n/a", self.host_inclusive)]

    def host_inclusive(self) -> float:
        t0 = time.perf_counter_ns()
        self.d_in.set(self.pinned_in, stream=self.stream)  # one transfer in
        self.build_full()
        self.out.tree_region().get(stream=self.stream, out=self.pinned_out)  # one transfer out: the TreeBatch
        self.stream.synchronize()
        return (time.perf_counter_ns() - t0) / 1e9

    def in_situ_series(self) -> list:
        """The in-situ series: the full build's graph replay and a graph of the packed-bits-only build by
        CUDA events; the device-array entry point's launch and a synchronisation by wall clock."""
        graph_packed = self.capture(self.build_packed)
        entry = DeviceTreeBuilder(self.gpu)

        def launch_sync(packed: bool) -> float:
            t0 = time.perf_counter_ns()
            entry(self.d_lp, self.d_ids, self.budget, packed_only=packed, out=self.out, stream=self.stream)
            self.stream.synchronize()
            return (time.perf_counter_ns() - t0) / 1e9

        return [
            (IN_SITU, "warm", partial(self.event_time, partial(self.graph.launch, self.stream), False)),
            (
                "in-situ-packed",
                "warm",
                partial(self.event_time, partial(graph_packed.launch, self.stream), False),
            ),
            ("in-situ-launch-sync", "n/a", partial(launch_sync, False)),
            ("in-situ-launch-sync-packed", "n/a", partial(launch_sync, True)),
        ]


def _rows(device: DeviceRun, base: dict, samples: list, correct: bool | None) -> pd.DataFrame:
    """The rows of every series' samples, with what the last host-inclusive call copied out: its trees
    (compared with reference's where ``correct`` is None), their mean node count, the device memory held and
    the kernel paths taken (``attrs["gpu_paths"]``)."""
    gpu, out = device.gpu, device.out
    trees = out.host_views(device.pinned_out)
    paths = np.bincount(out.stats.get(), minlength=len(_PATH_NAMES))
    gpu.last_paths = {label: int(c) for label, c in zip(_PATH_NAMES, paths, strict=True) if c}
    if correct is None:
        expected = get_builder(catalog.ORACLE).build(device.lp, device.ids, device.budget)
        correct = first_difference(expected, trees) is None
    base.update(
        correct=bool(correct),
        nodes_mean=float(np.mean(trees.node_count)),
        device_memory_bytes=float(out.nbytes + device.d_in.nbytes),
        threads=device.plan.threads,
    )
    rows = [
        row
        for timing, cache, series in samples
        for row in call_rows(
            {
                **base,
                "timing": timing,
                "cache": cache,
                "clock": "time.perf_counter_ns" if timing in WALL_TIMINGS else EVENT_CLOCK,
            },
            series,
        )
    ]
    df = frame(rows)
    df.attrs["gpu_paths"] = gpu.last_paths
    return df


_PATH_NAMES = tuple(STAT_NAMES[i] for i in range(len(STAT_NAMES)))
