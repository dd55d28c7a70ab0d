"""Which budget? The round model's arithmetic, the paper's worked example, the best-budget selection, the
build cost each builder is charged, the report section (published H200 data and a CPU-only run), and the
configuration's checks."""

from __future__ import annotations

import copy
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml
from report_rows import write_machine
from workflow_copy import ROOT

from ddtree_bench.config import check_config
from ddtree_bench.k26 import estimates as arithmetic
from ddtree_bench.report import FIGURE_NAMES, ReportFiles, load_machines, render_report
from ddtree_bench.report.throughput import TARGET, budget_targets, has_step_stages, no_model_note, sections
from ddtree_bench.settings import Settings
from ddtree_bench.summary.step import summarize_steps
from ddtree_bench.throughput import (
    PAPER_SPEEDUP,
    ROUND_TERMS,
    Comm,
    RoundAssumptions,
    WhatIf,
    best_budgets,
    build_costs,
    gpu_gains,
    paper_example,
    term_sources,
    throughput,
    tokens_per_second,
)
from ddtree_bench.timing.records import unavailable_stage_frame

PUBLISHED = ROOT / "results" / "published" / "h200"


# ----------------------------------------------------------------------------------------------- arithmetic


def test_experts_touched_against_the_formula_and_a_routing_simulation():
    # E(T) = 384 (1 - (1 - 8/384)^T): the brief's values
    assert arithmetic.experts_touched(1) == pytest.approx(8.0)
    assert arithmetic.experts_touched(9) == pytest.approx(66.3, abs=0.05)
    assert arithmetic.experts_touched(33) == pytest.approx(192.3, abs=0.1)
    assert arithmetic.experts_touched(257) == pytest.approx(382.3, abs=0.1)
    rng = np.random.default_rng(0)
    for tokens in (9, 33, 257):
        counts = []
        for _ in range(200):  # each token picks 8 distinct of 384 experts uniformly
            picks = np.argsort(rng.random((tokens, 384)), axis=1)[:, :8]
            counts.append(len(np.unique(picks)))
        expected = 384 * (1 - (1 - 8 / 384) ** tokens)
        assert np.mean(counts) == pytest.approx(expected, rel=0.02)
        assert arithmetic.experts_touched(tokens) == pytest.approx(expected)
    with pytest.raises(ValueError, match="tokens: must be a number >= 0"):
        arithmetic.experts_touched(-1)


def test_the_what_if_defaults_are_the_int4_bf16_arithmetic():
    derived = arithmetic.kimi_arithmetic(copy_tbps=4.3, gemm_tflops=790)
    assert arithmetic.K26.expert_slice_bytes() == 3 * 7168 * 256 * (0.5 + 2 / 32)
    assert derived["expert_slice_mb"] == pytest.approx(3.10, abs=0.005)
    default = WhatIf()
    for key in ("dense_weights_gb", "expert_slice_mb", "draft_weights_gb", "draft_per_token_us"):
        assert getattr(default, key) == pytest.approx(derived[key], rel=0.03), key
    assert default.dense_per_token_us == pytest.approx(derived["per_token_dense_us"], rel=0.01)
    assert default.dense_per_token_us + default.expert_per_token_us == pytest.approx(
        derived["per_token_us"], rel=0.01
    )
    # the what-if at T tokens: 4.5 GB / bw + 3.10 MB x E(T) x 60 / bw + per-token x T
    parts = default.parts_s(9, 4.3)
    assert parts["moe"] == pytest.approx(3.10e6 * 60 * arithmetic.experts_touched(9) / 4.3e12 + 6.7e-6 * 9)
    assert parts["dense"] == pytest.approx(4.5e9 / 4.3e12 + 5.75e-6 * 9)
    # saturates: beyond a few hundred tokens the expert bytes stop growing
    big = default.parts_s(4096, 4.3)["moe"] - 6.7e-6 * 4096
    assert big == pytest.approx(3.10e6 * 60 * 384 / 4.3e12, rel=1e-6)


def test_the_allreduce_estimate_formula():
    comm = Comm(world_size=8, bus_bandwidth_gbps=370.0, latency_us=15.0)
    tokens = 4 * 65
    expected = 122 * (15e-6 + 2 * 7 / 8 * tokens * 7168 * 2 / 370e9)
    assert comm.allreduce_s(tokens) == pytest.approx(expected)
    # the drafter's top-K all-gathers: values (fp32), ids (int64), logsumexp (fp32) of B x L rows
    rows, k = 4 * 16, 64
    gathers = sum(15e-6 + 7 / 8 * 8 * b / 370e9 for b in (rows * k * 4, rows * k * 8, rows * 4))
    assert comm.allgather_s(4, 16, k) == pytest.approx(gathers)
    assert Comm(world_size=1).allreduce_s(tokens) == 0.0
    model = RoundAssumptions()
    assert (
        model.comm_source == "estimated"
        and RoundAssumptions(comm=Comm(latency_us=5.0)).comm_source == "entered"
    )


def test_model_from_config_and_its_defaults():
    model = RoundAssumptions.from_config(
        {"draft_ms": 2.5, "what_if": {"bandwidth_tbps": 3.0}, "allreduce": {"world_size": 4}}, 61
    )
    assert model.draft_ms == 2.5 and model.what_if.bandwidth_tbps == 3.0 and model.comm.world_size == 4
    assert model.what_if_source == "entered"
    default = RoundAssumptions.from_config(None, 61)
    assert default.draft_ms is None and default.what_if == WhatIf() and default.comm == Comm()
    assert default.what_if_source == "estimated"
    options = Settings.from_config(default_config()).throughput_options()
    assert options == {
        "draft_ms": None,
        "forward_ms": None,
        "what_if": {
            "dense_weights_gb": 4.5,
            "expert_slice_mb": 3.10,
            "dense_per_token_us": 5.75,
            "expert_per_token_us": 6.7,
            "draft_weights_gb": 1.1,
            "draft_per_token_us": 1.4,
            "bandwidth_tbps": None,
        },
        "allreduce": {"world_size": 8, "bus_bandwidth_gbps": 370.0, "latency_us": 15.0},
        "prefix_length": None,
        "topk": 1024,
    }
    assert RoundAssumptions.from_options(options, 61) == RoundAssumptions(topk=1024)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: RoundAssumptions(draft_ms=-1.0),
            "throughput.draft_ms: must be a finite number >= 0, got -1.0",
        ),
        (lambda: WhatIf(expert_slice_mb=math.nan), "what_if.expert_slice_mb: must be a finite number >= 0"),
        (lambda: WhatIf(bandwidth_tbps=0.0), "what_if.bandwidth_tbps: must be a finite number > 0"),
        (lambda: Comm(world_size=0), "allreduce.world_size: must be an integer >= 1, got 0"),
        (lambda: RoundAssumptions(layers=0), "layers: must be an integer >= 1, got 0"),
        (lambda: RoundAssumptions.from_config({"what_if": {"fixed": 1}}, 61), "throughput: "),
        (lambda: tokens_per_second(0.5, 1, 1.0), "tau: must be a number >= 1"),
        (lambda: tokens_per_second(2.0, 0, 1.0), "batch: must be an integer >= 1, got 0"),
        (lambda: tokens_per_second(2.0, 1, 0.0), "round time: must be a number > 0"),
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


def stage_row(stage, impl, batch, budget, seconds, *, prefix=None, heads=None, status="ok", **extra):
    """One step-summary row of a stage (the lead's contract: stage, impl, keys, median_s; extra columns)."""
    row = dict(
        machine="m",
        stage=stage,
        impl=impl,
        distribution="d" if stage in ("verify-attention", "accept") else None,
        depth=16 if stage in ("verify-attention", "accept") else None,
        batch=batch,
        budget=budget,
        heads=heads,
        prefix=prefix,
        timing="cuda-events",
        cache="warm",
        status=status,
        status_reason=None if status == "ok" else "one GPU: no tensor parallel group",
        n=3 if status == "ok" else 0,
        median_s=seconds if status == "ok" else math.nan,
    )
    return row | extra


def hand_made_step(forward=None, parts=None, allreduce=None, draft=None, accept=None, attention=None):
    """Step rows at B = 1, N = 8, 64, 256, S = 4096: each argument {budget: seconds} (None: the defaults
    below, {} : no rows)."""
    budgets = (8, 64, 256)
    attention = {n: 0.1e-3 for n in budgets} if attention is None else attention
    accept = {n: 4e-6 for n in budgets} if accept is None else accept
    rows = [
        stage_row("verify-attention", "ours", 1, n, v, prefix=4096, heads=8) for n, v in attention.items()
    ]
    rows += [stage_row("accept", "gpu-kernel", 1, n, v) for n, v in accept.items()]
    for n, v in (forward or {}).items():
        rows.append(stage_row("forward", "marlin-w4a16", 1, n, v, prefix=4096, heads=8))
        rows.append(
            stage_row("forward", "bf16-grouped-mm", 1, n, v * 3, prefix=4096, heads=8)
        )  # not preferred
    for n, (moe, dense, head) in (parts or {}).items():
        rows.append(stage_row("moe", "triton-w4a16", 1, n, moe * 2, experts_touched=60.0))
        rows.append(stage_row("moe", "marlin-w4a16", 1, n, moe, experts_touched=60.0))
        rows.append(stage_row("dense", "torch", 1, n, dense))
        rows.append(stage_row("lm-head", "torch", 1, n, head))
    for n, v in (draft or {}).items():
        rows.append(stage_row("draft", "torch", 1, n, v, prefix=4096))
    for n, v in (allreduce or {}).items():
        rows.append(stage_row("allreduce", "nccl", 1, n, v, world_size=8))
    return pd.DataFrame(rows)


HAND_SUMMARY = [
    ("gpu", "kernel-events", "warm", 1, 8, 5e-6),
    ("gpu", "kernel-events", "warm", 1, 64, 20e-6),
    ("gpu", "kernel-events", "warm", 1, 256, 40e-6),
    ("reference", "wall", "n/a", 1, 8, 0.1e-3),
    ("reference", "wall", "n/a", 1, 64, 8e-3),
    ("reference", "wall", "n/a", 1, 256, 9e-3),
]
HAND_TAU = {8: 5.0, 64: 8.0, 256: 9.0}  # tau 6, 9, 10


def test_measured_round_best_budget_and_the_term_that_sets_it():
    step = hand_made_step(
        forward={8: 10e-3, 64: 11e-3, 256: 30e-3},
        draft={8: 1e-3, 64: 1e-3, 256: 1e-3},
        allreduce={8: 2e-3, 64: 2e-3, 256: 2e-3},
    )
    summary, shapes = summary_rows(HAND_SUMMARY), shape_rows(HAND_TAU)
    result = throughput(summary, step, shapes, RoundAssumptions(), distribution="d", depth=16)
    assert result.missing is None and result.unmodelled.empty
    table = result.table.set_index(["builder", "budget"])
    gpu64 = table.loc[("gpu", 64)]
    # 1 (draft) + 0.02 (build) + 11 (forward, marlin-w4a16 preferred) + 2 (allreduce) + 0.004 (accept) ms
    assert gpu64["round_s"] == pytest.approx(14.024e-3)
    assert gpu64["tokens_per_s"] == pytest.approx(9.0 / 14.024e-3)
    for term in ("draft", "build", "forward", "allreduce", "accept"):
        assert gpu64[f"{term}_source"] == "measured", term
    assert gpu64["parts"] == ("draft", "build", "forward", "allreduce", "accept")
    terms = result.terms[(1, 64, "gpu")]
    assert "marlin-w4a16" in terms["forward"].note and terms["allreduce"].note == "world size 8"
    best = best_budgets(result.table).set_index("builder")
    # gpu: 6 / 13.009 ms = 461, 9 / 14.024 ms = 642, 10 / 33.044 ms = 303 -> N = 64; the forward's
    # +19 ms to N = 256 outweighs tau's 10 / 9
    assert best.loc["gpu", "best_budget"] == 64
    assert best.loc["gpu", "set_by"] == "forward" and best.loc["gpu", "next_budget"] == 256
    assert best.loc["gpu", "set_by_growth_s"] == pytest.approx(19e-3)
    assert best.loc["gpu", "round_growth"] == pytest.approx(33.044 / 14.024)
    assert best.loc["gpu", "tau_gain"] == pytest.approx(10 / 9)
    # reference pays 8 ms at N = 64: 6 / 13.104 ms = 458 > 9 / 22.004 ms = 409 -> N = 8, set by its build
    assert best.loc["reference", "best_budget"] == 8
    assert best.loc["reference", "set_by"] == "build"
    assert best.loc["reference", "set_by_growth_s"] == pytest.approx(7.9e-3)
    gains = gpu_gains(best_budgets(result.table))
    assert gains["gain"].iloc[0] == pytest.approx((9.0 / 14.024e-3) / (6.0 / 13.104e-3))


def test_a_run_round_is_the_round_where_it_exists_and_the_terms_elsewhere():
    step = hand_made_step(
        forward={8: 10e-3, 64: 11e-3, 256: 30e-3},
        draft={8: 1e-3, 64: 1e-3, 256: 1e-3},
    )
    rounds = [
        stage_row("round", "gpu", 1, 64, 12.5e-3, prefix=4096, heads=8, timing="wall", note="one CUDA graph"),
        stage_row("round", "gpu", 1, 64, 12.6e-3, prefix=4096, heads=8, timing="sum-of-parts"),
        stage_row("round", "reference", 1, 64, 0.0, prefix=4096, heads=8, timing="wall", status="failed"),
    ]
    step = pd.concat([step, pd.DataFrame(rounds)], ignore_index=True)
    summary, shapes = summary_rows(HAND_SUMMARY), shape_rows(HAND_TAU)
    result = throughput(summary, step, shapes, RoundAssumptions(), distribution="d", depth=16)
    table = result.table.set_index(["builder", "budget"])
    gpu64 = table.loc[("gpu", 64)]
    comm = result.terms[(1, 64, "gpu")]["allreduce"]
    assert comm.source == "estimated"  # one GPU: the run round holds no communication
    assert gpu64["round_from"] == "run round + allreduce"
    assert gpu64["round_s"] == pytest.approx(12.5e-3 + comm.seconds)
    assert gpu64["run_round_s"] == pytest.approx(12.5e-3) and gpu64["run_parts_s"] == pytest.approx(12.6e-3)
    assert gpu64["run_note"] == "one CUDA graph"
    assert gpu64["model_round_s"] == pytest.approx(1e-3 + 20e-6 + 11e-3 + comm.seconds + 4e-6)
    assert gpu64["tokens_per_s"] == pytest.approx(9.0 / gpu64["round_s"])
    # no run round anywhere at (B, N): the sum of the terms
    row = table.loc[("gpu", 8)]
    assert row["round_from"] == "sum of the terms" and row["round_s"] == pytest.approx(row["model_round_s"])
    assert pd.isna(row["run_round_s"])
    # a builder without a run round (a failed one does not count) where another's was run: left out, named
    assert ("reference", 64) not in table.index
    left = result.unmodelled.set_index(["builder", "budget"]).loc[("reference", 64), "missing"]
    assert "the other builders' rounds here were run" in left


def test_best_budget_at_the_largest_budget_has_no_term_that_sets_it():
    step = hand_made_step(
        forward={8: 10e-3, 64: 10e-3, 256: 10e-3},
        draft={n: 1e-3 for n in (8, 64, 256)},
        allreduce={n: 2e-3 for n in (8, 64, 256)},
    )
    result = throughput(
        summary_rows(HAND_SUMMARY[:3]),
        step,
        shape_rows(HAND_TAU),
        RoundAssumptions(),
        distribution="d",
        depth=16,
    )
    best = best_budgets(result.table).set_index("builder")
    assert best.loc["gpu", "best_budget"] == 256 and best.loc["gpu", "set_by"] is None


def test_sum_of_parts_then_the_what_if_and_allreduce_estimated_where_unavailable():
    step = hand_made_step(
        forward={256: 30e-3},
        parts={64: (3e-3, 2e-3, 0.5e-3), 8: (3e-3, 2e-3, None)},  # N = 8 lacks the LM head
        draft={},
    )
    step = step[~((step["stage"] == "lm-head") & (step["budget"] == 8))]
    step = pd.concat(
        [step, pd.DataFrame([stage_row("allreduce", "nccl", 0, 0, None, status="unavailable")])],
        ignore_index=True,
    )
    result = throughput(
        summary_rows(HAND_SUMMARY[:3]),
        step,
        shape_rows(HAND_TAU),
        RoundAssumptions(),
        distribution="d",
        depth=16,
    )
    assert result.unmodelled.empty
    table = result.table.set_index("budget")
    # N = 256: the forward measured as one graph
    assert table.loc[256, "forward_source"] == "measured" and table.loc[256, "forward_s"] == 30e-3
    # N = 64: moe (marlin, 3 ms) + dense 2 + lm-head 0.5 + attention 0.1 ms x 61
    assert table.loc[64, "forward_source"] == "sum of parts"
    assert table.loc[64, "forward_s"] == pytest.approx(3e-3 + 2e-3 + 0.5e-3 + 61 * 0.1e-3)
    assert table.loc[64, "parts"] == (
        "draft",
        "build",
        "attention",
        "moe",
        "dense",
        "lm_head",
        "allreduce",
        "accept",
    )
    # N = 8: a part missing -> the linear what-if, estimated, on the H200's 4.3 TB/s (no peak rows here)
    assert table.loc[8, "forward_source"] == "estimated" and table.loc[8, "moe_source"] == "estimated"
    moe = WhatIf().parts_s(9, 4.3)
    assert table.loc[8, "moe_s"] == pytest.approx(moe["moe"])
    assert table.loc[8, "forward_s"] == pytest.approx(61 * 0.1e-3 + moe["moe"] + moe["dense"])
    assert "4.3 TB/s (the H200's device copy; no measured peak here)" == result.bandwidth
    # no draft rows: estimated; the all-reduce rows unavailable -> estimated, its reason named
    assert set(table["draft_source"]) == {"estimated"} and set(table["allreduce_source"]) == {"estimated"}
    terms = result.terms[(1, 64, "gpu")]
    assert terms["allreduce"].seconds == pytest.approx(Comm().allreduce_s(65) + Comm().allgather_s(1, 16, 64))
    assert "unavailable: one GPU: no tensor parallel group" in terms["allreduce"].note
    sources = term_sources(result.table).set_index("term")["sources"]
    assert sources["target forward"] == "estimated (1 of 3), measured (1 of 3), sum of parts (1 of 3)" or (
        set(sources["target forward"].split(", "))
        == {"estimated (1 of 3)", "measured (1 of 3)", "sum of parts (1 of 3)"}
    )
    # changed what-if numbers: entered, not estimated
    entered = throughput(
        summary_rows(HAND_SUMMARY[:3]),
        step,
        shape_rows(HAND_TAU),
        RoundAssumptions(what_if=WhatIf(bandwidth_tbps=3.0)),
        distribution="d",
        depth=16,
    )
    assert entered.table.set_index("budget").loc[8, "forward_source"] == "entered"
    drafted = throughput(
        summary_rows(HAND_SUMMARY[:3]),
        step,
        shape_rows(HAND_TAU),
        RoundAssumptions(draft_ms=2.0),
        distribution="d",
        depth=16,
    )
    assert set(drafted.table["draft_source"]) == {"entered"} and set(drafted.table["draft_s"]) == {2e-3}


def test_an_entered_forward_ms_is_the_whole_forward_where_none_was_measured():
    """throughput.forward_ms (a live service's target_verify): entered where no forward row was measured,
    before the sum of parts and the what-if; its communication is in it, so the all-reduce term is 0."""
    step = hand_made_step(forward={256: 30e-3}, parts={64: (3e-3, 2e-3, 0.5e-3)}, attention={})
    summary, shapes = summary_rows(HAND_SUMMARY[:3]), shape_rows(HAND_TAU)
    model = RoundAssumptions.from_config({"forward_ms": 12.5}, 61)
    assert model.forward_ms == 12.5 and "forward 12.5 ms where not measured" in model.describe()
    result = throughput(summary, step, shapes, model, distribution="d", depth=16)
    assert result.unmodelled.empty  # no verify attention measured: the entered forward needs none
    table = result.table.set_index("budget")
    for budget in (8, 64):
        assert table.loc[budget, "forward_source"] == "entered"
        assert table.loc[budget, "forward_s"] == pytest.approx(12.5e-3)
        assert table.loc[budget, "allreduce_source"] == "entered" and table.loc[budget, "allreduce_s"] == 0
        assert table.loc[budget, "parts"] == ("draft", "build", "forward", "allreduce", "accept")
        terms = result.terms[(1, budget, "gpu")]
        assert terms["forward"].note == "throughput.forward_ms"
        assert terms["allreduce"].note == "in throughput.forward_ms"
        assert table.loc[budget, "round_s"] == pytest.approx(sum(terms[n].seconds for n in ROUND_TERMS))
    # a measured forward row still comes first, and its communication is estimated beside it
    assert table.loc[256, "forward_source"] == "measured" and table.loc[256, "forward_s"] == 30e-3
    assert table.loc[256, "allreduce_source"] == "estimated"
    with pytest.raises(ValueError, match="throughput.forward_ms: must be a finite number >= 0"):
        RoundAssumptions(forward_ms=-1.0)


def test_a_missing_term_leaves_that_budget_unmodelled_and_named_never_zero():
    step = hand_made_step(
        forward={8: 10e-3, 64: 11e-3}, accept={8: 4e-6, 64: 4e-6}, attention={8: 0.1e-3, 64: 0.1e-3}
    )
    # a forward row that failed counts as missing, not as zero
    step = pd.concat(
        [
            step,
            pd.DataFrame(
                [stage_row("forward", "marlin-w4a16", 1, 256, None, prefix=4096, heads=8, status="error")]
            ),
        ],
        ignore_index=True,
    )
    summary, shapes = summary_rows(HAND_SUMMARY[:3]), shape_rows(HAND_TAU)
    result = throughput(summary, step, shapes, RoundAssumptions(), distribution="d", depth=16)
    assert sorted(result.table["budget"]) == [8, 64]
    missing = result.unmodelled.set_index("budget")["missing"]
    assert list(missing.index) == [256]
    assert "target forward: no measured forward and no measured verify attention (ours)" in missing[256]
    assert "accept: no measured tree accept (GPU kernel)" in missing[256]
    # with every budget missing a term, nothing is modelled and the reason names the term
    none = throughput(
        summary,
        hand_made_step(forward={8: 1e-3}, accept={}),
        shapes,
        RoundAssumptions(),
        distribution="d",
        depth=16,
    )
    assert none.table.empty and "accept: no measured tree accept" in none.missing


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
    model = RoundAssumptions()
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
        files=ReportFiles.in_folder(out),
        depth=16,
        distribution="drafter",
        step_depth=16,
        step_distribution="drafter",
        distributions=["drafter"],
    )
    markdown = (out / "summary.md").read_text()
    section = markdown[markdown.index("### Which budget?\n") : markdown.index("## Environment")]
    # the model's S: the largest with run rounds (the round stage ran at 4096)
    assert (
        "#### h200: drafter trees, tau: paper (DDTree paper, Qwen3-8B) (L = 16; verify attention at "
        "S = 4096, 8 heads)" in section
    )
    assert "#### h200: drafter trees, tau: k2.6-reported (a Kimi K2.6 DDTree service) (L = 16;" in section
    assert section.count("The model's assumptions") == 1 and section.count("\n1. ") == 3
    assert (
        "| B | builder | build cost from | best N | grid edge | tokens/s | tau (paper) | round | set by | "
        "budgets compared |" in section
    )
    # every term's source, stated: the forward and the drafter measured, the communication estimated (one GPU)
    assert "| term | sources |" in section
    assert "| draft | measured (47 of 47) |" in section
    # measured wherever modelled: the budgets whose forward did not fit (B = 64, N = 1024) are no candidates
    assert "| target forward | measured (47 of 47) |" in section
    assert "| communication | estimated (47 of 47) |" in section
    # at batch 1 the rounds were run (gpu, native-mt, sglang); builders without one are named, not mixed in
    assert "Rounds run on the GPU (the round stage" in section and "42 of 47 modelled" in section
    assert "B = 1, N = 8: round: the other builders' rounds here were run" in section
    assert "![round_parts](figures/round_parts.png)" in markdown
    assert (out / "figures" / "round_parts.png").stat().st_size > 10_000
    for label in ("sglang (SGLang's CPU builder)", "reference (ours, Python)", "native-mt (C++, all cores)"):
        assert f"| 64 | {label} | in-situ |" in section  # what the decode round pays
    assert "| 1 | reference (ours, Python) |" not in section
    assert "| 1 | gpu (our CUDA kernel) | in-situ |" in section
    assert "![which_budget](figures/which_budget.png)" in markdown  # in the figures, above the detail
    assert (out / "figures" / "which_budget.png").stat().st_size > 10_000
    target = next(line for line in markdown.splitlines() if TARGET in line)
    assert "| met |" in target and "gpu 16" in target  # the measured W4A16 round at B = 1 and 64
    page = (out / "index.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(FIGURE_NAMES)
    assert "<h3>Which budget?</h3>" in page


def test_a_configured_distribution_the_machine_lacks_is_named_not_substituted_silently():
    machines = load_machines(PUBLISHED / "summary.parquet")
    found = sections(machines, {"h200": {"layers": 61}}, None, distributions=["peaked", "recorded"], depth=16)
    found = [s for s in found if s.profile == "paper"]
    assert [s.distribution for s in found] == ["drafter", "recorded"]
    assert (
        found[0].note == "The configured peaked trees are absent on h200; shown instead: its drafter trees."
    )
    assert found[0].heading().startswith("h200: drafter trees")
    # nothing else to show for the recorded trees: said, not substituted by the drafter trees again
    assert found[1].result is None
    assert found[1].missing == "no tree-build rows of the recorded trees on this machine"


def test_a_cpu_only_run_has_no_modelled_tokens_per_second_only_the_note_saying_why(tmp_path):
    ours = write_machine(tmp_path / "m", "laptop")
    out = tmp_path / "r"
    render_report(summary=ours, files=ReportFiles.in_folder(out), step_enabled=False)
    markdown = (out / "summary.md").read_text()
    section = markdown[markdown.index("### Which budget?\n") : markdown.index("## Environment")]
    section = section[: section.index("\n### ", 5)]  # up to the next section of the detail tables
    assert (
        "_laptop (this run) has no GPU step stages (step stages off (step.enabled: false in the "
        "configuration)), so it has no modelled K2.6 tokens/s of its own. No machine here measured them: "
        "the step stages run on a CUDA GPU (step.enabled: true)._"
    ) in section
    assert "#### laptop" not in section and "| B | builder |" not in section and "| laptop" not in section
    target = next(line for line in markdown.splitlines() if TARGET in line)
    assert "| no data | no modelled tokens/s: no GPU step stages (step stages off" in target
    page = (out / "index.html").read_text()
    assert page.count("data:image/png;base64,") == len(FIGURE_NAMES)
    machines = load_machines(ours)
    assert sections(machines, {}, None) == []  # no section to model, none to draw a panel of
    results = budget_targets([], machines)
    assert [r[3] for r in results] == ["no data"]
    assert results[0][4] == "no modelled tokens/s: no GPU step stages (no step_summary.parquet)"


def test_a_machine_without_step_stages_has_no_section_and_leaves_a_published_machines_as_they_are(tmp_path):
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
    alone = sections(machines[1:], {}, None, distributions=["drafter"], depth=16)
    assert alone and all(s.machine == "h200" and not s.missing for s in alone)
    # with no step summary, and with one whose rows only say why the stages could not run here
    for step in (
        machines[0].step,
        summarize_steps(unavailable_stage_frame("attention", "no GPU", machine="laptop")),
    ):
        machines[0].step = step
        assert not has_step_stages(machines[0]) and has_step_stages(machines[1])
        found = sections(machines, {}, None, distributions=["drafter"], depth=16)
        # no section of laptop's: its builds are never set beside another machine's terms
        assert [s.machine for s in found] == ["h200"] * len(alone)
        # the published machine's sections are those it has alone: its own rows, its own rounds
        for mine, own in zip(found, alone, strict=True):
            assert (mine.heading(), mine.note, mine.profile) == (own.heading(), own.note, own.profile)
            pd.testing.assert_frame_equal(mine.result.table, own.result.table)
            pd.testing.assert_frame_equal(mine.best, own.best)
        assert (found[0].result.table["round_from"] != "sum of the terms").any()
        # the note says why laptop has none, in its own rows' words (never "they need a GPU")
        why = "no step_summary.parquet" if step.empty else "its step stages did not run: no GPU"
        note = no_model_note(machines, found)
        assert note == (
            f"laptop (this run) has no GPU step stages ({why}), so it has no modelled K2.6 tokens/s of its "
            "own. The sections below model only the machines that measured them, each on its own rows: h200 "
            "(published)."
        )
        targets = {r[0]: r for r in budget_targets(found, machines)}
        assert targets["laptop"][3:] == ("no data", f"no modelled tokens/s: no GPU step stages ({why})")
        assert targets["h200"][3] == "met"


# ----------------------------------------------------------------------------------------------- config


def default_config() -> dict:
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


BAD = [
    ({"draft_ms": -1}, "config: throughput.draft_ms: -1 is less than the minimum of 0"),
    ({"forward_ms": -2}, "config: throughput.forward_ms: -2 is less than the minimum of 0"),
    ({"draft_ms": "fast"}, "config: throughput.draft_ms: 'fast' is not of type 'null', 'number'"),
    (
        {"what_if": {"expert_slice_mb": -0.5}},
        "config: throughput.what_if.expert_slice_mb: -0.5 is less than the minimum of 0",
    ),
    (
        {"what_if": {"dense_per_token_us": True}},
        "config: throughput.what_if.dense_per_token_us: True is not of type 'number'",
    ),
    (
        {"what_if": {"bandwidth_tbps": 0}},
        "config: throughput.what_if.bandwidth_tbps: 0 is less than or equal to the minimum of 0",
    ),
    (
        {"what_if": {"dense_weights_gb": float("inf")}},
        "config: throughput.what_if.dense_weights_gb: must be a finite",
    ),
    (
        {"allreduce": {"world_size": 4}},
        "config: throughput.allreduce: Additional properties are not allowed ('world_size'",
    ),
    (
        {"allreduce": {"bus_bandwidth_gbps": 0.0}},
        "config: throughput.allreduce.bus_bandwidth_gbps: 0.0 is less than or equal to the minimum of 0",
    ),
    ({"what_if": {"fixed": 1}}, "config: throughput.what_if: Additional properties are not allowed ('fixed'"),
    ({"rest": {"fixed_ms": 1.0}}, "config: throughput: Additional properties are not allowed ('rest'"),
    ({"prefix_length": 0}, "config: throughput.prefix_length: 0 is less than the minimum of 1"),
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
    fragment.write_text("throughput:\n  draft_ms: 2.0\n  what_if: {bandwidth_tbps: 3.0}\n")
    done = run_cli(PUBLISHED, "--configfile", fragment)
    assert done.returncode == 0, done.stderr
    assert "Model: draft 2 ms where not measured; what-if forward:" in done.stdout
    assert "at 3 TB/s" in done.stdout
    assert "| B | builder | build cost from | best N |" in done.stdout
    # the published set measured the drafter (draft_ms applies where it is not measured) and every forward
    # that fits; budgets whose forward did not fit are no candidates, not entered what-ifs
    assert "| draft | measured (47 of 47) |" in done.stdout
    assert "| target forward | measured (47 of 47) |" in done.stdout
    fragment.write_text("throughput:\n  what_if: {expert_slice_mb: -3}\n")
    bad = run_cli(PUBLISHED, "--configfile", fragment)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "ddtree-bench: error: config: throughput.what_if.expert_slice_mb: -3 is less than the minimum of 0"
    ]
    assert bad.stdout == ""
    missing = run_cli(tmp_path / "nowhere")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert "no summary.parquet" in missing.stderr


def test_a_budget_whose_forward_does_not_fit_is_no_candidate_not_a_what_if():
    """Where the forward did not fit on the GPU, the round is not modelled (the what-if would price a round
    that cannot run), and the reason is named; a measured forward of another impl at that budget wins."""
    step = hand_made_step(forward={8: 10e-3, 64: 11e-3})
    unfit = stage_row("forward", "triton-w4a16", 1, 256, None, prefix=4096, heads=8, status="unavailable")
    unfit["status_reason"] = "does not fit: needs about 150.0 GB, 120.0 GB free"
    step = pd.concat([step, pd.DataFrame([unfit])], ignore_index=True)
    summary, shapes = summary_rows(HAND_SUMMARY), shape_rows(HAND_TAU)
    result = throughput(summary, step, shapes, RoundAssumptions(), distribution="d", depth=16)
    assert sorted(result.table["budget"].unique()) == [8, 64]
    missing = result.unmodelled[result.unmodelled["budget"] == 256]["missing"]
    assert len(missing) and all("the forward does not fit: needs about 150.0 GB" in m for m in missing)
    fits = pd.concat(
        [step, pd.DataFrame([stage_row("forward", "marlin-w4a16", 1, 256, 30e-3, prefix=4096, heads=8)])],
        ignore_index=True,
    )
    modelled = throughput(summary, fits, shapes, RoundAssumptions(), distribution="d", depth=16)
    assert 256 in set(modelled.table["budget"])


def test_the_moe_beside_a_measured_forward_is_the_forwards_own_kernel():
    """A forward run with Triton's MoE is never set beside Marlin's MoE (measured on its own, preferred where
    no forward ran): the MoE column takes the forward's kernel where both were measured."""
    from ddtree_bench.throughput import stage_costs  # noqa: PLC0415

    rows = [stage_row("verify-attention", "ours", 1, n, 1e-4, prefix=4096, heads=8) for n in (8, 64)]
    rows += [stage_row("forward", "triton-w4a16", 1, 8, 40e-3, prefix=4096, heads=8)]  # N = 64: no forward
    for n in (8, 64):
        rows.append(stage_row("moe", "marlin-w4a16", 1, n, 8e-3, experts_touched=60.0))
        rows.append(stage_row("moe", "triton-w4a16", 1, n, 33e-3, experts_touched=60.0))
    costs = stage_costs(pd.DataFrame(rows), "d", 16).costs.set_index("budget")
    assert costs.loc[8, "forward_impl"] == "triton-w4a16"
    assert costs.loc[8, "moe_impl"] == "triton-w4a16" and costs.loc[8, "moe_s"] == pytest.approx(33e-3)
    # without a forward the preferred MoE kernel (Marlin, as SGLang serves K2.6 on Hopper) stays
    assert costs.loc[64, "moe_impl"] == "marlin-w4a16" and costs.loc[64, "moe_s"] == pytest.approx(8e-3)


def test_which_budget_names_a_forward_other_than_the_stack_rounds():
    from ddtree_bench.report.load import Machine  # noqa: PLC0415
    from ddtree_bench.report.throughput import forward_line  # noqa: PLC0415

    def machine(impls):
        step = pd.DataFrame({"stage": "forward", "status": "ok", "impl": impls})
        return Machine("m", "published", pd.DataFrame(), pd.DataFrame(), {}, step)

    line = forward_line(machine(["triton-w4a16"]))
    assert "triton-w4a16 MoE kernel" in line and "marlin-w4a16" in line
    assert forward_line(machine(["marlin-w4a16"])) is None  # the same forward as the stack rounds
    assert forward_line(None) is None
