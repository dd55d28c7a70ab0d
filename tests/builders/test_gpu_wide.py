"""The wide single-tree path of the CUDA tree builder (``ddtree_build_tree_wide``): the plan's choice of
path by its cost model (CPU), and on a GPU exactness against the reference, both mask formats, SGLang's
regime (L = N, K = N) and its fallback."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_inputs import KINDS, topk_inputs

from ddtree_bench.builders import get_builder
from ddtree_bench.builders.gpu import (
    MAX_DEPTH,
    GpuBuilder,
    PathCosts,
    choose_path,
    plan_launch,
    wide_shared_bytes,
)
from ddtree_bench.cuda import loader as cuda
from ddtree_bench.tree import first_difference, packed_visibility

GPU_REASON = cuda.gpu_unavailable_reason()
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"needs a CUDA GPU: {GPU_REASON}")
H200_SHARED, H200_SMS = 232448, 132


def test_plan_takes_the_wide_path_for_deep_trees():
    """Only the wide path takes L > 32 (SGLang's regime at N > 32), whatever the batch."""
    for batch in (1, 64, 4096):
        assert choose_path(batch, 1024, 1024, H200_SMS) == "wide"
        assert plan_launch(batch, 1024, 1024, 1024, H200_SHARED).path == "wide"
    with pytest.raises(ValueError, match="depth"):
        plan_launch(1, MAX_DEPTH + 1, 64, 64, H200_SHARED, path="parallel")


def test_plan_picks_the_cheapest_path_by_its_cost_model():
    costs = PathCosts()
    for batch in (1, 2, 8, 64, 1024):
        for budget in (1, 8, 64, 65, 256, 1024):
            got = choose_path(batch, 16, budget, H200_SMS, costs)
            options = ["parallel"] + (["warp-heap"] if budget <= 64 else [])
            options += ["wide"] if batch <= costs.wide_max_batch else []
            assert got in options
            assert costs.cost(got, batch, budget, H200_SMS) == min(
                costs.cost(p, batch, budget, H200_SMS) for p in options
            )
    # calibrated constants move the choice: a slow wide path leaves batch 1 to the old paths
    slow = PathCosts(wide_base=1000.0)
    assert choose_path(1, 16, 8, H200_SMS, slow) == "warp-heap"
    assert choose_path(1, 16, 1024, H200_SMS, slow) == "parallel"
    fast = PathCosts(wide_max_batch=64)
    assert choose_path(64, 16, 1024, H200_SMS, fast) == "wide"
    # a batch beyond the SMs takes waves: the warp heap (16 trees an SM) wins small budgets there
    assert choose_path(8192, 16, 8, H200_SMS, PathCosts(wide_max_batch=10**9)) == "warp-heap"


def test_wide_plan_fits_shared_memory_and_holds_the_fallback_heap():
    for budget in (1, 2, 7, 64, 255, 1024, 2048):
        plan = plan_launch(1, budget, budget, budget, H200_SHARED, path="wide")
        assert plan.shared_bytes == wide_shared_bytes(plan.cap, budget, budget)
        assert plan.shared_bytes <= H200_SHARED - 3072
        assert plan.cap >= budget + 2
        assert plan.threads * 8 >= budget and plan.threads <= 1024


def _assert_equal(lp, ids, budget, packed_only=False, **kw):
    gpu = GpuBuilder(path="wide", **kw)
    got = gpu.build(lp, ids, budget)
    want = get_builder("reference").build(lp, ids, budget)
    assert first_difference(want, got) is None
    np.testing.assert_array_equal(gpu.last_visibility_bits, packed_visibility(want.visibility))
    return gpu.last_stats


@needs_gpu
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("budget", [1, 2, 7, 8, 31, 64, 100, 128, 256, 333, 512, 1024])
def test_wide_equals_reference(kind, budget):
    lp, ids = topk_inputs(kind, 2, 16, budget, seed=budget)
    stats = _assert_equal(lp, ids, budget)
    assert set(stats.tolist()) <= {5, 6, 7}


@needs_gpu
@pytest.mark.parametrize("kind", ["uniform", "peaked", "bf16", "certain"])
@pytest.mark.parametrize("budget", [8, 16, 32, 64, 128, 256, 512, 1024])
def test_wide_sglang_regime(kind, budget):
    lp, ids = topk_inputs(kind, 1, budget, budget, seed=budget)
    stats = _assert_equal(lp, ids, budget)
    if kind in ("uniform", "peaked"):
        assert stats.tolist() == [5]


@needs_gpu
def test_wide_falls_back_on_the_rounding_inputs():
    lp, ids = topk_inputs("rounding", 3, 8, 16)
    assert (_assert_equal(lp, ids, 16) == 6).all()


@needs_gpu
@pytest.mark.parametrize("budget", [64, 1024])
def test_wide_packed_only_leaves_the_same_bits(budget):
    import cupy as cp  # noqa: PLC0415

    lp, ids = topk_inputs("peaked", 1, budget, budget, seed=1)
    gpu = GpuBuilder(path="wide")
    plan = gpu.plan(1, budget, budget, budget)
    out_packed, _ = gpu.build_device(lp, ids, budget, bool_visibility=False)
    want = get_builder("reference").build(lp, ids, budget)
    np.testing.assert_array_equal(cp.asnumpy(out_packed.visibility_bits), packed_visibility(want.visibility))
    assert plan.path == "wide"


@needs_gpu
def test_default_plan_on_this_gpu_is_exact_in_sglang_regime():
    for budget in (8, 64, 256):
        lp, ids = topk_inputs("bf16", 1, budget, budget, seed=budget)
        got = GpuBuilder().build(lp, ids, budget)
        assert first_difference(get_builder("reference").build(lp, ids, budget), got) is None
