"""The measured stages. A step stage is one ``catalog.Stage`` entry plus its module here, which exports a
frozen ``Job`` (``Job.grid(settings)``, ``Job.from_settings(settings, **wildcards)``, ``job.inputs``) and
``run(job) -> rows``. This module is the one entry every caller takes (the workflow's ``stage`` script, the
CLI's ``stage`` command, ``tools/round_stages.py``): which jobs a configuration runs, each job's files, and
running a job and writing its rows. The tree build's timing job (``timing_job``) and the equality check
(``check``) live here too."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

from ddtree_bench import catalog
from ddtree_bench.io import write_frame
from ddtree_bench.paths import Layout
from ddtree_bench.timing.records import describe_rows


def stage_module(stage: str):
    """The module of a catalog stage (imported on first use)."""
    if stage not in catalog.STAGES:
        raise ValueError(f"unknown step stage {stage!r}; expected one of {list(catalog.STAGES)}")
    return importlib.import_module(catalog.STAGES[stage].module)


def enabled(stage: str, settings) -> bool:
    """Whether the configuration runs the stage (``step.enabled`` and its own switch, where it has one)."""
    switch = catalog.STAGES[stage].switch
    return bool(settings.step.enabled and (switch is None or getattr(settings.step, switch).enabled))


def grid(stage: str, settings) -> list[dict]:
    """The wildcards of every job of the stage the configuration runs (none where it is off)."""
    return list(stage_module(stage).Job.grid(settings)) if enabled(stage, settings) else []


def make_job(stage: str, settings, **wildcards):
    """The stage's job at these wildcards (Snakemake's strings or numbers)."""
    values = {key: int(value) if str(value).isdigit() else value for key, value in wildcards.items()}
    return stage_module(stage).Job.from_settings(settings, **values)


def job_fields(job) -> dict:
    """A job's fields as plain values (what Snakemake's rerun decisions compare)."""
    return dataclasses.asdict(job)


def configured_impls(stage: str, settings) -> dict:
    """The impls per record stage that the configuration runs (the module's ``configured_impls``, where it
    has one; else the catalog's)."""
    module = stage_module(stage)
    if hasattr(module, "configured_impls"):
        return dict(module.configured_impls(settings))
    return dict(catalog.STAGES[stage].records)


def outputs(stage: str, layout: Layout, wildcards: dict, budgets=()) -> list[str]:
    """A job's result files: one, or one per budget (``catalog.Stage.per_budget``)."""
    pattern = layout.step(stage)
    if catalog.STAGES[stage].per_budget:
        return [pattern.format(**wildcards, budget=budget) for budget in budgets]
    return [pattern.format(**wildcards)]


def run(job):
    """Run a job (its module's ``run``): its rows, or ``{budget: rows}`` for a per-budget stage."""
    return importlib.import_module(type(job).__module__).run(job)


def write_rows(rows, paths, budgets=()) -> None:
    """Write a job's rows to its files (``outputs``' order), printing each file's summary for its log."""
    if isinstance(rows, dict):
        for budget, path in zip(budgets, paths, strict=True):
            print(f"N = {budget}: {describe_rows(rows[budget])}")
            write_frame(rows[budget], path)
        return
    (path,) = paths
    print(describe_rows(rows))
    write_frame(rows, path)


def run_and_write(stage: str, settings, layout: Layout, **wildcards) -> list[str]:
    """Make, run and write one job where its files belong (the CLI's and the tools' entry): its files."""
    job = make_job(stage, settings, **wildcards)
    budgets = getattr(job, "budgets", ())
    paths = outputs(stage, layout, wildcards, budgets)
    rows = run(job)
    for path in paths:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_rows(rows, paths, budgets)
    return paths
