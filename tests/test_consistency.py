"""Nothing stale: a summary must hold exactly the configured grid; machines side by side say whether they ran
on the same traces."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest

from ddtree_bench.consistency import check_shapes, check_summary, configured_grid, trace_identity
from ddtree_bench.report import Machine

GRID = {
    "distributions": ["peaked", "uniform"],
    "depths": [16],
    "budgets": [8, 64],
    "batch_sizes": [1, 64],
    "builders": ["sglang", "reference", "gpu"],
}
SHA = {"peaked": "a" * 64, "uniform": "b" * 64}


def summary_of(grid=GRID, *, unavailable=("sglang",), digests=SHA) -> pd.DataFrame:
    rows = [
        {
            "builder": builder,
            "status": "unavailable",
            "distribution": None,
            "depth": None,
            "budget": 0,
            "batch": 0,
        }
        for builder in unavailable
    ]
    for builder in grid["builders"]:
        if builder in unavailable:
            continue
        for d, depth, n, b in itertools.product(
            grid["distributions"], grid["depths"], grid["budgets"], grid["batch_sizes"]
        ):
            rows.append(
                {
                    "builder": builder,
                    "status": "ok",
                    "distribution": d,
                    "depth": depth,
                    "budget": n,
                    "batch": b,
                    "trace_sha256": digests.get(d),
                }
            )
    return pd.DataFrame(rows)


def test_a_summary_of_exactly_the_grid_passes():
    check_summary(summary_of(), GRID)


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        (
            "distributions",
            ["peaked"],
            "holds rows of distribution 'uniform', which is not among the configured",
        ),
        (
            "distributions",
            ["peaked", "uniform", "bf16"],
            "lacks builder reference's rows for bf16 L=16 N=8 B=1",
        ),
        ("depths", [16, 8], "lacks builder reference's rows for peaked L=8 N=8 B=1"),
        ("budgets", [8], "holds rows of budget 64, which is not among the configured budgets [8]"),
        ("batch_sizes", [1, 8, 64], "lacks builder reference's rows for peaked L=16 N=8 B=8"),
        ("builders", ["reference", "gpu"], "holds rows of builder 'sglang'"),
        ("builders", ["sglang", "reference", "gpu", "native"], "has no rows of builder 'native'"),
    ],
)
def test_a_summary_of_another_configuration_is_refused_in_one_line(key, value, needle):
    grid = {**GRID, key: value}
    with pytest.raises(ValueError) as error:
        check_summary(summary_of(), grid, where="summary s.parquet")
    text = str(error.value)
    assert "\n" not in text and text.startswith("summary s.parquet: ") and needle in text, text


def test_an_empty_summary_and_a_grid_without_its_lists_are_refused():
    with pytest.raises(ValueError, match="holds no rows"):
        check_summary(summary_of().iloc[:0], GRID)
    with pytest.raises(ValueError, match="no budgets list"):
        configured_grid({k: v for k, v in GRID.items() if k != "budgets"})


def test_tree_shapes_must_hold_the_configured_points():
    shapes = pd.DataFrame(
        [
            {"distribution": d, "depth": 16, "budget": n}
            for d in GRID["distributions"]
            for n in GRID["budgets"]
        ]
    )
    check_shapes(shapes, GRID)
    with pytest.raises(ValueError, match="lacks the configured peaked L=16 N=128"):
        check_shapes(shapes, {**GRID, "budgets": [8, 64, 128]})
    with pytest.raises(ValueError, match="holds rows of peaked L=16 N=64"):
        check_shapes(shapes, {**GRID, "budgets": [8]})


def _machine(label, summary, source="published"):
    return Machine(label, source, summary, pd.DataFrame(), {})


def test_machines_side_by_side_say_whether_their_traces_were_identical():
    here = _machine("laptop", summary_of(), "this run")
    same = _machine("h200", summary_of())
    other = _machine("a100", summary_of(digests={"peaked": "c" * 64, "uniform": "b" * 64}))
    old = _machine("old", summary_of().drop(columns="trace_sha256"))
    lines = trace_identity([here, same, other, old])
    assert lines[0] == "Traces of h200 and laptop: identical (equal sha256) for peaked L=16, uniform L=16."
    assert lines[1].startswith("Traces of a100 and laptop: different for peaked L=16 (sha256 differ)")
    assert lines[2].startswith(
        "Traces of old and laptop: not known to be the same (old records no trace sha256"
    )
    assert trace_identity([here]) == []
