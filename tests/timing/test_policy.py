"""timing/: how many calls a timing job makes (``TimingPolicy``), and the step stages' row schema
(``records``): warm-up calls recorded apart, the stopping rules, one-line errors, unavailable rows."""

from __future__ import annotations

import math

import pytest

from ddtree_bench.timing.policy import TimingPolicy
from ddtree_bench.timing.records import STAGE_COLUMNS, stage_frame, unavailable_row


def counter(seconds: float = 1e-3):
    calls = []

    def measure():
        calls.append(len(calls))
        return seconds

    return measure, calls


def test_warmup_calls_are_recorded_apart_and_repeats_are_the_floor():
    measure, calls = counter()
    samples = TimingPolicy(warmup=2, repeats=3, min_seconds=0.0).samples(measure)
    assert [s[0] for s in samples] == ["warmup", "warmup", "timed", "timed", "timed"]
    assert [s[1] for s in samples] == [0, 1, 0, 1, 2] and len(calls) == 5


def test_max_repeats_stops_a_fast_configuration_before_min_seconds():
    measure, _ = counter()
    samples = TimingPolicy(warmup=0, repeats=2, min_seconds=3600.0, max_repeats=7).samples(measure)
    assert len(samples) == 7 and all(phase == "timed" for phase, _, _ in samples)


def test_max_seconds_stops_a_slow_configuration_after_min_repeats():
    measure, _ = counter()
    policy = TimingPolicy(warmup=0, repeats=1000, min_seconds=0.0, max_seconds=0.0, min_repeats=4)
    assert len(policy.samples(measure)) == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(warmup=-1, repeats=1, min_seconds=0), "warmup must be an integer >= 0, got -1"),
        (dict(warmup=0, repeats=0, min_seconds=0), "repeats must be an integer >= 1, got 0"),
        (dict(warmup=0, repeats=True, min_seconds=0), "repeats must be an integer >= 1, got True"),
        (dict(warmup=0, repeats=5, min_seconds=0, max_repeats=3), "max_repeats (3) must be >= repeats (5)"),
        (dict(warmup=0, repeats=1, min_seconds=math.inf), "min_seconds must be a finite number of seconds"),
    ],
)
def test_bad_settings_are_one_line_value_errors(kwargs, message):
    with pytest.raises(ValueError) as error:
        TimingPolicy(**kwargs)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_stage_frame_keeps_the_schema_and_refuses_unknown_columns_and_stages():
    row = {"stage": "accept", "impl": "gpu-kernel", "batch": 1, "budget": 8, "seconds": 1e-6, "status": "ok"}
    df = stage_frame([row])
    assert list(df.columns) == list(STAGE_COLUMNS) and df["batch"].dtype == "int64"
    with pytest.raises(ValueError, match="unknown columns \\['colour'\\]"):
        stage_frame([{**row, "colour": 1}])
    with pytest.raises(ValueError, match="unknown stage 'nope'"):
        stage_frame([{**row, "stage": "nope"}])


def test_an_unavailable_row_has_no_time_and_one_line_reason():
    row = unavailable_row({"stage": "forward", "batch": 64}, "does not fit:\n  needs about 143 GB")
    assert row["status"] == "unavailable" and math.isnan(row["seconds"]) and row["phase"] == "timed"
    assert row["status_reason"] == "does not fit: needs about 143 GB"
    assert unavailable_row({}, "boom", status="failed")["status"] == "failed"
