"""Aggregation (median, p10, p90, n over timed calls only), the tree shape, the benchmark targets, and the
report rendering from a tiny synthetic summary."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from ddtree_bench.aggregate import SUMMARY_COLUMNS, aggregate, combine_shapes, summarize, tree_shape
from ddtree_bench.bench import COLUMNS, frame, unavailable_frame
from ddtree_bench.builders import get_builder
from ddtree_bench.report import (
    FIGURE_NAMES,
    evaluate_targets,
    load_machines,
    render_report,
    speedups,
    timings,
)
from ddtree_bench.traces import generate_trace, save_trace


def rows_for(
    builder,
    seconds,
    *,
    warmup=(),
    batch=2,
    budget=8,
    machine="m",
    distribution="uniform",
    depth=16,
    timing="wall",
    cache="n/a",
):
    base = dict(
        builder=builder,
        label=builder,
        budget=budget,
        batch=batch,
        depth=depth,
        topk=budget,
        distribution=distribution,
        timing=timing,
        cache=cache,
        status="ok",
        status_reason=None,
        correct=True,
        nodes_mean=float(budget),
        device_memory_bytes=np.nan,
        threads=1,
        machine=machine,
    )
    rows = [
        dict(base, phase="warmup", repetition=i, seconds=s, per_tree_seconds=s / batch)
        for i, s in enumerate(warmup)
    ]
    rows += [
        dict(base, phase="timed", repetition=i, seconds=s, per_tree_seconds=s / batch)
        for i, s in enumerate(seconds)
    ]
    return frame(rows)


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


def synthetic_summary(machine, *, sglang=False, native_speedup=100.0, gpu=False):
    frames = []
    for budget in (8, 64):
        for batch in (1, 64):
            ref = 1e-4 * budget * batch
            frames.append(
                rows_for(
                    "reference",
                    [ref * f for f in (0.9, 1.0, 1.1)],
                    budget=budget,
                    batch=batch,
                    machine=machine,
                )
            )
            frames.append(
                rows_for(
                    "native",
                    [ref / native_speedup * f for f in (0.9, 1.0, 1.1)],
                    budget=budget,
                    batch=batch,
                    machine=machine,
                )
            )
            if sglang:
                frames.append(rows_for("sglang", [ref * 1.1], budget=budget, batch=batch, machine=machine))
            if gpu:
                frames.append(
                    rows_for(
                        "gpu",
                        [2e-5],
                        budget=budget,
                        batch=batch,
                        machine=machine,
                        timing="kernel-events",
                        cache="warm",
                    )
                )
                frames.append(
                    rows_for(
                        "gpu",
                        [1e-5],
                        budget=budget,
                        batch=batch,
                        machine=machine,
                        timing="floor",
                        cache="warm",
                    )
                )
    if not sglang:
        frames.append(unavailable_frame("sglang", "SGLang has no DDTree module", machine=machine))
    if not gpu:
        frames.append(unavailable_frame("gpu", "no CUDA device", machine=machine))
    return summarize(pd.concat(frames, ignore_index=True))


def write_machine(folder, machine, **kwargs):
    folder.mkdir(parents=True, exist_ok=True)
    synthetic_summary(machine, **kwargs).to_parquet(folder / "summary.parquet")
    shapes = [
        {
            "distribution": d,
            "depth": 16,
            "budget": b,
            "topk": b,
            "requests": 4,
            "tree_nodes_mean": b,
            "tree_depth": t,
            "nodes_mean": b / 16,
            "nodes_p10": 1.0,
            "nodes_p90": 2.0,
        }
        for d in ("uniform", "bf16")
        for b in (8, 64)
        for t in range(1, 17)
    ]
    pd.DataFrame(shapes).to_parquet(folder / "tree_shape.parquet")
    environment = {
        "machine": machine,
        "cpu_model": "Test CPU",
        "cpu_count": 2,
        "gpu_name": None,
        "config": {"builders": ["sglang", "reference", "native", "gpu"]},
        "builds": {},
        "nvcc": None,
    }
    (folder / "environment.json").write_text(json.dumps(environment))
    return folder / "summary.parquet"


def test_targets_met_not_met_and_no_data(tmp_path):
    fast = load_machines(write_machine(tmp_path / "fast", "fast", native_speedup=100.0))
    slow = load_machines(write_machine(tmp_path / "slow", "slow", native_speedup=10.0))
    status = {r.target: r.status for r in evaluate_targets(fast)}
    native_target = next(t for t in status if t.startswith("native (1 thread) >= 50x"))
    assert status[native_target] == "met"
    assert {r.target: r.status for r in evaluate_targets(slow)}[native_target] == "not met"
    assert status[next(t for t in status if t.startswith("reference within"))] == "no data"
    assert all(s == "no data" for t, s in status.items() if t.startswith("gpu"))


def test_gpu_targets_are_evaluated_where_gpu_data_exists(tmp_path):
    machines = load_machines(write_machine(tmp_path / "h", "h200", sglang=True, gpu=True))
    status = {r.target: r for r in evaluate_targets(machines)}
    floor = next(r for t, r in status.items() if "floor" in t)
    assert floor.status == "met"  # kernel 20 µs, floor 10 µs: 2.0x
    assert floor.measured == "worst 2.00x the floor (10.0 µs); N=8: 2.00x"  # budget 8 only (16/32 absent)
    speed = next(r for t, r in status.items() if t.startswith("gpu kernel >= 500x"))
    assert "SGLang" in speed.target and speed.status == "met"  # 56 ms / 20 µs
    assert "unreachable" not in speed.measured and "published" not in speed.measured  # SGLang measured here
    assert next(r for t, r in status.items() if "budget 1024, batch 1" in t).status == "no data"


@pytest.mark.parametrize(
    ("columns", "said"), [(None, "K = N columns (min(N, K))"), (1024, "the trace's K columns")]
)
def test_host_inclusive_target_says_which_columns_were_copied(tmp_path, columns, said):
    frames = [synthetic_summary("h200", gpu=True)]
    for budget in (8, 64):
        host = rows_for("gpu", [4e-5], budget=budget, batch=64, machine="h200", timing="host-inclusive")
        host["input_columns"] = budget if columns is None else columns
        mt = rows_for("native-mt", [2e-5], budget=budget, batch=64, machine="h200")
        mt["input_columns"] = host["input_columns"]
        frames += [summarize(host), summarize(mt)]
    path = tmp_path / "summary.parquet"
    pd.concat(frames, ignore_index=True).to_parquet(path)
    target = next(
        r for r in evaluate_targets(load_machines(path)) if r.target.startswith("gpu host-inclusive")
    )
    assert target.status == "not met"  # 40 µs against 20 µs: 0.5x
    assert "0.5x" in target.measured and f"it copies {said} in" in target.measured


def test_speed_targets_say_where_they_cannot_be_reached_and_what_sglang_published(tmp_path):
    common = dict(budget=8, batch=64, machine="h200")
    frames = [
        rows_for("reference", [4e-3], **common),  # 500x needs 8 µs, below the 10 µs floor
        rows_for("native-mt", [2e-5], **common),  # 10x needs 2 µs
        rows_for("gpu", [2e-5], timing="kernel-events", cache="warm", **common),
        rows_for("gpu", [1e-5], timing="floor", cache="warm", **common),
        rows_for("gpu", [5e-5], timing="host-inclusive", **common),  # 30 µs around the kernel
    ]
    path = tmp_path / "summary.parquet"
    summarize(pd.concat(frames, ignore_index=True)).to_parquet(path)
    targets = {r.target: r for r in evaluate_targets(load_machines(path))}
    speed = targets["gpu kernel >= 500x faster than reference (ours), batch 64, budgets 8/16/32"]
    assert speed.status == "not met" and speed.measured.startswith("min 200x (N=8, B=64")
    assert "; unreachable here: N=8 needs 8.00 µs, below the empty-kernel floor (10.00 µs)" in speed.measured
    # 3.0 ms (SGLang's batch of 64 at N = 8, ../shared/CONTEXT.md) / 20 µs
    assert speed.measured.endswith("(batch 64, L = 16, K = N; not this run): N=8: 150x")
    host = targets["gpu host-inclusive >= 10x faster than native-mt, batch 64, every budget"]
    assert host.status == "not met" and host.measured.endswith(
        "; unreachable here at N=8: 10x native-mt leaves 2.0 µs a call, less than the copies, launch and "
        "sync around the kernel took (30.0 µs: host-inclusive minus kernel time)"
    )


def test_floor_target_says_each_budget_and_fails_on_the_slowest(tmp_path):
    frames = [synthetic_summary("h200", gpu=True)]  # budget 8 at 2.0x the floor
    for budget, seconds in ((16, 3e-5), (32, 4.5e-5)):
        for distribution, scale in (("uniform", 1.0), ("peaked", 0.5)):  # the slowest trace counts
            kernel = rows_for(
                "gpu",
                [seconds * scale],
                budget=budget,
                batch=64,
                machine="h200",
                distribution=distribution,
                timing="kernel-events",
                cache="warm",
            )
            frames.append(summarize(kernel))
    path = tmp_path / "summary.parquet"
    pd.concat(frames, ignore_index=True).to_parquet(path)
    floor = next(r for r in evaluate_targets(load_machines(path)) if "empty-kernel floor" in r.target)
    assert floor.status == "not met"
    assert floor.measured == "worst 4.50x the floor (10.0 µs); N=8: 2.00x, N=16: 3.00x, N=32: 4.50x"


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
        html=out / "index.html",
        markdown=out / "summary.md",
        figures=figures,
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
        html=tmp_path / "r" / "index.html",
        markdown=tmp_path / "r" / "summary.md",
    )
    assert "no CUDA device" in (tmp_path / "r" / "summary.md").read_text()
    assert (tmp_path / "r" / "index.html").read_text().count("data:image/png;base64,") == len(FIGURE_NAMES)


def test_columns_contract_is_what_docs_say():
    documented = (
        "builder, label, budget, batch, depth, topk, input_columns, distribution, repetition, "
        "phase (warmup|timed), "
        "timing, cache, seconds, per_tree_seconds, status, status_reason, correct (bool), nodes_mean, "
        "device_memory_bytes, threads, trace_sha256, machine, hostname, cpu_model, cpu_count, gpu_name, "
        "gpu_driver, "
        "python, numpy, cupy, torch, sglang, git_commit, timestamp, clock"
    )
    names = [part.strip().split(" ")[0] for part in documented.split(", ")]
    assert list(COLUMNS) == names


def test_reference_is_set_beside_sglangs_published_figures_when_sglang_is_absent(tmp_path):
    """Without SGLang the target stays "no data", but the measured column compares reference's batch-64
    time with SGLang's published per-call figures (N = 8: 3.0 ms) and says they are not from this run."""
    machines = load_machines(write_machine(tmp_path / "m", "m"))
    result = next(r for r in evaluate_targets(machines) if r.target.startswith("reference within"))
    assert result.status == "no data"
    assert "published" in result.measured and "not this run" in result.measured
    # reference at N = 8, B = 64: 1e-4 * 8 * 64 s = 51.2 ms, against 3.0 ms published
    assert "from 17.07 to 17.07 (1 configurations)" in result.measured
