"""The spread across independent timing jobs, and what it does to a ratio of two builders' medians.

A CPU builder's configuration is timed by ``timing.jobs`` separate processes (the workflow's ``bench`` jobs,
``job`` = 1, 2, ...). The summary pools their calls (``median_s`` is the median of every call) and records
the spread across jobs: ``jobs`` (how many jobs timed the configuration) and the smallest and largest of the
per-job medians, per call and per tree (``SPREAD_COLUMNS``). A summary without these columns (published
before they existed) is read as one job: its range is its pooled median.

A ratio of two configurations' medians (a speedup, a gain) then has a range across jobs: from the
numerator's smallest job median over the denominator's largest to its largest over the denominator's
smallest. Where that range includes 1.0 the jobs do not agree on which side is faster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

#: The summary's spread columns (``summary.build.summarize``).
SPREAD_COLUMNS = (
    "jobs",
    "job_median_min_s",
    "job_median_max_s",
    "job_median_min_per_tree_s",
    "job_median_max_per_tree_s",
)
#: Which spread columns go with which pooled median.
BOUNDS = {
    "median_s": ("job_median_min_s", "job_median_max_s"),
    "median_per_tree_s": ("job_median_min_per_tree_s", "job_median_max_per_tree_s"),
}


def job_suffix(job: int) -> str:
    """The bench file name's suffix of timing job ``job`` (1-based): none for the first (its file keeps the
    name it had before there were several jobs), ``-r2``, ``-r3``, ... for the others."""
    job = int(job)
    if job < 1:
        raise ValueError(f"timing job must be >= 1, got {job}")
    return "" if job == 1 else f"-r{job}"


def job_of_suffix(suffix: str) -> int:
    """The job number of a bench file name's suffix (``job_suffix``'s inverse)."""
    if suffix == "":
        return 1
    if not suffix.startswith("-r") or not suffix[2:].isdigit() or int(suffix[2:]) < 2:
        raise ValueError(f"not a timing job suffix: {suffix!r}")
    return int(suffix[2:])


def job_spread(seconds: np.ndarray, per_tree: np.ndarray, jobs: np.ndarray) -> dict:
    """The spread columns of one configuration's timed calls (``jobs[i]``: the job of call ``i``): the job
    count and the min and max over jobs of each job's median."""
    if seconds.size == 0:
        return dict.fromkeys(SPREAD_COLUMNS, math.nan) | {"jobs": 0}
    per_job_call, per_job_tree = [], []
    for job in np.unique(jobs):
        mask = jobs == job
        per_job_call.append(float(np.median(seconds[mask])))
        per_job_tree.append(float(np.median(per_tree[mask])))
    return {
        "jobs": len(per_job_call),
        "job_median_min_s": min(per_job_call),
        "job_median_max_s": max(per_job_call),
        "job_median_min_per_tree_s": min(per_job_tree),
        "job_median_max_per_tree_s": max(per_job_tree),
    }


def _bounds_column(rows: pd.DataFrame, name: str, fallback: pd.Series) -> pd.Series:
    if name not in rows:
        return fallback.astype("float64")
    values = pd.to_numeric(rows[name], errors="coerce").astype("float64")
    return values.where(values.notna(), fallback.astype("float64"))


def job_range(rows: pd.DataFrame, column: str = "median_s") -> pd.DataFrame:
    """Per summary row (same index): ``low`` and ``high``, the smallest and largest job median of ``column``
    (``median_s`` or ``median_per_tree_s``), and ``jobs``. Rows without spread columns (older summaries)
    are one job: ``low = high = column``."""
    if column not in BOUNDS:
        raise ValueError(f"no job spread for column {column!r}; one of {sorted(BOUNDS)}")
    low_name, high_name = BOUNDS[column]
    pooled = pd.to_numeric(rows[column], errors="coerce").astype("float64")
    if "jobs" in rows:
        jobs = pd.to_numeric(rows["jobs"], errors="coerce").fillna(1).astype("int64")
    else:
        jobs = pd.Series(1, index=rows.index, dtype="int64")
    jobs = jobs.where(pooled.notna(), 0)
    return pd.DataFrame(
        {
            "low": _bounds_column(rows, low_name, pooled),
            "high": _bounds_column(rows, high_name, pooled),
            "jobs": jobs,
        },
        index=rows.index,
    )


@dataclass(frozen=True)
class RatioRange:
    """``ratio`` (numerator's pooled median over the denominator's), its range across jobs (``low``,
    ``high``) and the job counts behind each side."""

    ratio: float
    low: float
    high: float
    numerator_jobs: int
    denominator_jobs: int

    @property
    def includes_one(self) -> bool:
        """Whether the jobs' range includes 1.0 (no side is faster in every job pairing)."""
        return bool(self.low <= 1.0 <= self.high)

    @property
    def single_job(self) -> bool:
        """Whether both sides come from one job each (no spread measured)."""
        return self.numerator_jobs <= 1 and self.denominator_jobs <= 1

    def text(self, digits: int = 2) -> str:
        """E.g. ``3.10x (2.95x to 3.30x across 3 and 3 jobs)``; ``1.04x (0.97x to 1.12x across 3 and 3 jobs;
        the spread includes 1.0x)``; ``2.00x (one job each: no spread measured)``."""
        if not math.isfinite(self.ratio):
            return "n/a"
        head = f"{self.ratio:.{digits}f}x"
        if self.single_job:
            return f"{head} (one job each: no spread measured)"
        jobs = f"{self.numerator_jobs} and {self.denominator_jobs} jobs"
        span = f"{self.low:.{digits}f}x to {self.high:.{digits}f}x across {jobs}"
        if self.includes_one:
            span += "; the spread includes 1.0x"
        return f"{head} ({span})"


def _one_row(row) -> pd.DataFrame:
    if isinstance(row, pd.Series):
        return row.to_frame().T
    if isinstance(row, Mapping):
        return pd.DataFrame([dict(row)])
    raise ValueError(f"a summary row must be a pandas Series or a mapping, got {type(row).__name__}")


def ratio_range(numerator, denominator, column: str = "median_s") -> RatioRange:
    """The ratio of two summary rows' pooled medians (``numerator[column] / denominator[column]``) with its
    range across jobs: ``low`` = numerator's smallest job median / denominator's largest, ``high`` = its
    largest / the denominator's smallest. A row without spread columns counts as one job."""
    num = job_range(_one_row(numerator), column).iloc[0]
    den = job_range(_one_row(denominator), column).iloc[0]
    ratio = float(_one_row(numerator)[column].iloc[0]) / float(_one_row(denominator)[column].iloc[0])
    return RatioRange(
        ratio=ratio,
        low=float(num["low"] / den["high"]),
        high=float(num["high"] / den["low"]),
        numerator_jobs=int(num["jobs"]),
        denominator_jobs=int(den["jobs"]),
    )


def ratio_ranges(
    frame: pd.DataFrame, numerator_suffix: str, denominator_suffix: str = "", column: str = "median_s"
) -> pd.DataFrame:
    """``ratio_range`` for every row of a merged frame whose numerator columns end in ``numerator_suffix``
    and denominator columns in ``denominator_suffix`` (pandas ``merge(..., suffixes=...)``): columns
    ``ratio``, ``ratio_low``, ``ratio_high``, ``numerator_jobs``, ``denominator_jobs``, ``includes_one``
    (same index as ``frame``). Spread columns absent on a side: one job."""

    def side(suffix: str) -> pd.DataFrame:
        names = [column, *SPREAD_COLUMNS]
        present = {f"{name}{suffix}": name for name in names if f"{name}{suffix}" in frame}
        if column not in present.values():
            raise ValueError(f"no column {column}{suffix!s} to take a ratio of")
        return job_range(frame[list(present)].rename(columns=present), column)

    num, den = side(numerator_suffix), side(denominator_suffix)
    ratio = pd.to_numeric(frame[f"{column}{numerator_suffix}"], errors="coerce").astype("float64") / (
        pd.to_numeric(frame[f"{column}{denominator_suffix}"], errors="coerce").astype("float64")
    )
    low, high = num["low"] / den["high"], num["high"] / den["low"]
    return pd.DataFrame(
        {
            "ratio": ratio,
            "ratio_low": low,
            "ratio_high": high,
            "numerator_jobs": num["jobs"],
            "denominator_jobs": den["jobs"],
            "includes_one": (low <= 1.0) & (high >= 1.0),
        },
        index=frame.index,
    )
