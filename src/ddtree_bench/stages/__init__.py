"""The measured stages. A step stage is one ``catalog.Stage`` entry plus its module here, which exports a
frozen ``Job`` (``Job.grid(settings)``, ``Job.from_settings(settings, **wildcards)``, ``job.inputs``) and
``run(job) -> rows``. This module is the one entry every caller takes (the workflow's ``stage`` script, the
CLI's ``stage`` command, ``tools/round_stages.py``): which jobs a configuration runs, each job's files, and
running a job and writing its rows. The tree build's timing job (``timing_job``) and the equality check
(``check``) live here too."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import shutil
from pathlib import Path

from ddtree_bench import catalog
from ddtree_bench.io import atomic_output, write_frame
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


def points(**axes) -> list[dict]:
    """Every combination of the axes' values as wildcards (the first axis varies slowest): a ``Job.grid``."""
    return [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]


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


def parse_selector(text: str) -> tuple[str, dict]:
    """``stage`` or ``stage:key=value,key=value`` (e.g. ``round:batch=1,prefix=4096``): the stage and the
    wildcards its jobs must have (the rest: every configured value)."""
    stage, _, rest = text.partition(":")
    if stage not in catalog.STAGES:
        raise ValueError(f"job {text!r}: unknown stage {stage!r}; expected one of {list(catalog.STAGES)}")
    filters = {}
    for item in filter(None, rest.split(",")):
        key, equals, value = item.partition("=")
        if not equals or not key or not value:
            raise ValueError(f"job {text!r}: expected stage:key=value,key=value, got {item!r}")
        filters[key] = value
    return stage, filters


def select(stage: str, settings, filters: dict) -> list[dict]:
    """The wildcards of the stage's configured jobs that match ``filters`` (values compared as text)."""
    jobs = grid(stage, settings)
    known = {key for wildcards in jobs for key in wildcards}
    unknown = sorted(set(filters) - known)
    if unknown and jobs:
        raise ValueError(f"stage {stage}: unknown wildcard {unknown[0]!r}; its jobs have {sorted(known)}")
    return [w for w in jobs if all(str(w.get(key)) == value for key, value in filters.items())]


def parse_fields(items) -> dict:
    """``FIELD=VALUE`` items (a YAML value each) as job fields to override."""
    import yaml  # noqa: PLC0415

    fields = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE")
        fields[key] = yaml.safe_load(value)
    return fields


def override(job, fields: dict):
    """The job with ``fields`` replaced, those it has (a caller's overrides of the configuration)."""
    names = {field.name for field in dataclasses.fields(job)}
    return dataclasses.replace(job, **{key: value for key, value in fields.items() if key in names})


def check_fields(jobs, fields: dict) -> None:
    """A field that none of the jobs has is a one-line ValueError (a misspelt override must not vanish)."""
    names = {field.name for job in jobs for field in dataclasses.fields(job)}
    unknown = sorted(set(fields) - names - {"budgets"})
    if unknown:
        raise ValueError(f"--set {unknown[0]}: no job picked has that field; they have {sorted(names)}")


def run_jobs(settings, selectors, layout: Layout, fields: dict | None = None) -> list[str]:
    """Run the jobs the selectors pick (``parse_selector``), each made as the workflow makes it, with
    ``fields`` overridden, and write their rows where the workflow writes them (``layout``), making any
    missing input first. The CLI's ``stage`` command and ``tools/round_stages.py`` take this entry. Returns
    the files written."""
    picked = []
    for text in selectors:
        stage, filters = parse_selector(text)
        matched = select(stage, settings, filters)
        if not matched:
            raise ValueError(f"job {text!r}: no configured job of stage {stage} matches")
        picked += [(stage, wildcards) for wildcards in matched]
    fields = fields or {}
    budgets_wanted = fields.get("budgets")
    picked = [
        (stage, wildcards)
        for stage, wildcards in picked
        if budgets_wanted is None or "budget" not in wildcards or wildcards["budget"] in budgets_wanted
    ]
    jobs = [override(make_job(stage, settings, results=layout.results, **w), fields) for stage, w in picked]
    check_fields(jobs, fields)
    written = []
    for (stage, wildcards), job in zip(picked, jobs, strict=True):
        prepare_inputs(job, settings)
        budgets = getattr(job, "budgets", ())
        paths = outputs(stage, layout, wildcards, budgets)
        write_rows(run(job), paths, budgets)
        print(f"{stage} {wildcards}: done", flush=True)
        written += paths
    return written


def prepare_inputs(job, settings) -> None:
    """Make a job's missing inputs as the workflow's rules would: its trace (generated), its fatbins and the
    native builder's library (from the compiled kernels' cache)."""
    from ddtree_bench.cuda.loader import cached_fatbin, kernel_source  # noqa: PLC0415
    from ddtree_bench.native_build import cached_native_library  # noqa: PLC0415
    from ddtree_bench.traces import TraceSpec, generate, save_trace  # noqa: PLC0415

    for name, path in job.inputs.items():
        target = Path(path) if path is not None else None
        if target is None or target.is_file():
            continue
        if target.suffix in (".so", ".fatbin"):
            built = (
                cached_native_library()
                if target.suffix == ".so"
                else cached_fatbin(kernel_source(target.stem), tuple(settings.cuda_archs))
            )
            with atomic_output(target) as tmp:
                shutil.copyfile(built, tmp)
        elif name == "trace":
            distribution, _, depth = target.stem.rpartition("-L")
            spec = TraceSpec(
                distribution,
                settings.trace_requests,
                int(depth),
                settings.trace_columns,
                vocab_size=settings.vocab_size,
                seed=settings.seed,
            )
            trace = generate(spec, "cpu", drafter=settings.drafter_params(distribution))
            save_trace(target, trace.top_log_probs, trace.top_token_ids, **trace.metadata)
