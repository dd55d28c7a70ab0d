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
    """``FIELD=VALUE`` items (a YAML value each; a key given twice in a mapping is refused) as job fields to
    override."""
    from ddtree_bench.config import strict_yaml  # noqa: PLC0415

    fields = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE")
        fields[key] = strict_yaml(value, f"--set {key}")
    return fields


#: The job fields ``--set`` may give that a setting makes, each checked as that setting is (the
#: configuration's checks, on the configuration with the value in it): the setting's path, and how the value
#: goes in: "item" (one of a list setting's items), "items" (some of them) or "value" (the setting itself).
#: The timing's setting is the stage's own (``timing_setting``).
FIELD_SETTINGS = {
    "budget": ("budgets", "item"),
    "budgets": ("budgets", "items"),
    "batch": ("step.batch_sizes", "item"),
    "heads": ("step.attention.heads", "item"),
    "prefix": ("step.attention.prefix_lengths", "item"),
    "distribution": ("distributions", "item"),
    "impls": ("step.attention.impls", "items"),
    "moe_impls": ("step.model.moe_impls", "items"),
    "builders": ("step.round.builders", "items"),
    "forward_impl": ("step.model.forward_impl", "value"),
    "routing": ("step.model.routing", "value"),
    "skew": ("step.model.skew", "value"),
    "sglang_files": ("step.model.sglang_files", "value"),
    "block_size": ("step.draft.block_size", "value"),
    "follow_budget": ("step.draft.follow_budget", "value"),
    "max_round_seconds": ("step.round.max_round_seconds", "value"),
    "flex_kernel_options": ("step.attention.flexattention_kernel_options", "value"),
    "sglang_triton_source": ("step.attention.sglang_triton_source", "value"),
    "topk": ("topk", "value"),
    "seed": ("seed", "value"),
    "timing": (None, "timing"),
}
#: What a job field's annotation admits, for the fields no setting makes (paths, labels, switches, sizes).
PLAIN_TYPES = {"str": str, "int": int, "float": (int, float), "bool": bool, "dict": dict, "None": type(None)}


def timing_setting(stage: str) -> str:
    """The setting a stage's job takes its ``timing`` from: verify attention its own, the others the top
    level's."""
    return "step.attention.timing" if stage == "attention" else "timing"


def _setting(config: dict, path: str):
    node = config
    for key in path.split("."):
        node = node[key]
    return node


def _put(config: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    node = config
    for key in parents:
        node = node[key]
    node[last] = value


def _with_value(config: dict, path: str, how: str, value):
    """The setting at ``path`` with ``value`` in it, as ``FIELD_SETTINGS``' ``how`` says (the value's items
    first, so a problem's index is the value's own)."""
    if how == "value":
        return value
    current = _setting(config, path)
    if current is None:  # step.batch_sizes null: the configured batch_sizes
        current = config[path.rsplit(".", 1)[-1]]
    items = [value] if how == "item" else list(value) if isinstance(value, list | tuple) else value
    if not isinstance(items, list):
        return items  # not a list: the schema says so
    return items + [item for item in current if item not in items]


def check_field_value(settings, stage: str, name: str, value, current=None):
    """A ``--set`` value of a job field, checked before any job runs, as the configuration is checked: a field
    a setting makes (``FIELD_SETTINGS``) by the configuration's own checks with the value in it, any other
    by its annotation. Returns the value the job takes (lists as tuples; a timing mapping merged over the
    job's ``current`` one). Raises ``ValueError``, one line naming ``--set`` and the field."""
    from ddtree_bench.config import check_config  # noqa: PLC0415

    if name not in FIELD_SETTINGS:
        return value
    path, how = FIELD_SETTINGS[name]
    config = settings.as_config()
    if how == "timing":
        path = timing_setting(stage)
        if not isinstance(value, dict):
            raise ValueError(
                f"--set timing: must be a mapping of timing keys, e.g. {{repeats: 5}}, got {value!r}"
            )
        value = {**(current or {}), **value}
        setting = {**_setting(config, path), **value}
    else:
        setting = _with_value(config, path, how, value)
    _put(config, path, setting)
    try:
        check_config(config)
    except ValueError as error:
        raise ValueError(f"--set {name}: {str(error).removeprefix('config: ')}") from None
    return tuple(value) if isinstance(value, list) else value


def check_plain_field(job, name: str, value):
    """A ``--set`` value of a field no setting makes, checked against the field's annotation (``str | None``,
    ``int``, ``tuple[str, ...]``, ...): the value the job takes, or one line naming the field. A field that
    holds an object (a model's shape) is a setting of a configuration file, not a ``--set`` value."""
    kinds = [part.strip() for part in str(job.__dataclass_fields__[name].type).split("|")]
    for kind in kinds:
        if kind.startswith("tuple[") and isinstance(value, list | tuple):
            inner = PLAIN_TYPES.get(kind[len("tuple[") :].split(",")[0].strip())
            if inner is not None and all(_is(item, inner) for item in value):
                return tuple(value)
        elif kind in PLAIN_TYPES and _is(value, PLAIN_TYPES[kind]):
            if kind in ("int", "float") and value < 0:
                raise ValueError(f"--set {name}: must be >= 0, got {value!r}")
            return value
    if not any(kind in PLAIN_TYPES or kind.startswith("tuple[") for kind in kinds):
        raise ValueError(
            f"--set {name}: not a value the command line gives ({' | '.join(kinds)}); set it in a "
            "--configfile"
        )
    raise ValueError(f"--set {name}: must be {' or '.join(kinds)}, got {value!r}")


def _is(value, kind) -> bool:
    if isinstance(value, bool) and kind not in (bool, (int, float)):
        return False
    if isinstance(value, bool) and kind == (int, float):
        return False
    return isinstance(value, kind)


def override(job, fields: dict, settings=None, stage: str | None = None):
    """The job with ``fields`` replaced, those it has (a caller's overrides of the configuration); with
    ``settings``, each value checked first (``check_field_value``, ``check_plain_field``)."""
    names = {field.name for field in dataclasses.fields(job)}
    values = {}
    for key, value in fields.items():
        if key not in names:
            continue
        if settings is not None:
            if key in FIELD_SETTINGS:
                value = check_field_value(settings, stage, key, value, getattr(job, key))
            else:
                value = check_plain_field(job, key, value)
        values[key] = value
    return dataclasses.replace(job, **values)


def check_fields(jobs, fields: dict) -> None:
    """A field that none of the jobs has is a one-line ValueError (a misspelt override must not vanish)."""
    names = {field.name for job in jobs for field in dataclasses.fields(job)}
    unknown = sorted(set(fields) - names - {"budgets"})
    if unknown:
        raise ValueError(f"--set {unknown[0]}: no job picked has that field; they have {sorted(names)}")


def describe_jobs(jobs: list[dict]) -> str:
    """What a stage's jobs have, wildcard by wildcard (``budget 4, 16; batch 1, 4``), or that it has none."""
    if not jobs:
        return "it has no job in this configuration (step.enabled, or its own switch, is off)"
    keys = dict.fromkeys(key for wildcards in jobs for key in wildcards)
    if not keys:
        return "its one job has no wildcards"
    values = {key: list(dict.fromkeys(str(w[key]) for w in jobs if key in w)) for key in keys}
    return "its jobs have " + "; ".join(f"{key} {', '.join(vals)}" for key, vals in values.items())


def pick(settings, selectors, budgets_wanted=None) -> list[tuple[str, dict]]:
    """The (stage, wildcards) of the jobs the selectors pick (``parse_selector``), those of a per-job budget
    among ``budgets_wanted`` where given. A selector that picks nothing is a one-line ValueError listing
    what its stage's jobs have."""
    picked = []
    for text in selectors:
        stage, filters = parse_selector(text)
        matched = select(stage, settings, filters)
        if not matched:
            jobs = grid(stage, settings)
            raise ValueError(
                f"job {text!r}: no configured job of stage {stage} matches; {describe_jobs(jobs)}"
            )
        kept = [
            w for w in matched if budgets_wanted is None or "budget" not in w or w["budget"] in budgets_wanted
        ]
        if not kept:
            raise ValueError(
                f"job {text!r} with --set budgets={list(budgets_wanted)}: no job matches; "
                f"{describe_jobs(matched)}"
            )
        picked += [(stage, wildcards) for wildcards in kept]
    return picked


def run_jobs(settings, selectors, layout: Layout, fields: dict | None = None) -> list[str]:
    """Run the jobs the selectors pick (``pick``), each made as the workflow makes it, with ``fields``
    overridden (each checked as the configuration is: ``override``), and write their rows where the workflow
    writes them (``layout``), making any missing input first. Everything is checked before anything is built
    or written: the selection, the fields, the memory the jobs need (``memory``) and that the results folder
    can be written. The CLI's ``stage`` command and ``tools/round_stages.py`` take this entry. Returns the
    files written."""
    from ddtree_bench.io import check_writable  # noqa: PLC0415

    fields = fields or {}
    budgets_wanted = fields.get("budgets")
    if budgets_wanted is not None:
        budgets_wanted = check_field_value(settings, "", "budgets", budgets_wanted)
        fields = {**fields, "budgets": budgets_wanted}
    picked = pick(settings, selectors, budgets_wanted)
    jobs = [
        override(make_job(stage, settings, results=layout.results, **w), fields, settings, stage)
        for stage, w in picked
    ]
    check_fields(jobs, fields)
    check_jobs_memory(settings, jobs)
    check_writable(layout.results, "--results", folder=True)
    written = []
    for (stage, wildcards), job in zip(picked, jobs, strict=True):
        prepare_inputs(job, settings)
        budgets = getattr(job, "budgets", ())
        paths = outputs(stage, layout, wildcards, budgets)
        write_rows(run(job), paths, budgets)
        print(f"{stage} {wildcards}: done", flush=True)
        written += paths
    return written


def check_jobs_memory(settings, jobs) -> None:
    """The jobs' traces fit this machine's memory, and where a GPU is here, their verify attention fits it
    (``memory``): one line before anything is built."""
    from ddtree_bench import memory  # noqa: PLC0415
    from ddtree_bench.cuda.loader import gpu_unavailable_reason  # noqa: PLC0415
    from ddtree_bench.environment import gpu_memory_bytes  # noqa: PLC0415

    needs = []
    for job in jobs:
        trace = (getattr(job, "inputs", {}) or {}).get("trace")
        if trace is not None:
            distribution, _, depth = Path(trace).stem.rpartition("-L")
            columns, vocab = settings.trace_columns, settings.vocab_size
            needs.append(memory.trace_need(settings.trace_requests, int(depth), columns, vocab, distribution))
        if all(hasattr(job, key) for key in ("batch", "budget", "prefix", "heads")):
            needs.append(memory.attention_need(job.batch, job.budget, job.prefix, job.heads))
    gpu = gpu_memory_bytes() if gpu_unavailable_reason() is None else None
    memory.check_needs(needs, memory.host_memory_bytes(), gpu, prefix="stage:")


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
