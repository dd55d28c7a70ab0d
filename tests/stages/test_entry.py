"""The one entry of the step stages (``stages``): which jobs a configuration runs, picking some by their
wildcards, and running them where the workflow writes (the CLI's ``stage`` command)."""

from __future__ import annotations

import pandas as pd
import pytest

from ddtree_bench import catalog, stages
from ddtree_bench.cli import main
from ddtree_bench.paths import layout
from ddtree_bench.settings import load_settings
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
