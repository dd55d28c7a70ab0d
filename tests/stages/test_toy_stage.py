"""A step stage is one catalog entry plus one module: a toy stage registered in the catalog (before anything
else imports it, as an entry in the file would be) is planned by the workflow, run by its one stage script,
summarised into the step summary and listed by the report."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import yaml
from workflow_copy import catalog_entry_environment, needs_snakemake, snakemake, workdir_copy

TOY_ENTRY = """
from ddtree_bench import catalog

catalog.STAGES["toy"] = catalog.Stage(
    "toy",
    "toy_stage",
    {"toy": ("sum",)},
    "step/toy/N{budget}-B{batch}.parquet",
    "A toy stage: sums a range of its budget's length.",
    gpu=False,
)
"""

TOY_MODULE = """
import time
from dataclasses import dataclass

from ddtree_bench.timing.records import stage_frame


@dataclass(frozen=True)
class Job:
    budget: int
    batch: int
    machine: str | None = None

    @classmethod
    def grid(cls, settings):
        step = settings.step_options()
        return [{"budget": n, "batch": b} for n in step["budgets"] for b in step["batch_sizes"]]

    @classmethod
    def from_settings(cls, settings, *, budget, batch, results=None):
        return cls(int(budget), int(batch), settings.machine)

    @property
    def inputs(self):
        return {}


def run(job):
    rows = []
    for rep in range(3):
        start = time.perf_counter()
        sum(range(job.budget * job.batch))
        rows.append(
            {
                "stage": "toy",
                "impl": "sum",
                "batch": job.batch,
                "budget": job.budget,
                "repetition": rep,
                "phase": "timed",
                "timing": "wall",
                "cache": "n/a",
                "seconds": time.perf_counter() - start,
                "status": "ok",
                "machine": job.machine,
            }
        )
    return stage_frame(rows)
"""

REPORT_CHECK = """
import sys
from ddtree_bench.report import ReportFiles, render_report
from ddtree_bench.stages.build import unavailable_frame
from ddtree_bench.summary.build import summarize
import json, pathlib

folder = pathlib.Path(sys.argv[1])
summarize(unavailable_frame("gpu", "no CUDA device", machine="toy")).to_parquet(folder / "summary.parquet")
(folder / "environment.json").write_text(json.dumps({"machine": "toy"}))
render_report(
    summary=folder / "summary.parquet",
    step_summary=folder / "step_summary.parquet",
    files=ReportFiles.in_folder(folder / "r"),
)
"""


@needs_snakemake
def test_a_toy_stage_is_one_catalog_entry_plus_its_module(tmp_path):
    env = catalog_entry_environment(tmp_path, TOY_ENTRY, {"toy_stage": TOY_MODULE})
    work = workdir_copy(tmp_path)
    config = yaml.safe_load((work / "config" / "smoke.yaml").read_text())
    config.update(gpu="off", machine="toy", budgets=[4, 8], batch_sizes=[1, 2])
    config["step"] = {**config["step"], "enabled": True, "batch_sizes": None}
    (work / "config" / "toy.yaml").write_text(yaml.safe_dump(config))
    args = ("--cores", "1", "--configfile", "config/toy.yaml")

    # the dry run plans one job per (budget, batch), beside the GPU stages' rows saying why they are absent
    plan = snakemake(work, "-n", *args, "--", "report", env=env)
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
    for budget in (4, 8):
        for batch in (1, 2):
            assert f"results/toy/step/toy/N{budget}-B{batch}.parquet" in plan.stdout
    assert "step_toy" in plan.stdout and "results/toy/step/attention/unavailable.parquet" in plan.stdout

    # the jobs run (the stage script), their rows reach the step summary
    run = snakemake(work, *args, "--", "results/toy/step_summary.parquet", env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = pd.read_parquet(work / "results" / "toy" / "step_summary.parquet")
    toy = summary[summary["stage"] == "toy"]
    assert sorted(zip(toy["budget"], toy["batch"], strict=True)) == [(4, 1), (4, 2), (8, 1), (8, 2)]
    assert (toy["n"] == 3).all() and (toy["median_s"] > 0).all()

    # and the report lists them
    render = subprocess.run(
        [sys.executable, "-c", REPORT_CHECK, str(work / "results" / "toy")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert render.returncode == 0, render.stdout[-3000:] + render.stderr[-3000:]
    markdown = (work / "results" / "toy" / "r" / "summary.md").read_text()
    assert "| toy | sum |" in markdown
