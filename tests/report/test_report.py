"""Aggregation (median, p10, p90, n over timed calls only), the tree shape, the benchmark targets, and the
report rendering from a tiny synthetic summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from report_rows import rows_for, write_machine

from ddtree_bench.builders import get_builder
from ddtree_bench.catalog import all_series
from ddtree_bench.report import (
    FIGURE_NAMES,
    SGLANG_FUNCTION_TARGET,
    ReportFiles,
    evaluate_targets,
    load_machines,
    reference_vs_sglang_table,
    render_report,
    sglang_source_table,
    speedups,
    timings,
)
from ddtree_bench.stages.build import COLUMNS, unavailable_frame
from ddtree_bench.summary.build import SUMMARY_COLUMNS, aggregate, combine_shapes, summarize, tree_shape
from ddtree_bench.traces import generate_trace, save_trace


def test_summary_statistics_on_known_samples():
    seconds = [float(s) for s in range(1, 11)]  # 1..10
    rows = rows_for("reference", seconds, warmup=[100.0, 200.0])
    summary = summarize(rows)
    assert list(summary.columns) == list(SUMMARY_COLUMNS)
    assert len(summary) == 1
    row = summary.iloc[0]
    assert row["n"] == 10  # warm-up calls never enter a statistic
    assert row["median_s"] == pytest.approx(5.5)
    assert row["p10_s"] == pytest.approx(1.9)  # linear interpolation: 1 + 0.1 * 9
    assert row["p90_s"] == pytest.approx(9.1)
    assert row["mean_s"] == pytest.approx(5.5)
    assert row["min_s"] == pytest.approx(1.0)
    assert row["median_per_tree_s"] == pytest.approx(2.75)
    assert row["p10_per_tree_s"] == pytest.approx(0.95)
    assert bool(row["correct"]) is True


def test_summary_keeps_configurations_apart_and_carries_unavailable_builders():
    rows = pd.concat(
        [
            rows_for("reference", [1.0, 3.0, 2.0], budget=8),
            rows_for("reference", [10.0, 30.0, 20.0], budget=16),
            rows_for("native", [0.5], budget=8),
            rows_for("gpu", [1e-5, 2e-5], timing="kernel-events", cache="warm"),
            rows_for("gpu", [3e-5, 4e-5], timing="kernel-events", cache="cold"),
            unavailable_frame("sglang", "SGLang is not installed", machine="m"),
        ],
        ignore_index=True,
    )
    summary = summarize(rows).set_index(["builder", "budget", "cache"])
    assert summary.loc[("reference", 8, "n/a"), "median_s"] == pytest.approx(2.0)
    assert summary.loc[("reference", 16, "n/a"), "median_s"] == pytest.approx(20.0)
    assert summary.loc[("native", 8, "n/a"), "n"] == 1
    assert summary.loc[("gpu", 8, "warm"), "median_s"] == pytest.approx(1.5e-5)
    assert summary.loc[("gpu", 8, "cold"), "median_s"] == pytest.approx(3.5e-5)
    sglang = summary.loc[("sglang", 0, "n/a")]
    assert sglang["status"] == "unavailable" and sglang["n"] == 0
    assert sglang["status_reason"] == "SGLang is not installed"


def test_aggregate_writes_summary_shapes_and_environment(tmp_path):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    rows_for("reference", [1.0, 2.0, 3.0]).to_parquet(a)
    rows_for("native", [0.1, 0.2]).to_parquet(b)
    shape = tmp_path / "s.json"
    shape.write_text(
        json.dumps(
            [
                {
                    "distribution": "uniform",
                    "depth": 2,
                    "budget": 4,
                    "topk": 4,
                    "requests": 1,
                    "tree_nodes_mean": 4.0,
                    "tree_depth": 1,
                    "nodes_mean": 2.0,
                    "nodes_p10": 2.0,
                    "nodes_p90": 2.0,
                }
            ]
        )
    )
    summary = aggregate(
        [a, b],
        tmp_path / "out" / "summary.parquet",
        shape_paths=[shape],
        shape_path=tmp_path / "out" / "shape.parquet",
        environment={"machine": "m"},
        environment_path=tmp_path / "out" / "env.json",
    )
    assert len(summary) == 2
    assert len(pd.read_parquet(tmp_path / "out" / "summary.parquet")) == 2
    assert len(pd.read_parquet(tmp_path / "out" / "shape.parquet")) == 1
    assert json.loads((tmp_path / "out" / "env.json").read_text()) == {"machine": "m"}


def test_tree_shape_counts_nodes_per_depth(tmp_path):
    path = tmp_path / "t.npz"
    lp, ids = generate_trace("bf16", 5, 4, 8, vocab_size=200, seed=1, device="cpu")
    save_trace(path, lp, ids, distribution="bf16")
    records = tree_shape(path, 6, distribution="bf16")
    assert [r["tree_depth"] for r in records] == [1, 2, 3, 4]
    trees = get_builder("reference").build(lp, ids, 6)
    assert sum(r["nodes_mean"] for r in records) == pytest.approx(trees.node_count.mean())
    depth1 = np.mean([(trees.node_depths[i, : trees.node_count[i]] == 1).sum() for i in range(5)])
    assert records[0]["nodes_mean"] == pytest.approx(depth1)
    assert all(r["topk"] == 6 and r["requests"] == 5 for r in records)
    assert len(combine_shapes([])) == 0


RETIRED = (
    "native (1 thread) >= 50x",
    "reference within +-25%",
    "gpu kernel >= 500x faster than",
    "gpu kernel >= 1000x faster than",
    "gpu kernel <= 2x the empty-kernel floor",
    "verify attention (ours) >= 3.0 TB/s",
    "verify attention (ours) >= 300 TFLOP/s",
    "FlexAttention",
)


def test_retired_goals_are_gone_and_gpu_goals_say_no_data_without_gpu_rows(tmp_path):
    fast = load_machines(write_machine(tmp_path / "fast", "fast", native_speedup=100.0))
    status = {r.target: r.status for r in evaluate_targets(fast)}
    assert not [t for t in status if any(old in t for old in RETIRED)]
    assert all(s == "no data" for t, s in status.items() if t.startswith("gpu"))
    assert "gpu kernel <= 100 µs at budget 1024, batch 64" in status


def _kernel_machine(tmp_path, microseconds, distribution="drafter"):
    """A machine with the gpu kernel at budget 1024, batch 64 on one distribution, its trace K = 1024 wide."""
    rows = rows_for(
        "gpu",
        [microseconds * 1e-6],
        budget=1024,
        batch=64,
        machine="h200",
        distribution=distribution,
        timing="kernel-events",
        cache="warm",
    )
    path = tmp_path / distribution / "summary.parquet"
    path.parent.mkdir(parents=True)
    summarize(rows).to_parquet(path)
    return load_machines(path)


def test_the_100_us_goal_is_evaluated_on_every_distribution_and_says_by_how_much(tmp_path):
    target = "gpu kernel <= 100 µs at budget 1024, batch 64"
    met = {r.target: r for r in evaluate_targets(_kernel_machine(tmp_path, 100.0))}[target]
    assert met.status == "met" and "drafter" in met.measured and met.source == "tree build"
    short = {r.target: r for r in evaluate_targets(_kernel_machine(tmp_path, 200.0, "peaked"))}[target]
    assert short.status == "not met" and "200.0 µs (worst: N=1024, B=64, L=16, peaked)" in short.measured
    assert short.measured.endswith("100.0 µs over")


def test_gpu_targets_are_evaluated_where_gpu_data_exists(tmp_path):
    from ddtree_bench.report import SGLANG_FUNCTION_TARGET  # noqa: PLC0415

    machines = load_machines(write_machine(tmp_path / "h", "h200", sglang=True, gpu=True))
    status = {r.target: r for r in evaluate_targets(machines)}
    assert not [t for t in status if any(old in t for old in RETIRED)]
    function = status[SGLANG_FUNCTION_TARGET]
    assert function.status == "met" and function.source == "SGLang's function"  # 56 ms / 20 µs
    assert not any("budget 1024, batch 1" in t for t in status)  # retired for the batch-1 in-situ target
    assert next(r for t, r in status.items() if "budget 1024, batch 64" in t).status == "no data"
    in_situ = [r for r in status.values() if r.target.startswith("in-situ")]
    assert len(in_situ) == 4 and all(r.status == "no data" for r in in_situ)
    assert {r.source for r in in_situ} == {"decode round (in-situ)"}


def test_sglang_function_goal_is_evaluated_on_a_fixed_width_trace_and_says_by_how_much(tmp_path):
    """The drafter traces are K = 1024 wide at every budget (K != N): the goal still judges them."""
    from ddtree_bench.report import SGLANG_FUNCTION_TARGET  # noqa: PLC0415

    common = dict(budget=8, batch=64, machine="h200", distribution="drafter")
    frames = [
        rows_for("sglang", [4e-3], **common),
        rows_for("native-mt", [2e-5], **common),
        rows_for("gpu", [2e-5], timing="kernel-events", cache="warm", **common),
    ]
    frames = [f.assign(topk=1024) for f in frames]
    path = tmp_path / "summary.parquet"
    summarize(pd.concat(frames, ignore_index=True)).to_parquet(path)
    targets = {r.target: r for r in evaluate_targets(load_machines(path))}
    function = targets[SGLANG_FUNCTION_TARGET]
    assert function.status == "not met" and "min 200x where 500x is asked (N=8, B=64, L=16, drafter)" in (
        function.measured
    )
    assert "60% short" in function.measured
    assert not any(t.startswith("gpu host-inclusive") for t in targets)  # replaced by the in-situ target


def test_speedups_use_sglang_where_present_else_reference_labelled_as_ours(tmp_path):
    ours = write_machine(tmp_path / "ours", "laptop")
    published = write_machine(tmp_path / "published" / "h200", "h200", sglang=True)
    data = timings(load_machines(ours, published=[published]))
    sp = speedups(data)
    assert set(sp.loc[sp["machine"] == "laptop", "baseline"]) == {"reference"}
    assert set(sp.loc[sp["machine"] == "h200", "baseline"]) == {"sglang"}
    assert sp.loc[sp["machine"] == "laptop", "panel"].str.contains("reference \\(ours\\)").all()
    native = sp[(sp["machine"] == "laptop") & (sp["builder"] == "native")]
    assert native["speedup"].to_numpy() == pytest.approx(100.0)


def test_report_renders_self_contained_html_and_markdown(tmp_path):
    ours = write_machine(tmp_path / "results" / "laptop", "laptop")
    published = write_machine(tmp_path / "results" / "published" / "h200", "h200", sglang=True)
    out = tmp_path / "report"
    figures = [out / "figures" / f"{name}.png" for name in FIGURE_NAMES]
    render_report(
        summary=ours,
        published=[published],
        files=ReportFiles(out / "index.html", out / "summary.md", figures=figures),
        depth=16,
        distribution="uniform",
    )
    page = (out / "index.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(FIGURE_NAMES)
    assert "<img" in page and 'src="figures/' not in page  # nothing to fetch: self-contained
    for figure in figures:
        assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (out / "summary.md").read_text()
    assert "| N | B |" in markdown
    assert "reference (ours, Python)" in markdown
    assert "| machine | target | from | status | measured |" in markdown
    assert "SGLang has no DDTree module" in markdown and "no CUDA device" in markdown
    assert "laptop (this run)" in markdown and "h200 (published)" in markdown
    assert "laptop: speedups over reference (ours)" in markdown
    assert "h200: speedups over SGLang's CPU builder" in markdown
    assert "Test CPU" in page


def test_report_renders_with_no_timings(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    summarize(unavailable_frame("gpu", "no CUDA device", machine="m")).to_parquet(folder / "summary.parquet")
    (folder / "environment.json").write_text(json.dumps({"machine": "m"}))
    render_report(
        summary=folder / "summary.parquet",
        files=ReportFiles.in_folder(tmp_path / "r"),
    )
    assert "no CUDA device" in (tmp_path / "r" / "summary.md").read_text()
    assert (tmp_path / "r" / "index.html").read_text().count("data:image/png;base64,") == len(FIGURE_NAMES)


def test_columns_contract_is_what_docs_say():
    documented = (
        "builder, label, budget, batch, depth, topk, input_columns, distribution, repetition, "
        "phase (warmup|timed), "
        "timing, cache, seconds, per_tree_seconds, status, status_reason, correct (bool), nodes_mean, "
        "device_memory_bytes, threads, trace_sha256, machine, hostname, cpu_model, cpu_count, gpu_name, "
        "gpu_driver, python, numpy, cupy, torch, sglang, git_commit, timestamp, clock, builder_source, "
        "builder_source_sha256, builder_source_git_commit, builder_workspace"
    )
    names = [part.strip().split(" ")[0] for part in documented.split(", ")]
    assert list(COLUMNS) == names


def test_goals_are_named_by_what_they_measure_never_by_an_issue(tmp_path):
    machines = load_machines(write_machine(tmp_path / "m", "m", sglang=True, gpu=True))
    sources = {r.source for r in evaluate_targets(machines)}
    allowed = {"tree build", "decode round (in-situ)", "SGLang's function", "verify attention", "tree accept"}
    assert sources <= allowed | {"acceptance", "throughput"}
    texts = [f"{r.target} {r.source} {r.measured}".lower() for r in evaluate_targets(machines)]
    assert not [text for text in texts if "issue" in text]


# -- SGLang's measured function: the published run, the target, the stand-in's ratio, the provenance ---------

PUBLISHED_SGLANG = Path(__file__).resolve().parents[2] / "results" / "published" / "h200-sglang"


def test_published_h200_sglang_run_loads_and_its_sglang_target_is_evaluated():
    assert {"summary.parquet", "tree_shape.parquet", "environment.json", "README.md"} <= {
        p.name for p in PUBLISHED_SGLANG.iterdir()
    }
    (machine,) = load_machines(PUBLISHED_SGLANG / "summary.parquet")
    assert machine.label == "h200-sglang" and not machine.shapes.empty
    sglang = machine.summary[machine.summary["builder"] == "sglang"]
    assert len(sglang) == 24 and (sglang["status"] == "ok").all() and sglang["correct"].all()
    (result,) = [r for r in evaluate_targets([machine]) if r.target == SGLANG_FUNCTION_TARGET]
    assert result.status in ("met", "not met")
    assert "where 500x is asked" in result.measured and "where 1,000x is asked" in result.measured
    assert "(12 configurations)" in result.measured  # batch 64: 6 budgets x 2 traces
    # the run's own numbers: the smallest ratio at budgets <= 64 and from 256 up decide the status
    ok = machine.summary[(machine.summary["status"] == "ok") & (machine.summary["n"] > 0)]
    keys = ["budget", "distribution"]
    kernel = ok[(ok["builder"] == "gpu") & (ok["timing"] == "kernel-events") & (ok["cache"] == "warm")]
    pairs = sglang[sglang["batch"] == 64][keys + ["median_s"]].merge(
        kernel[kernel["batch"] == 64][keys + ["median_s"]], on=keys, suffixes=("_s", "_k")
    )
    ratio = pairs["median_s_s"] / pairs["median_s_k"]
    met = ratio[pairs["budget"] <= 64].min() >= 500 and ratio[pairs["budget"] >= 256].min() >= 1000
    assert result.status == ("met" if met else "not met")
    table = reference_vs_sglang_table([machine])
    assert len(table) == 24 and set(table["machine"]) == {"h200-sglang"}
    assert table["reference / SGLang"].astype(float).between(0.05, 20).all()
    (source,) = sglang_source_table([machine]).to_dict("records")
    assert source["SGLang's function from"].startswith("not recorded in these rows")


def sglang_function_machine(folder, *, kernel_us_at_8: float, provenance: bool = False):
    """SGLang's function at batch 64 (1 ms at N = 8, 100 ms at N = 256) and the kernel (N = 256: 50 µs)."""
    frames = []
    for budget, sglang_s, kernel_s in ((8, 1e-3, kernel_us_at_8 * 1e-6), (256, 0.1, 5e-5)):
        frames.append(rows_for("reference", [sglang_s / 2], budget=budget, batch=64, machine="s"))
        sglang = rows_for("sglang", [sglang_s], budget=budget, batch=64, machine="s")
        if provenance:
            sglang = sglang.assign(
                builder_source="/x/dflash_ddtree_utils.py",
                builder_source_sha256="ab" * 32,
                builder_source_git_commit="c" * 40,
                builder_workspace=True,
            )
        frames.append(sglang)
        frames.append(
            rows_for(
                "gpu", [kernel_s], budget=budget, batch=64, machine="s", timing="kernel-events", cache="warm"
            )
        )
    folder.mkdir(parents=True, exist_ok=True)
    summarize(pd.concat(frames, ignore_index=True)).to_parquet(folder / "summary.parquet")
    (folder / "environment.json").write_text(json.dumps({"machine": "s"}))
    return load_machines(folder / "summary.parquet")


def test_sglang_function_target_met_not_met_and_by_how_much(tmp_path):
    def result(machines):
        return next(r for r in evaluate_targets(machines) if r.target == SGLANG_FUNCTION_TARGET)

    met = result(sglang_function_machine(tmp_path / "a", kernel_us_at_8=1.0))  # 1000x and 2000x
    assert met.status == "met" and "short" not in met.measured
    slow = sglang_function_machine(tmp_path / "b", kernel_us_at_8=4.0, provenance=True)  # 250x at N = 8
    missed = result(slow)
    assert missed.status == "not met"
    assert "N=8, B=64, L=16, uniform: 250x, 50% short" in missed.measured
    assert "500x needs <= 2.0 µs" in missed.measured and "N=256" not in missed.measured.split("short:")[1]
    (source,) = sglang_source_table(slow).to_dict("records")
    assert (
        source["SGLang's function from"] == "/x/dflash_ddtree_utils.py" and source["file sha256"] == "ab" * 32
    )
    assert source["workspace passed"] == "yes" and "c" * 40 not in str(source)  # commit: data only
    # a machine where SGLang's function did not run says so, naming where it did
    other = load_machines(write_machine(tmp_path / "c", "laptop"))[0]
    nodata = result([other, *slow])
    assert nodata.machine == "laptop" and nodata.status == "no data" and "measured on s" in nodata.measured


# -- the page's layout: the answer first, detail collapsed, headings from the rows ------------------------

PUBLISHED_H200 = Path(__file__).resolve().parents[2] / "results" / "published" / "h200"
#: the stack, chain and attention run (step stages alone: no summary.parquet)
PUBLISHED_H100 = PUBLISHED_H200.parent / "h100"


def test_published_report_opens_with_the_answer_and_collapses_the_detail(tmp_path):
    out = tmp_path / "r"
    render_report(
        summary=PUBLISHED_H200 / "summary.parquet",
        published=[PUBLISHED_SGLANG / "summary.parquet"],
        files=ReportFiles.in_folder(out),
        depth=16,
        distribution="drafter",
        step_depth=16,
        step_distribution="drafter",
        distributions=["drafter"],
    )
    markdown, page = (out / "summary.md").read_text(), (out / "index.html").read_text()
    for text in (markdown, page):
        order = [
            text.index(h) for h in ("Answer", "Figures", "Detail tables", "Environment", "Appendix: goals")
        ]
        assert order == sorted(order)
        assert "issue" not in text.lower()
        assert not [old for old in RETIRED if old in text]
    answer = markdown[markdown.index("## Answer") : markdown.index("## Figures")]
    # the answer on the whole round (the model's S: the one the rounds were run at)
    assert "### Batch 1: h200, S = 4096 prefix tokens" in answer and "### Batch 64: h200" in answer
    assert "its share of that builder's whole round" in answer and "through triton-w4a16" in answer
    assert "| N | tau | round (gpu) | SGLang's function |" in answer
    assert "**B = 64:**" in answer and "![step_share]" in answer
    # the verdict at a glance: a row per question, a column per batch size, then the notes per batch
    assert "| question (the number it rests on) | B = 1 | B = 64 |" in answer
    for question in (
        "Does moving the build from SGLang's function to the GPU pay?",
        "Is the GPU kernel better than the best CPU builder",
        "Does the best budget move?",
    ):
        row = next(line for line in answer.splitlines() if line.startswith(f"| {question}"))
        assert len(row.split(" | ")) == 3 and all(c.startswith(("yes", "no")) for c in row.split(" | ")[1:])
    # every table between "Detail tables" and "Environment" is collapsed
    detail = page[page.index("<h2>Detail tables</h2>") : page.index("<h2>Environment</h2>")]
    starts = [i for i in range(len(detail)) if detail.startswith("<table>", i)]
    assert len(starts) > 5
    for start in starts:  # inside an open <details>
        before = detail[:start]
        assert before.count("<details>") > before.count("</details>"), detail[max(0, start - 300) : start]
    # a heading names what its rows hold: h200-sglang has no drafter rows, so its medians are peaked, said so
    assert (
        "Medians on h200-sglang (L = 16 fixed, not SGLang's L = N; peaked; per call, p10-p90); drafter trees "
        "not measured" in markdown
    )
    assert "Medians on h200-sglang (L = 16 fixed, not SGLang's L = N; drafter" not in markdown


def test_one_time_unit_per_column():
    from ddtree_bench.report.tables import one_unit_per_column  # noqa: PLC0415

    df = pd.DataFrame(
        {
            "t": ["5.5 µs (5.1 µs-5.9 µs)", "14.5 ms", "-"],
            "short": ["3.7 µs", "4.2 µs", "12.0 µs"],
            "prose": ["min 2 µs over 3 configurations", "4 ms", "x"],
        }
    )
    out = one_unit_per_column(df)
    assert list(out["t"]) == ["0.0055 ms (0.0051 ms-0.0059 ms)", "14.5 ms", "-"]
    assert list(out["short"]) == list(df["short"])  # one unit already
    assert list(out["prose"]) == list(df["prose"])  # not a time column


def test_selection_heading_says_what_is_absent(tmp_path):
    from ddtree_bench.report.load import selection_heading  # noqa: PLC0415

    data = timings(load_machines(write_machine(tmp_path / "m", "m")))
    assert (
        selection_heading(data, "m", 16, "uniform")
        == "m (L = 16 fixed, not SGLang's L = N; uniform; per call, p10-p90)"
    )
    heading = selection_heading(data, "m", 16, "drafter")
    assert heading.startswith("m (L = 16 fixed, ") and heading.endswith("; drafter trees not measured on m")
    assert "drafter;" not in heading


def test_figures_show_every_machine_naming_what_a_machine_lacks(tmp_path):
    from ddtree_bench.report.figures import others_note, select_each  # noqa: PLC0415

    data = timings(
        load_machines(PUBLISHED_H200 / "summary.parquet", published=[PUBLISHED_SGLANG / "summary.parquet"])
    )
    sel, depth, distribution = select_each(data, 16, "drafter")
    assert (depth, distribution) == (16, "drafter")
    assert set(sel["machine"]) == {"h200", "h200-sglang: peaked, L = 16"}  # its own rows, named
    assert (
        others_note(sel, distribution)
        == "; machines without these rows at their own: h200-sglang (peaked, L = 16)"
    )
    assert "gpu kernel, packed bits only (CUDA events)" in set(sel["series"])


# -- the report's structure: one model, two writers; the figures' panels; the first screen ----------------

REPORT_PACKAGE = Path(__file__).resolve().parents[2] / "src" / "ddtree_bench" / "report"


def _published_model(figure_folder):
    from ddtree_bench.report import ReportOptions, compose_report  # noqa: PLC0415
    from ddtree_bench.report.names import FIGURE_NAMES as NAMES  # noqa: PLC0415

    machines = load_machines(
        PUBLISHED_H200 / "summary.parquet",
        published=[PUBLISHED_SGLANG / "summary.parquet", PUBLISHED_H100 / "summary.parquet"],
    )
    options = ReportOptions(
        depth=16,
        distribution="drafter",
        step_depth=16,
        step_distribution="drafter",
        distributions=["drafter"],
    )
    figure_folder.mkdir(parents=True, exist_ok=True)
    return compose_report(machines, options, {name: figure_folder / f"{name}.png" for name in NAMES})


@pytest.fixture(scope="module")
def published_model(tmp_path_factory):
    """The published report's model, with every figure kept open to inspect."""
    import matplotlib  # noqa: PLC0415

    from ddtree_bench.report.figures import collect_figures  # noqa: PLC0415

    matplotlib.use("Agg")
    with collect_figures() as figures:
        model = _published_model(tmp_path_factory.mktemp("figures"))
        yield model, dict(figures)


def _check_panels(name, fig):
    """Every panel has data (an empty one is removed); in the main figures, at most one line per builder."""
    from ddtree_bench.report.names import BUILDER_STYLES, PER_BUILDER_FIGURES  # noqa: PLC0415

    for ax in fig.axes:
        assert ax.has_data(), f"{name}: an empty panel ({ax.get_title()!r})"
        if name not in PER_BUILDER_FIGURES:
            continue
        labelled = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
        builders = [line.get_gid() for line in labelled]
        assert None not in builders, f"{name}: a series that is not a builder's in {ax.get_title()!r}"
        assert set(builders) <= set(BUILDER_STYLES), (name, builders)
        assert len(builders) == len(set(builders)), f"{name}: a builder twice in {ax.get_title()!r}"


def _look(handle) -> tuple:
    """What tells a legend entry apart: its colour with its marker and line style, or its fill and hatch."""
    from matplotlib.colors import to_hex  # noqa: PLC0415
    from matplotlib.lines import Line2D  # noqa: PLC0415

    if isinstance(handle, Line2D):
        return to_hex(handle.get_color()), handle.get_marker(), handle.get_linestyle()
    return to_hex(handle.get_facecolor()), handle.get_hatch()


def _neutral(colour) -> bool:
    from matplotlib.colors import to_rgb  # noqa: PLC0415

    r, g, b = to_rgb(colour)
    return r == g == b  # black, greys, white


def _check_readable(name, fig):
    """Colours of seaborn's colour-blind palette (the tree shape's budgets: its sequential viridis, named by
    a colour bar); at most 8 entries a legend, each told apart; text of at least 9 points at the page's width
    (the figure is no wider than the page, so it is shown at its size)."""
    import seaborn as sns  # noqa: PLC0415
    from matplotlib.colors import to_hex  # noqa: PLC0415
    from matplotlib.text import Text  # noqa: PLC0415

    from ddtree_bench.report.figures import WIDTH  # noqa: PLC0415

    assert fig.get_figwidth() <= WIDTH <= 12.5, name  # 100 dpi: at most the page's 1250 px
    small = [
        (t.get_text(), t.get_fontsize())
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip() and t.get_fontsize() < 9
    ]
    assert not small, f"{name}: text under 9 points: {small[:5]}"
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    for legend in legends:
        assert len(legend.get_texts()) <= 8, f"{name}: {len(legend.get_texts())} legend entries"
        looks = [_look(handle) for handle in legend.legend_handles]
        assert len(set(looks)) == len(looks), f"{name}: two legend entries look alike"
    lines = [line for ax in fig.axes for line in ax.get_lines()]
    bars = [bar for ax in fig.axes for bar in ax.patches]
    colours = {
        to_hex(c) for c in [*(line.get_color() for line in lines), *(bar.get_facecolor() for bar in bars)]
    }
    colours = {c for c in colours if not _neutral(c)}
    if name == "tree_shape":
        budgets = {line.get_label() for line in lines}
        assert colours <= set(sns.color_palette("viridis", len(budgets)).as_hex()), colours
        assert not legends and any(ax.get_ylabel() == "budget N" for ax in fig.axes)  # the colour bar
    else:
        assert colours <= set(sns.color_palette("colorblind").as_hex()), f"{name}: {sorted(colours)}"


def test_figures_are_readable_in_seaborns_colour_blind_palette(published_model):
    _, figures = published_model
    for name, fig in figures.items():
        _check_readable(name, fig)
    # the timing variants: a colour per kind of timing (at most 8), the mask and the L2 cache by line style
    # and marker, not a colour per series (there are more than 8)
    assert len(all_series()) > 8
    assert [len(legend.get_texts()) for legend in figures["timing_variants"].legends] == [6, 2]
    # the round's parts: no label on a bar (each bar's builder is its marker), the text horizontal
    parts = figures["round_parts"]
    assert not any(ax.texts for ax in parts.axes)
    assert all(label.get_rotation() == 0 for ax in parts.axes for label in ax.get_xticklabels())


def test_best_budget_stars_sit_on_the_budgets_they_mean(published_model):
    from matplotlib.colors import to_hex  # noqa: PLC0415

    _, figures = published_model
    for name in ("which_budget", "stacks"):
        stars = 0
        for ax in figures[name].axes:
            lines = [line for line in ax.get_lines() if line.get_marker() != "*"]
            budgets = {float(x) for line in lines for x in line.get_xdata()}
            if ax.get_xscale() != "log":
                continue  # the stacks' waterfalls
            assert sorted(ax.get_xticks()) == sorted(budgets), (name, ax.get_title())  # ticks at the budgets
            for star in (line for line in ax.get_lines() if line.get_marker() == "*"):
                (x,), (y,) = star.get_xdata(), star.get_ydata()
                assert float(x) in budgets, (name, ax.get_title(), x)
                own = [line for line in lines if to_hex(line.get_color()) == to_hex(star.get_color())]
                assert any(y == max(line.get_ydata()) and x in list(line.get_xdata()) for line in own)
                stars += 1
        assert stars, name


def test_wide_tables_scroll_with_their_first_column_fixed(published_model):
    import re  # noqa: PLC0415

    from ddtree_bench.report import to_html  # noqa: PLC0415
    from ddtree_bench.report.render import CSS  # noqa: PLC0415
    from ddtree_bench.report.tables import html_table  # noqa: PLC0415

    columns = ["N", "B", *(f"builder {i}" for i in range(16))]
    wide = html_table(pd.DataFrame([range(18)], columns=columns))
    named = html_table(pd.DataFrame([["a machine", *range(17)]], columns=["machine", *columns[1:]]))
    narrow = html_table(pd.DataFrame([range(3)], columns=["a", "b", "c"]))
    assert wide.startswith("<div class='scroll wide key2'><table>")  # (N, B) stay in view
    assert named.startswith("<div class='scroll wide'><table>")  # the first column only
    assert narrow.startswith("<div class='scroll'><table>")
    css = CSS.replace("\n", "")
    assert ".scroll{overflow-x:auto" in css
    sticky = re.search(r"\.wide th:first-child,\.wide td:first-child,([^{]*)\{position:sticky;left:0;", css)
    assert sticky and ".key2 td:nth-child(2)" in sticky.group(1)
    assert (
        re.search(r"\.key2 th:nth-child\(2\),\.key2 td:nth-child\(2\)\{left:(\S+)\}", css).group(1) == "4.5em"
    )
    assert re.search(r"\.key2 td:first-child\{[^}]*width:4\.5em", css)  # the first column as wide as that
    model, _ = published_model
    page = to_html(model)
    wrappers = re.findall(r"<div class='(scroll[^']*)'><table><thead><tr>(.*?)</tr>", page)
    assert any(head.count("<th>") >= 17 for _, head in wrappers)  # the detail tables
    for wrapper, head in wrappers:
        assert ("wide" in wrapper.split()) == (head.count("<th>") > 8), head
    assert any("key2" in wrapper.split() for wrapper, _ in wrappers)


def test_main_figures_draw_one_line_per_builder_and_no_empty_panel(published_model):
    from ddtree_bench.report.names import PER_BUILDER_FIGURES  # noqa: PLC0415

    model, figures = published_model
    assert set(figures) == set(FIGURE_NAMES)
    for name, fig in figures.items():
        assert fig.axes, f"{name}: no panel"
        _check_panels(name, fig)
    for name in PER_BUILDER_FIGURES:  # the per-builder figures hold more than one builder here
        gids = {line.get_gid() for ax in figures[name].axes for line in ax.get_lines()}
        assert {"gpu", "native-mt"} <= gids, name
    # the per-call variants are in their own figure, collapsed
    variants = next(f for f in model.figures() if f.name == "timing_variants")
    assert variants.collapsed and len(figures["timing_variants"].axes) > 4


def test_a_small_report_has_no_empty_panels(tmp_path):
    import matplotlib  # noqa: PLC0415

    from ddtree_bench.report import ReportOptions, compose_report  # noqa: PLC0415
    from ddtree_bench.report.figures import collect_figures  # noqa: PLC0415

    matplotlib.use("Agg")
    ours = write_machine(tmp_path / "laptop", "laptop")
    other = write_machine(tmp_path / "h200", "h200", sglang=True, gpu=True)
    machines = load_machines(ours, published=[other])
    paths = {name: tmp_path / f"{name}.png" for name in FIGURE_NAMES}
    with collect_figures() as figures:
        compose_report(machines, ReportOptions(distribution="uniform"), paths)
        for name, fig in figures:
            _check_panels(name, fig)
            _check_readable(name, fig)
    assert all(path.stat().st_size > 1000 for path in paths.values())


def test_markdown_and_html_are_written_from_one_model(published_model):
    from html import escape  # noqa: PLC0415

    from ddtree_bench.report import to_html, to_markdown  # noqa: PLC0415
    from ddtree_bench.report.tables import one_unit_per_column  # noqa: PLC0415

    model, _ = published_model
    markdown, page = to_markdown(model), to_html(model)
    answer = model.answer
    assert answer.machine == "h200" and set(answer.tables) == {1, 64}
    for batch, table in answer.tables.items():
        assert answer.heading(batch) in markdown and escape(answer.heading(batch)) in page
        shown = one_unit_per_column(table.astype(str))  # as both writers write it
        for value in shown.to_numpy().ravel():  # every number of the answer, in both
            assert f"| {value} |" in markdown and f">{escape(value)}</td>" in page, value
    for line in answer.verdict:
        assert line in markdown
        assert escape(line.split(":** ", 1)[1]) in page
    for value in answer.verdict_table.to_numpy().ravel():
        assert f"| {value} |" in markdown and f">{escape(value)}</td>" in page, value
    # the same figures, captions and headings in both; each figure's title once, as its heading
    for figure in model.figures():
        assert figure.caption in markdown and escape(figure.caption).split("`")[0] in page
        assert markdown.count(f"### {figure.title}\n") == (0 if figure.collapsed else 1)
    for section in model.sections:
        assert f"## {section.title}" in markdown and f"<h2>{escape(section.title)}</h2>" in page


def test_a_cpu_only_report_opens_with_the_named_published_answer_then_what_this_machine_adds(tmp_path):
    """Every published folder, in the order a path sort gives them (h200-sglang-regime/ and h200-sglang/
    before h200/): the answer is still h200's, the one published_answer names, labelled as published; then
    this machine's CPU builders; and what could not run names the timing that did not, not the builder."""
    ours = write_machine(tmp_path / "results" / "laptop", "laptop", sglang=True)  # no GPU rows, no step
    published = sorted(str(p) for p in PUBLISHED_H200.parent.glob("*/summary.parquet"))
    assert [Path(p).parent.name for p in published][-1] == "h200"  # last by path
    out = tmp_path / "r"
    render_report(
        summary=ours,
        published=published,
        files=ReportFiles.in_folder(out),
        distribution="uniform",
        step_enabled=False,
    )
    markdown, page = (out / "summary.md").read_text(), (out / "index.html").read_text()
    first = markdown.split("\n\n")[1]  # the first screen after the title
    assert first.startswith("**This machine (laptop) has no GPU rows"), first
    assert "the answers below are the published h200's: measured on NVIDIA H200" in first
    assert "(results/published/h200/)" in first and "published_answer" not in first
    stacks_part = markdown[
        markdown.index("## What the three kernels are worth") : markdown.index("## Answer")
    ]
    assert "**h200** (published, NVIDIA H200)" in stacks_part
    assert "measured by an earlier method" in stacks_part
    answer = markdown[markdown.index("## Answer") : markdown.index("## What this machine adds")]
    assert (
        "**Verdict** (h200):" in answer and "| question (the number it rests on) | B = 1 | B = 64 |" in answer
    )
    assert "### Batch 1: h200," in answer and "| N | tau |" in answer  # the published rows
    assert "h200-sglang" not in answer and "none of the three questions" not in answer
    assert "Rounds: 42 of 47 run on the GPU" in answer  # h200's own rounds
    adds = markdown[markdown.index("## What this machine adds") : markdown.index("## Figures")]
    assert adds.startswith("## What this machine adds: laptop's CPU builders against SGLang's function")
    assert "SGLang's own `build_ddtree_tree_from_topk`, median per call, wall clock" in adds
    assert "| B | N | SGLang's function | reference (ours, Python) | native (C++, 1 thread) |" in adds
    body = page[page.index("</h1>") + len("</h1>") :]
    assert body.lstrip().startswith("<p class='banner'>This machine (laptop) has no GPU rows")
    # the machines without step stages are named, each with its own rows' reason (never "they need a GPU"),
    # and none of them has a modelled section of its own: only h200, which measured them, has one
    which = markdown[markdown.index("### Which budget?\n") : markdown.index("### Builders and timings")]
    assert (
        "_laptop (this run) has no GPU step stages (step stages off (step.enabled: false in the "
        "configuration)), so it has no modelled K2.6 tokens/s of its own. h200-sglang-regime (published) and "
        "h200-sglang (published) have no GPU step stages (no step_summary.parquet; the step stages were off "
        "in that run), so they have no modelled K2.6 tokens/s of their own. The sections below model only "
        "the machines that measured them, each on its own rows: h200 (published)._"
    ) in which
    assert {line.split(":")[0] for line in which.splitlines() if line.startswith("#### ")} == {"#### h200"}
    assert "(they need a GPU)" not in markdown


def _h200_sections(markdown: str) -> str:
    """The "Which budget?" sections of h200 in a page: from its first heading to the next other heading."""
    lines = markdown[markdown.index("#### h200: ") :].splitlines()
    others = (
        i for i, line in enumerate(lines) if line.startswith("#") and not line.startswith("#### h200: ")
    )
    end = next(others, len(lines))
    return "\n".join(lines[:end]).rstrip()


def test_a_cpu_machine_beside_a_published_one_has_no_modelled_tokens_per_second_on_the_page(tmp_path):
    """A CPU-only machine (the published H200's CPU builder rows and trees, relabelled; no step stages)
    beside the published h200: nowhere on the page a modelled tokens/s of the CPU machine (no section, no
    table row, no target, no figure panel), one note saying why, and h200's sections as the published page
    has them."""
    from ddtree_bench.report.figures import collect_figures  # noqa: PLC0415

    folder = tmp_path / "laptop"
    folder.mkdir()
    summary = pd.read_parquet(PUBLISHED_H200 / "summary.parquet")
    summary[summary["builder"] != "gpu"].assign(machine="laptop").to_parquet(folder / "summary.parquet")
    shapes = pd.read_parquet(PUBLISHED_H200 / "tree_shape.parquet").assign(machine="laptop")
    shapes.to_parquet(folder / "tree_shape.parquet")
    environment = json.loads((PUBLISHED_H200 / "environment.json").read_text())
    environment.update(machine="laptop", gpu_name=None)
    (folder / "environment.json").write_text(json.dumps(environment))
    out = tmp_path / "r"
    with collect_figures() as figures:
        render_report(
            summary=folder / "summary.parquet",
            published=[PUBLISHED_H200 / "summary.parquet"],
            files=ReportFiles.in_folder(out),
            distribution="drafter",
        )
        titles = {name: [ax.get_title() for ax in fig.axes] for name, fig in figures}
    markdown = (out / "summary.md").read_text()
    which = markdown[markdown.index("### Which budget?\n") : markdown.index("### Builders and timings")]
    assert (
        "_laptop (this run) has no GPU step stages (no step_summary.parquet), so it has no modelled K2.6 "
        "tokens/s of its own. The sections below model only the machines that measured them, each on its "
        "own rows: h200 (published)._"
    ) in which
    # no section, no table row of laptop's: the section's every heading is h200's
    assert "#### laptop" not in which and "| laptop" not in which
    assert {line.split(":")[0] for line in which.splitlines() if line.startswith("#### ")} == {"#### h200"}
    # h200's sections exactly as the published page gives them (its own rows, whoever is beside it)
    page = (PUBLISHED_H200 / "report.md").read_text()
    assert _h200_sections(which) == _h200_sections(page) and _h200_sections(page).count("#### h200: ") == 2
    # no figure panel of laptop's in the modelled figures, h200's there
    for name in ("which_budget", "round_parts"):
        assert titles[name] and not any("laptop" in t for t in titles[name]), (name, titles[name])
        assert any(t.startswith("h200, drafter trees") for t in titles[name]), name
    # the goal of the model: no data for laptop, saying why; h200's met
    target = [
        line for line in markdown.splitlines() if "the report names the best budget per builder" in line
    ]
    laptop = next(line for line in target if line.startswith("| laptop |"))
    assert "| no data | no modelled tokens/s: no GPU step stages (no step_summary.parquet) |" in laptop
    assert "| met |" in next(line for line in target if line.startswith("| h200 |"))
    # anywhere on the page, a line of laptop's with tokens/s says it has none
    for line in markdown.splitlines():
        if "laptop" in line and "tokens/s" in line:
            assert "no modelled" in line, line


def test_the_answer_is_the_named_published_machine_whatever_the_folders_order(tmp_path):
    import itertools  # noqa: PLC0415

    from ddtree_bench.report import answer as answer_module  # noqa: PLC0415
    from ddtree_bench.report import stacks as stacks_report  # noqa: PLC0415
    from ddtree_bench.report import throughput as throughput_report  # noqa: PLC0415
    from ddtree_bench.report.compose import banner, step_settings  # noqa: PLC0415

    ours = write_machine(tmp_path / "results" / "laptop", "laptop")
    folders = sorted(PUBLISHED_H200.parent.glob("*/summary.parquet"))
    assert {p.parent.name for p in folders} == {"h200", "h200-sglang", "h200-sglang-regime"}
    for order in itertools.permutations(folders):
        machines = load_machines(ours, published=list(order))
        settings = {m.label: step_settings(m, 61) for m in machines}
        found = throughput_report.sections(machines, settings, None)
        out = answer_module.answer(machines, {}, settings, found, published_answer="h200")
        assert out.machine == "h200", [p.parent.name for p in order]
        assert "the published h200's" in banner(machines, out)
        assert stacks_report.machine_with_stacks(machines).label == "h200"
    # another name chooses another machine: h200-sglang, named, has no step stages, so no modelled round
    # and no answer of its own; it says so, and never answers with h200's terms or h200 by order
    machines = load_machines(ours, published=folders)
    settings = {m.label: step_settings(m, 61) for m in machines}
    found = throughput_report.sections(machines, settings, None)
    assert {s.machine for s in found} == {"h200"}
    out = answer_module.answer(machines, {}, settings, found, published_answer="h200-sglang")
    assert out.machine is None and not out.tables and not out.verdict
    assert out.missing == (
        "neither laptop nor the published answer's machine (h200-sglang) has GPU builder rows with a "
        "modelled round or a step breakdown"
    )
    # a name among none of them: no answer, saying why (never another machine by order)
    out = answer_module.answer(machines, {}, settings, found, published_answer="h100")
    assert out.machine is None and "(h100, config published_answer) is not among" in out.missing


def test_a_published_gpu_run_without_step_stages_has_no_modelled_rounds():
    """A published GPU run whose step stages were off (h200-sglang) has no section: its builds are never set
    beside h200's measured terms. h200's sections are its own whatever runs are beside it, its rounds run
    on its GPU; h100 (step stages only, no tree builds) says it has no tree-build rows."""
    from ddtree_bench.report import throughput as throughput_report  # noqa: PLC0415
    from ddtree_bench.report.compose import step_settings  # noqa: PLC0415

    machines = load_machines(
        PUBLISHED_H200 / "summary.parquet",
        published=[PUBLISHED_SGLANG / "summary.parquet", PUBLISHED_H100 / "summary.parquet"],
    )
    settings = {m.label: step_settings(m, 61) for m in machines}
    found = throughput_report.sections(machines, settings, None)
    assert [m.label for m in machines if not throughput_report.has_step_stages(m)] == ["h200-sglang"]
    assert "h200-sglang" not in {s.machine for s in found}
    alone = throughput_report.sections(machines[:1], settings, None)
    own = [s for s in found if s.machine == "h200"]
    assert len(own) == len(alone) and all(not s.missing for s in own)
    for mine, by_itself in zip(own, alone, strict=True):
        pd.testing.assert_frame_equal(mine.result.table, by_itself.result.table)
    assert (own[0].result.table["round_from"] != "sum of the terms").any()
    assert own[0].result.verify.prefix == 4096
    (h100,) = [s for s in found if s.machine == "h100"]
    assert h100.result is None and h100.missing == "no tree-build rows of the drafter trees on this machine"
    assert throughput_report.no_model_note(machines, found) == (
        "h200-sglang (published) has no GPU step stages (no step_summary.parquet; the step stages were off "
        "in that run), so it has no modelled K2.6 tokens/s of its own. The sections below model only the "
        "machines that measured them, each on its own rows: h200 (published), h100 (published)."
    )
    targets = {r[0]: r[3:] for r in throughput_report.budget_targets(found, machines)}
    assert targets["h200-sglang"] == (
        "no data",
        "no modelled tokens/s: no GPU step stages (no step_summary.parquet; the step stages were off in that "
        "run)",
    )


def test_a_report_of_this_machines_own_gpu_rows_has_no_banner(published_model):
    model, _ = published_model
    assert model.banner is None


def test_no_private_name_crosses_the_report_modules():
    import ast  # noqa: PLC0415

    crossings = []
    for path in sorted(REPORT_PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text())
        modules = set()  # names bound to a report module here
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ddtree_bench.report"):
                for alias in node.names:
                    if alias.name.startswith("_"):
                        crossings.append(f"{path.name}: from {node.module} import {alias.name}")
                    if node.module == "ddtree_bench.report":
                        modules.add(alias.asname or alias.name)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("ddtree_bench.report"):
                        modules.add(alias.asname or alias.name)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
            ):
                crossings.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert not crossings, crossings


def test_every_table_names_its_depth_regime(published_model):
    from ddtree_bench.report.fmt import regime  # noqa: PLC0415

    assert regime(16, [8, 16, 1024]) == "L = 16 fixed, not SGLang's L = N"
    assert regime(64, [64]) == "L = N = 64: SGLang's regime"
    model, _ = published_model
    from ddtree_bench.report import to_markdown  # noqa: PLC0415

    markdown = to_markdown(model)
    headings = [line for line in markdown.splitlines() if line.startswith(("### Batch", "#### Medians on"))]
    headings += [line for line in markdown.splitlines() if line.startswith("### Medians on")]
    assert headings and all("SGLang's L = N" in line for line in headings), headings


def test_what_could_not_run_names_the_timing_where_the_builder_ran():
    from ddtree_bench.report.load import Machine  # noqa: PLC0415
    from ddtree_bench.report.tables import unavailable_table  # noqa: PLC0415

    summary = pd.DataFrame(
        [
            dict(builder="native", timing="wall", status="ok", status_reason=None),
            dict(builder="native", timing="in-situ", status="unavailable", status_reason="needs a CUDA GPU"),
            dict(builder="gpu", timing="wall", status="unavailable", status_reason="no CuPy"),
        ]
    )
    table = unavailable_table([Machine("laptop", "this run", summary, pd.DataFrame(), {})])
    rows = table.set_index("builder")["what did not run"].to_dict()
    assert rows == {"native": "in-situ timing (wall ran)", "gpu": "its timings (none ran)"}


def test_this_machines_cpu_builders_against_reference_where_sglang_did_not_run(tmp_path):
    from ddtree_bench.report.tables import cpu_builders_table  # noqa: PLC0415

    ours = write_machine(tmp_path / "results" / "laptop", "laptop", native_speedup=50.0)
    data = timings(load_machines(ours))
    table, found = cpu_builders_table(data, "laptop", 16, "uniform")
    assert found["baseline"] == "reference" and found["mode"] == "wall"
    assert list(table.columns) == ["B", "N", "reference (ours, Python)", "native (C++, 1 thread)"]
    assert len(table) == 4 and all("(50.0x" in cell for cell in table["native (C++, 1 thread)"])
    assert found["low"] == pytest.approx(50.0) and found["high"] == pytest.approx(50.0)


def test_the_banner_names_whose_whole_rounds_the_first_section_holds(tmp_path):
    """Beside the published h200 (the tree build's answer) and h100 (the current stack rounds), a machine
    without GPU rows is told that the first section's rounds are h100's, measured on its GPU."""
    from ddtree_bench.report import answer as answer_module  # noqa: PLC0415
    from ddtree_bench.report import throughput as throughput_report  # noqa: PLC0415
    from ddtree_bench.report.compose import banner, step_settings  # noqa: PLC0415

    ours = write_machine(tmp_path / "results" / "laptop", "laptop")
    machines = load_machines(
        ours, published=[PUBLISHED_H200 / "summary.parquet", PUBLISHED_H100 / "summary.parquet"]
    )
    settings = {m.label: step_settings(m, 61) for m in machines}
    found = throughput_report.sections(machines, settings, None)
    out = answer_module.answer(machines, {}, settings, found, published_answer="h200")
    line = banner(machines, out)
    assert "the published h200's: measured on NVIDIA H200" in line
    assert (
        "the first section's whole rounds" in line and "the published h100's, measured on NVIDIA H100" in line
    )
    # without the h100 folder the stack rounds are h200's own: nothing more to say
    alone = load_machines(ours, published=[PUBLISHED_H200 / "summary.parquet"])
    settings = {m.label: step_settings(m, 61) for m in alone}
    found = throughput_report.sections(alone, settings, None)
    out = answer_module.answer(alone, {}, settings, found, published_answer="h200")
    assert "first section" not in banner(alone, out)
