"""Which budget? The round model's arithmetic, the paper's worked example, the best-budget selection, the
build cost each builder is charged, the report section (published H200 data and a CPU-only run), and the
configuration's checks."""

from __future__ import annotations

import copy
import math
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from test_report import write_machine
from workflow_copy import ROOT

from ddtree_bench.config import check_config, throughput_options
from ddtree_bench.report import FIGURE_NAMES, load_machines, render_report
from ddtree_bench.report.throughput import TARGET, budget_targets, sections
from ddtree_bench.summary.step import summarize_steps, unavailable_stage_frame
from ddtree_bench.throughput import (
    PAPER_SPEEDUP,
    RoundModel,
    best_budgets,
    build_costs,
    gpu_gains,
    paper_example,
    tau_per_budget,
    throughput,
    tokens_per_second,
)

PUBLISHED = ROOT / "results" / "published" / "h200"


# ----------------------------------------------------------------------------------------------- arithmetic


def test_round_and_tokens_per_second_on_known_numbers():
    model = RoundModel(draft_s=1e-3, rest_fixed_s=2e-3, rest_per_token_s=10e-6, layers=61)
    # B = 4, N = 63: 4 x 64 = 256 tokens -> rest = 2 ms + 2.56 ms
    assert model.rest_s(4, 63) == pytest.approx(4.56e-3)
    round_s = model.round_s(4, 63, build_s=0.5e-3, attention_layer_s=100e-6, accept_s=10e-6)
    # 1 (draft) + 0.5 (build) + 6.1 (61 x 0.1) + 4.56 (rest) + 0.01 (accept) ms
    assert round_s == pytest.approx(12.17e-3)
    assert tokens_per_second(9.0, 4, round_s) == pytest.approx(4 * 9.0 / 12.17e-3)


def test_model_from_config_and_its_defaults():
    model = RoundModel.from_config({"draft_ms": 2.5, "rest": {"fixed_ms": 3.0, "per_token_us": 7.0}}, 61)
    assert (model.draft_s, model.rest_fixed_s, model.rest_per_token_s) == pytest.approx((2.5e-3, 3e-3, 7e-6))
    default = RoundModel.from_config(None, 61)
    assert (default.draft_s, default.rest_fixed_s, default.rest_per_token_s) == pytest.approx(
        (0, 1e-3, 10e-6)
    )
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    assert throughput_options(check_config(config)) == {
        "draft_ms": 0.0,
        "fixed_ms": 1.0,
        "per_token_us": 10.0,
        "prefix_length": None,
    }


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: RoundModel(draft_s=-1.0), "draft_s: must be a finite number >= 0, got -1.0"),
        (lambda: RoundModel(rest_fixed_s=math.nan), "rest_fixed_s: must be a finite number >= 0"),
        (lambda: RoundModel(layers=0), "layers: must be an integer >= 1, got 0"),
        (lambda: RoundModel.from_config({"draft_ms": True}, 61), "throughput.draft_ms: must be a finite"),
        (lambda: tokens_per_second(0.5, 1, 1.0), "tau: must be a number >= 1"),
        (lambda: tokens_per_second(2.0, 0, 1.0), "batch: must be an integer >= 1, got 0"),
        (lambda: tokens_per_second(2.0, 1, 0.0), "round time: must be a number > 0"),
        (
            lambda: RoundModel().round_s(1, 8, build_s=-1.0, attention_layer_s=0.0, accept_s=0.0),
            "build_s: must be a finite number >= 0",
        ),
    ],
)
def test_bad_model_input_raises_value_error(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


# ----------------------------------------------------------------------------------------- worked example


def test_paper_example_puts_the_peak_where_the_paper_does():
    example = paper_example()
    assert list(example["budget"]) == [16, 32, 64, 128, 256, 512, 1024]
    best = int(example.loc[example["modelled_speedup"].idxmax(), "budget"])
    assert best in (256, 512)  # the paper: speed peaks at budgets 256-512
    paper_best = max(PAPER_SPEEDUP, key=PAPER_SPEEDUP.get)
    assert best == paper_best == 512
    # the round costs are the paper's rounded ratios: within 1 % of its speedups at every budget
    ratio = example["modelled_speedup"] / example["paper_speedup"]
    assert ratio.between(0.99, 1.011).all(), example
    # and 1024 is past the peak, as in the paper
    assert example.set_index("budget")["modelled_speedup"][1024] < example["modelled_speedup"].max() * 0.95


# ----------------------------------------------------------------------------------------------- inputs


def summary_rows(rows):
    """Build-summary rows: (builder, timing, cache, batch, budget, median_s), distribution d, depth 16."""
    return pd.DataFrame(
        [
            {
                "builder": b,
                "timing": t,
                "cache": c,
                "batch": batch,
                "budget": budget,
                "median_s": m,
                "status": "ok",
                "n": 5,
                "distribution": "d",
                "depth": 16,
            }
            for b, t, c, batch, budget, m in rows
        ]
    )


def test_build_cost_is_in_situ_where_a_builder_has_it_else_kernel_or_wall():
    summary = summary_rows(
        [
            ("native", "wall", "n/a", 1, 8, 3e-6),
            ("native", "in-situ", "n/a", 1, 8, 40e-6),  # in-situ beats the bare wall time
            ("native", "wall", "n/a", 1, 64, 5e-6),  # no in-situ row at N = 64: not mixed in
            ("gpu", "kernel-events", "warm", 1, 8, 6e-6),
            ("gpu", "kernel-events", "cold", 1, 8, 9e-6),
            ("gpu", "host-inclusive", "n/a", 1, 8, 50e-6),
            ("reference", "wall", "n/a", 1, 8, 50e-6),
        ]
    )
    costs = build_costs(summary, "d", 16).set_index(["builder", "budget"])
    assert costs.loc[("native", 8), "build_s"] == pytest.approx(40e-6)
    assert costs.loc[("native", 8), "build_from"] == "in-situ"
    assert ("native", 64) not in costs.index
    assert costs.loc[("gpu", 8), "build_s"] == pytest.approx(6e-6)  # warm kernel, not cold or host-inclusive
    assert costs.loc[("gpu", 8), "build_from"] == "kernel (CUDA events)"
    assert costs.loc[("reference", 8), "build_from"] == "wall clock"
    # the GPU's in-situ rows: warm before n/a (the graph replay on the stream, not launch + sync wall)
    summary = pd.concat(
        [
            summary,
            summary_rows(
                [
                    ("gpu", "in-situ", "warm", 1, 8, 7e-6),
                    ("gpu", "in-situ", "warm", 1, 8, 6.5e-6),  # packed bits only: the fastest
                    ("gpu", "in-situ", "n/a", 1, 8, 20e-6),
                ]
            ),
        ]
    )
    costs = build_costs(summary, "d", 16).set_index(["builder", "budget"])
    assert costs.loc[("gpu", 8), "build_s"] == pytest.approx(6.5e-6)
    assert costs.loc[("gpu", 8), "build_from"] == "in-situ"


def step_rows(attention, accept, *, distribution="d", prefix=4096, heads=8):
    """Step-summary rows: ``attention`` {(batch, budget): s per layer}, ``accept`` {(batch, budget): s}."""
    common = dict(machine="m", depth=16, status="ok", n=3, distribution=distribution)
    rows = [
        dict(common, stage="verify-attention", impl="ours", batch=b, budget=n, heads=heads, prefix=prefix)
        | dict(timing="cuda-events", cache="warm", median_s=s)
        for (b, n), s in attention.items()
    ]
    rows += [
        dict(common, stage="accept", impl="gpu-kernel", batch=b, budget=n, heads=None, prefix=None)
        | dict(timing="cuda-events", cache="warm", median_s=s)
        for (b, n), s in accept.items()
    ]
    return pd.DataFrame(rows)


def shape_rows(expected, distribution="d"):
    return pd.DataFrame(
        [
            {"distribution": distribution, "depth": 16, "budget": n, "expected_accept_mean": e}
            for n, e in expected.items()
        ]
    )


def test_throughput_table_and_best_budget_on_synthetic_measurements():
    summary = summary_rows(
        [
            ("reference", "wall", "n/a", 1, 8, 0.1e-3),
            ("reference", "wall", "n/a", 1, 64, 2e-3),
            ("reference", "wall", "n/a", 1, 256, 9e-3),
            ("gpu", "kernel-events", "warm", 1, 8, 5e-6),
            ("gpu", "kernel-events", "warm", 1, 64, 20e-6),
            ("gpu", "kernel-events", "warm", 1, 256, 40e-6),
        ]
    )
    step = step_rows(
        {(1, 8): 20e-6, (1, 64): 30e-6, (1, 256): 60e-6}, {(1, 8): 4e-6, (1, 64): 4e-6, (1, 256): 4e-6}
    )
    shapes = shape_rows({8: 5.0, 64: 8.0, 256: 9.0})
    assert tau_per_budget(shapes, "d", 16).to_dict() == {8: 6.0, 64: 9.0, 256: 10.0}
    model = RoundModel(draft_s=0.0, rest_fixed_s=1e-3, rest_per_token_s=10e-6, layers=10)
    result = throughput(summary, step, shapes, model, distribution="d", depth=16)
    assert result.missing is None and result.verify.prefix == 4096 and result.verify.heads == 8
    table = result.table.set_index(["builder", "budget"])
    # gpu at N = 64: 20 us + 10 x 30 us + (1 ms + 10 us x 65) + 4 us = 1.974 ms; tau 9
    assert table.loc[("gpu", 64), "round_s"] == pytest.approx(1.974e-3)
    assert table.loc[("gpu", 64), "tokens_per_s"] == pytest.approx(9.0 / 1.974e-3)
    best = best_budgets(result.table).set_index("builder")
    # gpu: 6 / 1.299 ms (N=8) = 4619, 9 / 1.974 ms = 4559, 10 / 4.214 ms = 2373 -> N = 8
    assert best.loc["gpu", "best_budget"] == 8
    # reference pays 2 ms at N = 64, so it stays at 8 as well, with fewer tokens/s
    assert best.loc["reference", "best_budget"] == 8
    assert best.loc["gpu", "budgets"] == (8, 64, 256)
    gains = gpu_gains(best_budgets(result.table))
    assert list(gains["baseline"]) == ["reference"]  # no sglang rows: the stand-in, labelled
    assert "stand-in" in gains["baseline_label"].iloc[0]
    expected = table.loc[("gpu", 8), "tokens_per_s"] / table.loc[("reference", 8), "tokens_per_s"]
    assert gains["gain"].iloc[0] == pytest.approx(expected)


def test_best_budget_picks_the_maximum_and_the_smaller_budget_on_a_tie():
    table = pd.DataFrame(
        {
            "batch": [1] * 6,
            "budget": [8, 64, 256] * 2,
            "builder": ["gpu"] * 3 + ["sglang"] * 3,
            "label": ["g"] * 3 + ["s"] * 3,
            "build_from": ["kernel"] * 3 + ["wall clock"] * 3,
            "tokens_per_s": [100.0, 300.0, 300.0, 200.0, 150.0, 50.0],
            "tau": [2.0, 3.0, 4.0] * 2,
            "round_s": [0.02, 0.01, 0.013] * 2,
        }
    )
    best = best_budgets(table).set_index("builder")
    assert best.loc["gpu", "best_budget"] == 64  # tie with 256: the smaller budget
    assert best.loc["sglang", "best_budget"] == 8
    gains = gpu_gains(best_budgets(table))
    assert gains.iloc[0][["baseline", "gpu_budget", "baseline_budget"]].tolist() == ["sglang", 64, 8]
    assert gains["gain"].iloc[0] == pytest.approx(1.5)  # each at its own best budget: 300 / 200


def test_missing_inputs_say_why_and_model_nothing():
    summary = summary_rows([("gpu", "kernel-events", "warm", 1, 8, 5e-6)])
    shapes = shape_rows({8: 5.0})
    model = RoundModel()
    none = throughput(summary, pd.DataFrame(), shapes, model, distribution="d", depth=16)
    assert none.table.empty and none.missing.startswith("needs the step stages")
    step = step_rows({(1, 8): 20e-6}, {(1, 8): 4e-6})
    wrong_prefix = throughput(summary, step, shapes, model, distribution="d", depth=16, prefix=32768)
    assert wrong_prefix.table.empty and "no verify attention measured at S = 32768" in wrong_prefix.missing
    no_tau = throughput(summary, step, shape_rows({8: 5.0}, "other"), model, distribution="d", depth=16)
    assert no_tau.table.empty and "no expected acceptance of the d trees" in no_tau.missing
    # the step measured other trees: used, and the heading says so
    other = throughput(
        summary,
        step_rows({(1, 8): 20e-6}, {(1, 8): 4e-6}, distribution="e"),
        shapes,
        model,
        distribution="d",
        depth=16,
    )
    assert not other.table.empty and other.verify.distribution == "e"


# ----------------------------------------------------------------------------------------------- report


def test_section_names_best_budgets_on_the_published_h200_data(tmp_path):
    out = tmp_path / "report"
    render_report(
        summary=PUBLISHED / "summary.parquet",
        html=out / "index.html",
        markdown=out / "summary.md",
        depth=16,
        distribution="drafter",
        step_depth=16,
        step_distribution="drafter",
        distributions=["drafter"],
    )
    markdown = (out / "summary.md").read_text()
    section = markdown[markdown.index("### Which budget?\n") : markdown.index("## Environment")]
    assert "#### h200: drafter trees (L = 16; verify attention at S = 32768, 8 heads)" in section
    assert section.count("The model's assumptions") == 1 and section.count("\n1. ") == 3
    assert "| B | builder | build cost from | best N | tokens/s | tau | round | budgets compared |" in section
    for label in ("sglang (SGLang's CPU builder)", "reference (ours, Python)", "native-mt (C++, all cores)"):
        assert f"| 64 | {label} | in-situ |" in section  # what the decode round pays
    assert "| 1 | gpu (our CUDA kernel) | in-situ |" in section
    assert "![which_budget](figures/which_budget.png)" in markdown  # in the figures, above the detail
    assert (out / "figures" / "which_budget.png").stat().st_size > 10_000
    target = next(line for line in markdown.splitlines() if TARGET in line)
    assert "| met |" in target and "gpu 8" in target
    page = (out / "index.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(FIGURE_NAMES)
    assert "<h3>Which budget?</h3>" in page


def test_a_configured_distribution_the_machine_lacks_is_named_not_substituted_silently():
    machines = load_machines(PUBLISHED / "summary.parquet")
    found = sections(machines, {"h200": {"layers": 61}}, None, distributions=["peaked", "recorded"], depth=16)
    assert [s.distribution for s in found] == ["drafter", "recorded"]
    assert (
        found[0].note == "The configured peaked trees are absent on h200; shown instead: its drafter trees."
    )
    assert found[0].heading().startswith("h200: drafter trees")
    # nothing else to show for the recorded trees: said, not substituted by the drafter trees again
    assert found[1].result is None
    assert found[1].missing == "no tree-build rows of the recorded trees on this machine"


def test_section_on_a_cpu_only_run_says_it_needs_the_step_stages(tmp_path):
    ours = write_machine(tmp_path / "m", "laptop")
    out = tmp_path / "r"
    render_report(summary=ours, html=out / "index.html", markdown=out / "summary.md", step_enabled=False)
    markdown = (out / "summary.md").read_text()
    section = markdown[markdown.index("### Which budget?\n") : markdown.index("## Environment")]
    assert "#### laptop: uniform trees (L = 16)" in section
    assert "_no data: needs the step stages (measured verify attention): step stages off" in section
    assert "| B | builder |" not in section
    target = next(line for line in markdown.splitlines() if TARGET in line)
    assert "| no data |" in target
    page = (out / "index.html").read_text()
    assert page.count("data:image/png;base64,") == len(FIGURE_NAMES)
    results = budget_targets(sections(load_machines(ours), {}, None), load_machines(ours))
    assert [r[3] for r in results] == ["no data"]


def test_a_machine_without_step_stages_borrows_a_published_machines_verify_and_names_it(tmp_path):
    # a CPU machine's own builds and trees (the published CPU builders' rows, relabelled), no step stages
    summary = pd.read_parquet(PUBLISHED / "summary.parquet")
    summary = summary[summary["builder"] != "gpu"].assign(machine="laptop")
    folder = tmp_path / "laptop"
    folder.mkdir()
    summary.to_parquet(folder / "summary.parquet")
    pd.read_parquet(PUBLISHED / "tree_shape.parquet").assign(machine="laptop").to_parquet(
        folder / "tree_shape.parquet"
    )
    machines = load_machines(
        folder / "summary.parquet", folder / "tree_shape.parquet", published=[PUBLISHED / "summary.parquet"]
    )
    assert machines[0].step.empty and not machines[1].step.empty
    # with no step summary, and with one whose rows only say why the stages could not run here
    for step in (
        machines[0].step,
        summarize_steps(unavailable_stage_frame("attention", "no GPU", machine="laptop")),
    ):
        machines[0].step = step
        found = sections(machines, {}, None, distributions=["drafter"], depth=16)
        laptop = next(s for s in found if s.machine == "laptop")
        assert laptop.result is not None and not laptop.missing
        assert "Verify attention and tree accept measured on h200 (published)" in laptop.note
        assert "tree builds and tau are laptop's" in laptop.note
        assert set(laptop.best["builder"]) == {"sglang", "reference", "native", "native-mt"}
        # the published machine keeps its own measurements: nothing borrowed from a machine without them
        h200 = next(s for s in found if s.machine == "h200")
        assert "measured on" not in h200.note


# ----------------------------------------------------------------------------------------------- config


def default_config() -> dict:
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


BAD = [
    ({"draft_ms": -1}, "config: throughput.draft_ms: must be a finite number >= 0, got -1"),
    ({"draft_ms": "fast"}, "config: throughput.draft_ms: must be a finite number >= 0, got 'fast'"),
    (
        {"rest": {"fixed_ms": -0.5}},
        "config: throughput.rest.fixed_ms: must be a finite number >= 0, got -0.5",
    ),
    ({"rest": {"per_token_us": True}}, "config: throughput.rest.per_token_us: must be a finite number >= 0"),
    ({"rest": {"per_token_us": float("inf")}}, "config: throughput.rest.per_token_us: must be a finite"),
    ({"rest": {"fixed": 1}}, "config: throughput.rest: Additional properties are not allowed ('fixed'"),
    ({"prefix_length": 0}, "config: throughput.prefix_length: must be an integer >= 1 or null, got 0"),
    (
        {"prefix_length": 8192},
        "config: throughput.prefix_length: 8192 is not one of step.attention.prefix_lengths",
    ),
    ({"budget": 1}, "config: throughput: Additional properties are not allowed ('budget' was unexpected)"),
]


@pytest.mark.parametrize(("section", "message"), BAD, ids=[str(s) for s, _ in BAD])
def test_bad_throughput_config_is_one_clear_line(section, message):
    config = default_config()
    config["throughput"] = copy.deepcopy(section)
    with pytest.raises(ValueError) as error:
        check_config(config)
    text = str(error.value)
    assert "\n" not in text
    assert text.startswith(message), text


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "ddtree_bench.cli", "budget", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_cli_budget_takes_a_config_fragment_and_refuses_bad_values(tmp_path):
    fragment = tmp_path / "service.yaml"
    fragment.write_text("throughput:\n  draft_ms: 2.0\n  rest: {fixed_ms: 30.0, per_token_us: 25.0}\n")
    done = run_cli(PUBLISHED, "--configfile", fragment)
    assert done.returncode == 0, done.stderr
    assert "Model: draft 2 ms; rest 30 ms + 25 µs x B x (N + 1)" in done.stdout
    assert "| B | builder | build cost from | best N |" in done.stdout
    fragment.write_text("throughput:\n  rest: {fixed_ms: -3}\n")
    bad = run_cli(PUBLISHED, "--configfile", fragment)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "ddtree-bench: error: config: throughput.rest.fixed_ms: must be a finite number >= 0, got -3"
    ]
    assert bad.stdout == ""
    missing = run_cli(tmp_path / "nowhere")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert "no summary.parquet" in missing.stderr
