"""How the report writes a number: times, factors, where a row is, and the depth regime of a table."""

from __future__ import annotations

import math

import pandas as pd


def missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def fmt_us(value) -> str:
    """Seconds as µs (ms from 10 ms on), "-" for a missing value; a negative value the same way with its
    sign (the unit and the digits chosen by the magnitude)."""
    if missing(value):
        return "-"
    us = float(value) * 1e6
    sign, us = ("-" if us < 0 else ""), abs(us)
    if us >= 1e5:
        return f"{sign}{us / 1e3:,.0f} ms"
    if us >= 1e4:
        return f"{sign}{us / 1e3:,.1f} ms"
    if us >= 100:
        return f"{sign}{us:,.0f} µs"
    return f"{sign}{us:.1f} µs"


def fmt_x(value: float) -> str:
    return f"{value:,.1f}x" if value < 100 else f"{value:,.0f}x"


def where(row) -> str:
    """A summary row's configuration: budget, batch, depth, distribution."""
    return f"N={row['budget']}, B={row['batch']}, L={row['depth']}, {row['distribution']}"


def regime(depth, budgets=()) -> str:
    """The depth regime of rows at depth ``depth`` over ``budgets``: SGLang's worker builds with L = N (its
    drafter block is N + 1 tokens); a fixed L is the drafter's block size, another regime."""
    budgets = sorted({int(b) for b in budgets})
    if depth is None:
        return "L unknown"
    if budgets and all(b == int(depth) for b in budgets):
        return f"L = N = {int(depth)}: SGLang's regime"
    return f"L = {int(depth)} fixed, not SGLang's L = N"
