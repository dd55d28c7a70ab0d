"""What the three kernels are worth, from synthetic stack rows: tokens/s = B x tau / round, each stack's best
budget and whether it is the grid's edge, the waterfall's parts add up to the whole rounds' difference,
differences within the run-to-run spread are "no win shown", and a machine without stack rows says so."""

from __future__ import annotations

import types

import pandas as pd
import pytest

from ddtree_bench import catalog
from ddtree_bench.report import stacks
from ddtree_bench.report.load import Machine

#: per stack: (build, mask, forward, accept) seconds at every budget; the round is their sum + the draft
PARTS = {
    "sglang-fa3": (0.004, 0.0005, 0.020, 0.001),
    "sglang-triton": (0.004, 0.0005, 0.060, 0.001),
    "ours": (0.0001, None, 0.017, 0.0001),
    "sglang-fa3+build": (0.0001, 0.0005, 0.020, 0.001),
    "sglang-fa3+attention": (0.004, 0.0003, 0.017, 0.001),
    "sglang-fa3+accept": (0.004, 0.0005, 0.020, 0.0001),
    "sglang-triton+build": (0.0001, 0.0005, 0.060, 0.001),
    "sglang-triton+attention": (0.004, 0.0003, 0.017, 0.001),
    "sglang-triton+accept": (0.004, 0.0005, 0.060, 0.0001),
}
DRAFT = 0.002
TAU = {8: 5.0, 16: 8.0, 32: 8.5}


def _rows(budget_cost=0.001, repeat=None):
    rows = []
    for budget in TAU:
        for name, (build, mask, forward, accept) in PARTS.items():
            forward += budget_cost * budget / 8
            parts = {"draft": DRAFT, "build": build, "mask": mask, "forward": forward, "accept": accept}
            whole = sum(v for v in parts.values() if v is not None)
            common = {"stage": "stack", "impl": name, "batch": 1, "prefix": 4096, "depth": budget}
            common |= {"budget": budget, "status": "ok", "correct": True, "note": "n", "n": 2}
            timings = {"wall": whole, **{f"part-{k}": v for k, v in parts.items() if v is not None}}
            for timing, value in timings.items():
                rows.append({**common, "timing": timing, "median_s": value, "p10_s": value, "p90_s": value})
                if repeat is not None and budget == 16:
                    again = value * (repeat if timing == "part-build" else 1.0)
                    rows.append({**common, "timing": f"repeat:{timing}", "median_s": again})
    return pd.DataFrame(rows)


def _shapes():
    return pd.DataFrame(
        [
            {"distribution": "drafter", "depth": 16, "budget": n, "expected_accept_mean": t - 1}
            for n, t in TAU.items()
        ]
    )


def test_tokens_per_second_and_best_budgets():
    table = stacks.stack_table(_rows(), _shapes())
    assert set(table["stack"]) == set(catalog.STACKS)
    row = table[(table["stack"] == "ours") & (table["budget"] == 16)].iloc[0]
    assert row["tokens_per_s"] == pytest.approx(8.0 / row["round_s"])
    best = stacks.best_budgets(table)
    assert set(best.loc[best["stack"].isin(["ours", "sglang-fa3"]), "budget"]) == {16}
    assert not best.loc[best["stack"].isin(["ours", "sglang-fa3"]), "edge"].any()
    edge = stacks.best_budgets(stacks.stack_table(_rows(budget_cost=0.0), _shapes()))
    assert (edge["budget"] == 32).all() and edge["edge"].all()  # free budgets: the largest wins, on the edge


def test_the_waterfall_adds_up_to_the_whole_rounds():
    table = stacks.stack_table(_rows(), _shapes())
    steps = stacks.waterfall(table, "sglang-fa3", 1, 4096, 16)
    start = table[(table["stack"] == "sglang-fa3") & (table["budget"] == 16)]["round_s"].iloc[0]
    ours = table[(table["stack"] == "ours") & (table["budget"] == 16)]["round_s"].iloc[0]
    assert steps["saved_s"].sum() == pytest.approx(start - ours)
    saved = dict(zip(steps["step"], steps["saved_s"], strict=True))
    assert saved["our build"] == pytest.approx(0.004 - 0.0001)
    assert saved["our attention"] == pytest.approx(0.0005 + 0.003)
    assert saved["our accept"] == pytest.approx(0.0009)
    assert saved["the rest of the round"] == pytest.approx(0.0)
    assert steps["shown"].iloc[1:4].all()
    assert stacks.carrying_kernel(steps) == "build"
    assert steps["swap_s"].iloc[1] == pytest.approx(0.0039)  # the one-kernel swap's whole round


def test_a_repeat_sets_the_run_to_run_spread_and_small_differences_are_no_win():
    step = _rows(repeat=2.0)  # the repeat's host build part took twice as long
    spread = stacks.run_to_run(step)
    assert spread["host"] == pytest.approx(1.0) and spread["gpu"] == pytest.approx(0.0)
    table = stacks.stack_table(step, _shapes())
    steps = stacks.waterfall(table, "sglang-fa3", 1, 4096, 16, spread).set_index("step")
    assert not steps.loc["our build", "shown"]  # 3.9 ms against a band of 4.1 ms
    assert steps.loc["our attention", "shown"]
    line = stacks.verdict_lines(table, stacks.best_budgets(table), "sglang-fa3", spread)[0]
    assert "our build 3,900 µs (" in line and "%), no win shown; our attention" in line
    assert "The attention carries the gain." in line
    assert "spread" in stacks.spread_line(spread) and "100%" in stacks.spread_line(spread)


def test_a_machine_without_stack_rows_says_so():
    machine = Machine("local", "this run", pd.DataFrame(), pd.DataFrame(), {})
    section = stacks.report_section([machine], [])
    texts = [b.text for b in section.blocks if hasattr(b, "text")]
    assert any("Neither this machine nor the published answer's has stack rounds" in t for t in texts)
    table = stacks.stack_table(_rows(), _shapes())
    assert "equal the CPU walk" in stacks.correct_line(table)
    wrong = table.assign(correct=[False] + [True] * (len(table) - 1))
    assert stacks.correct_line(wrong).startswith("In 1 of")


def test_the_verdict_under_another_profile_names_edges_and_sameness():
    from ddtree_bench.report.throughput import BudgetSection, best_table, profile_verdict  # noqa: PLC0415

    def section(profile, gpu_budget, base_budget, gain):
        best = pd.DataFrame(
            [
                {
                    "batch": 1,
                    "builder": "gpu",
                    "label": "gpu",
                    "build_from": "in-situ",
                    "best_budget": gpu_budget,
                    "tokens_per_s": 100.0 * gain,
                    "tau": 5.0,
                    "round_s": 0.02,
                    "budgets": (8, 16, 32),
                },
                {
                    "batch": 1,
                    "builder": "sglang",
                    "label": "sglang",
                    "build_from": "in-situ",
                    "best_budget": base_budget,
                    "tokens_per_s": 100.0,
                    "tau": 5.0,
                    "round_s": 0.02,
                    "budgets": (8, 16, 32),
                },
            ]
        )
        gains = pd.DataFrame([{"batch": 1, "baseline_budget": base_budget, "gain": gain}])
        result = types.SimpleNamespace(missing=None)
        return BudgetSection("m", "drafter", 16, result, best=best, gains=gains, profile=profile)

    paper = section("paper", 16, 16, 1.10)
    same = profile_verdict([paper, section("k2.6-reported", 8, 8, 1.12)], paper)
    assert len(same) == 1 and "gpu N = 8 (the grid's edge)" in same[0] and "the same verdict" in same[0]
    other = profile_verdict([paper, section("k2.6-reported", 8, 16, 1.0)], paper)
    assert "a different verdict" in other[0]
    table = best_table(section("k2.6-reported", 8, 16, 1.0))
    assert list(table["grid edge"]) == ["yes", "no"] and "tau (k2.6-reported)" in table.columns
