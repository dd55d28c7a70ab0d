"""``stages.accept.run``: stage records of the tree accept. Without a GPU (or with the GPU
made unavailable) the GPU impls give one "unavailable" row each and the CPU walk is still timed; bad
arguments are one-line ValueErrors before anything runs; on a GPU every impl is timed and correct."""

from __future__ import annotations

import sys
import types

import numpy as np
import pandas as pd
import pytest

from ddtree_bench.acceptance import expected_accepted_tokens, sample_target_tokens
from ddtree_bench.builders import get_builder
from ddtree_bench.cuda import loader as cuda
from ddtree_bench.environment import ENVIRONMENT_COLUMNS
from ddtree_bench.ops.accept import GpuAccept, accept_cpu
from ddtree_bench.stages import accept as accept_bench
from ddtree_bench.stages.accept import IMPLS, NO_DEVICE_REASON, Job
from ddtree_bench.stages.accept import run as run_accept
from ddtree_bench.timing.records import STAGE_COLUMNS
from ddtree_bench.traces import generate_trace, save_trace

GPU_REASON = cuda.gpu_unavailable_reason()
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"needs a CUDA GPU: {GPU_REASON}")
TIMING = dict(warmup=2, repeats=3, min_seconds=0.0, max_repeats=3)
GPU_IMPLS = ("gpu-kernel", "gpu-host-inclusive", "floor")


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "peaked-L8.npz"
    lp, ids = generate_trace("peaked", 6, 8, 32, vocab_size=300, seed=3, device="cpu")
    save_trace(path, lp, ids, distribution="peaked", seed=3)
    return path


@pytest.fixture
def no_gpu(monkeypatch):
    """The GPU accept unavailable, whatever this machine has."""
    monkeypatch.setattr(GpuAccept, "unavailable_reason", lambda self: "no GPU in this test")


def run(trace_path, budget=16, batch=4, **overrides):
    arguments = dict(timing=TIMING, machine="test-machine", distribution=None)
    arguments.update(overrides)
    return run_accept(Job(trace_path, budget, batch, **arguments))


def expected_means(trace_path, budget, batch, seed=0):
    with np.load(trace_path) as data:
        lp, ids = data["top_log_probs"][:batch], data["top_token_ids"][:batch]
    trees = get_builder("reference").build(lp, ids, budget)
    target = sample_target_tokens(lp, ids, trees, seed=seed)
    return float(accept_cpu(trees, target)[1].mean()), float(expected_accepted_tokens(lp, ids, trees).mean())


def test_without_gpu_cpu_walk_is_timed_and_gpu_impls_are_unavailable(trace_path, no_gpu):
    df = run(trace_path)
    assert list(df.columns) == list(STAGE_COLUMNS)
    assert (df.stage == "accept").all()
    assert set(df.impl) == set(IMPLS)
    walk = df[df.impl == "cpu-walk"]
    assert (walk.phase == "warmup").sum() == 2 and (walk.phase == "timed").sum() == 3
    assert sorted(walk[walk.phase == "timed"].repetition) == [0, 1, 2]
    assert (walk.status == "ok").all() and (walk.status_reason == NO_DEVICE_REASON).all()
    assert (walk.timing == "wall").all() and (walk.cache == "n/a").all()
    assert (walk.seconds > 0).all() and walk.correct.all()
    for impl in GPU_IMPLS:
        rows = df[df.impl == impl]
        assert len(rows) == 1, impl
        row = rows.iloc[0]
        assert row.status == "unavailable" and row.status_reason == "no GPU in this test"
        assert np.isnan(row.seconds) and pd.isna(row.correct)
        assert row.timing == accept_bench.IMPL_TIMING[impl][0]
    # the inputs' figures and the grid point are on every row
    accept_length, expected = expected_means(trace_path, 16, 4)
    assert (df.accept_length_mean == accept_length).all()
    assert np.allclose(df.expected_accept_mean, expected, rtol=1e-12)
    assert 1.0 <= accept_length <= 9.0 and 0.0 < expected < 8.0
    assert (df.batch == 4).all() and (df.budget == 16).all() and (df.depth == 8).all()
    assert (df.distribution == "peaked").all()  # from the trace's metadata
    assert df.heads.isna().all() and df.prefix.isna().all() and df.error.isna().all()
    assert (df.machine == "test-machine").all()
    always = [
        c
        for c in ENVIRONMENT_COLUMNS
        if c not in ("gpu_name", "gpu_driver", "cupy", "torch", "sglang", "git_commit")
    ]
    assert df[always].notna().all().all()


def test_without_gpu_the_real_reason_is_recorded(trace_path):
    if GPU_REASON is not None:
        df = run(trace_path)
        reasons = set(df[df.impl.isin(GPU_IMPLS)].status_reason)
        assert reasons == {GPU_REASON}
        assert (df[df.impl.isin(GPU_IMPLS)].status == "unavailable").all()
    else:
        pytest.skip("this machine has a GPU: the no-GPU path is covered with the GPU made unavailable")


def test_distribution_argument_and_seed(trace_path, no_gpu):
    df = run(trace_path, distribution="mine", seed=5, budget=32, batch=6)
    assert (df.distribution == "mine").all()
    accept_length, expected = expected_means(trace_path, 32, 6, seed=5)
    assert (df.accept_length_mean == accept_length).all()
    assert np.allclose(df.expected_accept_mean, expected, rtol=1e-12)


@pytest.mark.parametrize(
    ("budget", "batch", "timing", "message"),
    [
        (0, 4, TIMING, "budget must be >= 1"),
        (16, 0, TIMING, "batch must be >= 1"),
        (16, 7, TIMING, "batch 7 is larger than the 6 requests"),
        (16, 4, dict(TIMING, warmups=1), "unknown keys"),
        (16, 4, dict(repeats=1, min_seconds=0), "missing keys"),
        (16, 4, dict(TIMING, repeats=0), "repeats must be an integer >= 1"),
    ],
)
def test_bad_arguments_are_one_line_errors(trace_path, monkeypatch, budget, batch, timing, message):
    def no_timing(*args, **kwargs):
        raise AssertionError("timed despite bad arguments")

    monkeypatch.setattr(accept_bench, "_timed", no_timing)
    with pytest.raises(ValueError, match=message) as info:
        run(trace_path, budget=budget, batch=batch, timing=timing)
    assert "\n" not in str(info.value)


def test_missing_trace_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist") as info:
        run(tmp_path / "nope.npz")
    assert "\n" not in str(info.value)


@needs_gpu
@pytest.mark.parametrize("budget", [8, 256])
def test_gpu_every_impl_is_timed_and_correct(tmp_path, budget):
    lp, ids = generate_trace("peaked", 4, 16, 64, vocab_size=500, seed=9, device="cpu")
    trace = tmp_path / "trace.npz"
    save_trace(trace, lp, ids, distribution="peaked")
    df = run(trace, budget=budget, batch=4, timing=dict(warmup=2, repeats=5, min_seconds=0.0))
    assert set(df.impl) == set(IMPLS)
    assert (df.status == "ok").all(), df[df.status != "ok"].status_reason.tolist()
    assert df.correct.all()
    timed = df[df.phase == "timed"]
    assert (timed.groupby("impl").size() >= 5).all()
    assert df[df.impl == "cpu-walk"].status_reason.isna().all()  # the D2H copy is in the interval
    kinds = set(zip(timed.impl, timed.timing, timed.cache, strict=True))
    assert kinds == {
        ("cpu-walk", "wall", "n/a"),
        ("gpu-kernel", "cuda-events", "warm"),
        ("gpu-host-inclusive", "wall", "n/a"),
        ("floor", "cuda-events", "warm"),
    }
    assert (df[df.timing == "cuda-events"].clock == "cudaEventElapsedTime").all()
    accept_length, expected = expected_means(trace, budget, 4)
    assert (df.accept_length_mean == accept_length).all()
    med = timed.groupby("impl").seconds.median()
    assert med["floor"] <= med["gpu-kernel"] * 1.5  # the empty kernel is no slower than the accept


# ---------------------------------------------------------------------------------------------------------
# the device path's bookkeeping on any machine: CuPy replaced by a numpy stand-in, the kernel by a Python walk


class _HostArray(np.ndarray):
    def get(self, stream=None, order="C", out=None, blocking=True):
        if out is None:
            return np.array(self)
        out[...] = self
        return out


class _Stream:
    ptr = 0

    def __init__(self, non_blocking=False):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass


class _Event:
    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


def _fake_cupy(launched: list):
    cp = types.ModuleType("cupy")
    cp.ndarray, cp.int32, cp.int64 = _HostArray, np.int32, np.int64
    cp.asarray = lambda a, dtype=None: np.array(a, dtype=dtype).view(_HostArray)
    cp.empty = lambda shape, dtype: np.empty(shape, dtype).view(_HostArray)
    cp.asnumpy = lambda a, stream=None, order="C", out=None, *, blocking=True: a.get(stream, order, out)
    cp.cuda = types.SimpleNamespace(
        Stream=_Stream,
        Event=_Event,
        get_elapsed_time=lambda start, end: 0.005,  # milliseconds
        alloc_pinned_memory=bytearray,
        get_current_stream=_Stream,
    )

    class Module:
        def __init__(self, path):
            pass

        def get_function(self, name):
            return lambda grid, block, args, stream=None: launched.append(name)

    cp.RawModule = Module
    return cp


def _python_accept_kernel(grid, block, args, stream=None, shared_mem=0):
    """What kernels/tree_accept/tree_accept.cu computes: node i (1..node_count) with a parent p in 0..i-1 is
    a child of p; from the root, move to the largest-index child whose token is the current node's target
    token."""
    target, tokens, parents, node_count, batch, budget, accepted, length, bonus = args
    for b in range(int(batch)):
        count = min(max(int(node_count[b]), 0), int(budget))
        current, path, token = 0, [0], target[b, 0]
        while True:
            match = -1
            for child in range(current + 1, count + 1):
                if parents[b, child] == current and tokens[b, child - 1] == token:
                    match = child
            if match < 0:
                break
            current = match
            path.append(current)
            token = target[b, current]
        accepted[b, :] = -1
        accepted[b, : len(path)] = path
        length[b], bonus[b] = len(path), token


@pytest.fixture
def fake_device(monkeypatch):
    """``(launched kernel names, set_kernel(fn))`` with CuPy faked and the GPU declared available."""
    launched = []
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(launched))
    monkeypatch.setattr(cuda, "cached_fatbin", lambda *args, **kwargs: "/fake/bench_util.fatbin")
    monkeypatch.setattr(GpuAccept, "unavailable_reason", lambda self: None)
    kernel = [_python_accept_kernel]
    monkeypatch.setattr(GpuAccept, "kernel", property(lambda self: kernel[0]))

    def set_kernel(fn):
        kernel[0] = fn

    return launched, set_kernel


@pytest.mark.parametrize("budget", [8, 256])
def test_device_path_rows_with_a_stand_in_device(trace_path, fake_device, budget):
    launched, _ = fake_device
    df = run(trace_path, budget=budget)
    assert list(df.columns) == list(STAGE_COLUMNS)
    assert (df.status == "ok").all() and df.correct.all()
    assert df[df.impl == "cpu-walk"].status_reason.isna().all()  # the copy is in the interval here
    for impl in IMPLS:
        rows = df[df.impl == impl]
        assert (rows.phase == "warmup").sum() == 2 and (rows.phase == "timed").sum() == 3, impl
        timing, cache = accept_bench.IMPL_TIMING[impl]
        assert (rows.timing == timing).all() and (rows.cache == cache).all()
    events = df[df.timing == "cuda-events"]
    assert (events.seconds == 5e-6).all() and (events.clock == "cudaEventElapsedTime").all()
    # every event-timed launch was queued behind a spin kernel: 5 floor calls, 5 kernel calls
    assert launched.count("ddtree_spin_kernel") == 10 and launched.count("ddtree_empty_kernel") == 5
    accept_length, _ = expected_means(trace_path, budget, 4)
    assert (df.accept_length_mean == accept_length).all()


def test_device_path_a_kernel_that_writes_nothing_is_incorrect(trace_path, fake_device):
    _, set_kernel = fake_device
    set_kernel(lambda grid, block, args, stream=None, shared_mem=0: None)
    df = run(trace_path)
    assert (df.status == "ok").all()
    assert df[df.impl == "cpu-walk"].correct.all()
    assert not df[df.impl.isin(GPU_IMPLS)].correct.any()


def test_device_path_kernel_load_failure_gives_failed_rows(trace_path, fake_device, monkeypatch):
    def broken(path):
        raise RuntimeError("nvcc failed on bench_util.cu:\nerror details")

    monkeypatch.setattr(sys.modules["cupy"], "RawModule", broken)
    df = run(trace_path)
    assert (df[df.impl == "cpu-walk"].status == "ok").all()
    gpu = df[df.impl.isin(GPU_IMPLS)]
    assert len(gpu) == 3 and (gpu.status == "failed").all()
    assert (gpu.status_reason == "RuntimeError: nvcc failed on bench_util.cu:").all()
