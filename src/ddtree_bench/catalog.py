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


#: The kinds of timing, each with its colour in the timing-variants figure. A colour "CN" is the Nth of the
#: report's palette (seaborn's colour-blind one, ``report.figures.colour``).
WALL_CLOCK = "wall clock"
IN_SITU_KIND = "in-situ (what the round pays)"
KERNEL_EVENTS = "kernel (CUDA events)"
GRAPH_REPLAY = "CUDA-graph replay"
HOST_INCLUSIVE = "host-inclusive (copies in + out)"
LAUNCH_SYNC = "launch + sync wall (in-situ)"
TIMING_KINDS = {
    WALL_CLOCK: "C0",
    IN_SITU_KIND: "C3",
    KERNEL_EVENTS: "C2",
    GRAPH_REPLAY: "C1",
    HOST_INCLUSIVE: "C4",
    LAUNCH_SYNC: "C7",
}


@dataclass(frozen=True)
class Series:
    """One (builder, timing) series: its name in the report's figures and tables and its kind of timing
    (``TIMING_KINDS``: its colour in the timing-variants figure); ``packed``: whether it takes the packed-bit
    mask only (a dashed line there); where the step breakdown shows it, its label there (``step``) and the
    cache states it takes."""

    timing: str
    name: str
    kind: str
    step: str | None = None
    caches: tuple[str, ...] = ("n/a", "warm")
    packed: bool = False


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
    answer's column (default: ``label``); ``style``: (colour, marker, line style) in the report's figures
    (colour "CN": the Nth of the report's palette, see ``TIMING_KINDS``);
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
#: The builders' roles. SUBJECT: what the benchmark asks about (our GPU kernel); BASELINE: what speedups are
#: over (SGLang's function); ORACLE: every tree is checked against its trees.
SUBJECT, BASELINE, ORACLE = GPU_BUILDER, SGLANG, REFERENCE
#: The C++ builders' compiled library, by its artefact name (``paths.Layout.artefact``).
NATIVE_ARTEFACT = "native"
_NATIVE_LIBRARY = (("library", NATIVE_ARTEFACT),)

#: Every builder, in the report's order.
BUILDERS: dict[str, Builder] = {
    b.name: b
    for b in (
        Builder(
            SGLANG,
            "ddtree_bench.builders.sglang:SGLangBuilder",
            CPU,
            "sglang (SGLang's CPU builder)",
            ("C0", "o", "-"),
            (Series(WALL, "sglang (SGLang's CPU builder)", WALL_CLOCK, "sglang (SGLang's CPU builder)"),),
            (Series(IN_SITU, "sglang in-situ (pageable copies)", IN_SITU_KIND, "sglang in-situ", ("n/a",)),),
            PAGEABLE,
            column="SGLang's function",
        ),
        Builder(
            REFERENCE,
            "ddtree_bench.builders.reference:ReferenceBuilder",
            CPU,
            "reference (ours, Python)",
            ("C1", "s", "--"),
            (Series(WALL, "reference (ours, Python)", WALL_CLOCK, "reference (ours, Python)"),),
            (
                Series(
                    IN_SITU,
                    "reference in-situ (pageable copies)",
                    IN_SITU_KIND,
                    "reference in-situ",
                    ("n/a",),
                ),
            ),
            PAGEABLE,
        ),
        Builder(
            NATIVE,
            "ddtree_bench.builders.native:NativeBuilder",
            CPU,
            "native (C++, 1 thread)",
            ("C2", "^", "-."),
            (Series(WALL, "native (C++, 1 thread)", WALL_CLOCK, "native (C++, 1 thread)"),),
            (Series(IN_SITU, "native in-situ (pinned copies)", IN_SITU_KIND, "native in-situ", ("n/a",)),),
            PINNED,
            libraries=_NATIVE_LIBRARY,
        ),
        Builder(
            NATIVE_MT,
            "ddtree_bench.builders.native:NativeBuilder",
            CPU,
            "native-mt (C++, all cores)",
            ("C4", "D", ":"),
            (Series(WALL, "native-mt (C++, all cores)", WALL_CLOCK, "native-mt (C++, all cores)"),),
            (
                Series(
                    IN_SITU, "native-mt in-situ (pinned copies)", IN_SITU_KIND, "native-mt in-situ", ("n/a",)
                ),
            ),
            PINNED,
            options={"threads": 0},
            libraries=_NATIVE_LIBRARY,
        ),
        Builder(
            GPU_BUILDER,
            "ddtree_bench.builders.gpu:GpuBuilder",
            GPU,
            "gpu (our CUDA kernel)",
            ("C3", "v", "-"),
            (
                Series("kernel-events", "gpu kernel (CUDA events)", KERNEL_EVENTS, "gpu kernel", ("warm",)),
                Series("graph-replay", "gpu CUDA-graph replay", GRAPH_REPLAY),
                Series(
                    "host-inclusive",
                    "gpu host-inclusive (secondary: copies in + out)",
                    HOST_INCLUSIVE,
                    "gpu host-inclusive",
                ),
                Series(WALL, "gpu (wall)", WALL_CLOCK),
                Series(
                    "kernel-events-packed",
                    "gpu kernel, packed bits only (CUDA events)",
                    KERNEL_EVENTS,
                    packed=True,
                ),
            ),
            (
                Series(
                    IN_SITU,
                    "gpu in-situ (graph replay, bool mask)",
                    IN_SITU_KIND,
                    "gpu in-situ (graph replay)",
                    ("warm",),
                ),
                Series(
                    "in-situ-packed", "gpu in-situ (graph replay, packed bits)", IN_SITU_KIND, packed=True
                ),
                Series("in-situ-launch-sync", "gpu launch + sync wall (secondary, bool mask)", LAUNCH_SYNC),
                Series(
                    "in-situ-launch-sync-packed",
                    "gpu launch + sync wall (secondary, packed bits)",
                    LAUNCH_SYNC,
                    packed=True,
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


# ----------------------------------------------------------------------------------------- acceptance


@dataclass(frozen=True)
class AcceptanceProfile:
    """Whose acceptance tau(N) is: the drafter distribution (``drafter.py``) with parameters fitted by
    ``ddtree-bench calibrate`` to ``targets`` ((budget, tau) pairs, fitted at depth 15: block 16).
    ``distribution``: the trace distribution whose trees give tau (tree shapes); ``params``: its drafter
    parameters (None: the configured ``drafter:`` mapping, by default the paper's fit); ``label``: its name
    beside every tau; ``source``: what the targets are and which budgets they were taken to belong to."""

    name: str
    label: str
    distribution: str
    source: str
    targets: tuple[tuple[int, float], ...]
    params: tuple[tuple[str, float], ...] | None = None


PAPER_PROFILE, K26_PROFILE = "paper", "k2.6-reported"
#: The acceptance profiles, the paper's first.
ACCEPTANCE_PROFILES: dict[str, AcceptanceProfile] = {
    p.name: p
    for p in (
        AcceptanceProfile(
            PAPER_PROFILE,
            "paper (DDTree paper, Qwen3-8B)",
            "drafter",
            "the DDTree paper's Fig. 3 (Qwen3-8B, MATH-500, block 16) and its DFlash chain, 7.79",
            ((16, 8.61), (32, 9.27), (64, 9.75), (128, 10.20), (256, 10.43), (512, 10.73), (1024, 10.98)),
        ),
        AcceptanceProfile(
            K26_PROFILE,
            "k2.6-reported (a Kimi K2.6 DDTree service)",
            "drafter-k2.6",
            "a Kimi K2.6 DDTree service's reported acceptance, taken as 4.5 tokens a round at N = 8 (its "
            "smallest budget tried) and 5.3 and 6.4 at N = 16 and 32 (the larger ones); budgets above 32 "
            "are the fit's extrapolation",
            ((8, 4.5), (16, 5.3), (32, 6.4)),
            # ddtree-bench calibrate --tau 8:4.5 16:5.3 32:6.4 --requests 128 --iterations 150
            # (docs/drafter.md)
            (
                ("confident_fraction", 0.000394),
                ("confident_top1", 0.999999),
                ("confident_decay", 0.000906),
                ("uncertain_top1", 0.978508),
                ("uncertain_decay", 0.709855),
                ("top1_spread", 9.9659),
                ("alt_mass", 0.940956),
                ("alt_ratio", 0.296613),
                ("alt_ranks", 8),
            ),
        ),
    )
}


def profile_names() -> tuple[str, ...]:
    return tuple(ACCEPTANCE_PROFILES)


def profile_of_distribution(distribution: str) -> AcceptanceProfile | None:
    """The profile whose own parameters make ``distribution``'s trees (None for the configured drafter)."""
    for profile in ACCEPTANCE_PROFILES.values():
        if profile.distribution == distribution and profile.params is not None:
            return profile
    return None


# ----------------------------------------------------------------------------------------- other names

#: The trace distributions (``traces``); ``drafter-k2.6`` is the drafter with the k2.6-reported profile's
#: parameters.
DISTRIBUTIONS = ("uniform", "peaked", "bf16", "recorded", "drafter", "drafter-bf16", "drafter-k2.6")
#: The verify-attention impls: ours (the packed-bit mask; OURS_MMA: forced onto its mma.sync kernel), torch's
#: FlexAttention and SDPA, FlashMLA, SGLang's Triton ``extend_attention_fwd`` and FA3 two-pass. STREAM_IMPL
#: is no attention: a kernel that reads as many bytes as the call moves (its measured bound).
OURS = "ours"
OURS_MMA, FLEXATTENTION, SDPA, FLASHMLA = "ours-mma", "flexattention", "sdpa", "flashmla"
SGLANG_TRITON_ATTENTION, SGLANG_FA3_ATTENTION = "sglang-triton", "sglang-fa3"
STREAM_IMPL = "read-stream"
#: Every verify-attention impl, in the report's order; FLASHMLA and SGLANG_TRITON_ATTENTION are optional
#: extras (rows saying why where they do not load).
ATTENTION_IMPLS = (
    OURS,
    OURS_MMA,
    FLEXATTENTION,
    SDPA,
    FLASHMLA,
    SGLANG_TRITON_ATTENTION,
    SGLANG_FA3_ATTENTION,
    STREAM_IMPL,
)

#: The routed experts' kernels (``k26.moe``), preferred first: SGLang's Marlin and Triton W4A16, BF16.
MOE_IMPLS = ("marlin-w4a16", "triton-w4a16", "bf16-grouped-mm")
#: The MoE kernel SGLang runs K2.6's INT4 experts with on Hopper: the published stack rounds' forward.
SGLANG_MOE = MOE_IMPLS[0]


# ----------------------------------------------------------------------------------------- round stacks

#: The kernels a stack's round runs (``k26.stack``). Tree build: SGLang's function per request with its
#: copies, or our GPU kernel. Verify attention: ours (packed-bit mask), SGLang's Triton
#: ``extend_attention_fwd`` (its per-request bool mask), or FA3 two-pass as SGLang's DDTree fork runs it
#: (the same bool mask). Accept: ours, or SGLang's Triton accept kernel.
SGLANG_ACCEPT = "sglang-triton"
STACK_KERNELS = ("build", "attention", "accept")


@dataclass(frozen=True)
class Stack:
    """A whole decode round's three kernels (``STACK_KERNELS``): ``build`` (a builder name: ``SGLANG`` or
    ``GPU_BUILDER``), ``attention`` (``OURS``, ``SGLANG_TRITON_ATTENTION``, ``SGLANG_FA3_ATTENTION``) and
    ``accept`` (``OURS`` or ``SGLANG_ACCEPT``). ``base``: the SGLang stack a one-kernel swap starts from
    (None for a whole stack); ``swap``: the kernel it swaps for ours. ``label``: its name in the report;
    ``color``: its colour there ("CN", as a builder's; a swap takes its base's)."""

    name: str
    label: str
    build: str
    attention: str
    accept: str
    color: str
    base: str | None = None
    swap: str | None = None

    @property
    def sglang_mask(self) -> bool:
        """Whether the round builds SGLang's per-request bool verify mask (SGLang's attention reads it)."""
        return self.attention != OURS


def _sglang_stack(name, attention, label, color):
    return Stack(name, label, SGLANG, attention, SGLANG_ACCEPT, color)


def _swap(base: Stack, kernel: str) -> Stack:
    ours = {"build": GPU_BUILDER, "attention": OURS, "accept": OURS}
    fields = {"build": base.build, "attention": base.attention, "accept": base.accept, kernel: ours[kernel]}
    return Stack(
        f"{base.name}+{kernel}",
        f"{base.name} with our {kernel}",
        color=base.color,
        base=base.name,
        swap=kernel,
        **fields,
    )


_SGLANG_FA3 = _sglang_stack(
    "sglang-fa3", SGLANG_FA3_ATTENTION, "SGLang as the H200 runs it (FA3 tree verify)", "C0"
)
_SGLANG_TRITON = _sglang_stack(
    "sglang-triton", SGLANG_TRITON_ATTENTION, "SGLang as sm_120 runs it (Triton tree verify)", "C4"
)
#: SGLang's DDTree round as Hopper runs it: the base of every swap and verdict in the report.
SGLANG_ROUND = _SGLANG_FA3.name
#: Every stack, in the report's order: SGLang as it runs (H200, then sm_120), ours, then the swaps.
STACKS: dict[str, Stack] = {
    s.name: s
    for s in (
        _SGLANG_FA3,
        _SGLANG_TRITON,
        Stack(
            OURS,
            "ours (GPU build, our attention and accept, one CUDA graph)",
            GPU_BUILDER,
            OURS,
            OURS,
            "C3",
        ),
        *(_swap(base, kernel) for base in (_SGLANG_FA3, _SGLANG_TRITON) for kernel in STACK_KERNELS),
    )
}


#: The linear DFlash chain's round (``k26.chain``: upstream SGLang's, no tree), in the round job beside the
#: stacks: its rows are stack rows of this name at budget block - 1.
CHAIN = "chain"
CHAIN_LABEL = "linear DFlash chain (upstream SGLang: causal verify, its Triton accept)"
CHAIN_COLOR = "C2"


def stack_names() -> tuple[str, ...]:
    return tuple(STACKS)


# ----------------------------------------------------------------------------------------- step stages


@dataclass(frozen=True)
class Stage:
    """A step stage: one entry here plus one module (``module``, e.g. ``ddtree_bench.stages.attention``),
    which exports a frozen ``Job`` (``Job.grid(settings)``: the wildcards of every job the configuration
    runs; ``Job.from_settings(settings, **wildcards)``; ``job.inputs``: the files it loads) and
    ``run(job) -> rows``.

    ``records``: each ``stage`` value its rows carry, with every impl such rows may name (the rows saying why
    a stage cannot run name these). ``path``: its result file under ``results/<machine>/``, its wildcards in
    braces (the rule's wildcards). ``per_budget``: one job runs every step budget and writes a file per
    budget (``run`` returns ``{budget: rows}``; ``{budget}`` is in ``path``). ``gpu``: whether a job needs
    a GPU (without one, the stage writes one file of rows saying why). ``switch``: the setting that turns it
    on beside ``step.enabled`` (``step.<switch>.enabled``; None: none). ``description``: its rule's
    docstring."""

    name: str
    module: str
    records: dict[str, tuple[str, ...]]
    path: str
    description: str
    per_budget: bool = False
    gpu: bool = True
    switch: str | None = None

    @property
    def rule(self) -> str:
        return f"step_{self.name}"


_STAGES = "ddtree_bench.stages."
#: The builders a whole round runs, by how its round moves the trees: on the device (one CUDA graph), then
#: through pageable copies, then pinned ones (``k26.round``).
ROUND_BUILDERS = tuple(
    b for copies in (DEVICE, PAGEABLE, PINNED) for b in BUILDERS if BUILDERS[b].copies == copies
)

#: Every step stage, in the order they run and the report lists them.
STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage(
            "attention",
            _STAGES + "attention",
            {"verify-attention": ATTENTION_IMPLS},
            "step/attention/{distribution}-L{depth}-N{budget}-B{batch}-S{prefix}-H{heads}.parquet",
            "Time the tree-verify attention of one (budget, batch, prefix length, heads): every impl, same "
            "inputs.",
        ),
        Stage(
            "accept",
            _STAGES + "accept",
            {"accept": ("gpu-kernel", "gpu-host-inclusive", "cpu-walk", "floor")},
            "step/accept/{distribution}-L{depth}-N{budget}-B{batch}.parquet",
            "Time the tree accept of one (budget, batch): GPU kernel, host-inclusive, CPU walk, empty-kernel "
            "floor.",
        ),
        Stage(
            "peaks",
            _STAGES + "peaks",
            {"peak": ("bf16-gemm", "device-copy", "floor")},
            "step/peaks.parquet",
            "The GPU's measured peaks, once per machine: bf16 GEMM, device copy, the empty-kernel floor.",
        ),
        Stage(
            "model",
            _STAGES + "model",
            {"forward": MOE_IMPLS, "moe": MOE_IMPLS, "dense": ("torch",), "lm-head": ("torch",)},
            "step/model/{distribution}-L{depth}-N{budget}-B{batch}-S{prefix}.parquet",
            "The target's verify forward on one GPU's share of Kimi K2.6 and (smallest prefix) its parts: "
            "every budget.",
            per_budget=True,
            switch="model",
        ),
        Stage(
            "draft",
            _STAGES + "draft",
            {"draft": ("torch",)},
            "step/draft/N{budget}-B{batch}-S{prefix}.parquet",
            "The drafter's forward, LM-head shard, normaliser and top-K at one (batch, prefix): every "
            "budget.",
            per_budget=True,
            switch="draft",
        ),
        Stage(
            "allreduce",
            _STAGES + "allreduce",
            {"allreduce": ("nccl",)},
            "step/allreduce/N{budget}-B{batch}.parquet",
            "The round's tensor-parallel collectives with NCCL on this host's GPUs at one batch: every "
            "budget.",
            per_budget=True,
            switch="allreduce",
        ),
        Stage(
            "round",
            _STAGES + "round",
            {"round": ROUND_BUILDERS, "stack": (*STACKS, CHAIN)},
            "step/round/N{budget}-B{batch}-S{prefix}.parquet",
            "Whole rounds per builder and per stack at one (batch, prefix): every budget.",
            per_budget=True,
            switch="round",
        ),
    )
}


def stage_names() -> tuple[str, ...]:
    return tuple(STAGES)


def record_stages() -> dict[str, tuple[str, ...]]:
    """Every record stage (a row's ``stage``) of every step stage, with its impls, in the stages' order."""
    return {record: impls for s in STAGES.values() for record, impls in s.records.items()}


# ----------------------------------------------------------------------------------------- report figures


@dataclass(frozen=True)
class Figure:
    """A report figure: its file name, the heading above it, what it shows (the caption's first sentence),
    the function that draws it (``draw``: "module:function", called with the report model's inputs and the
    PNG's path; it returns the rest of the caption), and where it goes: "answer" (under the answer's tables),
    "stacks" (in the section on what the three kernels are worth), "figures", or "collapsed" (in a
    <details>). ``section``: what it is drawn from ("build": the tree build's timings and shapes;
    "acceptance", "throughput", "step", "stacks"). ``per_builder``: at most one line per
    builder in each panel."""

    name: str
    title: str
    caption: str
    draw: str
    place: str = "figures"
    section: str = "build"
    per_builder: bool = False


_REPORT = "ddtree_bench.report."

#: Every figure, in the report's page order. One question each.
FIGURES: dict[str, Figure] = {
    f.name: f
    for f in (
        Figure(
            "tree_or_chain",
            "Tree or chain: tokens/s against batch, over SGLang's tree round",
            "Ours (tree) and the linear DFlash chain over SGLang's DDTree round (tree), each at its best "
            "budget, on one GPU's share of K2.6 with the tensor-parallel terms estimated.",
            _REPORT + "stacks:chain_figure_for_report",
            "stacks",
            "stacks",
        ),
        Figure(
            "stacks",
            "Tokens/s per stack and budget, and SGLang's round to ours",
            "Whole K2.6 rounds per stack (SGLang's DDTree round as its fork's worker runs it, ours, one-"
            "kernel swaps) and the linear DFlash chain.",
            _REPORT + "stacks:figure_for_report",
            "stacks",
            "stacks",
        ),
        Figure(
            "step_share",
            "The tree build's share of the round's measured part",
            "Tree build (in-situ) as a % of build + verify attention (all layers) + accept, a line per "
            "builder; the drafter, MoE/MLP and LM head are not in this sum.",
            _REPORT + "step:figure_for_report",
            "answer",
            "step",
            per_builder=True,
        ),
        Figure(
            "time_vs_budget",
            "What each builder's tree build costs, per budget",
            "Median per call, p10-p90 band, one line per builder: in-situ (what the decode round pays: "
            "from the drafter's top-K on the GPU to the padded tree on the GPU) where the machine measured "
            "it, else per call (CPU builders by wall clock, gpu by CUDA events).",
            _REPORT + "figures:figure_time_vs_budget",
            per_builder=True,
        ),
        Figure(
            "speedup",
            "Speedup over SGLang's builder",
            "Each builder's median over the baseline's (same budget, batch, trace), one line per builder; "
            "the dashed line is 1x.",
            _REPORT + "figures:figure_speedup",
            per_builder=True,
        ),
        Figure(
            "time_vs_batch",
            "Does batching amortise the build?",
            "Per-tree time at the larger batch over per-tree time at batch 1, one line per builder: below "
            "1, a batch builds each tree cheaper than one request at a time.",
            _REPORT + "figures:figure_time_vs_batch",
            per_builder=True,
        ),
        Figure(
            "timing_variants",
            "Timing variants",
            "Every timing of every builder (kernel only, CUDA-graph replay, host-inclusive, packed bits, "
            "launch + synchronise, wall clock, in-situ): a panel per builder, a line per timing.",
            _REPORT + "figures:figure_timing_variants",
            "collapsed",
        ),
        Figure(
            "which_budget",
            "Which budget? Modelled tokens/s",
            "Modelled tokens/s = B x tau(N) / round per builder (star: each builder's best budget).",
            _REPORT + "throughput:figure_for_report",
            section="throughput",
            per_builder=True,
        ),
        Figure(
            "round_parts",
            "The round's parts per budget",
            "Draft, tree build, verify attention, MoE, dense, LM head, communication and accept, stacked; "
            "bars: gpu | fastest other CPU builder | sglang; hatched parts are estimated or entered, not "
            "measured.",
            _REPORT + "throughput:figure_round_parts_for_report",
            section="throughput",
        ),
        Figure(
            "tree_shape",
            "Tree shape",
            "Nodes per depth of reference's trees (mean over all requests of each trace), a line per budget.",
            _REPORT + "figures:figure_tree_shape_for_report",
        ),
        Figure(
            "acceptance_tau",
            "tau per budget beside the DDTree paper",
            "tau (tokens per verify round, bonus included): expected (lines), simulated (x, 2 s.e.), beside "
            "the DDTree paper's Fig. 3.",
            _REPORT + "acceptance:figure_tau_for_report",
            section="acceptance",
        ),
        Figure(
            "acceptance_histogram",
            "Per-round acceptance",
            "P(tau >= k) of the simulated rounds (drafter equals target) beside the paper's Fig. 4.",
            _REPORT + "acceptance:figure_histogram_for_report",
            section="acceptance",
        ),
    )
}


def figure_names() -> tuple[str, ...]:
    return tuple(FIGURES)
