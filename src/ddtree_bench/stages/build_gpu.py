"""Timing the GPU builder: ``run_gpu_benchmark`` (same signature and columns as
``stages.build.run_benchmark``).

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

With ``in_situ=True`` (``stages.insitu``: what the decode round pays, inputs already on the device and the
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

import numpy as np
import pandas as pd

from ddtree_bench.builders import get_builder
from ddtree_bench.builders.gpu import STAT_NAMES, DeviceTrees, GpuBuilder, device_layout, device_views
from ddtree_bench.builders.gpu_device import DeviceTreeBuilder
from ddtree_bench.catalog import IN_SITU
from ddtree_bench.stages.build import frame, start_run
from ddtree_bench.timing.gpu import EVENT_CLOCK, EventTimer, pinned
from ddtree_bench.tree import first_difference

#: The GPU timings measured by wall clock (the others: CUDA events).
WALL_TIMINGS = ("host-inclusive", "in-situ-launch-sync", "in-situ-launch-sync-packed")


def run_gpu_benchmark(
    builder,
    trace_path,
    budget,
    batch,
    *,
    warmup: int,
    repeats: int,
    min_seconds: float,
    machine: str | None,
    distribution: str | None,
    builder_options: dict | None = None,
    max_seconds: float | None = None,
    min_repeats: int = 1,
    max_repeats: int | None = None,
    correct: bool | None = None,
    input_columns: str = "trace",
    in_situ: bool = False,
) -> pd.DataFrame:
    policy, prepared = start_run(locals())  # first: the arguments, nothing else
    if isinstance(prepared, pd.DataFrame):
        return prepared  # unavailable here, with the reason
    gpu, lp, ids, budget, base = prepared
    batch = base["batch"]
    if not isinstance(gpu, GpuBuilder):
        raise ValueError(f"run_gpu_benchmark times the gpu builder, not {base['builder']!r}")

    import cupy as cp  # noqa: PLC0415

    kernels = gpu.kernels
    plan = gpu.plan(batch, lp.shape[1], lp.shape[-1], budget)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        # inputs in one device buffer (log-probs, then token ids), filled from one pinned host buffer
        in_offsets, in_bytes = device_layout([("lp", lp.shape, lp.dtype), ("ids", ids.shape, ids.dtype)])
        d_in = cp.zeros(in_bytes, cp.uint8)
        d_lp, d_ids = (device_views(d_in, in_offsets)[k] for k in ("lp", "ids"))
        pinned_in = pinned(in_bytes)
        host_in = device_views(pinned_in, in_offsets)
        host_in["lp"][...] = lp
        host_in["ids"][...] = ids
        d_in.set(pinned_in)
        out = DeviceTrees(batch, budget)
        pinned_out = pinned(out.tree_bytes)
        flush_words = 2 * kernels.l2_bytes // 4
        flush_buf = cp.empty(flush_words, cp.uint32)

    def flush():
        kernels.flush_l2(
            (4 * kernels.sm_count,), (1024,), (flush_buf, np.int64(flush_words), np.uint32(7)), stream=stream
        )

    def build_full():
        gpu.launch(plan, d_lp, d_ids, out, stream=stream, bool_visibility=True)

    def build_packed():
        gpu.launch(plan, d_lp, d_ids, out, stream=stream, bool_visibility=False)

    def empty():
        kernels.empty((1,), (1,), (), stream=stream)

    # one graph replaying the full build
    build_full()
    stream.synchronize()
    stream.begin_capture()
    build_full()
    graph = stream.end_capture()

    def replay():
        graph.launch(stream)

    if in_situ:  # the packed-bits-only build as a graph too, and the device-array entry point
        build_packed()
        stream.synchronize()
        stream.begin_capture()
        build_packed()
        graph_packed = stream.end_capture()
        entry = DeviceTreeBuilder(gpu)

        def replay_packed():
            graph_packed.launch(stream)

        def launch_sync(packed: bool) -> float:
            t0 = time.perf_counter_ns()
            entry(d_lp, d_ids, budget, packed_only=packed, out=out, stream=stream)
            stream.synchronize()
            return (time.perf_counter_ns() - t0) / 1e9

    event_time = EventTimer(stream, kernels.spin, flush=flush)

    def host_inclusive() -> float:
        t0 = time.perf_counter_ns()
        d_in.set(pinned_in, stream=stream)  # one transfer in
        build_full()
        out.tree_region().get(stream=stream, out=pinned_out)  # one transfer out: the whole TreeBatch
        stream.synchronize()
        return (time.perf_counter_ns() - t0) / 1e9

    kinds = [
        ("floor", "warm", lambda: event_time(empty, False)),
        ("kernel-events", "warm", lambda: event_time(build_full, False)),
        ("kernel-events", "cold", lambda: event_time(build_full, True)),
        ("kernel-events-packed", "warm", lambda: event_time(build_packed, False)),
        ("kernel-events-packed", "cold", lambda: event_time(build_packed, True)),
        ("graph-replay", "warm", lambda: event_time(replay, False)),
        ("host-inclusive", "n/a", host_inclusive),
    ]
    if in_situ:
        kinds += [
            (IN_SITU, "warm", lambda: event_time(replay, False)),
            ("in-situ-packed", "warm", lambda: event_time(replay_packed, False)),
            ("in-situ-launch-sync", "n/a", lambda: launch_sync(False)),
            ("in-situ-launch-sync-packed", "n/a", lambda: launch_sync(True)),
        ]
    samples = [
        (timing, cache, phase, rep, seconds)
        for timing, cache, measure in kinds
        for phase, rep, seconds in policy.samples(measure)
    ]

    trees = out.host_views(pinned_out)  # what the last host-inclusive call copied out
    paths = np.bincount(out.stats.get(), minlength=len(_PATH_NAMES))
    gpu.last_paths = {label: int(c) for label, c in zip(_PATH_NAMES, paths, strict=True) if c}
    if correct is None:
        correct = first_difference(get_builder("reference").build(lp, ids, budget), trees) is None
    device_bytes = out.nbytes + d_in.nbytes
    base.update(
        correct=bool(correct),
        nodes_mean=float(np.mean(trees.node_count)),
        device_memory_bytes=float(device_bytes),
        threads=plan.threads,
    )
    rows = []
    for timing, cache, phase, rep, seconds in samples:
        clock = "time.perf_counter_ns" if timing in WALL_TIMINGS else EVENT_CLOCK
        rows.append(
            {
                **base,
                "timing": timing,
                "cache": cache,
                "phase": phase,
                "repetition": rep,
                "seconds": seconds,
                "per_tree_seconds": seconds / base["batch"],
                "clock": clock,
            }
        )
    df = frame(rows)
    df.attrs["gpu_paths"] = gpu.last_paths
    return df


_PATH_NAMES = tuple(STAT_NAMES[i] for i in range(len(STAT_NAMES)))
