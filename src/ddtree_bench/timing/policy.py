"""How many calls a timing job makes, and the CPU timer: ``TimingPolicy.samples(measure)``.

Every stage takes its samples through one policy: ``warmup`` calls recorded with ``phase = "warmup"``, then
timed calls until ``repeats`` calls and ``min_seconds`` are both reached, or ``max_repeats`` calls, or
``max_seconds`` once there are ``min_repeats`` calls. ``measure()`` returns the seconds of one call: a wall
clock (``time.perf_counter_ns`` around the call) or a GPU event timer (``timing.gpu.EventTimer``).
"""

from __future__ import annotations

import math
import time

import numpy as np


def check_count(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_seconds(value, name: str, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


class TimingPolicy:
    """How many calls a timing job makes (module docstring): ``warmup`` untimed-but-recorded calls, then timed
    calls until ``repeats`` calls and ``min_seconds`` are both reached, or ``max_repeats`` calls, or
    ``max_seconds`` once there are ``min_repeats`` calls. Arguments are validated (one-line ValueError)."""

    def __init__(self, *, warmup, repeats, min_seconds, max_seconds=None, min_repeats=1, max_repeats=None):
        self.warmup = check_count(warmup, "warmup", 0)
        self.repeats = check_count(repeats, "repeats", 1)
        self.min_repeats = check_count(min_repeats, "min_repeats", 1)
        self.max_repeats = None if max_repeats is None else check_count(max_repeats, "max_repeats", 1)
        if self.max_repeats is not None and self.max_repeats < self.repeats:
            raise ValueError(f"max_repeats ({self.max_repeats}) must be >= repeats ({self.repeats})")
        self.min_seconds = check_seconds(min_seconds, "min_seconds")
        self.max_seconds = check_seconds(max_seconds, "max_seconds", allow_none=True)

    def samples(self, measure) -> list[tuple[str, int, float]]:
        """``(phase, repetition, seconds)`` for every call of ``measure()`` (which returns its seconds)."""
        out = [("warmup", rep, measure()) for rep in range(self.warmup)]
        start, rep = time.perf_counter(), 0
        while True:
            out.append(("timed", rep, measure()))
            rep += 1
            elapsed = time.perf_counter() - start
            if self.max_repeats is not None and rep >= self.max_repeats:
                break
            if rep >= self.repeats and elapsed >= self.min_seconds:
                break
            if self.max_seconds is not None and rep >= self.min_repeats and elapsed >= self.max_seconds:
                break
        return out
