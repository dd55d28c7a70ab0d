"""The spread across independent timing jobs: the summary pools the jobs' calls and records the smallest and
largest per-job median; a ratio of two builders' medians gets its range across jobs and says whether that
range includes 1.0; summaries and per-job files from before (no spread columns, no job column) read as one
job."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from ddtree_bench.summary.build import SUMMARY_COLUMNS, aggregate, summarize
from ddtree_bench.summary.spread import (
    SPREAD_COLUMNS,
    RatioRange,
    job_of_suffix,
    job_range,
    job_suffix,
    ratio_range,
    ratio_ranges,
)


def _rows(
    builder: str, jobs: dict[int, list[float]], *, batch: int = 4, job_column: bool = True
) -> pd.DataFrame:
    """Timed rows of one configuration: ``jobs[j]`` the per-call seconds of job ``j``."""
    records = []
    for job, seconds in jobs.items():
        for repetition, value in enumerate(seconds):
            record = {
                "builder": builder,
                "label": builder,
                "budget": 16,
                "batch": batch,
                "depth": 4,
                "topk": 16,
                "input_columns": 16,
                "distribution": "uniform",
                "repetition": repetition,
                "phase": "timed",
                "timing": "wall",
                "cache": "warm",
                "seconds": value,
                "per_tree_seconds": value / batch,
                "status": "ok",
                "status_reason": None,
                "threads": 1,
                "machine": "test",
            }
            if job_column:
                record["job"] = job
            records.append(record)
    return pd.DataFrame.from_records(records)


def test_summary_pools_the_jobs_and_records_their_spread():
    jobs = {1: [1.0, 2.0, 3.0], 2: [4.0, 5.0, 6.0], 3: [2.0, 2.0, 8.0]}
    summary = summarize(_rows("native", jobs))
    assert list(summary.columns) == list(SUMMARY_COLUMNS)
    (row,) = summary.to_dict("records")
    pooled = [v for values in jobs.values() for v in values]
    assert row["n"] == 9 and row["median_s"] == float(np.median(pooled))  # every call, pooled
    assert row["jobs"] == 3
    assert row["job_median_min_s"] == 2.0 and row["job_median_max_s"] == 5.0  # medians 2, 5, 2
    assert row["job_median_min_per_tree_s"] == 0.5 and row["job_median_max_per_tree_s"] == 1.25


def test_one_job_has_no_spread_and_unavailable_rows_have_no_jobs():
    one = summarize(_rows("native", {1: [1.0, 3.0]})).iloc[0]
    assert one["jobs"] == 1 and one["job_median_min_s"] == one["job_median_max_s"] == 2.0
    unavailable = pd.DataFrame(
        [
            {
                "builder": "gpu",
                "phase": "timed",
                "status": "unavailable",
                "status_reason": "no GPU",
                "seconds": np.nan,
                "per_tree_seconds": np.nan,
                "budget": 16,
                "batch": 4,
                "machine": "test",
            }
        ]
    )
    row = summarize(unavailable).iloc[0]
    assert row["n"] == 0 and row["jobs"] == 0 and math.isnan(row["job_median_min_s"])


def test_per_job_files_without_a_job_column_are_one_job(tmp_path):
    old = tmp_path / "old.parquet"
    _rows("native", {1: [1.0, 2.0, 3.0]}, job_column=False).to_parquet(old, index=False)
    summary = aggregate([old], tmp_path / "summary.parquet")
    assert summary.iloc[0]["jobs"] == 1
    new = [tmp_path / "j1.parquet", tmp_path / "j2.parquet"]
    _rows("native", {1: [1.0]}).to_parquet(new[0], index=False)
    _rows("native", {2: [3.0]}).to_parquet(new[1], index=False)
    summary = aggregate(new, tmp_path / "summary.parquet")
    row = pd.read_parquet(tmp_path / "summary.parquet").iloc[0]
    assert row["jobs"] == 2 and (row["job_median_min_s"], row["job_median_max_s"]) == (1.0, 3.0)


def test_the_bench_file_suffix_of_each_job():
    assert [job_suffix(j) for j in (1, 2, 10)] == ["", "-r2", "-r10"]
    assert [job_of_suffix(s) for s in ("", "-r2", "-r10")] == [1, 2, 10]
    for bad in ("-r1", "-r0", "r2", "-rx"):
        with pytest.raises(ValueError, match="not a timing job suffix"):
            job_of_suffix(bad)
    with pytest.raises(ValueError, match="must be >= 1"):
        job_suffix(0)


def _summary_row(median, low, high, jobs) -> dict:
    return {"median_s": median, "job_median_min_s": low, "job_median_max_s": high, "jobs": jobs}


def test_a_ratio_gets_its_range_across_jobs():
    sglang = _summary_row(10.0, 8.0, 12.0, 3)
    native = _summary_row(2.0, 1.6, 2.5, 3)
    gain = ratio_range(sglang, native)
    assert gain.ratio == 5.0
    assert gain.low == pytest.approx(8.0 / 2.5) and gain.high == pytest.approx(12.0 / 1.6)
    assert not gain.includes_one
    assert gain.text() == "5.00x (3.20x to 7.50x across 3 and 3 jobs)"


def test_a_ratio_whose_range_includes_one_says_so():
    gain = ratio_range(_summary_row(1.1, 0.9, 1.3, 3), _summary_row(1.0, 0.95, 1.05, 3))
    assert gain.includes_one
    assert gain.text().endswith("; the spread includes 1.0x)")
    assert (
        "includes 1.0x"
        not in ratio_range(_summary_row(3.0, 2.9, 3.1, 3), _summary_row(1.0, 0.9, 1.1, 3)).text()
    )


def test_a_summary_without_spread_columns_reads_as_one_job():
    """Published summaries from before the spread: their pooled median is the whole range."""
    old = pd.DataFrame({"median_s": [4.0, 2.0], "median_per_tree_s": [1.0, 0.5]})
    spread = job_range(old)
    assert spread["low"].tolist() == [4.0, 2.0] and spread["high"].tolist() == [4.0, 2.0]
    assert spread["jobs"].tolist() == [1, 1]
    gain = ratio_range(old.iloc[0], old.iloc[1])
    assert gain == RatioRange(ratio=2.0, low=2.0, high=2.0, numerator_jobs=1, denominator_jobs=1)
    assert gain.single_job and gain.text() == "2.00x (one job each: no spread measured)"
    # one side with jobs, the other from an old summary
    mixed = ratio_range(_summary_row(4.0, 3.0, 5.0, 3), {"median_s": 2.0})
    assert (mixed.low, mixed.high, mixed.denominator_jobs) == (1.5, 2.5, 1)


def test_ratio_ranges_over_a_merged_frame():
    """What the report's speedups do: the baseline merged beside each series with a suffix."""
    series = pd.DataFrame([_summary_row(2.0, 1.5, 2.5, 3), _summary_row(9.0, 8.0, 11.0, 3)]).assign(
        key=[1, 2]
    )
    base = pd.DataFrame([_summary_row(10.0, 9.0, 12.0, 3), {"median_s": 10.0}]).assign(key=[1, 2])
    merged = series.merge(base, on="key", suffixes=("", "_baseline"))
    ranges = ratio_ranges(merged, numerator_suffix="_baseline")
    assert ranges["ratio"].tolist() == [5.0, 10.0 / 9.0]
    assert ranges["ratio_low"].tolist() == pytest.approx([9.0 / 2.5, 10.0 / 11.0])
    assert ranges["ratio_high"].tolist() == pytest.approx([12.0 / 1.5, 10.0 / 8.0])
    assert ranges["includes_one"].tolist() == [False, True]
    assert ranges["denominator_jobs"].tolist() == [3, 3] and ranges["numerator_jobs"].tolist() == [3, 1]
    # a frame with no spread columns at all (older summaries on both sides): the ratio itself
    old = pd.DataFrame({"median_s": [2.0], "median_s_baseline": [4.0]})
    ranges = ratio_ranges(old, "_baseline")
    assert ranges.iloc[0][["ratio", "ratio_low", "ratio_high"]].tolist() == [2.0, 2.0, 2.0]


def test_ratio_of_a_missing_column_is_one_clear_error():
    with pytest.raises(ValueError, match="no job spread for column 'p10_s'"):
        job_range(pd.DataFrame({"p10_s": [1.0]}), "p10_s")
    with pytest.raises(ValueError, match="no column median_s_baseline"):
        ratio_ranges(pd.DataFrame({"median_s": [1.0]}), "_baseline")


def test_spread_columns_are_in_the_summary():
    assert set(SPREAD_COLUMNS) <= set(SUMMARY_COLUMNS)
