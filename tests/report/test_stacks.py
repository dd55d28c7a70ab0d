"""What the three kernels are worth, and tree or chain, from synthetic stack rows: tokens/s = B x tau / round
with the estimated terms added and tau at the rows' own depth, each stack's best budget, a kernel's worth is
its swap's, the waterfall adds up to the whole rounds' difference, differences within the noise are "no win
shown", the chain's rows and its overlap model, the winner of tree or chain, and the machine with the
current method's rows is chosen by content."""

from __future__ import annotations

import pandas as pd
import pytest

from ddtree_bench import catalog
from ddtree_bench.calibrate import round_tau
from ddtree_bench.report import stacks
from ddtree_bench.report.load import Machine

#: per stack: (build, mask, metadata, forward, accept) seconds; the round is their sum + draft + commit
PARTS = {
    "sglang-fa3": (0.004, 0.0005, 0.0003, 0.020, 0.001),
    "ours": (0.0001, None, None, 0.017, 0.0001),
    "sglang-fa3+build": (0.0001, 0.0005, 0.0003, 0.020, 0.001),
    "sglang-fa3+attention": (0.004, 0.0003, None, 0.017, 0.001),
    "sglang-fa3+accept": (0.004, 0.0005, 0.0003, 0.020, 0.0001),
}
DRAFT, COMMIT, ESTIMATE = 0.002, 0.001, 0.0015
DEPTH = 15
BUDGETS = (8, 16, 32)


def _row(name, budget, depth, timing, value, **extra):
    return {
        "stage": "stack",
        "impl": name,
        "batch": 8,
        "prefix": 4096,
        "depth": depth,
        "budget": budget,
        "status": "ok",
        "correct": True,
        "note": "n",
        "n": 10,
        "timing": timing,
        "median_s": value,
        "p10_s": value,
        "p90_s": value,
        "launches": 6 if name == "sglang-fa3" else 1,
        "timestamp": "2026-12-06T00:00:00",
        **extra,
    }


def _rows(budget_cost=0.004, runs=None, chain=True):
    rows = []
    for budget in BUDGETS:
        for name, (build, mask, meta, forward, accept) in PARTS.items():
            forward += budget_cost * budget / 8
            parts = {"draft": DRAFT, "build": build, "mask": mask, "metadata": meta, "forward": forward}
            parts |= {"accept": accept, "commit": COMMIT}
            whole = sum(v for v in parts.values() if v is not None)
            rows.append(_row(name, budget, DEPTH, "wall", whole))
            rows += [_row(name, budget, DEPTH, f"part-{k}", v) for k, v in parts.items() if v is not None]
            rows += [_row(name, budget, DEPTH, t, ESTIMATE / 2) for t in stacks.ESTIMATES]
            for run, factor in (runs or {}).items():
                if budget == 16:
                    rows.append(_row(name, budget, DEPTH, f"run{run}:wall", whole * factor))
    if chain:
        for block, wall in ((8, 0.018), (16, 0.020)):
            rows.append(_row(catalog.CHAIN, block - 1, block - 1, "wall", wall))
            rows.append(_row(catalog.CHAIN, block - 1, block - 1, "model-one-graph", wall - 0.002))
            rows += [_row(catalog.CHAIN, block - 1, block - 1, t, ESTIMATE / 2) for t in stacks.ESTIMATES]
    return pd.DataFrame(rows)


def test_tokens_per_second_take_the_estimates_and_tau_at_the_rows_depth():
    table = stacks.stack_table(_rows())
    assert set(table["stack"]) == {*PARTS, catalog.CHAIN}
    row = table[(table["stack"] == "ours") & (table["budget"] == 16)].iloc[0]
    assert row["round_s"] == pytest.approx(row["wall_s"] + ESTIMATE)
    tau, chain_tau = round_tau(catalog.PAPER_PROFILE, DEPTH, BUDGETS)
    assert row["tau"] == pytest.approx(tau[16])
    assert row["tokens_per_s"] == pytest.approx(8 * tau[16] / row["round_s"])
    chain = table[(table["stack"] == catalog.CHAIN) & (table["budget"] == 15)].iloc[0]
    assert chain["tau"] == pytest.approx(chain_tau)
    assert chain["overlap_s"] == pytest.approx(0.018 + ESTIMATE)
    best = stacks.best_budgets(table)
    assert set(best.loc[best["stack"].isin(["ours", "sglang-fa3"]), "budget"]) == {16}
    edge = stacks.best_budgets(stacks.stack_table(_rows(budget_cost=0.0)))
    trees = edge[edge["stack"] != catalog.CHAIN]
    assert (trees["budget"] == 32).all() and trees["edge"].all()


def test_a_kernels_worth_is_its_swap_and_the_waterfall_adds_up():
    table = stacks.stack_table(_rows())
    worth = stacks.kernel_worth(table, 8, 4096, 16, 0.0).set_index("kernel")
    assert worth.loc["build", "worth_s"] == pytest.approx(0.004 - 0.0001)
    assert worth.loc["attention", "worth_s"] == pytest.approx((0.0005 - 0.0003) + 0.0003 + 0.003)
    assert worth.loc["accept", "worth_s"] == pytest.approx(0.0009)
    steps = stacks.waterfall(table, 8, 4096, 16, 0.0)
    at = table[table["budget"] == 16].set_index("stack")["round_s"]
    assert steps["saved_s"].sum() == pytest.approx(at["sglang-fa3"] - at["ours"])
    assert stacks.carrying_kernel(stacks.kernel_worth(table, 8, 4096, 16, 0.0)) == "build"


def test_repeated_runs_set_the_spread_and_small_differences_are_no_win():
    table = stacks.stack_table(_rows(runs={2: 1.01, 3: 1.5}))
    rel = stacks.run_spread(table)
    assert rel == pytest.approx(0.5)
    assert set(stacks.repeated(table)["budget"]) == {16}
    worth = stacks.kernel_worth(table, 8, 4096, 16, rel).set_index("kernel")
    assert not worth["shown"].any()  # every swap's gain is inside a 50 % spread
    verdict = stacks.verdict_table(table, stacks.best_budgets(table, rel), rel)
    assert verdict.iloc[0, 1].startswith("no win shown") and verdict.iloc[2, 1] == "none shown"
    assert "50.0%" in stacks.spread_line(table, rel)
    quiet = stacks.stack_table(_rows())
    assert stacks.kernel_worth(quiet, 8, 4096, 16, 0.0)["shown"].all()


def test_tree_or_chain_names_the_winner_and_whether_it_is_beyond_the_noise():
    table = stacks.stack_table(_rows())
    frame = stacks.tree_or_chain(table, 0.0)
    row = frame.iloc[0]
    assert {row["ours_budget"], row["chain_budget"]} <= {7, 8, 15, 16, 32}
    best = max(stacks.CHOICES, key=lambda k: row[f"{k}_tokens_per_s"])
    assert row["winner"] == best and row["margin"] >= 1.0 and bool(row["shown"])
    assert row["overlap_tokens_per_s"] > row["chain_tokens_per_s"]
    shown = stacks.chain_table(frame)
    assert "block = " in shown["chain"].iloc[0] and "N = " in shown["ours (tree)"].iloc[0]
    noisy = stacks.tree_or_chain(table, 10.0)
    assert not noisy["shown"].any()


def test_without_chain_rows_there_is_no_tree_or_chain_answer():
    assert stacks.tree_or_chain(stacks.stack_table(_rows(chain=False)), 0.0).empty


def _machine(label, step, source="published"):
    return Machine(label, source, pd.DataFrame(), pd.DataFrame(), {"gpu_name": "NVIDIA H100"}, step)


def test_the_current_methods_stack_rows_are_chosen_by_content():
    old = _rows(chain=False)
    old = old[old["timing"] != "part-commit"].assign(timestamp="2026-12-02")
    new = _rows()
    for order in ([_machine("a", old), _machine("b", new)], [_machine("b", new), _machine("a", old)]):
        here = [_machine("cpu", pd.DataFrame(), source="this run"), *order]
        assert stacks.machine_with_stacks(here).label == "b"
    assert stacks.machine_with_stacks([_machine("cpu", pd.DataFrame(), "this run")]) is None
    section = stacks.report_section([_machine("cpu", pd.DataFrame(), "this run")], [])
    assert "No machine here has stack rounds" in str(section.blocks)


def test_the_section_names_profile_gpu_and_depth():
    from ddtree_bench.report.render import _md_section  # noqa: PLC0415

    section = stacks.report_section([_machine("h100", _rows())], [])
    text = "\n".join(_md_section(section, 2, None))
    assert "Tree or chain? tau: paper" in text and "NVIDIA H100" in text
    assert "k2.6-reported" in text and "L = 15" in text
    assert "Verify-attention launches a layer" in text and "sglang-fa3: 6" in text


def test_the_build_probes_show_what_the_part_pays_over_the_in_situ_path():
    rows = _rows()
    assert stacks.build_probe_table(rows).empty  # no probe ran: no table, no section
    probes = [
        _row("sglang-fa3", 16, DEPTH, "build-gc-off", 0.0038),
        _row("sglang-fa3", 16, DEPTH, "build-in-situ", 0.0010, p10_s=0.0009, p90_s=0.0012),
        _row("sglang-fa3", 16, DEPTH, "build-in-situ-back-to-back", 0.0004),
    ]
    table = stacks.build_probe_table(pd.concat([rows, pd.DataFrame(probes)], ignore_index=True))
    assert list(table["N"]) == [16]  # only where the probes ran
    row = table.iloc[0]
    assert row["the in-situ path, after the draft"] == "1,000 µs (900 µs-1,200 µs)"
    assert row["per-request work (part - in-situ)"] == "3,000 µs"  # part-build 4 ms - in-situ 1 ms
    assert row["wake-up (after the draft - back to back)"] == "600 µs"
    from ddtree_bench.report.render import _md_section  # noqa: PLC0415

    section = stacks.report_section([_machine("h100", pd.concat([rows, pd.DataFrame(probes)]))], [])
    assert "sglang-fa3's build part, three ways" in "\n".join(_md_section(section, 2, None))


def test_two_rounds_are_apart_beyond_both_widths_plus_the_spread_once():
    def round_(tokens, p10, p90):
        return {"tokens_per_s": tokens, "round_s": 1.0, "p10_s": p10, "p90_s": p90}

    # 5% apart, no width: beyond a 4% spread, not beyond 6%
    assert stacks.apart(round_(105.0, 1.0, 1.0), round_(100.0, 1.0, 1.0), 0.04)
    assert not stacks.apart(round_(105.0, 1.0, 1.0), round_(100.0, 1.0, 1.0), 0.06)
    # each round's own p10-p90 (1% and 2% of its median) adds to the spread
    assert not stacks.apart(round_(105.0, 0.995, 1.005), round_(100.0, 0.99, 1.01), 0.025)
    assert stacks.apart(round_(105.0, 0.995, 1.005), round_(100.0, 0.99, 1.01), 0.015)


def test_the_launches_line_names_rows_of_the_older_gather_only_where_there_are_some():
    """SGLang's layer made 11 launches with the earlier gather (three launches) and 9 with the current one:
    the line says so only where some of the rows are the earlier code's."""
    current = pd.DataFrame({"stack": [stacks.BASE, catalog.OURS], "launches": [9.0, 1.0]})
    mixed = pd.DataFrame({"stack": [stacks.BASE, stacks.BASE, catalog.OURS], "launches": [9.0, 11.0, 1.0]})
    assert "sglang-fa3: 9;" in stacks.launches_line(current)
    assert "rows of" not in stacks.launches_line(current)
    assert stacks.launches_line(current).endswith("(one launch).")
    line = stacks.launches_line(mixed)
    assert "sglang-fa3: 9-11;" in line and "three in rows of 11 launches" in line
