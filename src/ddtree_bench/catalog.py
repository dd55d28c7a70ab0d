"""The catalog: every tree builder, timing series, attention impl, trace distribution, stage and report figure
of the project, declared once, as plain data (this module imports nothing of the project).

Everything else derives from it: ``builders.get_builder``, the configuration's checks (and the schema's enums,
which a test compares with it), the workflow's patterns and builder options, the report's series, columns,
styles and figure order. Adding a builder is one ``Builder`` entry here plus its own module; adding a figure
is one ``Figure`` entry plus the function that draws it.

Code refers to entries by these names (``catalog.NATIVE_MT``, ``catalog.IN_SITU``), never by spelling them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# ----------------------------------------------------------------------------------------- timing series

#: The timing of the in-situ rows (what the decode round pays: from the drafter's top-K on the GPU to the
#: padded tree on the GPU, the copies each builder needs included; ``stages.insitu``).
IN_SITU = "in-situ"
#: The timing of a CPU builder's host call (``stages.build``; wall clock).
WALL = "wall"


@dataclass(frozen=True)
class Series:
    """One (builder, timing) series: its name in the report's figures and tables and its colour there; where
    the step breakdown shows it, its label there (``step``) and the cache states it takes."""

    timing: str
    name: str
    color: str
    step: str | None = None
    caches: tuple[str, ...] = ("n/a", "warm")


# ----------------------------------------------------------------------------------------- builders

CPU = "cpu"
GPU = "gpu"
#: How a builder's in-situ call (and its round) moves the drafter's output and its trees: none (on the
#: device), through torch's pageable copies (as SGLang's worker), or through pinned host buffers.
DEVICE, PAGEABLE, PINNED = "device", "pageable", "pinned"


@dataclass(frozen=True)
class Builder:
    """A tree builder.

    ``impl``: "module:Class" (``get_builder`` imports it on first use; its constructor takes ``options`` and
    the workflow's library options). ``runner``: CPU or GPU (the GPU's jobs take one GPU; its timing job is
    ``stages.build_gpu``'s). ``libraries``: (constructor option, workflow artefact) pairs the workflow fills
    in (``native``: the C++ library; ``tree_build``, ``bench_util``: fatbins). ``copies``: DEVICE, PAGEABLE or
    PINNED (see above). ``label``: its name in the "Which budget?" model and the answer; ``column``: the
    answer's column (default: ``label``); ``style``: (colour, marker, line style) in the model's figures;
    ``fallback``: (timing, its name) the model takes where no in-situ rows exist; ``series`` and ``in_situ``:
    its timing series (in the report's order)."""

    name: str
    impl: str
    runner: str
    label: str
    style: tuple[str, str, str]
    series: tuple[Series, ...]
    in_situ: tuple[Series, ...]
    copies: str
    options: dict = field(default_factory=dict)
    libraries: tuple[tuple[str, str], ...] = ()
    fallback: tuple[str, str] = (WALL, "wall clock")
    column: str | None = None

    @property
    def column_name(self) -> str:
        return self.column or self.label


SGLANG, REFERENCE, NATIVE, NATIVE_MT, GPU_BUILDER = "sglang", "reference", "native", "native-mt", "gpu"
_NATIVE_LIBRARY = (("library", "native"),)

#: Every builder, in the report's order.
BUILDERS: dict[str, Builder] = {
    b.name: b
    for b in (
        Builder(
            SGLANG,
            "ddtree_bench.builders.sglang:SGLangBuilder",
            CPU,
            "sglang (SGLang's CPU builder)",
            ("#1f77b4", "o", "-"),
            (Series(WALL, "sglang (SGLang's CPU builder)", "#1f77b4", "sglang (SGLang's CPU builder)"),),
            (Series(IN_SITU, "sglang in-situ (pageable copies)", "#ffbb78", "sglang in-situ", ("n/a",)),),
            PAGEABLE,
            column="SGLang's function",
        ),
        Builder(
            REFERENCE,
            "ddtree_bench.builders.reference:ReferenceBuilder",
            CPU,
            "reference (ours, Python)",
            ("#ff7f0e", "s", "--"),
            (Series(WALL, "reference (ours, Python)", "#ff7f0e", "reference (ours, Python)"),),
            (
                Series(
                    IN_SITU, "reference in-situ (pageable copies)", "#98df8a", "reference in-situ", ("n/a",)
                ),
            ),
            PAGEABLE,
        ),
        Builder(
            NATIVE,
            "ddtree_bench.builders.native:NativeBuilder",
            CPU,
            "native (C++, 1 thread)",
            ("#2ca02c", "^", "-."),
            (Series(WALL, "native (C++, 1 thread)", "#2ca02c", "native (C++, 1 thread)"),),
            (Series(IN_SITU, "native in-situ (pinned copies)", "#c5b0d5", "native in-situ", ("n/a",)),),
            PINNED,
            libraries=_NATIVE_LIBRARY,
        ),
        Builder(
            NATIVE_MT,
            "ddtree_bench.builders.native:NativeBuilder",
            CPU,
            "native-mt (C++, all cores)",
            ("#9467bd", "D", ":"),
            (Series(WALL, "native-mt (C++, all cores)", "#9467bd", "native-mt (C++, all cores)"),),
            (Series(IN_SITU, "native-mt in-situ (pinned copies)", "#ff9896", "native-mt in-situ", ("n/a",)),),
            PINNED,
            options={"threads": 0},
            libraries=_NATIVE_LIBRARY,
        ),
        Builder(
            GPU_BUILDER,
            "ddtree_bench.builders.gpu:GpuBuilder",
            GPU,
            "gpu (our CUDA kernel)",
            ("#d62728", "v", "-"),
            (
                Series("kernel-events", "gpu kernel (CUDA events)", "#d62728", "gpu kernel", ("warm",)),
                Series("graph-replay", "gpu CUDA-graph replay", "#8c564b"),
                Series(
                    "host-inclusive",
                    "gpu host-inclusive (secondary: copies in + out)",
                    "#e377c2",
                    "gpu host-inclusive",
                ),
                Series(WALL, "gpu (wall)", "#17becf"),
                Series("kernel-events-packed", "gpu kernel, packed bits only (CUDA events)", "#aec7e8"),
            ),
            (
                Series(
                    IN_SITU,
                    "gpu in-situ (graph replay, bool mask)",
                    "#c49c94",
                    "gpu in-situ (graph replay)",
                    ("warm",),
                ),
                Series("in-situ-packed", "gpu in-situ (graph replay, packed bits)", "#f7b6d2"),
                Series("in-situ-launch-sync", "gpu launch + sync wall (secondary, bool mask)", "#9edae5"),
                Series(
                    "in-situ-launch-sync-packed", "gpu launch + sync wall (secondary, packed bits)", "#7f7f7f"
                ),
            ),
            DEVICE,
            libraries=(("fatbin", "tree_build"), ("util_fatbin", "bench_util")),
            fallback=("kernel-events", "kernel (CUDA events)"),
        ),
    )
}


def builder_names() -> tuple[str, ...]:
    return tuple(BUILDERS)


def builders_where(**fields) -> tuple[str, ...]:
    """The names of the builders whose fields equal ``fields`` (``builders_where(runner=CPU)``)."""
    return tuple(b.name for b in BUILDERS.values() if all(getattr(b, k) == v for k, v in fields.items()))


def all_series() -> dict[tuple[str, str], Series]:
    """Every (builder, timing) series, in the report's order: each builder's own series, then the in-situ
    ones."""
    return {
        (b.name, s.timing): s
        for part in ("series", "in_situ")
        for b in BUILDERS.values()
        for s in getattr(b, part)
    }


def in_situ_timings() -> tuple[str, ...]:
    """The timing values of the in-situ rows, each once (the gpu builder's variants included)."""
    return tuple(dict.fromkeys(s.timing for b in BUILDERS.values() for s in b.in_situ))


# ----------------------------------------------------------------------------------------- other names

#: The trace distributions (``traces``).
DISTRIBUTIONS = ("uniform", "peaked", "bf16", "recorded", "drafter", "drafter-bf16")
#: "read-stream" is no attention: a kernel that reads as many bytes as the call moves (its measured bound).
STREAM_IMPL = "read-stream"
#: The verify-attention impls; "flashmla" and "sglang-triton" are optional extras (rows saying why where they
#: do not load).
ATTENTION_IMPLS = ("ours", "ours-mma", "flexattention", "sdpa", "flashmla", "sglang-triton", STREAM_IMPL)

#: The routed experts' kernels (``model.moe``), preferred first: SGLang's Marlin and Triton W4A16, BF16.
MOE_IMPLS = ("marlin-w4a16", "triton-w4a16", "bf16-grouped-mm")

#: The step stages (each a ``stages/<name>.py``); the rest of the round's have their own ``enabled`` switch.
STEP_STAGES = ("attention", "accept", "peaks", "model", "draft", "allreduce", "round")
ROUND_STAGES = ("model", "draft", "allreduce", "round")


# ----------------------------------------------------------------------------------------- report figures


@dataclass(frozen=True)
class Figure:
    """A report figure: ``draw`` ("module:function") is called with ``path=`` and the named ``inputs`` (from
    the report's data: ``data``, ``machines``, ``breakdowns``, ``found``, ``options``, ``depth``,
    ``distribution``) and returns its title. ``section``: what it shows ("build": the tree build's timings
    and shapes; "acceptance", "throughput", "step"). ``timings``: drawn empty ("no timings") where no
    tree-build timings exist. ``key``: the answer's figure (shown first, not among the others)."""

    name: str
    draw: str
    inputs: tuple[str, ...]
    section: str
    timings: bool = False
    key: bool = False


_FIGURES = "ddtree_bench.report.figures:"
_BUILD_INPUTS = ("data", "depth", "distribution")

#: Every figure, in the report's order.
FIGURES: dict[str, Figure] = {
    f.name: f
    for f in (
        Figure("time_vs_budget", _FIGURES + "figure_time_vs_budget", _BUILD_INPUTS, "build", timings=True),
        Figure("time_vs_batch", _FIGURES + "figure_time_vs_batch", _BUILD_INPUTS, "build", timings=True),
        Figure("speedup", _FIGURES + "figure_speedup", _BUILD_INPUTS, "build", timings=True),
        Figure("tree_shape", _FIGURES + "figure_tree_shape", ("machines", "depth"), "build"),
        Figure("acceptance_tau", "ddtree_bench.report.acceptance:figure_tau", ("machines",), "acceptance"),
        Figure(
            "acceptance_histogram",
            "ddtree_bench.report.acceptance:figure_histogram",
            ("machines", "distribution", "depth"),
            "acceptance",
        ),
        Figure("which_budget", "ddtree_bench.report.throughput:figure", ("found", "options"), "throughput"),
        Figure("round_parts", "ddtree_bench.report.throughput:figure_round_parts", ("found",), "throughput"),
        Figure("step_share", "ddtree_bench.report.step:figure_step_share", ("breakdowns",), "step", key=True),
    )
}


def figure_names() -> tuple[str, ...]:
    return tuple(FIGURES)
