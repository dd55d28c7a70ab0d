"""The tensor-parallel communication harness: the round's collectives (count, sizes) and the harness run on
two CPU processes over torch.distributed's gloo backend (NCCL numbers need a multi-GPU host)."""

from __future__ import annotations

import pytest

from ddtree_bench.k26.allreduce import collective_plan, measure_collectives, plan_bytes
from ddtree_bench.k26.shapes import ModelShape
from ddtree_bench.stages import allreduce
from ddtree_bench.timing.records import STAGE_COLUMNS

TIMING = {
    "warmup": 1,
    "repeats": 2,
    "min_repeats": 1,
    "max_repeats": 5,
    "min_seconds": 0.0,
    "max_seconds": 1.0,
}


def test_plan_of_a_k26_round():
    plan = collective_plan(tokens=9, hidden=7168, layers=61, draft_rows=15, topk=8)
    reduces = [c for c in plan if c.op == "all-reduce"]
    gathers = [c for c in plan if c.op == "all-gather"]
    assert len(reduces) == 122 and all(c.numel == 9 * 7168 and c.dtype == "bfloat16" for c in reduces)
    assert [(c.numel, c.dtype) for c in gathers] == [(120, "float32"), (120, "int64"), (15, "float32")]
    assert plan_bytes(plan) == 122 * 9 * 7168 * 2 + 120 * 4 + 120 * 8 + 15 * 4
    assert len(collective_plan(9, 7168, 61, 0, 8)) == 122  # no drafter rows: no all-gathers
    with pytest.raises(ValueError, match="layers must be >= 1"):
        collective_plan(9, 7168, 0, 15, 8)


def test_measure_rejects_bad_worlds():
    with pytest.raises(ValueError, match="world size must be >= 2"):
        measure_collectives([], world=1, backend="gloo")
    with pytest.raises(ValueError, match="backend must be one of"):
        measure_collectives([], world=2, backend="mpi")


def test_gloo_harness_runs_and_checks_every_collective():
    pytest.importorskip("torch", reason="the harness runs on torch.distributed (PyTorch not installed)")
    plan = collective_plan(tokens=3, hidden=64, layers=2, draft_rows=2, topk=4)
    status, samples = measure_collectives(plan, world=2, backend="gloo", warmup=1, repeats=3, timeout=120)
    assert status == "ok", samples
    assert [(p, r) for p, r, _ in samples] == [("warmup", 0), ("timed", 0), ("timed", 1), ("timed", 2)]
    assert all(seconds > 0 for *_, seconds in samples)


def test_allreduce_stage_rows_over_gloo():
    pytest.importorskip("torch", reason="the harness runs on torch.distributed (PyTorch not installed)")
    shape = ModelShape(
        hidden=64,
        layers=2,
        dense_layers=1,
        experts=8,
        top_k=2,
        moe_intermediate=64,
        shared_intermediate=64,
        dense_intermediate=64,
        heads=8,
        vocab=64,
        tp=2,
    )
    rows = allreduce.run(
        allreduce.Job(
            batch=1,
            budgets=(2, 4),
            shape=shape,
            world_size=2,
            block_size=4,
            follow_budget=False,
            topk=4,
            timing=TIMING,
            machine="m",
            backend="gloo",
        )
    )
    assert set(rows) == {2, 4}
    for budget, frame in rows.items():
        assert list(frame.columns) == list(STAGE_COLUMNS)
        assert set(frame["status"]) == {"ok"}
        assert set(frame["stage"]) == {"allreduce"} and set(frame["impl"]) == {"gloo"}
        assert set(frame["world_size"]) == {2} and set(frame["tokens"]) == {budget + 1}
        assert (frame[frame["phase"] == "timed"]["seconds"] > 0).all()
        assert frame["bytes"].iloc[0] == plan_bytes(collective_plan(budget + 1, 64, 2, 3, min(budget, 4)))


def test_allreduce_stage_without_gpus_says_it_uses_the_estimate():
    torch = pytest.importorskip("torch", reason="PyTorch not installed: the stage says so instead")
    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("this host has several GPUs: the stage measures")
    rows = allreduce.run(
        allreduce.Job(
            batch=1,
            budgets=(8,),
            shape=ModelShape(),
            world_size=8,
            block_size=16,
            follow_budget=False,
            topk=8,
            timing=TIMING,
            machine="m",
        )
    )
    frame = rows[8]
    assert set(frame["status"]) == {"unavailable"}
    assert (
        "needs >= 2 GPUs" in frame["status_reason"].iloc[0] and "estimate" in frame["status_reason"].iloc[0]
    )
