"""Timing the tree accept (the greedy verify walk): ``run_accept_benchmark``, rows in ``timing.records``'
format with ``stage = "accept"``.

Inputs, prepared once and untimed: the trace's first ``batch`` requests (``stages.build.read_batch``), their
trees at ``budget`` built by the ``native`` builder (``reference`` where no C++ compiler is found: the same
trees, element for element), and target tokens ``[B, N+1]`` drawn by ``acceptance.sample_target_tokens(seed)``
(per node, from the drafter's own distribution of the next position, so that accept lengths are realistic).
After the target's forward pass those tokens are on the device, so that is where every impl starts from.

Per impl, in one run, ``TimingPolicy`` calls each (warm-up calls kept as ``phase = "warmup"`` rows):

- ``cpu-walk`` (``timing = "wall"``, ``time.perf_counter_ns``): copy the target tokens from the device to a
  pinned host buffer, synchronise, and run ``ops.accept.accept_cpu`` on the host TreeBatch (SGLang's child
  maps and walk); one interval covers both. Without a GPU the interval covers the walk alone
  (``status_reason`` says so).
- ``gpu-kernel`` (``timing = "cuda-events"``, ``cache = "warm"``): ``GpuAccept.launch`` on device arrays,
  queued behind a short spin kernel so that the events time the GPU's work, not the host's launch overhead.
- ``gpu-host-inclusive`` (``timing = "wall"``): the launch, the three outputs copied to pinned host memory,
  and a stream synchronise, as a CPU-side consumer of the accept pays.
- ``floor`` (``timing = "cuda-events"``): the empty kernel, timed like ``gpu-kernel``, in the same run.

``correct``: the impl's outputs (accepted indices, accept length, bonus token) equal an untimed
``accept_cpu`` on the same inputs (the last timed call's outputs are compared; device outputs are filled
with a sentinel before timing, so an element the kernel never writes shows up). ``floor`` rows carry the
``gpu-kernel`` check of the same run. ``accept_length_mean`` (root included) and ``expected_accept_mean``
(``acceptance.expected_accepted_tokens``, draft tokens) describe the inputs and are on every row.

Without a GPU the three GPU impls get one ``status = "unavailable"`` row each, with the reason. If a GPU impl
raises, its rows say ``"failed"`` and why.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.acceptance import expected_accepted_tokens, sample_target_tokens
from ddtree_bench.builders import get_builder
from ddtree_bench.cuda import loader as cuda
from ddtree_bench.environment import ENVIRONMENT_COLUMNS, collect_environment
from ddtree_bench.ops.accept import TREE_LINK_FIELDS, DeviceAccept, GpuAccept, accept_cpu, host_field
from ddtree_bench.paths import layout
from ddtree_bench.stages import points
from ddtree_bench.stages.build import read_batch
from ddtree_bench.timing.gpu import EVENT_CLOCK, EventTimer, pinned
from ddtree_bench.timing.policy import TimingPolicy
from ddtree_bench.timing.records import stage_frame
from ddtree_bench.traces import check_positive_int, row_sha256
from ddtree_bench.validation import check_budget

STAGE = "accept"
IMPLS = ("cpu-walk", "gpu-kernel", "gpu-host-inclusive", "floor")
TIMING_KEYS = ("warmup", "repeats", "min_seconds", "max_seconds", "min_repeats", "max_repeats")
REQUIRED_TIMING_KEYS = ("warmup", "repeats", "min_seconds")
NO_DEVICE_REASON = "no device: walk only, no device-to-host copy"
# (timing, cache) of each impl's rows
IMPL_TIMING = {
    "cpu-walk": ("wall", "n/a"),
    "gpu-kernel": ("cuda-events", "warm"),
    "gpu-host-inclusive": ("wall", "n/a"),
    "floor": ("cuda-events", "warm"),
}
_SENTINEL = -0x5EED  # in no output: indices are >= -1, lengths >= 1, tokens >= 0


def timing_policy(timing) -> TimingPolicy:
    """``timing.policy.TimingPolicy`` from a dict of its keyword arguments (one-line ValueError on unknown or
    missing keys, or bad values)."""
    if not isinstance(timing, dict):
        raise ValueError(f"timing must be a dict with keys {list(TIMING_KEYS)}, got {type(timing).__name__}")
    unknown = sorted(set(timing) - set(TIMING_KEYS))
    if unknown:
        raise ValueError(f"timing: unknown keys {unknown}; known keys: {list(TIMING_KEYS)}")
    missing = [key for key in REQUIRED_TIMING_KEYS if key not in timing]
    if missing:
        raise ValueError(f"timing: missing keys {missing}")
    return TimingPolicy(**timing)


def _build_trees(lp, ids, budget):
    builder = get_builder(catalog.NATIVE)
    if builder.unavailable_reason() is not None:
        builder = get_builder(catalog.ORACLE)  # identical trees (the project's checks), only slower to build
    return builder.build(lp, ids, budget)


def _timed(policy: TimingPolicy, measure) -> list[tuple[str, int, float]]:
    """``policy.samples(measure)`` with Python's garbage collector off (as ``stages.build.run_benchmark``)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return policy.samples(measure)
    finally:
        if was_enabled:
            gc.enable()


def _same(result, expected) -> bool:
    return all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(result, expected, strict=True))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@dataclass(frozen=True)
class Job:
    """One tree-accept job: the trace's first ``batch`` requests at ``budget``. ``timing``: ``TimingPolicy``'s
    keyword arguments; ``accept_fatbin`` / ``util_fatbin``: prebuilt ``tree_accept.cu`` / ``bench_util.cu``
    fatbins (None: the cached builds)."""

    trace: str
    budget: int
    batch: int
    timing: dict
    machine: str | None = None
    distribution: str | None = None
    accept_fatbin: str | None = None
    util_fatbin: str | None = None
    seed: int = 0

    @classmethod
    def grid(cls, settings) -> list[dict]:
        step = settings.step_options()
        return points(
            distribution=[step["distribution"]],
            depth=[step["depth"]],
            budget=step["budgets"],
            batch=step["batch_sizes"],
        )

    @classmethod
    def from_settings(cls, settings, *, distribution, depth, budget, batch, results=None):
        files = layout(settings, results)
        return cls(
            trace=files.trace_of(distribution, depth),
            budget=int(budget),
            batch=int(batch),
            timing=settings.step_options()["timing"],
            machine=settings.machine,
            distribution=distribution,
            accept_fatbin=files.artefact("tree_accept"),
            util_fatbin=files.artefact("bench_util"),
        )

    @property
    def inputs(self) -> dict[str, str]:
        return {"trace": self.trace, "accept": self.accept_fatbin, "util": self.util_fatbin}


@dataclass
class _Inputs:
    """What every timing of a job takes: the policy, the rows' common fields, the trees, the target tokens
    and the CPU walk's result (what every impl must equal)."""

    policy: TimingPolicy
    base: dict
    trees: object
    target: np.ndarray
    expected: tuple


def run(job: Job) -> pd.DataFrame:
    """Time the tree accept of the job (module docstring); one row per call, ``timing.records.stage_frame``
    columns. Bad arguments are a one-line ValueError before anything runs."""
    policy = timing_policy(job.timing)
    budget = check_budget(job.budget)
    batch = check_positive_int(job.batch, "batch")
    seed = job.seed
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    path = Path(job.trace)
    if not path.is_file():
        raise ValueError(f"trace {path} does not exist")
    lp, ids, _, metadata = read_batch(path, batch)
    trees = _build_trees(lp, ids, budget)
    target = sample_target_tokens(lp, ids, trees, seed=int(seed))
    expected = accept_cpu(trees, target)
    env = collect_environment(job.machine)
    base = {
        "stage": STAGE,
        "batch": batch,
        "budget": budget,
        "depth": int(lp.shape[1]),
        "distribution": job.distribution or metadata.get("distribution"),
        "flops": None,
        "bytes": None,
        "accept_length_mean": float(np.mean(expected[1])),
        "expected_accept_mean": float(np.mean(expected_accepted_tokens(lp, ids, trees))),
        "trace_sha256": row_sha256(path, metadata),
        **{k: env.get(k) for k in ENVIRONMENT_COLUMNS},
    }
    inputs = _Inputs(policy, base, trees, target, expected)
    accept = GpuAccept(job.accept_fatbin)
    reason = accept.unavailable_reason()
    if reason is not None:
        rows = _cpu_walk_rows(inputs, device=None)
        for impl in IMPLS[1:]:
            rows.append(_status_row(base, impl, "unavailable", reason))
        return stage_frame(rows)
    return stage_frame(_device_rows(inputs, accept, job.util_fatbin))


def _row(base: dict, impl: str, phase: str, rep: int, seconds: float, **fields) -> dict:
    timing, cache = IMPL_TIMING[impl]
    row = {
        **base,
        "impl": impl,
        "timing": timing,
        "cache": cache,
        "phase": phase,
        "repetition": rep,
        "seconds": seconds,
        "status": "ok",
        "status_reason": None,
        **fields,
    }
    if timing == "cuda-events":
        row["clock"] = EVENT_CLOCK
    return row


def _status_row(base: dict, impl: str, status: str, reason: str) -> dict:
    """One row saying ``impl`` did not run here (``unavailable``) or raised (``failed``), and why."""
    return _row(
        base,
        impl,
        "timed",
        -1,
        math.nan,
        status=status,
        status_reason=" ".join(str(reason).split()),
        correct=None,
    )


def _cpu_walk_rows(inputs: _Inputs, device) -> list[dict]:
    """The ``cpu-walk`` rows: device-to-host copy of the target tokens plus the walk (``device`` is
    ``(stream, d_target, pinned_target)``), or the walk alone on the host tokens when ``device`` is None."""
    policy, base, trees, target, expected = (
        inputs.policy,
        inputs.base,
        inputs.trees,
        inputs.target,
        inputs.expected,
    )
    clock = time.perf_counter_ns
    last = []
    if device is None:
        host_target = np.ascontiguousarray(target)

        def measure() -> float:
            t0 = clock()
            result = accept_cpu(trees, host_target)
            t1 = clock()
            last[:] = [result]
            return (t1 - t0) / 1e9

        reason = NO_DEVICE_REASON
    else:
        import cupy as cp  # noqa: PLC0415

        stream, d_target, pinned = device

        def measure() -> float:
            t0 = clock()
            cp.asnumpy(d_target, stream=stream, out=pinned, blocking=False)
            stream.synchronize()
            result = accept_cpu(trees, pinned)
            t1 = clock()
            last[:] = [result]
            return (t1 - t0) / 1e9

        reason = None
    samples = _timed(policy, measure)
    correct = _same(last[0], expected)
    return [
        _row(base, "cpu-walk", phase, rep, seconds, status_reason=reason, correct=correct)
        for phase, rep, seconds in samples
    ]


def _device_rows(inputs: _Inputs, accept: GpuAccept, util_fatbin) -> list[dict]:
    import cupy as cp  # noqa: PLC0415

    base = inputs.base
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        d_target = cp.asarray(np.ascontiguousarray(inputs.target, np.int64))
        d_trees = SimpleNamespace(
            **{name: cp.asarray(host_field(inputs.trees, name)) for name in TREE_LINK_FIELDS}
        )
    stream.synchronize()
    pinned_target = pinned(d_target.nbytes).view(np.int64).reshape(d_target.shape)
    rows = _cpu_walk_rows(inputs, device=(stream, d_target, pinned_target))
    try:
        device = _Device(inputs, accept, util_fatbin, stream, (d_target, d_trees))
    except Exception as exc:  # the kernels cannot be built or loaded here: every GPU impl failed
        reason = _first_line(exc)
        return rows + [_status_row(base, impl, "failed", reason) for impl in IMPLS[1:]]
    results = {}
    for impl, measure in (
        ("floor", device.floor),
        ("gpu-kernel", device.kernel),
        ("gpu-host-inclusive", device.host_inclusive),
    ):
        try:
            results[impl] = measure()
        except Exception as exc:
            results[impl] = _first_line(exc)
    kernel_correct = results["gpu-kernel"][1] if isinstance(results["gpu-kernel"], tuple) else None
    for impl in IMPLS[1:]:
        result = results[impl]
        if isinstance(result, str):
            rows.append(_status_row(base, impl, "failed", result))
            continue
        samples, correct = result
        if impl == "floor":
            correct = kernel_correct
        rows.extend(_row(base, impl, phase, rep, seconds, correct=correct) for phase, rep, seconds in samples)
    return rows


class _Device:
    """The GPU impls' timings of one job: the empty-kernel floor, the kernel (CUDA events) and the kernel
    with its copies to pinned host buffers (wall clock); each returns (samples, equal to the CPU walk)."""

    def __init__(self, inputs: _Inputs, accept: GpuAccept, util_fatbin, stream, device_inputs):
        import cupy as cp  # noqa: PLC0415

        self.cp, self.inputs, self.accept, self.stream = cp, inputs, accept, stream
        self.d_target, self.d_trees = device_inputs
        util = cp.RawModule(path=str(util_fatbin or cuda.cached_fatbin(cuda.BENCH_UTIL_SOURCE)))
        self.empty_kernel = util.get_function("ddtree_empty_kernel")
        spin_kernel = util.get_function("ddtree_spin_kernel")
        with stream:
            self.out = DeviceAccept(inputs.base["batch"], inputs.base["budget"])
        out = self.out
        self.outputs = (out.accepted_indices, out.accept_length, out.bonus_token)
        self.pinned_out = [pinned(a.nbytes).view(a.dtype).reshape(a.shape) for a in self.outputs]
        self.launch()  # loads the module outside any timing
        stream.synchronize()
        self.event_time = EventTimer(stream, spin_kernel)

    def launch(self):
        self.accept.launch(self.d_target, self.d_trees, self.out, stream=self.stream)

    def fill_sentinel(self):
        with self.stream:
            for array in self.outputs:
                array.fill(_SENTINEL)
            for array in self.pinned_out:
                array.fill(_SENTINEL)
            self.stream.synchronize()

    def floor(self):
        def empty():
            self.empty_kernel((1,), (1,), (), stream=self.stream)

        return _timed(self.inputs.policy, lambda: self.event_time(empty)), None

    def kernel(self):
        self.fill_sentinel()
        samples = _timed(self.inputs.policy, lambda: self.event_time(self.launch))
        self.stream.synchronize()
        return samples, _same(self.out.to_host(), self.inputs.expected)

    def host_inclusive(self):
        cp, stream = self.cp, self.stream

        def call() -> float:
            t0 = time.perf_counter_ns()
            self.launch()
            for device_array, host_array in zip(self.outputs, self.pinned_out, strict=True):
                cp.asnumpy(device_array, stream=stream, out=host_array, blocking=False)
            stream.synchronize()
            return (time.perf_counter_ns() - t0) / 1e9

        self.fill_sentinel()
        samples = _timed(self.inputs.policy, call)
        return samples, _same(self.pinned_out, self.inputs.expected)
