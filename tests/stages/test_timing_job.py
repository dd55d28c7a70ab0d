"""``stages.timing_job``: the one entry of a tree-build timing job picks the runner by the catalog's entry and
adds the in-situ rows (or one row saying why)."""

from __future__ import annotations

import pandas as pd
import pytest

from ddtree_bench import catalog
from ddtree_bench.stages import build_gpu, timing_job
from ddtree_bench.stages.timing_job import TimingJob, run_timing_job
from ddtree_bench.traces import generate_trace, save_trace

TIMING = {
    "warmup": 1,
    "repeats": 3,
    "min_seconds": 0.0,
    "max_seconds": None,
    "min_repeats": 1,
    "max_repeats": 3,
}


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "uniform-L4.npz"
    lp, ids = generate_trace("uniform", 4, 4, 16, vocab_size=300, seed=5, device="cpu")
    save_trace(path, lp, ids, distribution="uniform", seed=5)
    return path


def job(builder, trace_path, **fields):
    return TimingJob(builder, str(trace_path), 8, 2, TIMING, machine="m", distribution="uniform", **fields)


def test_a_cpu_builder_is_timed_by_run_benchmark(trace_path):
    rows = run_timing_job(job("reference", trace_path))
    assert set(rows["timing"]) == {"wall"} and (rows["phase"] == "timed").sum() == 3
    assert rows["correct"].all() and (rows["builder"] == "reference").all()


def test_in_situ_where_it_cannot_run_adds_one_row_saying_why(trace_path):
    rows = run_timing_job(job("reference", trace_path), in_situ=True, in_situ_reason="no GPU here")
    in_situ = rows[rows["timing"] == catalog.IN_SITU]
    assert len(in_situ) == 1 and in_situ["status"].iloc[0] == "unavailable"
    assert in_situ["status_reason"].iloc[0] == "in-situ timing needs a CUDA GPU: no GPU here"
    assert (rows.loc[rows["timing"] == "wall", "phase"] == "timed").sum() == 3


def test_a_gpu_runner_gets_the_job_and_the_in_situ_switch(trace_path, monkeypatch):
    calls = []

    def fake(*args, **keywords):
        calls.append((args, keywords))
        return pd.DataFrame({"status": ["ok"], "timing": ["kernel-events"]})

    monkeypatch.setattr(build_gpu, "run_gpu_benchmark", fake)
    rows = run_timing_job(job("gpu", trace_path, correct=True), in_situ=True)
    assert len(rows) == 1  # the gpu runner times its in-situ variants itself
    ((args, keywords),) = calls
    assert (
        args == ("gpu", str(trace_path), 8, 2) and keywords["in_situ"] is True and keywords["correct"] is True
    )
    assert {key: keywords[key] for key in TIMING} == TIMING


def test_a_timing_section_without_a_key_is_one_line(trace_path):
    with pytest.raises(ValueError, match="timing job: the timing section has no 'max_repeats'"):
        run_timing_job(
            TimingJob(
                "reference", str(trace_path), 8, 2, {k: v for k, v in TIMING.items() if k != "max_repeats"}
            )
        )


def test_the_runner_is_the_catalogs():
    assert job("gpu", "t").runner == catalog.GPU and job("native-mt", "t").runner == catalog.CPU
    assert timing_job.TimingJob(object(), "t", 8, 1, TIMING).runner == catalog.CPU  # a builder object
