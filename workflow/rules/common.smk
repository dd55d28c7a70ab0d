"""Shared values and helpers of the workflow: result paths, the job grid, builder options and availability."""

import os
import shutil
from pathlib import Path

from ddtree_bench.config import (
    builder_input_columns,
    step_options,
    throughput_options,
    timing_options,
    trace_columns,
    trace_requests,
)
from ddtree_bench.consistency import GRID_KEYS
from ddtree_bench.environment import default_machine_label

MACHINE = config["machine"] or default_machine_label()
RESULTS = f"results/{MACHINE}"
LOGS = f"{RESULTS}/logs"

BUDGETS = config["budgets"]
BATCH_SIZES = config["batch_sizes"]
DEPTHS = config["depths"]
DISTRIBUTIONS = config["distributions"]
BUILDERS = config["builders"]
TRACE_REQUESTS = trace_requests(config)
TRACE_COLUMNS = trace_columns(config)
# The columns each timing job hands the builders: the first min(N, K) under `topk: budget` (K = N).
INPUT_COLUMNS = builder_input_columns(config)
TIMING = timing_options(config)
# The in-situ timing mode (GPU machines; elsewhere its rows say why): every timing job adds it.
IN_SITU = bool(config["timing"]["in_situ"])
# The step stages (verify attention, tree accept, peaks): nulls resolved (budgets, distribution, depth).
STEP = step_options(config)
# The report's "Which budget?" model (draft, rest of the target's forward, prefix length S).
THROUGHPUT = throughput_options(config)

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
KERNEL_SOURCE = "kernels/tree_build/tree_build.cu"
FATBIN = f"{RESULTS}/build/tree_build.fatbin"
FATBIN_INFO = f"{FATBIN}.json"
# the empty, spin and L2-flush kernels the GPU benchmark launches around the build
UTIL_FATBIN = f"{RESULTS}/build/bench_util.fatbin"
# the step stages' kernels (built by build_fatbin like the tree builder's)
ATTENTION_FATBIN = f"{RESULTS}/build/verify_attn.fatbin"
ACCEPT_FATBIN = f"{RESULTS}/build/tree_accept.fatbin"

SUMMARY = f"{RESULTS}/summary.parquet"
SHAPES = f"{RESULTS}/tree_shape.parquet"
STEP_SUMMARY = f"{RESULTS}/step_summary.parquet"
PEAKS = f"{RESULTS}/step/peaks.parquet"
ENVIRONMENT = f"{RESULTS}/environment.json"
REPORT_DIR = config["report_dir"].rstrip("/")
REPORT_HTML = f"{REPORT_DIR}/index.html"
REPORT_MD = f"{REPORT_DIR}/summary.md"
FIGURES = (
    "time_vs_budget",
    "time_vs_batch",
    "speedup",
    "tree_shape",
    "step_share",
    "which_budget",
    # the acceptance section's figures (tau per budget beside the DDTree paper, P(tau >= k) per round)
    "acceptance_tau",
    "acceptance_histogram",
)
# The lists that decide the tree-build grid (consistency.GRID_KEYS): what the summary must hold exactly.
GRID = {key: list(config[key]) for key in GRID_KEYS}


wildcard_constraints:
    distribution="|".join(DISTRIBUTIONS),
    depth=r"\d+",
    budget=r"\d+",
    batch=r"\d+",
    builder="|".join(b.replace("-", r"\-") for b in BUILDERS),


# ----------------------------------------------------------------------------------------------- builders


def nvcc_path():
    """nvcc's path (as ddtree_bench.cuda.loader finds it), or None where there is none."""
    try:
        from ddtree_bench.cuda.loader import find_nvcc
    except ImportError:
        return shutil.which("nvcc")
    return find_nvcc()


def gpu_reason():
    """Why the GPU jobs are left out here (None: they run). `gpu: on` without a GPU stops the run."""
    if config["gpu"] == "off":
        return "gpu: off in the configuration"
    try:
        from ddtree_bench.cuda.loader import gpu_unavailable_reason
    except ImportError as error:
        reason = f"ddtree_bench.cuda.loader cannot be imported ({error})"
    else:
        reason = gpu_unavailable_reason()
    if reason is not None and config["gpu"] == "on":
        raise WorkflowError(f"config: gpu: on, but no usable GPU here: {reason}")
    return reason


def sglang_reason():
    """Why SGLang's builder cannot run here (None: it can); probed once, when the workflow is parsed.
    With sglang.source set, a failure stops the run with one line instead (the user asked for that file).
    """
    if config["sglang"].get("source") is not None:
        from ddtree_bench.builders import get_builder

        try:
            return get_builder(
                "sglang", **builder_options("sglang")
            ).unavailable_reason()
        except ValueError as error:
            raise WorkflowError(
                f"config: sglang.source: {' '.join(str(error).split())}"
            ) from None
    try:
        from ddtree_bench.builders import get_builder

        return get_builder("sglang", **builder_options("sglang")).unavailable_reason()
    except (
        Exception
    ) as error:  # a broken SGLang install is "unavailable", with the error as the reason
        return f"{type(error).__name__}: {' '.join(str(error).split())}"


def builder_options(builder):
    """Keyword options for get_builder(builder): the libraries this workflow built, SGLang's module paths."""
    if builder in ("native", "native-mt"):
        return {"library": NATIVE_LIBRARY}
    if builder == "gpu":
        return {"fatbin": FATBIN, "util_fatbin": UTIL_FATBIN}
    if builder == "sglang":
        options = {"module_paths": list(config["sglang"]["module_paths"])}
        if config["sglang"].get("source") is not None:
            options["source"] = str(config["sglang"]["source"])
        return options
    return {}


# Probed once, and only where a GPU job is configured (the gpu builder, the step stages).
GPU_REASON = gpu_reason() if "gpu" in BUILDERS or STEP["enabled"] else None


def in_situ_reason():
    """Why the in-situ mode cannot run here (None: it can, or it is off); probed once, when parsed."""
    if not IN_SITU:
        return None
    if config["gpu"] == "off":
        return "gpu: off in the configuration"
    try:
        from ddtree_bench.cuda.loader import gpu_unavailable_reason
    except ImportError as error:
        return f"ddtree_bench.cuda.loader cannot be imported ({error})"
    return gpu_unavailable_reason()


# Where it is not None, each timing job adds one in-situ row saying why (no torch import, no trace re-read).
IN_SITU_REASON = in_situ_reason()

# Builders that cannot run here get one "unavailable" row with the reason instead of their timing jobs.
UNAVAILABLE = {}
if "sglang" in BUILDERS:
    UNAVAILABLE["sglang"] = sglang_reason()
if "gpu" in BUILDERS:
    UNAVAILABLE["gpu"] = GPU_REASON
UNAVAILABLE = {builder: reason for builder, reason in UNAVAILABLE.items() if reason}
TIMED_BUILDERS = [b for b in BUILDERS if b not in UNAVAILABLE]
CHECKED_BUILDERS = [b for b in TIMED_BUILDERS if b != "reference"]
# The kernel compiles wherever nvcc is (CI included), even where no GPU runs it.
BUILD_FATBIN = (
    "gpu" in BUILDERS
    and config["gpu"] != "off"
    and ("gpu" in TIMED_BUILDERS or nvcc_path() is not None)
)


# ----------------------------------------------------------------------------------------------- paths


def trace_path(distribution, depth):
    return f"{RESULTS}/traces/{distribution}-L{depth}.npz"


def check_path(builder, distribution, depth, budget):
    return f"{RESULTS}/check/{builder}/{distribution}-L{depth}-N{budget}.json"


def bench_path(builder, distribution, depth, budget, batch):
    return (
        f"{RESULTS}/bench/{builder}/{distribution}-L{depth}-N{budget}-B{batch}.parquet"
    )


def unavailable_path(builder):
    return f"{RESULTS}/bench/{builder}/unavailable.parquet"


def shape_path(distribution, depth, budget):
    return f"{RESULTS}/shape/{distribution}-L{depth}-N{budget}.json"


def bench_outputs():
    """Every timing job's file, plus one "unavailable" file per builder left out."""
    paths = [
        bench_path(builder, distribution, depth, budget, batch)
        for builder in TIMED_BUILDERS
        for distribution in DISTRIBUTIONS
        for depth in DEPTHS
        for budget in BUDGETS
        for batch in BATCH_SIZES
    ]
    return paths + [unavailable_path(builder) for builder in UNAVAILABLE]


def shape_outputs():
    return [
        shape_path(distribution, depth, budget)
        for distribution in DISTRIBUTIONS
        for depth in DEPTHS
        for budget in BUDGETS
    ]


def build_outputs(wildcards=None):
    """The compiled artefacts the run records (and the CUDA kernels, compiled even where no GPU runs them)."""
    outputs = {}
    if {"native", "native-mt"} & set(BUILDERS):
        outputs["native"] = NATIVE_LIBRARY
    if BUILD_FATBIN:
        outputs["fatbin"] = FATBIN
        outputs["util_fatbin"] = UTIL_FATBIN
    outputs.update(STEP_BUILDS)
    return outputs


def library_input(builder):
    """The compiled library a builder loads (empty for the Python builders)."""
    if builder in ("native", "native-mt"):
        return {"library": NATIVE_LIBRARY}
    if builder == "gpu":
        return {"library": FATBIN, "util_library": UTIL_FATBIN}
    return {}


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
    if wildcards.builder != "reference":
        inputs["check"] = check_path(
            wildcards.builder, wildcards.distribution, wildcards.depth, wildcards.budget
        )
    return inputs


def published_summaries():
    """Committed summaries of other machines (results/published/<machine>/summary.parquet)."""
    return sorted(str(p) for p in Path("results/published").glob("*/summary.parquet"))


def published_step_summaries():
    """Their step summaries, where a machine has one (older publications have none)."""
    return sorted(
        str(p) for p in Path("results/published").glob("*/step_summary.parquet")
    )


# ----------------------------------------------------------------------------------------------- step stages

# Every step job runs on the GPU; where none is usable (or gpu: off), each stage gives one file of rows
# saying why (rule step_unavailable) instead of its jobs.
STEP_STAGES = ("attention", "accept", "peaks")


def attention_path(distribution, depth, budget, batch, prefix, heads):
    return f"{RESULTS}/step/attention/{distribution}-L{depth}-N{budget}-B{batch}-S{prefix}-H{heads}.parquet"


def accept_path(distribution, depth, budget, batch):
    return f"{RESULTS}/step/accept/{distribution}-L{depth}-N{budget}-B{batch}.parquet"


def step_unavailable_path(stage):
    return f"{RESULTS}/step/{stage}/unavailable.parquet"


def step_outputs():
    """Every step job's file (nothing with step.enabled false; one unavailable file per stage without a GPU)."""
    if not STEP["enabled"]:
        return []
    if GPU_REASON is not None:
        return [step_unavailable_path(stage) for stage in STEP_STAGES]
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
    return attention + accept + [PEAKS]


# The step stages' kernels, compiled wherever nvcc is (like the tree builder's), even where no GPU runs
# them; without a GPU only those whose source is in the tree (with one, the step jobs need them all).
STEP_BUILDS = {}
if STEP["enabled"] and config["gpu"] != "off":
    if GPU_REASON is None or nvcc_path() is not None:
        for key, path in (
            ("attention_fatbin", ATTENTION_FATBIN),
            ("accept_fatbin", ACCEPT_FATBIN),
        ):
            source = f"kernels/{Path(path).stem}/{Path(path).stem}.cu"
            if GPU_REASON is None or Path(source).is_file():
                STEP_BUILDS[key] = path
        STEP_BUILDS["util_fatbin"] = UTIL_FATBIN

# The step summary the report reads (none with step.enabled false).
STEP_TARGETS = [STEP_SUMMARY] if STEP["enabled"] else []
