"""Shared values and helpers of the workflow: result paths, the job grid, builder options and availability.
Every setting comes from SETTINGS (settings.Settings, built and checked once by the Snakefile).
"""

import dataclasses
import os
import re
import shutil
from pathlib import Path

from ddtree_bench import catalog, consistency
from ddtree_bench.config import check_builders_run_here
from ddtree_bench.cuda.loader import fatbin_toolchain
from ddtree_bench.native_build import toolchain as native_toolchain
from ddtree_bench.config import published_files, published_results
from ddtree_bench.environment import gpu_memory_bytes
from ddtree_bench.memory import check_memory
from ddtree_bench.consistency import GRID_KEYS
from ddtree_bench import stages
from ddtree_bench.paths import KERNEL_SOURCE as KERNEL_SOURCE_PATTERN
from ddtree_bench.paths import NATIVE_SOURCE, layout, machine_label
from ddtree_bench.report.compose import ReportOptions
from ddtree_bench.stages.timing_job import TimingJob
from ddtree_bench.summary.spread import job_of_suffix, job_suffix

MACHINE = machine_label(SETTINGS)
LAYOUT = layout(SETTINGS)
RESULTS = LAYOUT.results
LOGS = LAYOUT.logs

BUDGETS = list(SETTINGS.budgets)
BATCH_SIZES = list(SETTINGS.batch_sizes)
DEPTHS = list(SETTINGS.depths)
# the (depth, budget) points: every pair, or each budget with L = N (depth_follows_budget: SGLang's regime)
DEPTH_BUDGETS = SETTINGS.depth_budget_pairs
DISTRIBUTIONS = list(SETTINGS.distributions)
BUILDERS = list(SETTINGS.builders)
TRACE_REQUESTS = SETTINGS.trace_requests
TRACE_COLUMNS = SETTINGS.trace_columns
# Independent timing jobs per CPU builder configuration (timing.jobs); a GPU builder's take one.
TIMING_JOBS = int(SETTINGS.timing.jobs)
# The in-situ timing mode (GPU machines; elsewhere its rows say why): every timing job adds it.
IN_SITU = bool(SETTINGS.timing.in_situ)
# The step stages (verify attention, tree accept, peaks): nulls resolved (budgets, distribution, depth).
STEP = SETTINGS.step_options()

# A timing job takes every core Snakemake may use here (Snakemake scales this down to --cores), so no trace,
# check or other job runs beside it; and the timing_slot resource (one globally) keeps timing jobs apart
# even where cores are plentiful. Trace generation and checks still run in parallel with each other.
TIMING_THREADS = (
    len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
)
if "timing_slot" not in workflow.global_resources:
    workflow.register_resource("timing_slot", 1)


def headers(folder):
    """The headers next to a source: explicit inputs, so editing one rebuilds and reruns what depends on it."""
    if not Path(folder).is_dir():
        return []
    return sorted(
        str(p)
        for p in Path(folder).iterdir()
        if p.suffix in (".h", ".hpp", ".cuh", ".inc")
    )


NATIVE_HEADERS = headers("kernels/native")
NATIVE_LIBRARY = LAYOUT.native_library
FATBIN_PATTERN = LAYOUT.fatbin
FATBIN = LAYOUT.artefact("tree_build")
FATBIN_INFO = f"{FATBIN}.json"
# the empty, spin and L2-flush kernels the GPU benchmark launches around the build
UTIL_FATBIN = LAYOUT.artefact("bench_util")
SUMMARY = LAYOUT.summary
SHAPES = LAYOUT.shapes
STEP_SUMMARY = LAYOUT.step_summary
ENVIRONMENT = LAYOUT.environment
REPORT_DIR = SETTINGS.report_dir.rstrip("/")
REPORT_HTML = f"{REPORT_DIR}/index.html"
REPORT_MD = f"{REPORT_DIR}/summary.md"
# the report's figures (catalog.FIGURES), in its order
FIGURES = catalog.figure_names()
# The lists that decide the tree-build grid (consistency.GRID_KEYS): what the summary must hold exactly.
# plus the tree shapes tau needs beyond the grid's: the stack rounds' budgets, the acceptance profiles'
# own drafters (consistency.extra_shape_points)
EXTRA_SHAPES = consistency.extra_shape_points(SETTINGS.as_config())
GRID = SETTINGS.grid(GRID_KEYS) | {"extra_shapes": EXTRA_SHAPES}


def names_pattern(names):
    """A wildcard constraint matching exactly these names."""
    return "|".join(re.escape(name) for name in names)


# the bench rule serves every catalog builder, the check rule every one but reference (what they equal)
BENCH_BUILDERS = names_pattern(catalog.builder_names())
CHECK_BUILDERS = names_pattern(
    [b for b in catalog.builder_names() if b != catalog.REFERENCE]
)
# the builders that run on the GPU (their jobs take one; without a usable GPU they are left out)
GPU_BUILDERS = catalog.builders_where(runner=catalog.GPU)


wildcard_constraints:
    # the configured ones, and an acceptance profile's own (its tree shapes: EXTRA_SHAPES)
    distribution=names_pattern(sorted({*DISTRIBUTIONS, *(p[0] for p in EXTRA_SHAPES)})),
    depth=r"\d+",
    budget=r"\d+",
    batch=r"\d+",
    builder=names_pattern(BUILDERS),


# ----------------------------------------------------------------------------------------------- builders


def library_input(builder):
    """The compiled libraries a builder loads, by its constructor's option (empty for the Python builders)."""
    return LAYOUT.libraries(builder)


def builder_options(builder):
    """Keyword options for get_builder(builder): the libraries this workflow built, SGLang's module paths."""
    return {**library_input(builder), **SETTINGS.builder_options(builder)}


def artefacts_of(builders):
    """The artefacts (paths.Layout.artefact names) the builders load."""
    return {
        artefact
        for builder in builders
        for _, artefact in catalog.BUILDERS[builder].libraries
    }


include: "probes.smk"


# Builders that cannot run here get one "unavailable" row with the reason instead of their timing jobs.
UNAVAILABLE = {}
if catalog.SGLANG in BUILDERS:
    UNAVAILABLE[catalog.SGLANG] = sglang_reason()
for builder in GPU_BUILDERS:
    if builder in BUILDERS:
        UNAVAILABLE[builder] = GPU_REASON
UNAVAILABLE = {builder: reason for builder, reason in UNAVAILABLE.items() if reason}
# Where none of the builders can run here, the run would time nothing: one line, before any job.
try:
    check_builders_run_here(BUILDERS, UNAVAILABLE, SETTINGS.gpu)
    # each job's peak memory from its sizes (ddtree_bench.memory): a configuration this machine cannot hold
    # is one line naming what it needs and what the machine has, before any job; GPU memory where one runs
    check_memory(SETTINGS, gpu=gpu_memory_bytes() if GPU_REASON is None else None)
except ValueError as error:
    bad_input(error)
TIMED_BUILDERS = [b for b in BUILDERS if b not in UNAVAILABLE]
# The kernels compile wherever nvcc is (CI included), even where no GPU runs them, unless
# compile_without_gpu is false.
COMPILE_WITHOUT_GPU = SETTINGS.compile_without_gpu and nvcc_path() is not None
BUILD_FATBIN = (
    "tree_build" in artefacts_of(BUILDERS)
    and SETTINGS.gpu != "off"
    and (any(b in TIMED_BUILDERS for b in GPU_BUILDERS) or COMPILE_WITHOUT_GPU)
)


# ----------------------------------------------------------------------------------------------- paths


# Each result file's pattern is defined once, in ddtree_bench.paths (LAYOUT); the functions below fill them in.
TRACE = LAYOUT.trace
CHECK = LAYOUT.check
# {rep}: the timing job's suffix (summary.spread.job_suffix): none for job 1, -r2, -r3, ... for the others
BENCH = LAYOUT.bench
BENCH_UNAVAILABLE = LAYOUT.bench_unavailable
SHAPE = LAYOUT.shape
log_of = LAYOUT.log_of


def trace_path(distribution, depth):
    return TRACE.format(distribution=distribution, depth=depth)


def check_path(builder, distribution, depth, budget):
    return CHECK.format(
        builder=builder, distribution=distribution, depth=depth, budget=budget
    )


def bench_path(builder, distribution, depth, budget, batch, job=1):
    return BENCH.format(
        builder=builder,
        distribution=distribution,
        depth=depth,
        budget=budget,
        batch=batch,
        rep=job_suffix(job),
    )


def bench_jobs(builder):
    """The independent timing jobs of each configuration of ``builder`` (timing.jobs; GPU builders: one)."""
    return 1 if builder in GPU_BUILDERS else TIMING_JOBS


def unavailable_path(builder):
    return BENCH_UNAVAILABLE.format(builder=builder)


def shape_path(distribution, depth, budget):
    return SHAPE.format(distribution=distribution, depth=depth, budget=budget)


def bench_outputs():
    """Every timing job's file (``bench_jobs`` per configuration), plus one "unavailable" file per builder
    left out."""
    paths = [
        bench_path(builder, distribution, depth, budget, batch, job)
        for builder in TIMED_BUILDERS
        for distribution in DISTRIBUTIONS
        for depth, budget in DEPTH_BUDGETS
        for batch in BATCH_SIZES
        for job in range(1, bench_jobs(builder) + 1)
    ]
    return paths + [unavailable_path(builder) for builder in UNAVAILABLE]


def shape_outputs():
    """The tree shapes of the grid, and those tau needs beyond it (``EXTRA_SHAPES``)."""
    points = {
        (distribution, depth, budget)
        for distribution in DISTRIBUTIONS
        for depth, budget in DEPTH_BUDGETS
    }
    points |= {tuple(p) for p in EXTRA_SHAPES}
    return [shape_path(*point) for point in sorted(points, key=str)]


def build_outputs(wildcards=None):
    """The compiled artefacts the run records (and the CUDA kernels, compiled even where no GPU runs them)."""
    outputs = {}
    if "native" in artefacts_of(BUILDERS):
        outputs["native"] = NATIVE_LIBRARY
    if BUILD_FATBIN:
        outputs["fatbin"] = FATBIN
        outputs["util_fatbin"] = UTIL_FATBIN
    outputs.update(STEP_BUILDS)
    return outputs


def timing_job(wildcards):
    """The timing job of these wildcards (stages.timing_job.TimingJob.from_settings), with the in-situ probe."""
    job = TimingJob.from_settings(
        SETTINGS,
        builder=wildcards.builder,
        distribution=wildcards.distribution,
        depth=wildcards.depth,
        budget=wildcards.budget,
        batch=wildcards.batch,
        job=job_of_suffix(wildcards.rep),
    )
    return dataclasses.replace(job, in_situ_reason=IN_SITU_REASON)


def builder_gpus(wildcards):
    """The GPUs a check or timing job of the builder takes (the gpu builder: one; the others: no gpu resource)."""
    return 1 if wildcards.builder in GPU_BUILDERS else None


def check_inputs(wildcards):
    return {
        "trace": trace_path(wildcards.distribution, wildcards.depth),
        **library_input(wildcards.builder),
    }


def bench_inputs(wildcards):
    """The trace, the builder's library, and (for every builder but reference) its passed equality check."""
    inputs = {
        "trace": trace_path(wildcards.distribution, wildcards.depth),
        **library_input(wildcards.builder),
    }
    if wildcards.builder != catalog.REFERENCE:
        inputs["check"] = check_path(
            wildcards.builder, wildcards.distribution, wildcards.depth, wildcards.budget
        )
    return inputs


# The published machine whose answer the report shows where this run has none (config published_answer).
PUBLISHED_ANSWER = SETTINGS.published_answer
# What the report shows (its options, from the settings).
REPORT_OPTIONS = ReportOptions.from_settings(SETTINGS)


def published_summaries():
    """Committed summaries of other machines (results/published/<machine>/summary.parquet): the published
    answer's first, then the others by folder name."""
    return [str(p) for p in published_files("summary.parquet", first=PUBLISHED_ANSWER)]


def published_results_folders():
    """Every published machine's summary.parquet path, as the report loads them: those holding the
    step stages' summary alone included (config.published_results)."""
    return [str(p) for p in published_results(first=PUBLISHED_ANSWER)]


def published_step_summaries():
    """Their step summaries, where a machine has one (older publications have none)."""
    return [
        str(p) for p in published_files("step_summary.parquet", first=PUBLISHED_ANSWER)
    ]


# ----------------------------------------------------------------------------------------------- step stages

# Every step stage is a catalog entry (catalog.STAGES) with its module (stages/<name>.py): its jobs, files
# and rows come from there (stages.grid, stages.make_job, stages.outputs). A stage that needs a GPU gives,
# where none is usable (or gpu: off), one file of rows saying why (rule step_unavailable) instead of its jobs.
STEP_UNAVAILABLE = LAYOUT.step_unavailable
STEP_STAGES = [name for name in catalog.STAGES if stages.enabled(name, SETTINGS)]


def step_job(stage, wildcards):
    """The stage's job at these wildcards (stages/<stage>.py Job.from_settings)."""
    return stages.make_job(stage, SETTINGS, **dict(wildcards.items()))


def step_files(stage):
    """A stage rule's output: its pattern, or one per step budget (``catalog.Stage.per_budget``)."""
    pattern = LAYOUT.step(stage)
    if catalog.STAGES[stage].per_budget:
        return expand(pattern, budget=STEP["budgets"], allow_missing=True)
    return pattern


def stage_rule_inputs(stage):
    """A stage rule's input function: the files its job loads."""
    return lambda wildcards: step_job(stage, wildcards).inputs


def stage_rule_job(stage):
    """A stage rule's job (the object its script runs)."""
    return lambda wildcards: step_job(stage, wildcards)


def stage_rule_fields(stage):
    """A stage rule's job as plain values (what Snakemake's rerun decisions compare)."""
    return lambda wildcards: stages.job_fields(step_job(stage, wildcards))


def step_outputs():
    """Every step job's file (nothing with step.enabled false; one unavailable file per GPU stage without
    a GPU)."""
    paths = []
    for stage in STEP_STAGES:
        if catalog.STAGES[stage].gpu and GPU_REASON is not None:
            paths.append(STEP_UNAVAILABLE.format(stage=stage))
            continue
        for wildcards in stages.grid(stage, SETTINGS):
            paths += stages.outputs(stage, LAYOUT, wildcards, STEP["budgets"])
    return paths


# The step stages' kernels, compiled wherever nvcc is (like the tree builder's), even where no GPU runs
# them (unless compile_without_gpu is false); without a GPU only those whose source is in the tree (with
# one, the step jobs need them all).
STEP_BUILDS = {}
if STEP["enabled"] and SETTINGS.gpu != "off":
    if GPU_REASON is None or COMPILE_WITHOUT_GPU:
        for key, path in (
            ("attention_fatbin", LAYOUT.artefact("verify_attn")),
            ("accept_fatbin", LAYOUT.artefact("tree_accept")),
        ):
            source = KERNEL_SOURCE_PATTERN.format(kernel=Path(path).stem)
            if GPU_REASON is None or Path(source).is_file():
                STEP_BUILDS[key] = path
        STEP_BUILDS["util_fatbin"] = UTIL_FATBIN

# The step summary the report reads (none with step.enabled false).
STEP_TARGETS = [STEP_SUMMARY] if STEP["enabled"] else []
