"""``stages.timing_job``: the one entry of a tree-build timing job picks the runner by the catalog's entry,
adds the in-situ rows (or one row saying why) and the job's number; ``TimingJob.from_settings`` takes what
the settings say."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pandas as pd
import pytest

from ddtree_bench import catalog
from ddtree_bench.paths import layout
from ddtree_bench.settings import Settings
from ddtree_bench.stages import build, build_gpu
from ddtree_bench.stages.timing_job import TimingJob, run
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
    rows = run(job("reference", trace_path))
    assert set(rows["timing"]) == {"wall"} and (rows["phase"] == "timed").sum() == 3
    assert rows["correct"].all() and (rows["builder"] == "reference").all()
    assert list(rows.columns) == [*build.COLUMNS, build.JOB_COLUMN] and set(rows["job"]) == {1}


def test_every_row_records_the_jobs_number(trace_path):
    rows = run(job("reference", trace_path, job=3, in_situ=True, in_situ_reason="no GPU here"))
    assert len(rows) == 5 and list(rows["job"]) == [3] * 5  # the warm-up, the timed calls, the in-situ row
    assert rows["job"].dtype == "int64"
    with pytest.raises(ValueError, match="timing job must be an integer >= 1, got 0"):
        job("reference", trace_path, job=0)


def test_in_situ_where_it_cannot_run_adds_one_row_saying_why(trace_path):
    rows = run(job("reference", trace_path, in_situ=True, in_situ_reason="no GPU here"))
    in_situ = rows[rows["timing"] == catalog.IN_SITU]
    assert len(in_situ) == 1 and in_situ["status"].iloc[0] == "unavailable"
    assert in_situ["status_reason"].iloc[0] == "in-situ timing needs a CUDA GPU: no GPU here"
    assert (rows.loc[rows["timing"] == "wall", "phase"] == "timed").sum() == 3


def test_a_gpu_runner_gets_the_whole_job(trace_path, monkeypatch):
    calls = []

    def fake(job):
        calls.append(job)
        return pd.DataFrame({"status": ["ok"], "timing": ["kernel-events"]})

    monkeypatch.setattr(build_gpu, "run_gpu_benchmark", fake)
    given = job("gpu", trace_path, correct=True, in_situ=True)
    rows = run(given)
    assert len(rows) == 1 and rows["job"].tolist() == [1]  # the gpu runner times its in-situ variants itself
    assert calls == [given] and calls[0].timing == TIMING


def test_a_timing_section_without_a_key_is_one_line(trace_path):
    with pytest.raises(ValueError, match="timing job: the timing section has no 'max_repeats'"):
        TimingJob("reference", str(trace_path), 8, 2, {k: v for k, v in TIMING.items() if k != "max_repeats"})


def test_a_trace_of_another_depth_is_one_line(trace_path):
    with pytest.raises(ValueError, match="has depth 4, not the job's 6"):
        run(job("reference", trace_path, depth=6))
    assert (run(job("reference", trace_path, depth=4))["depth"] == 4).all()


def test_the_job_is_frozen_and_holds_only_the_timing_keys(trace_path):
    timed = TimingJob("reference", str(trace_path), 8, 2, {**TIMING, "jobs": 3, "in_situ": True})
    assert timed.timing == TIMING
    with pytest.raises(dataclasses.FrozenInstanceError):
        timed.budget = 16


def test_the_runner_is_the_catalogs():
    assert job("gpu", "t").runner == catalog.GPU and job("native-mt", "t").runner == catalog.CPU
    assert TimingJob(object(), "t", 8, 1, TIMING).runner == catalog.CPU  # a builder object


def _settings(**overrides) -> Settings:
    config = {
        "budgets": [8],
        "batch_sizes": [2],
        "depths": [4],
        "distributions": ["uniform"],
        "machine": "settings-machine",
        "timing": {
            "warmup": 0,
            "repeats": 2,
            "min_repeats": 1,
            "max_repeats": 4,
            "min_seconds": 0.0,
            "jobs": 2,
            "in_situ": False,
        },
        "step": {"enabled": False},
        **overrides,
    }
    return Settings.from_config(config)


def test_from_settings_takes_the_settings_timing_machine_and_columns(trace_path, tmp_path):
    settings = _settings()
    results = tmp_path / "results"
    made = TimingJob.from_settings(
        settings,
        builder="reference",
        distribution="uniform",
        depth="4",
        budget="8",
        batch="2",
        job=2,
        results=results,
    )
    trace = layout(settings, results).trace_of("uniform", 4)
    assert made == TimingJob(
        builder="reference",
        trace_path=trace,
        budget=8,
        batch=2,
        timing=settings.timing.options(),
        machine="settings-machine",
        distribution="uniform",
        builder_options={},
        input_columns=settings.builder_input_columns,
        depth=4,
        job=2,
        in_situ=False,
    )
    Path(trace).parent.mkdir(parents=True)
    shutil.copy(trace_path, trace)
    rows = run(made)
    assert set(rows["machine"]) == {"settings-machine"} and set(rows["job"]) == {2}
    assert set(rows["input_columns"]) == {8}  # "topk": the first min(N, K) columns
    assert (rows["phase"] == "timed").sum() >= settings.timing.repeats


def test_from_settings_takes_the_configured_builder_options_and_the_built_libraries():
    settings = _settings(timing={"in_situ": True})
    made = TimingJob.from_settings(
        settings, builder="sglang", distribution="uniform", depth=4, budget=8, batch=2
    )
    assert made.builder_options == settings.builder_options("sglang") and made.builder_options
    assert made.in_situ and made.correct is None and made.in_situ_reason is None
    native = TimingJob.from_settings(
        settings, builder="native", distribution="uniform", depth=4, budget=8, batch=2
    )
    assert native.builder_options == {"library": layout(settings).native_library}
