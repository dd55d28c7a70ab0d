"""``stages.build.run_benchmark`` (given a ``stages.timing_job.TimingJob``): one row per call, warm-up rows
kept and flagged, the stopping rule, GC off while timing, unavailable builders, and the contract's columns."""

from __future__ import annotations

import gc
import math
import time

import numpy as np
import pandas as pd
import pytest

from ddtree_bench.builders import get_builder
from ddtree_bench.builders.base import Builder
from ddtree_bench.stages.build import COLUMNS, read_batch, run_benchmark, unavailable_frame
from ddtree_bench.stages.timing_job import TimingJob
from ddtree_bench.traces import generate_trace, load_trace, save_trace
from ddtree_bench.tree import TreeBatch

BUDGET = 8


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "uniform-L4.npz"
    lp, ids = generate_trace("uniform", 6, 4, 16, vocab_size=300, seed=3, device="cpu")
    save_trace(path, lp, ids, distribution="uniform", seed=3)
    return path


#: The timing section where a test gives no other (``TimingPolicy``'s defaults past the first three).
TIMING = dict(warmup=2, repeats=5, min_seconds=0.0, max_seconds=None, min_repeats=1, max_repeats=None)


def bench(builder, trace_path, budget=BUDGET, batch=4, *, correct=None, input_columns="trace", **timing):
    job = TimingJob(
        builder,
        trace_path,
        budget,
        batch,
        {**TIMING, **timing},
        machine="test-machine",
        distribution="uniform",
        correct=correct,
        input_columns=input_columns,
    )
    return run_benchmark(job)


class RecordingBuilder(Builder):
    """reference's trees, recording what each call saw (GC state, the out buffer), optionally slow."""

    name = "recording"
    label = "recording test builder"

    def __init__(self, sleep=0.0, reason=None, corrupt=False):
        self.sleep, self.reason, self.corrupt = sleep, reason, corrupt
        self.gc_enabled, self.checks = [], 0
        self._reference = get_builder("reference")

    def unavailable_reason(self):
        return self.reason

    def check(self, top_log_probs, top_token_ids, budget):
        self.checks += 1
        return super().check(top_log_probs, top_token_ids, budget)

    def build(self, top_log_probs, top_token_ids, budget):
        budget = self.check(top_log_probs, top_token_ids, budget)
        self.gc_enabled.append(gc.isenabled())
        if self.sleep:
            time.sleep(self.sleep)
        trees = self._reference.build(top_log_probs, top_token_ids, budget)
        if self.corrupt:
            trees.node_token_ids[-1, 0] += 1
        return trees


class OutBuilder(RecordingBuilder):
    def __init__(self):
        super().__init__()
        self.outs = []

    def build(self, top_log_probs, top_token_ids, budget, *, out=None):
        self.outs.append(out)
        return super().build(top_log_probs, top_token_ids, budget)


def test_rows_columns_and_phases(trace_path):
    rows = bench("reference", trace_path, warmup=3, repeats=7)
    assert list(rows.columns) == list(COLUMNS)
    warm = rows[rows["phase"] == "warmup"]
    timed = rows[rows["phase"] == "timed"]
    assert len(warm) == 3 and list(warm["repetition"]) == [0, 1, 2]
    assert len(timed) >= 7 and list(timed["repetition"]) == list(range(len(timed)))
    assert (rows["seconds"] > 0).all()
    assert np.allclose(rows["per_tree_seconds"], rows["seconds"] / 4)
    assert set(rows["status"]) == {"ok"} and rows["correct"].all()
    assert set(rows["timing"]) == {"wall"} and set(rows["cache"]) == {"n/a"}
    first = rows.iloc[0]
    assert (first["builder"], first["budget"], first["batch"], first["depth"]) == ("reference", BUDGET, 4, 4)
    assert first["topk"] == min(BUDGET, 16)
    assert first["distribution"] == "uniform"
    assert first["machine"] == "test-machine"
    assert first["label"] == get_builder("reference").label
    assert "perf_counter_ns" in first["clock"]
    for column in ("hostname", "cpu_model", "cpu_count", "python", "numpy", "timestamp"):
        assert first[column] is not None and first[column] == first[column], column
    assert first["nodes_mean"] == pytest.approx(BUDGET)  # K = 16, L = 4: no heap drain at budget 8


def test_topk_is_min_of_budget_and_trace_columns(trace_path):
    rows = bench("reference", trace_path, budget=32, warmup=0, repeats=1)
    assert set(rows["topk"]) == {16}


class ShapeRecordingBuilder(RecordingBuilder):
    """reference's trees, recording the shape and layout of the arrays each call was handed."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def build(self, top_log_probs, top_token_ids, budget):
        self.seen.append(
            (
                top_log_probs.shape,
                top_token_ids.shape,
                top_log_probs.flags.c_contiguous,
                top_token_ids.flags.c_contiguous,
            )
        )
        return super().build(top_log_probs, top_token_ids, budget)


def test_input_columns_topk_hands_builders_the_first_topk_columns(trace_path):
    lp, ids = load_trace(trace_path).batch(4)
    builder = ShapeRecordingBuilder()
    rows = bench(builder, trace_path, budget=8, warmup=1, repeats=2, input_columns="topk")
    assert builder.seen and set(builder.seen) == {((4, 4, 8), (4, 4, 8), True, True)}
    assert set(rows["topk"]) == {8} and set(rows["input_columns"]) == {8}
    assert rows["correct"].all()  # same trees as reference on the full columns
    expected = get_builder("reference").build(lp, ids, 8)
    trimmed = get_builder("reference").build(
        np.ascontiguousarray(lp[:, :, :8]), np.ascontiguousarray(ids[:, :, :8]), 8
    )
    assert np.array_equal(expected.node_token_ids, trimmed.node_token_ids)


def test_input_columns_trace_hands_builders_every_column(trace_path):
    builder = ShapeRecordingBuilder()
    rows = bench(builder, trace_path, budget=8, warmup=0, repeats=1, input_columns="trace")
    assert set(builder.seen) == {((4, 4, 16), (4, 4, 16), True, True)}
    assert set(rows["topk"]) == {8} and set(rows["input_columns"]) == {16}
    # a budget above K: "topk" has nothing to cut, the builder gets all K columns
    builder = ShapeRecordingBuilder()
    rows = bench(builder, trace_path, budget=32, warmup=0, repeats=1, input_columns="topk")
    assert set(builder.seen) == {((4, 4, 16), (4, 4, 16), True, True)}
    assert set(rows["input_columns"]) == {16}


def test_input_columns_must_be_known(trace_path):
    with pytest.raises(ValueError, match="input_columns must be one of topk, trace, got 'all'"):
        bench("reference", trace_path, input_columns="all")


def test_gc_is_off_while_timing_and_restored(trace_path):
    builder = RecordingBuilder()
    assert gc.isenabled()
    bench(builder, trace_path, warmup=2, repeats=4)
    assert builder.gc_enabled and not any(builder.gc_enabled)
    assert gc.isenabled()


def test_inputs_are_validated_once_not_per_timed_call(trace_path):
    builder = RecordingBuilder()
    rows = bench(builder, trace_path, warmup=2, repeats=6)
    assert len(rows) >= 8
    assert builder.checks == 1


def test_gc_stays_off_if_it_was_off(trace_path):
    gc.disable()
    try:
        bench(RecordingBuilder(), trace_path, warmup=0, repeats=1)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_min_seconds_keeps_timing_past_repeats(trace_path):
    rows = bench(RecordingBuilder(sleep=0.002), trace_path, warmup=0, repeats=2, min_seconds=0.05)
    timed = rows[rows["phase"] == "timed"]
    assert len(timed) > 2
    assert timed["seconds"].sum() >= 0.045


def test_max_seconds_caps_a_slow_configuration_after_min_repeats(trace_path):
    rows = bench(
        RecordingBuilder(sleep=0.02),
        trace_path,
        warmup=1,
        repeats=50,
        min_seconds=10.0,
        max_seconds=0.05,
        min_repeats=2,
    )
    timed = rows[rows["phase"] == "timed"]
    assert 2 <= len(timed) <= 4


def test_max_repeats_caps_a_fast_configuration(trace_path):
    rows = bench("reference", trace_path, warmup=0, repeats=3, min_seconds=60.0, max_repeats=5)
    assert (rows["phase"] == "timed").sum() == 5


def test_preallocated_output_is_reused_where_the_builder_takes_one(trace_path):
    builder = OutBuilder()
    bench(builder, trace_path, warmup=1, repeats=3)
    assert len(builder.outs) >= 4
    assert all(isinstance(o, TreeBatch) for o in builder.outs)
    assert all(o is builder.outs[0] for o in builder.outs)


def test_unavailable_builder_gives_one_row_with_the_reason(trace_path):
    rows = bench(RecordingBuilder(reason="no such device here"), trace_path)
    assert len(rows) == 1
    row = rows.iloc[0]
    assert row["status"] == "unavailable" and row["status_reason"] == "no such device here"
    assert math.isnan(row["seconds"]) and row["budget"] == BUDGET and row["batch"] == 4
    assert list(rows.columns) == list(COLUMNS)


def test_unavailable_frame_for_a_left_out_builder():
    rows = unavailable_frame("gpu", "no CUDA device\n(details)", machine="m")
    assert list(rows.columns) == list(COLUMNS)
    row = rows.iloc[0]
    assert row["status_reason"] == "no CUDA device (details)" and row["machine"] == "m"
    assert (row["label"], row["budget"], row["batch"]) == ("gpu", 0, 0)  # every configuration
    assert all(pd.isna(row[k]) for k in ("depth", "topk", "input_columns", "distribution", "trace_sha256"))


def test_unavailable_frame_names_a_configuration():
    fields = dict(label="GPU", budget=8, batch=4, depth=6, topk=8, input_columns=16, distribution="bf16")
    rows = unavailable_frame("gpu", "no CUDA device", machine="m", fields={**fields, "trace_sha256": "ab"})
    row = rows.iloc[0]
    assert {k: row[k] for k in fields} == fields and row["trace_sha256"] == "ab"
    with pytest.raises(ValueError, match=r"unknown row fields \['seconds'\]"):
        unavailable_frame("gpu", "no CUDA device", fields={"seconds": 1.0})


def test_correctness_is_checked_when_not_given(trace_path):
    assert bench(RecordingBuilder(), trace_path, repeats=1)["correct"].all()
    assert not bench(RecordingBuilder(corrupt=True), trace_path, repeats=1)["correct"].any()
    assert bench(RecordingBuilder(corrupt=True), trace_path, repeats=1, correct=True)["correct"].all()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"budget": 0}, "budget must be >= 1"),
        ({"batch": 7}, "batch 7 is larger than the 6 requests"),
        ({"batch": 0}, "batch must be an integer >= 1"),
        ({"repeats": 0}, "repeats must be an integer >= 1"),
        ({"warmup": -1}, "warmup must be an integer >= 0"),
        ({"min_seconds": float("nan")}, "min_seconds must be a finite number"),
        ({"max_repeats": 2, "repeats": 3}, "max_repeats (2) must be >= repeats (3)"),
    ],
)
def test_bad_arguments_are_value_errors(trace_path, overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        bench("reference", trace_path, **overrides)


def test_missing_trace_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="file not found"):
        bench("reference", tmp_path / "nope.npz")


def test_native_builder_times_and_is_correct(trace_path):
    native = get_builder("native")
    if native.unavailable_reason():
        pytest.skip(native.unavailable_reason())
    rows = bench("native", trace_path, warmup=1, repeats=3)
    assert set(rows["status"]) == {"ok"} and rows["correct"].all()
    assert set(rows["threads"]) == {1}


@pytest.mark.parametrize("batch", [1, 4, 6])
def test_read_batch_is_the_first_requests_of_the_trace(trace_path, batch):
    lp, ids, columns, metadata = read_batch(trace_path, batch)
    expected_lp, expected_ids = load_trace(trace_path).batch(batch)
    assert np.array_equal(lp, expected_lp) and np.array_equal(ids, expected_ids)
    assert lp.dtype == np.float32 and ids.dtype == np.int64 and lp.flags.c_contiguous and lp.flags.writeable
    assert columns == 16 and metadata["distribution"] == "uniform" and metadata["seed"] == 3


def test_read_batch_of_a_compressed_archive_falls_back_to_the_full_loader(tmp_path, trace_path):
    trace = load_trace(trace_path)
    path = tmp_path / "compressed.npz"
    np.savez_compressed(path, top_log_probs=trace.top_log_probs, top_token_ids=trace.top_token_ids)
    lp, ids, columns, _ = read_batch(path, 2)
    assert np.array_equal(lp, trace.top_log_probs[:2]) and columns == 16


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda lp, ids: lp.__setitem__((0, 1, 2), np.nan), "non-finite"),
        (lambda lp, ids: ids.__setitem__((1, 0, 0), -5), "negative token id"),
        (lambda lp, ids: lp.__setitem__((0, 0, 0), -50.0), "sorted descending"),
    ],
)
def test_read_batch_validates_the_batch(tmp_path, trace_path, mutate, message):
    trace = load_trace(trace_path)
    lp, ids = trace.top_log_probs.copy(), trace.top_token_ids.copy()
    mutate(lp, ids)
    path = tmp_path / "bad.npz"
    np.savez(path, top_log_probs=lp, top_token_ids=ids)
    with pytest.raises(ValueError, match=message):
        read_batch(path, 2)
    with pytest.raises(ValueError, match=message):
        bench("reference", path, batch=2)


def test_read_batch_refuses_a_file_that_is_not_a_trace(tmp_path):
    path = tmp_path / "junk.npz"
    path.write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="junk.npz"):
        read_batch(path, 1)
    np.savez(tmp_path / "half.npz", top_log_probs=np.zeros((2, 2, 2), np.float32))
    with pytest.raises(ValueError, match="missing array"):
        read_batch(tmp_path / "half.npz", 1)


def test_every_row_records_the_traces_sha256(trace_path):
    """Rows name their inputs: the trace's sha256 (the digest stored in the file, of its arrays)."""
    digest = load_trace(trace_path).sha256
    assert len(digest) == 64
    rows = bench("reference", trace_path, warmup=1, repeats=2)
    assert set(rows["trace_sha256"]) == {digest}
    missing = bench(RecordingBuilder(reason="not here"), trace_path)
    assert list(missing["status"]) == ["unavailable"] and set(missing["trace_sha256"]) == {digest}
