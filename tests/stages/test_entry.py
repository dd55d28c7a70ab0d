"""The one entry of the step stages (``stages``): which jobs a configuration runs, picking some by their
wildcards, and running them where the workflow writes (the CLI's ``stage`` command)."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from ddtree_bench import catalog, stages
from ddtree_bench.cli import main
from ddtree_bench.paths import layout
from ddtree_bench.settings import Settings, load_settings
from ddtree_bench.timing.records import STAGE_COLUMNS

SMOKE = "config/smoke.yaml"


def test_every_stage_module_exports_a_job_and_run():
    for name in catalog.STAGES:
        module = stages.stage_module(name)
        assert callable(module.run) and hasattr(module.Job, "grid") and hasattr(module.Job, "from_settings")


def test_the_grid_of_a_stage_follows_the_configuration():
    settings = load_settings(SMOKE)
    step = settings.step_options()
    jobs = stages.grid("accept", settings)
    assert len(jobs) == len(step["budgets"]) * len(step["batch_sizes"])
    assert stages.grid("peaks", settings) == [{}]
    job = stages.make_job("accept", settings, **{k: str(v) for k, v in jobs[0].items()})
    assert job.budget == jobs[0]["budget"] and job.trace == layout(settings).trace_of(
        step["distribution"], step["depth"]
    )
    assert set(job.inputs) == {"trace", "accept", "util"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("forward", "unknown stage 'forward'"),
        ("accept:budget", "expected stage:key=value"),
        ("accept:heads=8", "unknown wildcard 'heads'"),
        ("accept:budget=3", "no configured job"),
    ],
)
def test_a_bad_selector_is_one_line(text, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        stages.run_jobs(load_settings(SMOKE), [text], layout(load_settings(SMOKE), tmp_path))


def test_the_stage_command_runs_and_writes_where_the_workflow_does(tmp_path, capsys):
    settings = load_settings(SMOKE)
    budget, batch = settings.step_options()["budgets"][0], settings.step_options()["batch_sizes"][0]
    code = main(
        [
            "stage",
            f"accept:budget={budget},batch={batch}",
            "--configfile",
            SMOKE,
            "--results",
            str(tmp_path),
            "--set",
            "accept_fatbin=null",
            "--set",
            "util_fatbin=null",
        ]
    )
    assert code == 0
    (path,) = stages.outputs(
        "accept",
        layout(settings, tmp_path),
        stages.select("accept", settings, {"budget": str(budget), "batch": str(batch)})[0],
    )
    assert capsys.readouterr().out.strip().splitlines()[-1] == path
    rows = pd.read_parquet(path)
    assert list(rows.columns) == list(STAGE_COLUMNS) and set(rows["stage"]) == {"accept"}
    assert (rows["budget"] == budget).all() and (rows["batch"] == batch).all()
    assert (tmp_path / "traces").is_dir()  # its trace was made first


def test_a_field_no_picked_job_has_is_refused(tmp_path):
    settings = load_settings(SMOKE)
    with pytest.raises(ValueError, match="--set forward_impl: no job picked has that field"):
        stages.run_jobs(settings, ["accept"], layout(settings, tmp_path), {"forward_impl": "bf16-grouped-mm"})
    assert not (tmp_path / "step").exists()  # refused before any job ran


@pytest.mark.parametrize(
    ("stage", "value", "message"),
    [
        ("round", "budgets=[0]", "--set budgets: budgets[0]: 0 is less than the minimum of 1"),
        ("attention", "heads=0", "--set heads: step.attention.heads[0]: 0 is less than the minimum of 1"),
        ("accept", "batch=9", "--set batch: step.batch_sizes: 9 is more than the 4 requests the traces hold"),
        ("accept", "timing={repeats: 0}", "--set timing: timing.repeats: 0 is less than the minimum of 1"),
        ("attention", "impls=[fast]", "--set impls: step.attention.impls[0]: 'fast' is not one of"),
        ("accept", "trace=5", "--set trace: must be str, got 5"),
        ("model", "shape={}", "--set shape: not a value the command line gives (ModelShape)"),
        ("accept", "timing={repeats: 1, repeats: 2}", "--set timing: line 1: key 'repeats' is given twice"),
    ],
)
def test_a_set_value_passes_the_configurations_checks_before_anything_is_built(
    tmp_path, stage, value, message
):
    """Before: ``stage --set 'budgets=[0]' round`` wrote round/N0-B1-S256.parquet and exited 0 (and the
    fatbins and the native library were built first). Now each value is checked as the configuration is,
    before anything is built or written: one line, exit 2."""
    out = tmp_path / "results"
    argv = ["stage", stage, "--configfile", SMOKE, "--results", str(out), "--set", value]
    assert main(argv) == 2
    assert not out.exists()  # no trace, fatbin, library or row made
    with pytest.raises(ValueError, match=re.escape(message)):
        settings = load_settings(SMOKE)
        stages.run_jobs(settings, [stage], layout(settings, out), stages.parse_fields([value]))


def test_a_selection_that_matches_nothing_lists_what_would(tmp_path, capsys):
    """Before: ``--set 'budgets=[64]' attention`` with 64 not configured ran nothing and exited 0."""
    out = tmp_path / "results"
    argv = ["stage", "attention", "--configfile", SMOKE, "--results", str(out), "--set", "budgets=[8]"]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "ddtree-bench: error: job 'attention' with --set budgets=[8]: no job matches; its jobs have "
        "distribution drafter; depth 4; budget 4, 16; batch 1, 4; prefix 256; heads 8"
    )
    assert main(["stage", "accept:batch=3", "--configfile", SMOKE, "--results", str(out)]) == 2
    assert "its jobs have distribution drafter; depth 4; budget 4, 16; batch 1, 4" in capsys.readouterr().err
    assert not out.exists()


def test_a_job_the_machine_cannot_hold_is_refused_before_its_trace_is_made(tmp_path, monkeypatch):
    monkeypatch.setattr("ddtree_bench.memory.host_memory_bytes", lambda: 1 << 20)  # a 1 MiB machine
    settings = load_settings(SMOKE)  # its traces: 4 x 4 x 32 x 12 B, fine
    big = Settings.from_config({**settings.as_config(), "batch_sizes": [1, 4096]})
    with pytest.raises(
        ValueError, match=r"stage: batch_sizes, depths, topk: the trace drafter-L4 needs at least 6\.0 MiB"
    ):
        stages.run_jobs(big, ["accept:batch=1,budget=4"], layout(big, tmp_path / "r"))
    assert not (tmp_path / "r").exists()
