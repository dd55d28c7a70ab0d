"""The rest of the round's stages (forward, moe, dense, lm-head, draft): their rows where no GPU runs them,
bad arguments, the unavailable rows of the workflow, and the step summary of their rows."""

from __future__ import annotations

import dataclasses
import math
import pickle

import pandas as pd
import pytest
from workflow_copy import ROOT

from ddtree_bench import catalog, stages
from ddtree_bench.cuda.loader import gpu_unavailable_reason
from ddtree_bench.k26.draft import draft_block
from ddtree_bench.k26.shapes import DrafterShape, ModelShape
from ddtree_bench.paths import layout
from ddtree_bench.settings import load_settings
from ddtree_bench.stages import draft, model
from ddtree_bench.stages.gpu_runner import gpu_reason
from ddtree_bench.stages.model import MODEL_STAGES
from ddtree_bench.summary.step import summarize_steps
from ddtree_bench.timing.records import ROUND_STAGES, STAGE_COLUMNS, stage_frame, unavailable_stage_frame

GPU_REASON = gpu_unavailable_reason()
TIMING = {
    "warmup": 0,
    "repeats": 1,
    "min_repeats": 1,
    "max_repeats": 2,
    "min_seconds": 0.0,
    "max_seconds": 1.0,
}
MOE = ["marlin-w4a16", "triton-w4a16", "bf16-grouped-mm"]


@pytest.mark.skipif(GPU_REASON is None, reason="a GPU is present: the stage measures")
def test_model_stage_without_a_gpu_writes_rows_saying_why(tmp_path):
    args = {
        "trace": str(tmp_path / "unused.npz"),
        "batch": 1,
        "prefix": 4096,
        "budgets": (8, 16),
        "shape": ModelShape(),
        "moe_impls": tuple(MOE),
        "forward_impl": "marlin-w4a16",
        "parts": True,
        "routing": "uniform",
        "skew": 1.0,
        "sglang_files": None,
        "timing": TIMING,
        "machine": "m",
        "distribution": "drafter",
    }
    rows = model.run(model.Job(**args))
    assert set(rows) == {8, 16}
    for budget, frame in rows.items():
        assert list(frame.columns) == list(STAGE_COLUMNS)
        assert set(frame["status"]) == {"unavailable"}
        assert set(frame["stage"]) == set(MODEL_STAGES)
        assert set(frame[frame["stage"] == "moe"]["impl"]) == set(MOE)
        assert list(frame[frame["stage"] == "forward"]["impl"]) == ["marlin-w4a16"]
        assert frame["seconds"].isna().all() and (frame["budget"] == budget).all()
        assert frame["status_reason"].str.contains(gpu_reason(), regex=False).all()
        assert set(frame["tokens"]) == {budget + 1}
    forward_only = model.run(model.Job(**{**args, "batch": 2, "prefix": 0, "budgets": (8,), "parts": False}))
    assert set(forward_only[8]["stage"]) == {"forward"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"moe_impls": ("cutlass",)}, "unknown MoE impl 'cutlass'"),
        ({"forward_impl": "cutlass"}, "unknown MoE impl 'cutlass'"),
        ({"budgets": ()}, "budgets >= 1 needed"),
        ({"batch": 0}, "batch >= 1"),
    ],
)
def test_model_stage_rejects_bad_arguments(tmp_path, kwargs, message):
    args = {
        "trace": str(tmp_path / "t.npz"),
        "batch": 1,
        "prefix": 0,
        "budgets": (8,),
        "shape": ModelShape(),
        "moe_impls": tuple(MOE),
        "forward_impl": "marlin-w4a16",
        "parts": True,
        "routing": "uniform",
        "skew": 1.0,
        "sglang_files": None,
        "timing": TIMING,
        "machine": "m",
        "distribution": None,
    }
    with pytest.raises(ValueError, match=message):
        model.run(model.Job(**{**args, **kwargs}))


def test_draft_block_follows_the_budget_as_sglangs_worker_does():
    assert draft_block(64, 16, 1024, follow_budget=False) == (16, 64)
    assert draft_block(2048, 16, 1024, follow_budget=False) == (16, 1024)
    assert draft_block(64, 16, 1024, follow_budget=True) == (65, 64)


@pytest.mark.skipif(GPU_REASON is None, reason="a GPU is present: the stage measures")
def test_draft_stage_without_a_gpu_writes_rows_saying_why():
    rows = draft.run(
        draft.Job(
            batch=1,
            prefix=4096,
            budgets=(8, 1024),
            shape=DrafterShape(),
            vocab_shard=20480,
            block_size=16,
            follow_budget=True,
            topk=1024,
            timing=TIMING,
            machine="m",
        )
    )
    for budget, frame in rows.items():
        assert set(frame["status"]) == {"unavailable"} and set(frame["stage"]) == {"draft"}
        assert frame["depth"].iloc[0] == budget  # the block is N + 1: N drafted positions
        assert "block follows the budget" in frame["note"].iloc[0]
    with pytest.raises(ValueError, match="block_size must be >= 2"):
        draft.run(
            draft.Job(
                batch=1,
                prefix=0,
                budgets=(8,),
                shape=DrafterShape(),
                vocab_shard=20480,
                block_size=1,
                follow_budget=False,
                topk=8,
                timing=TIMING,
                machine="m",
            )
        )


@pytest.mark.parametrize("stage", ["model", "draft", "allreduce"])
def test_unavailable_rows_of_the_round_stages(stage):
    impls = {"forward": ("triton-w4a16",), "moe": ("triton-w4a16",)}
    frame = unavailable_stage_frame(stage, "no GPU here", impls=impls, machine="m")
    assert set(frame["status"]) == {"unavailable"} and set(frame["status_reason"]) == {"no GPU here"}
    if stage == "model":
        assert list(frame["stage"]) == ["forward", "moe", "dense", "lm-head"]
        assert list(frame["impl"]) == ["triton-w4a16", "triton-w4a16", "torch", "torch"]
    else:
        assert set(frame["stage"]) == {stage}


def test_step_summary_of_round_rows():
    rows = []
    for stage, impl, seconds in [
        ("forward", "marlin-w4a16", 0.02),
        ("moe", "marlin-w4a16", 0.012),
        ("moe", "bf16-grouped-mm", 0.03),
        ("dense", "torch", 0.004),
        ("lm-head", "torch", 0.0003),
        ("draft", "torch", 0.002),
    ]:
        for rep, s in enumerate([seconds, seconds * 1.1, seconds * 0.9]):
            rows.append(
                {
                    "stage": stage,
                    "impl": impl,
                    "batch": 1,
                    "budget": 8,
                    "phase": "timed",
                    "repetition": rep,
                    "timing": "cuda-events",
                    "cache": "warm",
                    "seconds": s,
                    "status": "ok",
                    "machine": "m",
                    "tokens": 9,
                    "experts_touched": 66.0 if stage in ("forward", "moe") else None,
                    "bytes": 1e9,
                    "flops": 1e12,
                    "note": "one CUDA graph",
                }
            )
    rows.append(
        {
            "stage": "allreduce",
            "impl": "nccl",
            "batch": 1,
            "budget": 8,
            "phase": "timed",
            "repetition": 0,
            "seconds": math.nan,
            "status": "unavailable",
            "status_reason": "needs >= 2 GPUs",
            "machine": "m",
            "world_size": 1,
            "cache": "n/a",
        }
    )
    summary = summarize_steps(stage_frame(rows))
    assert set(summary["stage"]) == set(ROUND_STAGES) - {"round", "stack"}
    forward = summary[summary["stage"] == "forward"].iloc[0]
    assert forward["median_s"] == pytest.approx(0.02) and forward["n"] == 3
    assert (
        forward["experts_touched"] == 66.0 and forward["tokens"] == 9 and forward["note"] == "one CUDA graph"
    )
    assert forward["median_tbps"] == pytest.approx(1e9 / 0.02 / 1e12)
    comm = summary[summary["stage"] == "allreduce"].iloc[0]
    assert comm["n"] == 0 and comm["status"] == "unavailable" and comm["world_size"] == 1
    assert isinstance(summary, pd.DataFrame)


def test_round_jobs_from_settings_are_what_the_rules_passed():
    settings = load_settings(ROOT / "config" / "h200.yaml")
    step, files = settings.step_options(), layout(settings)
    budgets, prefixes = tuple(step["budgets"]), step["prefix_lengths"]
    jobs = {}
    for stage in ("model", "draft", "allreduce", "round"):
        wildcards = stages.grid(stage, settings)
        assert wildcards, stage
        jobs[stage] = [
            stages.make_job(stage, settings, **{k: str(v) for k, v in w.items()}) for w in wildcards
        ]
        for job in jobs[stage]:
            assert pickle.loads(pickle.dumps(job)) == job and job.budgets == budgets
            assert all(isinstance(path, str) for path in job.inputs.values())
    assert [(j.batch, j.prefix, j.parts) for j in jobs["model"]] == [
        (b, s, s == min(prefixes)) for b in step["batch_sizes"] for s in prefixes
    ]
    forward = jobs["model"][0]
    assert forward.shape == step["model"]["shape"] and forward.forward_impl == step["model"]["forward_impl"]
    assert forward.trace == files.trace_of(step["distribution"], step["depth"])
    drafting = jobs["draft"][0]
    assert drafting.vocab_shard == step["model"]["shape"].vocab_shard
    assert drafting.topk == settings.trace_columns and drafting.shape == step["draft"]["shape"]
    assert [j.world_size for j in jobs["allreduce"]] == [step["model"]["shape"].tp] * len(step["batch_sizes"])
    rounds = jobs["round"]
    assert [(j.batch, j.prefix) for j in rounds] == [
        (b, s) for b in step["round"]["batch_sizes"] for s in prefixes
    ]
    builders = rounds[0].builders
    assert builders == tuple(step["round"]["builders"]) and catalog.SGLANG in rounds[0].builder_options
    assert rounds[0].builder_options[catalog.SGLANG]["module_paths"] == list(settings.sglang.module_paths)
    assert rounds[0].inputs["accept"] == files.artefact("tree_accept")
    for builder in builders:
        for option, path in files.libraries(builder).items():
            assert rounds[0].inputs[f"{builder}_{option}"] == path
    replaced = dataclasses.replace(rounds[0], forward_impl="bf16-grouped-mm", sglang_files="/x")
    assert replaced.options(8).budget == 8 and replaced.forward_impl == "bf16-grouped-mm"


def test_a_round_with_no_builders_stacks_or_chain_has_no_jobs(tmp_path):
    """Stacks (or chain blocks) alone still make round jobs; with neither and no builder there are none."""
    settings = load_settings(ROOT / "config" / "h200-stacks.yaml")
    assert stages.enabled("round", settings) and len(stages.grid("round", settings)) == 6
    empty = tmp_path / "none.yaml"
    empty.write_text("step:\n  round:\n    builders: []\n    stacks: []\n    chain_blocks: []\n")
    settings = load_settings(ROOT / "config" / "h200-stacks.yaml", empty)
    assert stages.grid("round", settings) == []


def test_the_model_stages_configured_impls_name_its_rows_saying_why():
    settings = load_settings(ROOT / "config" / "h200.yaml")
    impls = model.configured_impls(settings)
    frame = unavailable_stage_frame("model", "no GPU here", impls=impls, machine="m")
    forward = frame[frame["stage"] == "forward"]
    assert list(forward["impl"]) == [settings.step.model.forward_impl]
    assert list(frame[frame["stage"] == "moe"]["impl"]) == list(settings.step.model.moe_impls)
