"""The CUDA tree builder: compiles everywhere (CI has nvcc, no GPU); on a GPU it must build exactly the
reference's trees, ties included, on every distribution and shape edge."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gpu_inputs import KINDS, topk_inputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddtree_bench.builders import get_builder
from ddtree_bench.builders.gpu import (
    BOOL_IN_BUILD_MAX_BUDGET,
    BOOL_IN_BUILD_MIN_BATCH,
    STATIC_SHARED_BYTES,
    GpuBuilder,
    plan_launch,
    warp_shared_bytes,
    warp_slots,
)
from ddtree_bench.cuda import loader as cuda
from ddtree_bench.stages.build_gpu import run_gpu_benchmark
from ddtree_bench.stages.timing_job import TimingJob
from ddtree_bench.traces import save_trace
from ddtree_bench.tree import first_difference, packed_visibility

GPU_REASON = cuda.gpu_unavailable_reason()
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"needs a CUDA GPU: {GPU_REASON}")


@pytest.mark.skipif(cuda.find_nvcc() is None, reason="nvcc not found")
def test_kernels_compile_for_configured_archs(tmp_path):
    out = tmp_path / "tree_build.fatbin"
    info = cuda.build_fatbin(cuda.TREE_BUILD_SOURCE, out, ["sm_90", "sm_120"])
    assert out.stat().st_size > 10_000
    assert info["archs"] == ["sm_120", "sm_90"] and info["ptx"] == "compute_120"
    assert json.loads((tmp_path / "tree_build.fatbin.json").read_text())["archs"] == info["archs"]


@pytest.mark.skipif(cuda.find_nvcc() is None, reason="nvcc not found")
@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
def test_static_shared_memory_within_what_the_plan_reserves_ptxas(tmp_path, arch):
    """ptxas's count of the parallel kernel's static __shared__ bytes fits what plan_launch keeps free for
    them (the rest of the block's shared memory goes to the pool)."""
    cmd = [cuda.find_nvcc(), *cuda.NVCC_FLAGS, "-cubin", f"-arch={arch}", "-Xptxas", "-v"]
    cmd += ["-o", str(tmp_path / "k.cubin"), str(cuda.TREE_BUILD_SOURCE)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry = proc.stderr.split("Compiling entry function 'ddtree_build_tree'")[1]
    static = int(re.search(r"(\d+) bytes smem", entry).group(1))
    assert 0 < static <= STATIC_SHARED_BYTES


@pytest.mark.skipif(cuda.find_nvcc() is None, reason="nvcc not found")
def test_compile_error_is_reported(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void k() { this is not C++ }\n')
    with pytest.raises(RuntimeError, match="nvcc failed"):
        cuda.build_fatbin(bad, tmp_path / "bad.fatbin", ["sm_90"])
    assert not (tmp_path / "bad.fatbin").exists()


def test_cached_fatbin_is_rebuilt_when_a_header_changes(tmp_path, monkeypatch):
    built = []

    def fake_build(source, output, archs):
        built.append(Path(output))
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_bytes(b"fatbin")
        return {}

    monkeypatch.setattr(cuda, "build_fatbin", fake_build)
    monkeypatch.setenv("DDTREE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "k.cu").write_text('#include "k.cuh"\n')
    (tmp_path / "k.cuh").write_text("// one\n")
    first = cuda.cached_fatbin(tmp_path / "k.cu", ["sm_90"])
    assert cuda.cached_fatbin(tmp_path / "k.cu", ["sm_90"]) == first and len(built) == 1
    (tmp_path / "k.cuh").write_text("// two\n")
    second = cuda.cached_fatbin(tmp_path / "k.cu", ["sm_90"])
    assert second != first and built == [first, second]


def test_unknown_arch_is_refused():
    with pytest.raises(ValueError, match="unknown CUDA architecture"):
        cuda.gencode_flags(["gfx90a"])


def test_launch_plan_refuses_shapes_it_cannot_take():
    with pytest.raises(ValueError, match="depth"):
        plan_launch(1, 33, 8, 8, 232_448, "parallel")  # the pool and warp paths take L <= 32
    assert plan_launch(1, 33, 8, 8, 232_448).path == "wide"  # the wide path any depth up to 4096
    with pytest.raises(ValueError, match="depth"):
        plan_launch(1, 4097, 8, 8, 232_448)
    with pytest.raises(ValueError, match="budget"):
        plan_launch(1, 16, 8, 4096, 232_448)
    with pytest.raises(ValueError, match="shared memory"):
        plan_launch(1, 16, 1024, 2048, 48 * 1024)
    plan = plan_launch(64, 16, 1024, 1024, 232_448)
    assert plan.cap >= 2 * 1024 and plan.shared_bytes <= 232_448 - 2048


def test_launch_plan_picks_the_warp_heap_for_small_budgets():
    for budget in (1, 8, 32, 64):
        plan = plan_launch(64, 16, budget, budget, 232_448)
        assert (plan.path, plan.threads) == ("warp-heap", 32)
    assert plan_launch(64, 16, 65, 65, 232_448).path == "parallel"
    forced = plan_launch(1, 32, 1000, 128, 232_448, "warp-heap")
    assert forced.path == "warp-heap" and forced.shared_bytes == warp_shared_bytes(128, 32, 128)
    assert plan_launch(1, 16, 64, 64, 232_448, "parallel").path == "parallel"
    assert [warp_slots(n) for n in (1, 32, 33, 64, 65, 128)] == [1, 1, 2, 2, 4, 4]


@pytest.fixture(scope="module")
def gpu():
    return get_builder("gpu")


@pytest.fixture(scope="module")
def gpu_heap():
    return get_builder("gpu", force_heap=True)


@pytest.fixture(scope="module")
def gpu_warp():
    """The warp heap forced up to its limit (budget 128)."""
    return get_builder("gpu", path="warp-heap")


@pytest.fixture(scope="module")
def gpu_parallel():
    """The parallel pool path forced for every budget (small budgets otherwise take the warp heap)."""
    return get_builder("gpu", path="parallel")


def assert_same(lp, ids, budget, builder):
    expected = get_builder("reference").build(lp, ids, budget)
    actual = builder.build(lp, ids, budget)
    diff = first_difference(expected, actual)
    assert diff is None, diff
    np.testing.assert_array_equal(builder.last_visibility_bits, packed_visibility(expected.visibility))
    return builder.last_stats


@needs_gpu
def test_static_shared_memory_within_what_the_plan_reserves(gpu):
    """The parallel kernel's static __shared__ arrays fit the bytes plan_launch keeps free for them (the rest
    of the block's shared memory goes to the pool)."""
    assert 0 < gpu.kernels.build.shared_size_bytes <= STATIC_SHARED_BYTES


@needs_gpu
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("budget", [1, 2, 3, 8, 16, 31, 64, 100, 256, 1024, 2048])
def test_gpu_equals_reference(gpu, gpu_heap, gpu_parallel, gpu_warp, kind, budget):
    depth, k = 16, min(budget, 256) if budget > 256 else budget
    batch = 2 if budget >= 256 else 4
    lp, ids = topk_inputs(kind, batch, depth, max(k, 1), seed=budget)
    stats = assert_same(lp, ids, budget, gpu)
    assert stats.shape == (batch,)
    if budget <= 256:
        assert (assert_same(lp, ids, budget, gpu_heap) == 3).all()
    if budget <= 128:
        assert (assert_same(lp, ids, budget, gpu_parallel) <= 2).all()
        assert (assert_same(lp, ids, budget, gpu_warp) == 4).all()


@needs_gpu
@pytest.mark.parametrize(
    "batch,depth,k,budget",
    [
        (3, 1, 5, 8),
        (2, 1, 40, 8),
        (2, 2, 3, 64),
        (1, 3, 2, 100),
        (2, 16, 4, 64),
        (2, 4, 1024, 64),
        (1, 32, 16, 512),
        (5, 8, 1, 8),
        (1, 1, 1, 1),
        (2, 16, 64, 1024),
        (1, 16, 2048, 2048),
        (1, 32, 1024, 1024),
        (2, 32, 2, 128),
        (3, 32, 200, 33),
        (2, 20, 3, 65),
    ],
)
def test_gpu_shape_edges(gpu, gpu_parallel, gpu_warp, batch, depth, k, budget):
    """K < N, K > N, heap drain (n < N), L = 1, K = 1, deep trees; every path that takes the shape."""
    for kind in ("uniform", "bf16", "equal"):
        lp, ids = topk_inputs(kind, batch, depth, k, vocab=max(k, 64), seed=k + depth)
        assert_same(lp, ids, budget, gpu)
        assert_same(lp, ids, budget, gpu_parallel)
        if budget <= 128:
            assert (assert_same(lp, ids, budget, gpu_warp) == 4).all()


@needs_gpu
@pytest.mark.parametrize("budget", [8, 64, 256])
def test_gpu_batch_512(gpu, gpu_parallel, budget):
    """The largest batch in the contract (one block per request): every path, every tree equal."""
    for kind in ("peaked", "bf16"):
        lp, ids = topk_inputs(kind, 512, 16, budget, seed=budget)
        assert_same(lp, ids, budget, gpu)
        assert_same(lp, ids, budget, gpu_parallel)


@needs_gpu
@pytest.mark.parametrize("budget", [1, 3, 7, 15, 16, 100, 257, 1024])
@pytest.mark.parametrize("batch", [1, 3, 5])
def test_bool_mask_written_by_the_build_kernel_or_the_expansion(batch, budget):
    """The parallel kernel's own bool rows (16-byte chunks inside a tree, single bytes where a chunk is
    shared with the neighbouring trees, byte by byte below 16 columns) equal the expansion kernel's and the
    reference's."""
    lp, ids = topk_inputs("bf16", batch, 16, budget, seed=batch * budget)
    for in_build in (True, False):
        builder = get_builder("gpu", path="parallel", bool_in_build=in_build)
        assert builder.bool_in_build_kernel(builder.plan(batch, 16, budget, budget)) is in_build
        assert_same(lp, ids, budget, builder)


def test_bool_mask_goes_into_the_build_kernel_at_mid_budgets_and_large_batches():
    builder = GpuBuilder()
    for budget in (128, BOOL_IN_BUILD_MAX_BUDGET, BOOL_IN_BUILD_MAX_BUDGET + 1, 1024):
        for batch in (1, BOOL_IN_BUILD_MIN_BATCH - 1, BOOL_IN_BUILD_MIN_BATCH, 512):
            plan = plan_launch(batch, 16, budget, budget, 227 * 1024)
            expected = budget <= BOOL_IN_BUILD_MAX_BUDGET and batch >= BOOL_IN_BUILD_MIN_BATCH
            assert builder.bool_in_build_kernel(plan) is expected
    assert GpuBuilder(bool_in_build=True).bool_in_build_kernel(plan) is True


@needs_gpu
@pytest.mark.parametrize("budget,path", [(8, 4), (33, 4), (64, 4), (65, 0), (256, 0), (1024, 0)])
def test_fast_paths_are_taken_on_ordinary_inputs(gpu, budget, path):
    """Budgets <= 64: the warp heap (stat 4); larger: the parallel pool path (stat 0), no fallback."""
    for kind in ("uniform", "peaked", "bf16"):
        lp, ids = topk_inputs(kind, 4, 16, budget, seed=3)
        stats = assert_same(lp, ids, budget, gpu)
        assert (stats == path).all(), (kind, stats)


@needs_gpu
@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    batch=st.integers(1, 3),
    depth=st.integers(1, 20),
    k=st.integers(1, 48),
    budget=st.integers(1, 160),
    kind=st.sampled_from(KINDS),
    seed=st.integers(0, 2**31 - 1),
)
def test_gpu_property(gpu, gpu_parallel, gpu_warp, batch, depth, k, budget, kind, seed):
    lp, ids = topk_inputs(kind, batch, depth, k, vocab=max(64, k), seed=seed)
    builder = (gpu, gpu_parallel, gpu_warp)[seed % 3]
    if builder is gpu_warp and budget > 128:
        builder = gpu
    assert_same(lp, ids, budget, builder)


@needs_gpu
@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer not installed")
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_sanitizer_clean(tool):
    cmd = [
        "compute-sanitizer",
        f"--tool={tool}",
        "--error-exitcode=9",
        sys.executable,
        "-m",
        "ddtree_bench.builders.selftest",
        "--budgets",
        "8",
        "32",
        "256",
        "1024",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = proc.stdout + proc.stderr
    assert "ERROR SUMMARY: 0 errors" in report or "RACECHECK SUMMARY: 0 hazards" in report, report[-2000:]


@needs_gpu
def test_gpu_benchmark_rows(tmp_path):
    """Every timing kind is measured in the same run, on trees checked equal to the reference's."""
    lp, ids = topk_inputs("peaked", 8, 16, 64, seed=5)
    trace = tmp_path / "trace.npz"
    save_trace(trace, lp, ids, distribution="peaked")
    timing = dict(warmup=1, repeats=5, min_seconds=0.0, max_seconds=None, min_repeats=1, max_repeats=None)
    df = run_gpu_benchmark(TimingJob("gpu", trace, 64, 8, timing, machine="test", distribution="peaked"))
    timed = df[df.phase == "timed"]
    kinds = set(zip(timed.timing, timed.cache, strict=True))
    assert kinds == {
        ("floor", "warm"),
        ("kernel-events", "warm"),
        ("kernel-events", "cold"),
        ("kernel-events-packed", "warm"),
        ("kernel-events-packed", "cold"),
        ("graph-replay", "warm"),
        ("host-inclusive", "n/a"),
    }
    assert (timed.groupby(["timing", "cache"]).size() >= 5).all()
    assert timed.correct.all() and (timed.status == "ok").all() and (timed.nodes_mean == 64).all()
    med = timed.groupby("timing").seconds.median()
    assert med["floor"] < med["kernel-events"] < med["host-inclusive"]
    assert (df.phase == "warmup").any()
