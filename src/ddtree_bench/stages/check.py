"""Equality before timing: a builder's trees must equal ``reference``'s (or another builder's) element for
element on the exact trace requests it is timed on."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ddtree_bench import catalog
from ddtree_bench.builders import BuilderUnavailable, get_builder
from ddtree_bench.traces import load_trace
from ddtree_bench.tree import first_difference
from ddtree_bench.validation import check_budget


class TreeMismatch(ValueError):
    """A builder's trees differ from the builder it is checked against (the message names the first
    differing request and field)."""


def _builder(builder, options: dict | None):
    if isinstance(builder, str):
        return get_builder(builder, **(options or {}))
    if options:
        raise ValueError("builder_options only apply when the builder is given by name")
    return builder


def check_builder(
    builder, trace_path, budget, *, against=catalog.ORACLE, batch=None, builder_options=None
) -> dict:
    """Build the first ``batch`` requests (all when ``None``) of the trace at ``trace_path`` with ``builder``
    (a name, built with ``builder_options``, or a builder object) and with ``against``, and compare.

    Returns ``{"builder", "against", "trace", "budget", "requests", "depth", "topk", "nodes_mean",
    "trace_sha256", "status", "reason"}`` with status ``"ok"``, or ``"unavailable"`` (and the reason) when
    either builder cannot run here. Raises ``TreeMismatch`` on any difference, ``ValueError`` on bad input.
    """
    budget = check_budget(budget)
    trace = load_trace(trace_path)
    lp, ids = trace.batch(batch)
    tested = _builder(builder, builder_options)
    expected_builder = _builder(against, None)
    name = getattr(tested, "name", None) or str(builder)
    against_name = getattr(expected_builder, "name", None) or str(against)
    summary = {
        "builder": name,
        "against": against_name,
        "trace": str(Path(trace_path)),
        "budget": budget,
        "requests": int(lp.shape[0]),
        "depth": int(lp.shape[1]),
        "topk": int(lp.shape[2]),
        "nodes_mean": None,
        "trace_sha256": trace.sha256,
        "status": "ok",
        "reason": None,
    }
    for which, who in ((name, tested), (against_name, expected_builder)):
        reason = who.unavailable_reason()
        if reason is not None:
            return summary | {"status": "unavailable", "reason": f"builder {which} is unavailable: {reason}"}
    try:
        expected = expected_builder.build(lp, ids, budget)
        actual = tested.build(lp, ids, budget)
    except BuilderUnavailable as error:
        return summary | {"status": "unavailable", "reason": str(error)}
    difference = first_difference(expected, actual)
    if difference is not None:
        raise TreeMismatch(
            f"builder {name} differs from {against_name} on trace {trace_path}, budget {budget}: {difference}"
        )
    summary["nodes_mean"] = float(np.mean(actual.node_count))
    return summary


__all__ = ["TreeMismatch", "check_builder"]
