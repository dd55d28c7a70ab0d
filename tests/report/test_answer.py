"""The answer's gains and build ratios carry their spread across timing jobs: a range that includes 1.0x is
said so and is no win; a summary without spread columns reads as one job and says so; a round run on the GPU
is one run."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from ddtree_bench.report import answer as answer_module
from ddtree_bench.report.load import Machine, load_machines, speedups, timings
from ddtree_bench.report.throughput import BudgetSection
from ddtree_bench.throughput import RoundAssumptions, best_budgets, gpu_gains, throughput

PUBLISHED = Path(__file__).resolve().parents[2] / "results" / "published"
BUDGETS = (8, 64)
TAU = {8: 5.0, 64: 8.0}  # expected accepted tokens; tau = 1 + E[accepted]


def build_rows(sglang_s, sglang_jobs=None):
    """In-situ build rows at B = 1 (distribution d, L = 16): gpu 5 µs (one job); sglang ``sglang_s`` per
    budget, and where ``sglang_jobs`` = (jobs, fastest, slowest job median) its spread columns."""
    rows = []
    for n in BUDGETS:
        common = dict(batch=1, budget=n, status="ok", n=9, distribution="d", depth=16, timing="in-situ")
        rows.append(dict(common, builder="gpu", cache="warm", median_s=5e-6))
        row = dict(common, builder="sglang", cache="n/a", median_s=sglang_s[n])
        if sglang_jobs is not None:
            jobs, fastest, slowest = sglang_jobs[n]
            row |= dict(jobs=jobs, job_median_min_s=fastest, job_median_max_s=slowest)
        rows.append(row)
    return pd.DataFrame(rows)


def step_rows():
    """Step rows at B = 1, S = 4096: attention, accept, the forward, the drafter (no run round)."""
    rows = []
    for n in BUDGETS:
        common = dict(machine="m", batch=1, budget=n, timing="cuda-events", cache="warm", status="ok", n=3)
        tree = dict(distribution="d", depth=16)
        rows += [
            dict(common, **tree, stage="verify-attention", impl="ours", heads=8, prefix=4096, median_s=1e-4),
            dict(common, **tree, stage="accept", impl="gpu-kernel", median_s=4e-6),
            dict(common, stage="forward", impl="marlin-w4a16", heads=8, prefix=4096, median_s=10e-3),
            dict(common, stage="draft", impl="torch", prefix=4096, median_s=1e-3),
            dict(common, stage="allreduce", impl="nccl", median_s=2e-3, world_size=8),
        ]
    return pd.DataFrame(rows)


def shapes():
    return pd.DataFrame(
        [{"distribution": "d", "depth": 16, "budget": n, "expected_accept_mean": e} for n, e in TAU.items()]
    )


def answer_of(summary):
    result = throughput(summary, step_rows(), shapes(), RoundAssumptions(), distribution="d", depth=16)
    assert result.missing is None, result.missing
    best = best_budgets(result.table)
    section = BudgetSection("m", "d", 16, result, best=best, gains=gpu_gains(best))
    machine = Machine("m", "this run", summary, shapes(), {})
    out = answer_module.answer([machine], {}, {"m": {"layers": 61}}, [section])
    assert out.machine == "m" and len(out.verdict) == 1
    return out


def cells_of(out, batch: int = 1) -> dict[str, str]:
    """The verdict table's column of one batch: question -> its cell."""
    table = out.verdict_table
    assert list(table.iloc[:, 0]) == [f"{q} ({n})" for q, n in answer_module.QUESTIONS.items()]
    return dict(zip(answer_module.QUESTIONS, table[f"B = {batch}"], strict=True))


def question(out) -> tuple[str, str]:
    """The pay question's cell and the note behind it (its part of the batch's note)."""
    note = out.verdict[0]
    return cells_of(out)[answer_module.PAY], note[: note.index("Best budgets:")]


def test_a_gain_whose_spread_across_jobs_includes_one_says_so_and_is_no_win():
    # sglang's pooled median 1 ms (the modelled gain ~1.07x), but one of its three jobs ran at 4 µs, faster
    # than the gpu builder's 5 µs: the jobs do not agree on which is faster
    summary = build_rows({8: 1e-3, 64: 1e-3}, {8: (3, 4e-6, 1.1e-3), 64: (3, 4e-6, 1.1e-3)})
    cell, text = question(answer_of(summary))
    gain = float(cell.split(": ")[1].split("x")[0])
    assert gain > 1 + answer_module.SAME  # would be a "yes" without the spread
    assert cell == f"no win shown: {gain:.3f}x (its spread includes 1.0x)"
    assert "yes" not in cell
    assert "across the builds' timing jobs; the spread includes 1.0x" in text
    # the build alone: 1 ms / 5 µs = 200x, from 4 µs / 5 µs = 0.8x to 1.1 ms / 5 µs = 220x
    build = "gpu builder's 200x (0.80x to 220x across 3 and 1 jobs; the spread includes 1.0x)"
    assert build in text


def test_a_gain_whose_spread_excludes_one_is_a_yes_with_its_range():
    summary = build_rows({8: 1e-3, 64: 1e-3}, {8: (3, 0.9e-3, 1.2e-3), 64: (3, 0.9e-3, 1.2e-3)})
    cell, text = question(answer_of(summary))
    assert cell.startswith("yes: ")
    assert "includes 1.0x" not in text and "one job" not in text
    # the range: gpu's round (fixed: one job) over sglang's with its build at its fastest and slowest job
    result = throughput(summary, step_rows(), shapes(), RoundAssumptions(), distribution="d", depth=16)
    table = result.table.set_index(["builder", "budget"])
    best = best_budgets(result.table).set_index("builder")
    g = table.loc[("gpu", int(best.loc["gpu", "best_budget"]))]
    o = table.loc[("sglang", int(best.loc["sglang", "best_budget"]))]
    low = (g["tau"] / g["round_s"]) / (o["tau"] / (o["round_s"] - 1e-3 + 0.9e-3))
    high = (g["tau"] / g["round_s"]) / (o["tau"] / (o["round_s"] - 1e-3 + 1.2e-3))
    assert f"{low:.3f}x to {high:.3f}x across the builds' timing jobs" in text
    assert "sglang's over the gpu builder's 200x (180x to 240x across 3 and 1 jobs)" in text
    note = answer_of(summary).verdict[0]
    assert "the same with every build at its fastest or its slowest timing job" in note


def test_a_summary_without_spread_columns_reads_as_one_job_and_says_so():
    cell, text = question(answer_of(build_rows({8: 1e-3, 64: 1e-3})))
    assert cell.startswith("yes: ")
    assert "one timing job per build: no spread measured" in text
    assert "sglang's over the gpu builder's 200x (one job each: no spread measured)" in text


def test_the_published_answer_reads_as_one_job_and_its_run_rounds_as_one_run():
    from ddtree_bench.report import throughput as throughput_report  # noqa: PLC0415

    machines = load_machines(PUBLISHED / "h200" / "summary.parquet")
    settings = {"h200": {"layers": 61, "depth": 16, "distribution": "drafter"}}
    found = throughput_report.sections(machines, settings, None, distributions=["drafter"], depth=16)
    out = answer_module.answer(machines, {}, settings, found)
    # a note per batch under the first profile (paper), then one under the other (k2.6-reported)
    assert out.machine == "h200" and len(out.verdict) == 3 and "k2.6-reported" in out.verdict[2]
    # the verdict at a glance: a row per question, a column per batch, yes or no and its number
    assert list(out.verdict_table.columns) == ["question (the number it rests on)", "B = 1", "B = 64"]
    assert cells_of(out, 1)[answer_module.PAY] == "no: 1.018x, within 2%"
    assert cells_of(out, 64)[answer_module.PAY] == "yes: 1.111x"
    assert cells_of(out, 64)[answer_module.BEATS_CPU] == "no (over native-mt): 1.005x, within 2%"
    assert cells_of(out, 64)[answer_module.MOVES] == "no: N = 16 for sglang, native-mt, gpu"
    for line in out.verdict[:2]:
        assert "(one job each: no spread measured)" in line
        assert "the spread includes 1.0x" not in line
    # B = 1: the rounds at the best budget were run on the GPU: one run each, no invented range
    assert "both rounds run on the GPU, one run each: no spread across jobs" in out.verdict[0]
    assert "across the builds' timing jobs" not in " ".join(out.verdict)


def test_speedups_carry_their_range_across_jobs():
    def row(builder, median, spread=None):
        out = dict(
            machine="m",
            builder=builder,
            timing="wall",
            cache="n/a",
            status="ok",
            n=9,
            budget=8,
            batch=1,
            depth=16,
            distribution="d",
            median_s=median,
        )
        if spread:
            out |= dict(jobs=3, job_median_min_s=spread[0], job_median_max_s=spread[1])
        return out

    data = pd.DataFrame([row("sglang", 2e-3, (1.8e-3, 2.2e-3)), row("native", 1e-3, (0.9e-3, 1.1e-3))])
    sp = speedups(timings_of(data)).set_index("builder")
    assert sp.loc["native", "speedup"] == pytest.approx(2.0)
    assert sp.loc["native", "speedup_low"] == pytest.approx(1.8 / 1.1)
    assert sp.loc["native", "speedup_high"] == pytest.approx(2.2 / 0.9)
    assert sp.loc["native", "baseline_jobs"] == 3 and sp.loc["native", "series_jobs"] == 3
    assert not sp.loc["native", "includes_one"]
    # a spread that includes 1.0x
    data = pd.DataFrame([row("sglang", 2e-3, (0.8e-3, 2.2e-3)), row("native", 1e-3, (0.9e-3, 1.1e-3))])
    assert speedups(timings_of(data)).set_index("builder").loc["native", "includes_one"]
    # no spread columns (a published summary): one job each, the range is the speedup
    sp = speedups(timings_of(pd.DataFrame([row("sglang", 2e-3), row("native", 1e-3)]))).set_index("builder")
    assert sp.loc["native", "speedup_low"] == sp.loc["native", "speedup_high"] == pytest.approx(2.0)
    assert sp.loc["native", "baseline_jobs"] == 1 and sp.loc["native", "series_jobs"] == 1


def timings_of(summary: pd.DataFrame) -> pd.DataFrame:
    machine = Machine("m", "this run", summary, pd.DataFrame(), {})
    return timings([machine])


def test_tau_and_e_accepted_are_explained_as_one_plus_the_other_where_each_sits():
    from ddtree_bench.report.step import BREAKDOWN_INTRO  # noqa: PLC0415

    summary = build_rows({8: 1e-3, 64: 1e-3})
    result = throughput(summary, step_rows(), shapes(), RoundAssumptions(), distribution="d", depth=16)
    best = best_budgets(result.table)
    section = BudgetSection("m", "d", 16, result, best=best, gains=gpu_gains(best))
    out = answer_module.answer_from_round(section, {"layers": 61}, summary)
    assert all("tau" in table.columns for table in out.tables.values())
    # one tau everywhere (docs/drafter.md): the tokens a round commits, bonus included, over the whole trace
    assert answer_module.TAU_TEXT in out.intro()
    assert "tau: the tokens a round commits, the target's bonus token included" in answer_module.TAU_TEXT
    assert "averaged over every request of the trace" in answer_module.TAU_TEXT
    assert "step-time breakdown" not in out.intro()  # its E[accepted] is one batch's, not tau's
    # the breakdown's E[accepted] is its batch's requests' and says it is not tau
    assert "E[accepted], this batch's requests, is the expected number" in BREAKDOWN_INTRO
    assert "It is not tau" in BREAKDOWN_INTRO and "averaged over every request" in BREAKDOWN_INTRO


def test_a_builder_modelled_at_fewer_budgets_is_not_compared_for_the_best_budget(tmp_path):
    """On the published H200 set, reference and native were modelled at batch 64 at N = 512 only: their
    best budget is no answer to "does the best budget move?", and the verdict names them as not compared."""
    from ddtree_bench.report import ReportFiles, render_report  # noqa: PLC0415

    out = Path(__file__).resolve().parents[2] / "results" / "published" / "h200"
    target = tmp_path
    render_report(summary=out / "summary.parquet", files=ReportFiles.in_folder(target))
    markdown = (target / "summary.md").read_text()
    verdict = next(line for line in markdown.splitlines() if "**B = 64:**" in line)
    moves = verdict[verdict.index("Best budgets:") :]
    assert moves.startswith("Best budgets: sglang N = 16, native-mt N = 16, gpu N = 16")
    assert "not compared: reference, native (modelled at reference N = 512; native N = 512 only)" in moves
    row = next(line for line in markdown.splitlines() if line.startswith(f"| {answer_module.MOVES}"))
    assert row.endswith("| no: N = 16 for sglang, native-mt, gpu | no: N = 16 for sglang, native-mt, gpu |")


def test_a_batch_without_gpu_rows_says_why_in_every_cell():
    from types import SimpleNamespace  # noqa: PLC0415

    best = pd.DataFrame({"batch": [1, 1], "builder": ["native", "native-mt"], "best_budget": [16, 16]})
    cells, note = answer_module._round_verdict(1, pd.DataFrame(), SimpleNamespace(best=best))
    assert cells == {q: answer_module.NO_GPU_ROWS for q in answer_module.QUESTIONS}
    assert "needs a CUDA GPU" in answer_module.NO_GPU_ROWS
    assert note == "**B = 1:** no GPU builder rows at this batch."
