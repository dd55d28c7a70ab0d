"""Shared values and helpers of the workflow: result paths, the job grid, builder options and availability.
Every setting comes from SETTINGS (settings.Settings, built and checked once by the Snakefile).
"""

import os
import re
import shutil
from pathlib import Path

from ddtree_bench import catalog, consistency
from ddtree_bench.config import check_builders_run_here
from ddtree_bench.cuda.loader import fatbin_toolchain
from ddtree_bench.native_build import toolchain as native_toolchain
from ddtree_bench.config import published_files
from ddtree_bench.consistency import GRID_KEYS
from ddtree_bench.environment import default_machine_label
from ddtree_bench.summary.spread import job_suffix

MACHINE = SETTINGS.machine or default_machine_label()
RESULTS = f"results/{MACHINE}"
LOGS = f"{RESULTS}/logs"

BUDGETS = list(SETTINGS.budgets)
BATCH_SIZES = list(SETTINGS.batch_sizes)
DEPTHS = list(SETTINGS.depths)
# the (depth, budget) points: every pair, or each budget with L = N (depth_follows_budget: SGLang's regime)
DEPTH_BUDGETS = SETTINGS.depth_budget_pairs
DISTRIBUTIONS = list(SETTINGS.distributions)
BUILDERS = list(SETTINGS.builders)
TRACE_REQUESTS = SETTINGS.trace_requests
TRACE_COLUMNS = SETTINGS.trace_columns
# The columns each timing job hands the builders: the first min(N, K) under `topk: budget` (K = N).
INPUT_COLUMNS = SETTINGS.builder_input_columns
TIMING = SETTINGS.timing.options()
# Independent timing jobs per CPU builder configuration (timing.jobs); a GPU builder's take one.
TIMING_JOBS = int(SETTINGS.timing.jobs)
# The in-situ timing mode (GPU machines; elsewhere its rows say why): every timing job adds it.
IN_SITU = bool(SETTINGS.timing.in_situ)
# The drafter distributions' parameters (the trace rule's, for those distributions).
DRAFTER = SETTINGS.drafter.as_dict()
# The step stages (verify attention, tree accept, peaks): nulls resolved (budgets, distribution, depth).
STEP = SETTINGS.step_options()
# The report's "Which budget?" model (draft, rest of the target's forward, prefix length S).
THROUGHPUT = SETTINGS.throughput_options()

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


NATIVE_SOURCE = "kernels/native/tree_build_cpu.cpp"
NATIVE_HEADERS = headers("kernels/native")
NATIVE_LIBRARY = f"{RESULTS}/build/libddtree_native.so"
KERNEL_SOURCE_PATTERN = "kernels/{kernel}/{kernel}.cu"
KERNEL_SOURCE = KERNEL_SOURCE_PATTERN.format(kernel="tree_build")
FATBIN_PATTERN = f"{RESULTS}/build/{{kernel}}.fatbin"
FATBIN = FATBIN_PATTERN.format(kernel="tree_build")
FATBIN_INFO = f"{FATBIN}.json"
# the empty, spin and L2-flush kernels the GPU benchmark launches around the build
UTIL_FATBIN = FATBIN_PATTERN.format(kernel="bench_util")
# the step stages' kernels (built by build_fatbin like the tree builder's)
ATTENTION_FATBIN = FATBIN_PATTERN.format(kernel="verify_attn")
ACCEPT_FATBIN = FATBIN_PATTERN.format(kernel="tree_accept")

SUMMARY = f"{RESULTS}/summary.parquet"
SHAPES = f"{RESULTS}/tree_shape.parquet"
STEP_SUMMARY = f"{RESULTS}/step_summary.parquet"
PEAKS = f"{RESULTS}/step/peaks.parquet"
ENVIRONMENT = f"{RESULTS}/environment.json"
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


# What this workflow builds, by the name a catalog builder's ``libraries`` give it.
ARTEFACTS = {"native": NATIVE_LIBRARY, "tree_build": FATBIN, "bench_util": UTIL_FATBIN}


def library_input(builder):
    """The compiled libraries a builder loads, by its constructor's option (empty for the Python builders)."""
    return {
        option: ARTEFACTS[artefact]
        for option, artefact in catalog.BUILDERS[builder].libraries
    }


def builder_options(builder):
    """Keyword options for get_builder(builder): the libraries this workflow built, SGLang's module paths."""
    return {**library_input(builder), **SETTINGS.builder_options(builder)}


def artefacts_of(builders):
    """The artefacts (ARTEFACTS' names) the builders load."""
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


# Each result file's pattern, defined once: the rules write these, the functions below fill them in.
TRACE = f"{RESULTS}/traces/{{distribution}}-L{{depth}}.npz"
CHECK = f"{RESULTS}/check/{{builder}}/{{distribution}}-L{{depth}}-N{{budget}}.json"
# {rep}: the timing job's suffix (summary.spread.job_suffix): none for job 1, -r2, -r3, ... for the others
BENCH = f"{RESULTS}/bench/{{builder}}/{{distribution}}-L{{depth}}-N{{budget}}-B{{batch}}{{rep}}.parquet"
BENCH_UNAVAILABLE = f"{RESULTS}/bench/{{builder}}/unavailable.parquet"
SHAPE = f"{RESULTS}/shape/{{distribution}}-L{{depth}}-N{{budget}}.json"


def log_of(pattern):
    """A result file's log: the same path under LOGS, ending in .log."""
    return LOGS + pattern[len(RESULTS) :].rsplit(".", 1)[0] + ".log"


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


def published_summaries():
    """Committed summaries of other machines (results/published/<machine>/summary.parquet): the published
    answer's first, then the others by folder name."""
    return [str(p) for p in published_files("summary.parquet", first=PUBLISHED_ANSWER)]


def published_step_summaries():
    """Their step summaries, where a machine has one (older publications have none)."""
    return [
        str(p) for p in published_files("step_summary.parquet", first=PUBLISHED_ANSWER)
    ]


# ----------------------------------------------------------------------------------------------- step stages

# Every step job runs on the GPU; where none is usable (or gpu: off), each stage gives one file of rows
# saying why (rule step_unavailable) instead of its jobs.
STEP_STAGES = catalog.STEP_STAGES
# the rest of the round's stages, each with its switch (step.model, step.draft, step.allreduce)
ROUND = {stage: STEP[stage] for stage in catalog.ROUND_STAGES}


STEP_ATTENTION = f"{RESULTS}/step/attention/{{distribution}}-L{{depth}}-N{{budget}}-B{{batch}}-S{{prefix}}-H{{heads}}.parquet"
STEP_ACCEPT = (
    f"{RESULTS}/step/accept/{{distribution}}-L{{depth}}-N{{budget}}-B{{batch}}.parquet"
)
STEP_UNAVAILABLE = f"{RESULTS}/step/{{stage}}/unavailable.parquet"
# the rest of the round: one model / draft job per (batch, prefix), one allreduce job per batch, every budget
STEP_MODEL = f"{RESULTS}/step/model/{{distribution}}-L{{depth}}-N{{budget}}-B{{batch}}-S{{prefix}}.parquet"
STEP_DRAFT = f"{RESULTS}/step/draft/N{{budget}}-B{{batch}}-S{{prefix}}.parquet"
STEP_ALLREDUCE = f"{RESULTS}/step/allreduce/N{{budget}}-B{{batch}}.parquet"
STEP_ROUND = f"{RESULTS}/step/round/N{{budget}}-B{{batch}}-S{{prefix}}.parquet"


def round_outputs(pattern, **fixed):
    """A round stage job's files: one per step budget, the job's other wildcards kept (``allow_missing``)."""
    return expand(pattern, budget=STEP["budgets"], allow_missing=True, **fixed)


def round_paths():
    """Every file of the rest of the round's jobs (the enabled stages), for the step grid."""
    distribution, depth = STEP["distribution"], STEP["depth"]
    paths = []
    for batch in STEP["batch_sizes"]:
        for budget in STEP["budgets"]:
            for prefix in STEP["prefix_lengths"]:
                if ROUND["model"]["enabled"]:
                    paths.append(
                        STEP_MODEL.format(
                            distribution=distribution,
                            depth=depth,
                            budget=budget,
                            batch=batch,
                            prefix=prefix,
                        )
                    )
                if ROUND["draft"]["enabled"]:
                    paths.append(
                        STEP_DRAFT.format(budget=budget, batch=batch, prefix=prefix)
                    )
            if ROUND["allreduce"]["enabled"]:
                paths.append(STEP_ALLREDUCE.format(budget=budget, batch=batch))
    if ROUND["round"]["enabled"] and ROUND["round"]["builders"]:
        paths += [
            STEP_ROUND.format(budget=budget, batch=batch, prefix=prefix)
            for batch in ROUND["round"]["batch_sizes"]
            for budget in STEP["budgets"]
            for prefix in STEP["prefix_lengths"]
        ]
    return paths


def attention_path(distribution, depth, budget, batch, prefix, heads):
    return STEP_ATTENTION.format(
        distribution=distribution,
        depth=depth,
        budget=budget,
        batch=batch,
        prefix=prefix,
        heads=heads,
    )


def accept_path(distribution, depth, budget, batch):
    return STEP_ACCEPT.format(
        distribution=distribution, depth=depth, budget=budget, batch=batch
    )


def step_unavailable_path(stage):
    return STEP_UNAVAILABLE.format(stage=stage)


def step_outputs():
    """Every step job's file (nothing with step.enabled false; one unavailable file per stage without a GPU)."""
    if not STEP["enabled"]:
        return []
    if GPU_REASON is not None:
        return [
            step_unavailable_path(stage)
            for stage in STEP_STAGES
            if stage not in ROUND or ROUND[stage]["enabled"]
        ]
    distribution, depth = STEP["distribution"], STEP["depth"]
    attention = [
        attention_path(distribution, depth, budget, batch, prefix, heads)
        for budget in STEP["budgets"]
        for batch in STEP["batch_sizes"]
        for prefix in STEP["prefix_lengths"]
        for heads in STEP["heads"]
    ]
    accept = [
        accept_path(distribution, depth, budget, batch)
        for budget in STEP["budgets"]
        for batch in STEP["batch_sizes"]
    ]
    return attention + accept + [PEAKS] + round_paths()


def round_inputs():
    """What a round job loads: the attention and accept kernels, and every round builder's library."""
    inputs = {"attention": ATTENTION_FATBIN, "accept": ACCEPT_FATBIN}
    for builder in ROUND["round"]["builders"]:
        for key, path in library_input(builder).items():
            inputs[f"{builder}_{key}"] = path
    return inputs


# The step stages' kernels, compiled wherever nvcc is (like the tree builder's), even where no GPU runs
# them (unless compile_without_gpu is false); without a GPU only those whose source is in the tree (with
# one, the step jobs need them all).
STEP_BUILDS = {}
if STEP["enabled"] and SETTINGS.gpu != "off":
    if GPU_REASON is None or COMPILE_WITHOUT_GPU:
        for key, path in (
            ("attention_fatbin", ATTENTION_FATBIN),
            ("accept_fatbin", ACCEPT_FATBIN),
        ):
            source = KERNEL_SOURCE_PATTERN.format(kernel=Path(path).stem)
            if GPU_REASON is None or Path(source).is_file():
                STEP_BUILDS[key] = path
        STEP_BUILDS["util_fatbin"] = UTIL_FATBIN

# The step summary the report reads (none with step.enabled false).
STEP_TARGETS = [STEP_SUMMARY] if STEP["enabled"] else []
