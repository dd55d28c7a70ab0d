"""The step stages' summary (median, p10, p90, n, TFLOP/s, TB/s, % of the measured peaks), the step-time
breakdown, the tree accept and verify attention goals (met / not met / no data), and the report's step part
with and without step data, all on synthetic stage records (``timing.records.stage_frame``)."""

from __future__ import annotations

import json
import math
import runpy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from report_rows import rows_for, synthetic_summary, write_machine
from step_rows import (
    COPY_TBPS,
    FLOOR_S,
    GEMM_TFLOPS,
    attention_rows,
    peak_rows,
    shapes_frame,
    synthetic_step,
    target_status,
)

from ddtree_bench import stages
from ddtree_bench.acceptance import expected_accepted_tokens
from ddtree_bench.builders import get_builder
from ddtree_bench.cuda.loader import gpu_unavailable_reason
from ddtree_bench.report import FIGURE_NAMES, ReportFiles, evaluate_targets, load_machines, render_report
from ddtree_bench.report.step import (
    PEER_TARGETS,
    STEP_TARGETS,
    TARGET_ACCEPT,
    TARGET_STREAM_85,
    accept_table,
    attention_table,
    backends_line,
    breakdown_table,
    step_targets,
)
from ddtree_bench.stages import accept as accept_stage
from ddtree_bench.stages import attention as attention_stage
from ddtree_bench.stages import peaks as peaks_stage
from ddtree_bench.summary.build import combine_shapes, summarize, tree_shape
from ddtree_bench.summary.step import (
    LEFT_OUT,
    STEP_SUMMARY_COLUMNS,
    aggregate_steps,
    peak_rates,
    preferred,
    step_breakdown,
    summarize_steps,
)
from ddtree_bench.timing.records import stage_frame, unavailable_stage_frame
from ddtree_bench.traces import generate_trace, save_trace

# ----------------------------------------------------------------------------------------------- summary


def test_step_summary_statistics_rates_and_peaks():
    rows = synthetic_step()
    summary = summarize_steps(rows)
    assert list(summary.columns) == list(STEP_SUMMARY_COLUMNS)
    key = (
        (summary["impl"] == "ours")
        & (summary["budget"] == 8)
        & (summary["batch"] == 1)
        & (summary["prefix"] == 4096)
        & (summary["cache"] == "warm")
    )
    row = summary[key].iloc[0]
    seconds = 1e-4 * (1 + 8 / 64)
    assert row["n"] == 3  # the warm-up call never enters a statistic
    assert row["median_s"] == pytest.approx(seconds)
    assert row["p10_s"] == pytest.approx(seconds * (0.9 + 0.2 * 0.1))  # linear interpolation
    assert row["p90_s"] == pytest.approx(seconds * (1.1 - 0.2 * 0.1))
    assert row["median_tbps"] == pytest.approx(3.5)
    assert row["median_tflops"] == pytest.approx(400.0)
    assert row["pct_copy_peak"] == pytest.approx(100 * 3.5 / COPY_TBPS)
    assert row["pct_gemm_peak"] == pytest.approx(100 * 400 / GEMM_TFLOPS)
    assert row["peak_floor_s"] == pytest.approx(FLOOR_S)
    assert bool(row["correct"]) and row["error_max"] == pytest.approx(1e-3)
    cold = summary[
        (summary["impl"] == "ours")
        & (summary["budget"] == 8)
        & (summary["batch"] == 1)
        & (summary["prefix"] == 4096)
        & (summary["cache"] == "cold")
    ]
    assert len(cold) == 1 and cold.iloc[0]["n"] == 1  # warm and cold kept apart
    sdpa = summary[summary["impl"] == "sdpa"].iloc[0]
    assert sdpa["status"] == "unavailable" and sdpa["n"] == 0 and "out of memory" in sdpa["status_reason"]
    accept = summary[(summary["stage"] == "accept") & (summary["impl"] == "gpu-kernel")].iloc[0]
    assert accept["accept_length_mean"] == 3.0 and accept["expected_accept_mean"] == 2.5
    assert math.isnan(accept["pct_gemm_peak"])  # only attention rows are set against the peaks
    gemm = summary[summary["impl"] == "bf16-gemm"].iloc[0]
    assert gemm["median_tflops"] == pytest.approx(GEMM_TFLOPS)


def test_peak_rates_are_none_without_peaks():
    rows = stage_frame(attention_rows("ours", 8, 1, 4096, tbps=1, tflops=1))
    assert peak_rates(rows) == {"gemm_tflops": None, "copy_tbps": None, "floor_seconds": None}
    summary = summarize_steps(rows)
    assert summary["pct_copy_peak"].isna().all() and summary["median_tbps"].notna().all()


def test_aggregate_steps_writes_the_summary(tmp_path):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    stage_frame(peak_rows()).to_parquet(a)
    stage_frame(attention_rows("ours", 8, 1, 4096, tbps=2, tflops=10)).to_parquet(b)
    out = tmp_path / "out" / "step_summary.parquet"
    summary = aggregate_steps([a, b], out)
    assert len(pd.read_parquet(out)) == len(summary) == 5  # 3 peaks + ours warm + ours cold
    empty = aggregate_steps([], tmp_path / "empty.parquet")
    assert empty.empty and list(empty.columns) == list(STEP_SUMMARY_COLUMNS)


@pytest.mark.parametrize(
    ("stage", "impls"),
    [
        ("attention", ["ours", "sdpa"]),
        ("accept", ["gpu-kernel", "gpu-host-inclusive", "cpu-walk", "floor"]),
        ("peaks", ["bf16-gemm", "device-copy", "floor"]),
    ],
)
def test_unavailable_stage_rows_say_why(stage, impls):
    rows = unavailable_stage_frame(
        stage, "no usable CUDA device\n(driver)", impls={"verify-attention": ["ours", "sdpa"]}
    )
    assert list(rows["impl"]) == impls
    assert set(rows["status"]) == {"unavailable"}
    assert set(rows["status_reason"]) == {"no usable CUDA device (driver)"}  # one line
    summary = summarize_steps(rows)
    assert (summary["n"] == 0).all() and len(summary) == len(impls)


def test_unknown_stage_is_refused():
    with pytest.raises(ValueError, match="unknown step stage"):
        unavailable_stage_frame("drafter", "x")


def test_preferred_takes_warm_device_time():
    summary = summarize_steps(synthetic_step())
    best = preferred(summary)
    ours = best[
        (best["impl"] == "ours") & (best["budget"] == 8) & (best["batch"] == 1) & (best["prefix"] == 4096)
    ]
    assert len(ours) == 1 and ours.iloc[0]["cache"] == "warm"
    assert "sdpa" not in set(best["impl"])  # only measured rows


# ----------------------------------------------------------------------------------------------- breakdown


def build_summary():
    """Tree-build summary at depth 16, peaked: reference and native (CPU), gpu kernel + host-inclusive."""
    frames = []
    for budget in (8, 64):
        for batch in (1, 64):
            kw = dict(budget=budget, batch=batch, distribution="peaked", depth=16, machine="m")
            frames.append(rows_for("reference", [1e-3 * batch], **kw))
            frames.append(rows_for("native", [1e-5 * batch], **kw))
            frames.append(rows_for("gpu", [2e-5], timing="kernel-events", cache="warm", **kw))
            frames.append(rows_for("gpu", [9e-5], timing="kernel-events", cache="cold", **kw))
            frames.append(rows_for("gpu", [3e-4], timing="host-inclusive", **kw))
    return summarize(pd.concat(frames, ignore_index=True))


def test_step_breakdown_sums_build_attention_and_accept():
    step = summarize_steps(synthetic_step())
    breakdown = step_breakdown(
        build_summary(), step, shapes_frame(), layers=61, depth=16, distribution="peaked"
    )
    builders = list(dict.fromkeys(breakdown["builder"]))
    assert builders == [
        "reference (ours, Python)",
        "native (C++, 1 thread)",
        "gpu kernel",
        "gpu host-inclusive",
    ]
    assert len(breakdown) == 2 * 2 * 2 * 4  # budgets x batches x prefixes x builders
    row = breakdown[
        (breakdown["builder"] == "gpu kernel")
        & (breakdown["budget"] == 64)
        & (breakdown["batch"] == 64)
        & (breakdown["prefix"] == 32768)
    ].iloc[0]
    attention = 1e-4 * (1 + 64 / 64) * 64
    accept = FLOOR_S * 1.5
    assert row["build_s"] == pytest.approx(2e-5)  # warm kernel, not the cold one
    assert row["attention_layer_s"] == pytest.approx(attention)
    assert row["attention_s"] == pytest.approx(61 * attention)
    assert row["accept_s"] == pytest.approx(accept)
    assert row["total_s"] == pytest.approx(2e-5 + 61 * attention + accept)
    assert row["share"] == pytest.approx(2e-5 / (2e-5 + 61 * attention + accept))
    # the accept job's own trees (this batch's requests) first; the tree-shape table only where it has none
    assert row["expected_accept_mean"] == 2.5
    raw = synthetic_step()
    no_expected = summarize_steps(raw.assign(expected_accept_mean=np.nan))
    fallback = step_breakdown(
        build_summary(), no_expected, shapes_frame(), layers=61, depth=16, distribution="peaked"
    )
    assert set(fallback.loc[fallback["budget"] == 64, "expected_accept_mean"]) == {3.5}
    table = breakdown_table(breakdown, "m", 61)
    assert {
        "E[accepted], this batch's requests",
        "attention x 61",
        "accept",
        "gpu kernel: build (share)",
    } <= set(table.columns)
    assert len(table) == 8


def test_breakdown_without_a_build_or_accept_leaves_share_empty():
    rows = stage_frame(attention_rows("ours", 8, 1, 4096, tbps=1, tflops=1))
    breakdown = step_breakdown(build_summary(), summarize_steps(rows), None, layers=61)
    assert len(breakdown) and breakdown["share"].isna().all()  # no accept timing: no sum
    assert step_breakdown(build_summary(), pd.DataFrame(), None, layers=61).empty


# ----------------------------------------------------------------------------------------------- targets


def test_step_targets_met():
    status = target_status(summarize_steps(synthetic_step(fast=True, accept_factor=1.5)))
    assert status[TARGET_ACCEPT][0] == "met" and "1.50x" in status[TARGET_ACCEPT][1]
    # the retired goals (3.0 TB/s, 300 TFLOP/s, 1.5x FlexAttention) are gone: superseded by the peers'
    assert not [t for t in status if "3.0 TB/s" in t or "300 TFLOP/s" in t or "FlexAttention" in t]


def test_step_targets_not_met():
    status = target_status(summarize_steps(synthetic_step(fast=False, accept_factor=3.0)))
    assert status[TARGET_ACCEPT][0] == "not met" and "3.00x" in status[TARGET_ACCEPT][1]


def test_flexattention_rows_set_no_goal():
    rows = peak_rows()
    for impl, tbps in (("ours", 2.0), ("flexattention", 1.0)):
        rows += attention_rows(impl, 8, 1, 8192, tbps=tbps, tflops=1)
    step = summarize_steps(stage_frame(rows))
    # FlexAttention is no longer a goal's peer (not measured in the published run): its rows judge nothing
    assert not [t for t in target_status(step) if "FlexAttention" in t]
    assert set(target_status(step)) == {TARGET_ACCEPT, *PEER_TARGETS}


def test_read_stream_sets_each_shape_against_its_bandwidth_bound():
    rows = peak_rows()
    # same bytes; the read stream takes half ours' time at B=8 (slow=0.5) and a quarter at B=1
    rows += attention_rows("ours", 8, 8, 32768, tbps=2.5, tflops=300)
    rows += attention_rows("read-stream", 8, 8, 32768, tbps=5.0, tflops=600, slow=0.5)
    rows += attention_rows("ours", 8, 1, 32768, tbps=1.0, tflops=100)
    rows += attention_rows("read-stream", 8, 1, 32768, tbps=4.0, tflops=400, slow=0.25)
    rows += attention_rows("ours", 64, 1, 32768, tbps=0.5, tflops=400)  # no read stream there
    rows += attention_rows("flexattention", 8, 8, 32768, tbps=1.0, tflops=100, slow=2)
    step = summarize_steps(stage_frame(rows))
    table = attention_table(step, "m")
    bound = dict(
        zip(zip(table["impl"], table["B"], table["N"], strict=True), table["% of read stream"], strict=True)
    )
    assert bound == {
        ("ours", "8", "8"): "50.0%",
        ("flexattention", "8", "8"): "25.0%",  # peers too
        ("read-stream", "8", "8"): "-",
        ("ours", "1", "8"): "25.0%",
        ("read-stream", "1", "8"): "-",
        ("ours", "1", "64"): "-",
    }
    assert set(table.loc[table["impl"] == "read-stream", "vs flexattention"]) == {"-"}  # no attention
    # the read-stream goal (batch >= 8) sets ours against the stream of the same bytes, and says by how much
    status, measured = target_status(step)[TARGET_STREAM_85]
    assert status == "not met" and "min 50.0% (N=8, B=8, S=32768, H=8) over 1 configurations" in measured
    assert "35.0% short" in measured and "met at" not in measured  # met nowhere


def test_step_targets_no_data():
    status = target_status(summarize_steps(synthetic_step(flex=False)))
    assert status[TARGET_ACCEPT][0] != "no data"
    empty = step_targets(pd.DataFrame(), missing="no step_summary.parquet")
    assert [s for _, _, s, _ in empty] == ["no data"] * 9  # accept here, 8 against the peers
    assert all(m == "no step_summary.parquet" for *_, m in empty)
    only_small = summarize_steps(stage_frame(attention_rows("ours", 8, 1, 4096, tbps=5, tflops=5)))
    # S = 32768, B >= 8 is where it applies
    assert target_status(only_small)[TARGET_STREAM_85][0] == "no data"


def test_wrong_output_fails_a_speed_target():
    rows = peak_rows() + attention_rows("ours", 8, 8, 32768, tbps=5.0, tflops=1, correct=False)
    rows += attention_rows("read-stream", 8, 8, 32768, tbps=5.0, tflops=1)
    status = target_status(summarize_steps(stage_frame(rows)))
    assert status[TARGET_STREAM_85][0] == "not met" and "output wrong" in status[TARGET_STREAM_85][1]


def test_tables_show_unavailable_rows_and_floors():
    step = summarize_steps(synthetic_step())
    attention = attention_table(step, "m")
    sdpa = attention[attention["impl"] == "sdpa"].iloc[0]
    assert sdpa["status"].startswith("unavailable: out of memory")
    ours = attention[(attention["impl"] == "ours") & (attention["N"] == "8") & (attention["B"] == "1")]
    assert set(ours["vs flexattention"]) == {"2.00x"}  # flex takes twice as long by construction
    accept = accept_table(step, "m")
    assert set(accept.loc[accept["impl"] == "gpu-kernel", "x floor"]) == {"1.50x"}
    none = unavailable_stage_frame("attention", "no GPU", machine="m")
    table = attention_table(summarize_steps(none), "m")
    assert set(table["B"]) == {"all"} and table["status"].str.contains("no GPU").all()
    assert set(table["kernel"]) == {"-"}


def test_attention_table_says_how_each_row_ran():
    rows = peak_rows()
    for impl, budget, reason in (
        ("ours", 8, "backend: wgmma path, 72-row tiles"),
        ("ours", 1024, "backend: wgmma path"),
        ("sdpa", 8, None),
    ):
        measured = attention_rows(impl, budget, 8, 32768, tbps=2, tflops=9)
        rows += [dict(r, status_reason=reason) for r in measured]
    table = attention_table(summarize_steps(stage_frame(rows)), "m")
    kernel = dict(zip(zip(table["impl"], table["N"], strict=True), table["kernel"], strict=True))
    assert kernel == {
        ("ours", "8"): "wgmma path, 72-row tiles",
        ("ours", "1024"): "wgmma path",
        ("sdpa", "8"): "-",
    }


# ----------------------------------------------------------------------------------------------- report


def write_step_machine(folder, machine="h200", step=None):
    summary_path = write_machine(folder, machine, gpu=True)
    build_summary().assign(machine=machine).to_parquet(folder / "summary.parquet")
    shapes_frame().to_parquet(folder / "tree_shape.parquet")
    env = json.loads((folder / "environment.json").read_text())
    env["config"] = {"depths": [16], "distributions": ["peaked"], "step": {"layers": 61}}
    (folder / "environment.json").write_text(json.dumps(env))
    step = summarize_steps(synthetic_step() if step is None else step)
    step.assign(machine=machine).to_parquet(folder / "step_summary.parquet")
    return summary_path


def test_report_renders_the_step_part(tmp_path):
    ours = write_step_machine(tmp_path / "results" / "h200")
    old = write_machine(tmp_path / "results" / "published" / "old", "old-h200", gpu=True)
    out = tmp_path / "report"
    render_report(
        summary=ours,
        published=[old],
        files=ReportFiles.in_folder(out),
        depth=16,
        distribution="peaked",
        step_layers=61,
        step_depth=16,
        step_distribution="peaked",
    )
    markdown = (out / "summary.md").read_text()
    page = (out / "index.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(FIGURE_NAMES)
    for heading in (
        "## Verify attention",
        "## Tree accept",
        "## Step-time breakdown",
        "### Expected acceptance per budget",
    ):
        assert heading in markdown
    assert LEFT_OUT in markdown and "drafter's forward" in markdown
    assert "GPU peaks: h200: bf16 GEMM 800 TFLOP/s, device copy 4.00 TB/s" in markdown
    assert (
        "| machine | S | H | B | N | E[accepted], this batch's requests | attention x 61 | accept |"
        in markdown
    )
    assert "gpu kernel: build (share)" in markdown
    assert "3.50 [3.00-4.00]" in markdown  # E[accepted] at N = 64
    # the older publication has no step summary: its step cells say "no data" and why
    assert "old-h200: no data (no step_summary.parquet; published before the step stages)" in markdown
    targets = {
        (r.machine, r.target): r.status for r in evaluate_targets(load_machines(ours, published=[old]))
    }
    assert targets[("h200", TARGET_ACCEPT)] in ("met", "not met")
    assert targets[("old-h200", TARGET_ACCEPT)] == "no data"
    assert "Verify attention" in page and "Left out:" in page


def test_report_renders_without_any_step_data(tmp_path):
    ours = write_machine(tmp_path / "m", "laptop")
    out = tmp_path / "r"
    render_report(summary=ours, files=ReportFiles.in_folder(out), step_enabled=False)
    markdown = (out / "summary.md").read_text()
    assert "laptop: no data (step stages off (step.enabled: false in the configuration))" in markdown
    assert "## Step-time breakdown" in markdown and "_no data_" in markdown
    page = (out / "index.html").read_text()
    assert page.count("data:image/png;base64,") == len(FIGURE_NAMES)
    machines = load_machines(ours)
    step = [r for r in evaluate_targets(machines) if r.source in ("tree accept", "verify attention")]
    assert len(step) == len(STEP_TARGETS) + len(PEER_TARGETS) and {r.status for r in step} == {"no data"}


def test_report_with_unavailable_step_rows(tmp_path):
    folder = tmp_path / "m"
    ours = write_machine(folder, "laptop")
    rows = pd.concat(
        [
            unavailable_stage_frame(s, "no usable CUDA device", machine="laptop")
            for s in ("attention", "accept", "peaks")
        ],
        ignore_index=True,
    )
    summarize_steps(rows).to_parquet(folder / "step_summary.parquet")
    out = tmp_path / "r"
    render_report(summary=ours, files=ReportFiles.in_folder(out))
    markdown = (out / "summary.md").read_text()
    assert "unavailable: no usable CUDA device" in markdown
    assert "GPU peaks: laptop: not measured (no usable CUDA device)" in markdown


# ----------------------------------------------------------------------------------------------- tree shape


def test_tree_shape_carries_expected_acceptance(tmp_path):
    path = tmp_path / "t.npz"
    lp, ids = generate_trace("peaked", 6, 4, 16, vocab_size=300, seed=2, device="cpu")
    save_trace(path, lp, ids, distribution="peaked")
    small, large = tree_shape(path, 2, distribution="peaked"), tree_shape(path, 16, distribution="peaked")
    values = expected_accepted_tokens(lp, ids, get_builder("reference").build(lp, ids, 16))
    assert large[0]["expected_accept_mean"] == pytest.approx(float(np.mean(values)))
    assert large[0]["expected_accept_p10"] == pytest.approx(float(np.percentile(values, 10)))
    assert all(r["expected_accept_mean"] == large[0]["expected_accept_mean"] for r in large)
    assert large[0]["expected_accept_mean"] >= small[0]["expected_accept_mean"]  # more nodes, more accepted
    files = []
    for i, records in enumerate((small, large)):
        files.append(tmp_path / f"{i}.json")
        files[-1].write_text(json.dumps(records))
    shapes = combine_shapes(files)
    assert shapes["expected_accept_mean"].notna().all()
    old = tmp_path / "old.json"  # written before the expected acceptance existed
    old.write_text(json.dumps([{k: v for k, v in small[0].items() if not k.startswith("expected")}]))
    assert combine_shapes([old])["expected_accept_mean"].isna().all()


def test_synthetic_summary_helper_still_works():
    assert len(synthetic_summary("m"))  # the shared helper this module builds on


# ----------------------------------------------------------------------------------------------- scripts


SCRIPTS = Path(__file__).resolve().parents[2] / "workflow" / "scripts"


def run_script(name, monkeypatch, **job):
    """Run workflow/scripts/<name>.py as Snakemake would, with a stand-in for its ``snakemake`` object."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    namespace = {
        key: SimpleNamespace(**value) if isinstance(value, dict) else value for key, value in job.items()
    }
    runpy.run_path(str(SCRIPTS / f"{name}.py"), init_globals={"snakemake": SimpleNamespace(**namespace)})


def test_step_scripts_call_the_libraries(tmp_path, monkeypatch):
    """The one script of the step rules, on this machine (no GPU: rows saying why; the CPU walk where it
    runs), end to end into the step summary."""
    trace = tmp_path / "peaked-L4.npz"
    lp, ids = generate_trace("peaked", 2, 4, 8, vocab_size=64, seed=0, device="cpu")
    save_trace(trace, lp, ids, distribution="peaked")
    timing = {
        "warmup": 1,
        "repeats": 2,
        "min_repeats": 1,
        "max_repeats": 3,
        "min_seconds": 0.0,
        "max_seconds": 0.05,
    }
    wildcards = {
        "distribution": "peaked",
        "depth": "4",
        "budget": "4",
        "batch": "2",
        "prefix": "64",
        "heads": "8",
    }
    out = {name: tmp_path / f"{name}.parquet" for name in ("attention", "accept", "peaks", "unavailable")}
    common = {"wildcards": wildcards, "log": [str(tmp_path / "job.log")]}
    jobs = {
        "attention": attention_stage.Job(
            str(trace), 4, 2, heads=8, prefix=64, timing=timing, impls=("ours", "sdpa"), machine="m"
        ),
        "accept": accept_stage.Job(str(trace), 4, 2, timing=timing, machine="m"),
        "peaks": peaks_stage.Job(timing=timing, machine="m"),
    }
    for stage, job in jobs.items():
        fields = {"job": job, "fields": stages.job_fields(job)}
        run_script(
            "stage", monkeypatch, rule=f"step_{stage}", output=[str(out[stage])], params=fields, **common
        )
    run_script(
        "step_unavailable",
        monkeypatch,
        rule="step_unavailable",
        wildcards={"stage": "attention"},
        output={"rows": str(out["unavailable"])},
        params={
            "reason": "gpu: off in the configuration",
            "impls": {"verify-attention": ["ours"]},
            "machine": "m",
        },
        log=[str(tmp_path / "job.log")],
    )
    summary_path = tmp_path / "step_summary.parquet"
    run_script(
        "aggregate_step",
        monkeypatch,
        rule="aggregate_step",
        input={"rows": [str(p) for p in out.values()]},
        output={"summary": str(summary_path)},
        log=[str(tmp_path / "job.log")],
    )
    summary = pd.read_parquet(summary_path)
    assert list(summary.columns) == list(STEP_SUMMARY_COLUMNS)
    assert {"verify-attention", "accept", "peak"} == set(summary["stage"])
    attention = summary[summary["stage"] == "verify-attention"]
    assert {"ours", "sdpa"} <= set(attention["impl"])
    assert (attention["budget"].isin([0, 4])).all() and (attention["prefix"].dropna().isin([64])).all()
    walk = summary[(summary["impl"] == "cpu-walk") & (summary["status"] == "ok")]

    if gpu_unavailable_reason() is not None:  # the walk runs without a GPU; the rest says why not
        assert len(walk) == 1 and walk.iloc[0]["n"] >= 1 and walk.iloc[0]["expected_accept_mean"] > 0
        assert set(summary.loc[summary["impl"] != "cpu-walk", "status"]) == {"unavailable"}


def test_backends_line_says_how_each_attention_impl_ran():
    flex = "flex_attention (torch.compile, Triton), enable_gqa, kernel_options BLOCK_M=64, BLOCK_N=32"
    step = pd.DataFrame(
        {
            "stage": ["verify-attention"] * 5 + ["accept"],
            "impl": ["ours", "ours", "flexattention", "sdpa", "ours-mma", "gpu-kernel"],
            "status": ["ok", "ok", "ok", "unavailable", "ok", "ok"],
            "status_reason": [
                "backend: wgmma path",
                "backend: wgmma path",
                f"backend: {flex}",
                "sdpa: out of memory",
                None,
                "backend: not attention",
            ],
        }
    )
    assert backends_line(step) == f"flexattention: {flex}; ours: wgmma path"
    assert backends_line(step.iloc[3:4]) == ""  # nothing measured: nothing to say
    assert backends_line(pd.DataFrame()) == ""


def test_rest_of_the_round_goals_on_hand_made_rows():
    from ddtree_bench.report.round_goals import (  # noqa: PLC0415
        FORWARD,
        MOE_FULL,
        MOE_SMALL,
        ROUND_BEATS,
        ROUND_PARTS,
        round_targets,
    )

    def rows(stage, impl, batch, budget, seconds, **extra):
        base = {
            "stage": stage,
            "impl": impl,
            "batch": batch,
            "budget": budget,
            "timing": "cuda-events",
            "cache": "warm",
            "status": "ok",
            "machine": "m",
        }
        return [base | extra | {"phase": "timed", "repetition": i, "seconds": seconds} for i in range(3)]

    records = rows("peak", "device-copy", 0, 0, 2e9 / 4e12, bytes=2e9)  # 4 TB/s
    records += rows("moe", "triton-w4a16", 1, 8, 1e-3, bytes=3e9, experts_touched=66.0)  # 3 TB/s: 75%
    records += rows("moe", "triton-w4a16", 64, 256, 2e-3, bytes=2e9, experts_touched=384.0)  # 1 TB/s: 25%
    records += rows("moe", "bf16-grouped-mm", 64, 256, 1e-3, bytes=3e9, experts_touched=384.0)  # 75%
    records += rows("dense", "torch", 1, 8, 1e-3) + rows("lm-head", "torch", 1, 8, 0.1e-3)
    records += rows("verify-attention", "ours", 1, 8, 10e-6, prefix=4096, heads=8)
    # forward 2.4 ms against 1 + 1 + 0.1 + 61 x 0.01 = 2.71 ms of parts
    records += rows("forward", "triton-w4a16", 1, 8, 2.4e-3, prefix=4096, heads=8)
    for impl, wall in (("gpu", 10e-3), ("native-mt", 11e-3)):
        records += rows("round", impl, 1, 8, wall, timing="wall", prefix=4096, cache="n/a")
        records += rows("round", impl, 1, 8, wall / 1.1, timing="sum-of-parts", prefix=4096, cache="n/a")
    results = {
        target: (status, text)
        for target, _, status, text in round_targets(summarize_steps(stage_frame(records)))
    }
    assert results[MOE_FULL][0] == "met" and "min 75% (bf16-grouped-mm" in results[MOE_FULL][1]
    assert results[MOE_SMALL][0] == "met" and results[MOE_SMALL][1].startswith("75% (triton-w4a16")
    assert results[FORWARD][0] == "met" and "worst 0.886x" in results[FORWARD][1]
    assert results[ROUND_BEATS][0] == "met" and "0.909-0.909x over 1 budgets" in results[ROUND_BEATS][1]
    assert results[ROUND_PARTS][0] == "not met" and "worst 1.100x" in results[ROUND_PARTS][1]
    assert {status for status, _ in (r[2:4] for r in round_targets(pd.DataFrame()))} == {"no data"}
