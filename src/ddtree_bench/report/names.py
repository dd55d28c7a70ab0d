"""Every name the report declares once: the series (builder, timing) and their colours, the builders and their
styles, the answer's columns, and the figures in page order (name, title, caption, maker)."""

from __future__ import annotations

from dataclasses import dataclass

#: How each (builder, timing) is named in figures and tables. ``reference`` is ours, never SGLang.
SERIES_NAMES = {
    ("sglang", "wall"): "sglang (SGLang's CPU builder)",
    ("reference", "wall"): "reference (ours, Python)",
    ("native", "wall"): "native (C++, 1 thread)",
    ("native-mt", "wall"): "native-mt (C++, all cores)",
    ("gpu", "kernel-events"): "gpu kernel (CUDA events)",
    ("gpu", "graph-replay"): "gpu CUDA-graph replay",
    ("gpu", "host-inclusive"): "gpu host-inclusive (secondary: copies in + out)",
    ("gpu", "wall"): "gpu (wall)",
    ("gpu", "kernel-events-packed"): "gpu kernel, packed bits only (CUDA events)",
    # in-situ (insitu_bench): from the drafter's top-K on the GPU to the padded tree on the GPU
    ("sglang", "in-situ"): "sglang in-situ (pageable copies)",
    ("reference", "in-situ"): "reference in-situ (pageable copies)",
    ("native", "in-situ"): "native in-situ (pinned copies)",
    ("native-mt", "in-situ"): "native-mt in-situ (pinned copies)",
    ("gpu", "in-situ"): "gpu in-situ (graph replay, bool mask)",
    ("gpu", "in-situ-packed"): "gpu in-situ (graph replay, packed bits)",
    ("gpu", "in-situ-launch-sync"): "gpu launch + sync wall (secondary, bool mask)",
    ("gpu", "in-situ-launch-sync-packed"): "gpu launch + sync wall (secondary, packed bits)",
}
SERIES_ORDER = list(SERIES_NAMES.values())
#: One colour per series in the timing-variants figure (SERIES_NAMES' order).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#d62728", "#8c564b", "#e377c2", "#17becf")
PALETTE += ("#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#ff9896", "#c49c94", "#f7b6d2", "#9edae5")
PALETTE += ("#7f7f7f",)
SERIES_COLORS = dict(zip(SERIES_ORDER, PALETTE, strict=True))
BASELINE_NAMES = {"sglang": "SGLang's CPU builder", "reference": "reference (ours)"}
#: The timing values of the in-situ rows (what the decode round pays; ``insitu_bench``).
IN_SITU_TIMINGS = ("in-situ", "in-situ-packed", "in-situ-launch-sync", "in-situ-launch-sync-packed")

#: The builders, in legend order, with their name in figures and their (colour, marker, line style): one
#: line per builder in every main figure, the same on every machine.
BUILDER_STYLES = {
    "sglang": ("#1f77b4", "o", "-"),
    "reference": ("#ff7f0e", "s", "--"),
    "native": ("#2ca02c", "^", "-."),
    "native-mt": ("#9467bd", "D", ":"),
    "gpu": ("#d62728", "v", "-"),
}
BUILDER_LABELS = {
    "sglang": "sglang (SGLang's function)",
    "reference": "reference (ours, Python)",
    "native": "native (C++, 1 thread)",
    "native-mt": "native-mt (C++, all cores)",
    "gpu": "gpu (our CUDA kernel)",
}
CPU_BUILDERS = ("sglang", "reference", "native", "native-mt")
#: Each builder's one line in the main figures: its in-situ series where the machine has in-situ rows
#: (what the decode round pays), else its per-call timing (CPU builders: wall clock; gpu: kernel events).
PER_CALL_TIMING = {
    "sglang": "wall",
    "reference": "wall",
    "native": "wall",
    "native-mt": "wall",
    "gpu": "kernel-events",
}

#: The in-situ build labels of the step breakdown (``summary.step.BUILD_LABELS``), in column order, with the
#: builder each one is and the column name of the answer's tables.
IN_SITU_COLUMNS = (
    ("sglang in-situ", "sglang", "SGLang's function"),
    ("reference in-situ", "reference", "reference (ours, Python)"),
    ("native in-situ", "native", "native (C++, 1 thread)"),
    ("native-mt in-situ", "native-mt", "native-mt (C++, all cores)"),
    ("gpu in-situ (graph replay)", "gpu", "gpu (our CUDA kernel)"),
)


@dataclass(frozen=True)
class FigureSpec:
    """One figure: its file name, the heading above it, what it shows (the caption's first sentence), the
    function that draws it (``module:function`` in ``ddtree_bench.report``; it takes the model's inputs and
    the path, and returns the rest of the caption), and where it goes."""

    name: str
    title: str
    caption: str
    maker: str
    place: str = "figures"  # "answer" (under the answer's tables), "figures", or "collapsed" (in <details>)


#: The figures in page order. One question each.
FIGURES = (
    FigureSpec(
        "step_share",
        "The tree build's share of the round's measured part",
        "Tree build (in-situ) as a % of build + verify attention (all layers) + accept, a line per builder; "
        "the drafter, MoE/MLP and LM head are not in this sum.",
        "step:figure_for_report",
        "answer",
    ),
    FigureSpec(
        "time_vs_budget",
        "What each builder's tree build costs, per budget",
        "Median per call, p10-p90 band, one line per builder: in-situ (what the decode round pays: from the "
        "drafter's top-K on the GPU to the padded tree on the GPU) where the machine measured it, else per "
        "call (CPU builders by wall clock, gpu by CUDA events).",
        "figures:figure_time_vs_budget",
    ),
    FigureSpec(
        "speedup",
        "Speedup over SGLang's builder",
        "Each builder's median over the baseline's (same budget, batch, trace), one line per builder; the "
        "dashed line is 1x.",
        "figures:figure_speedup",
    ),
    FigureSpec(
        "time_vs_batch",
        "Does batching amortise the build?",
        "Per-tree time at the larger batch over per-tree time at batch 1, one line per builder: below 1, a "
        "batch builds each tree cheaper than one request at a time.",
        "figures:figure_time_vs_batch",
    ),
    FigureSpec(
        "timing_variants",
        "Timing variants",
        "Every timing of every builder (kernel only, CUDA-graph replay, host-inclusive, packed bits, launch "
        "+ synchronise, wall clock, in-situ): a panel per builder, a line per timing.",
        "figures:figure_timing_variants",
        "collapsed",
    ),
    FigureSpec(
        "which_budget",
        "Which budget? Modelled tokens/s",
        "Modelled tokens/s = B x tau(N) / round per builder (star: each builder's best budget).",
        "throughput:figure_for_report",
    ),
    FigureSpec(
        "round_parts",
        "The round's parts per budget",
        "Draft, tree build, verify attention, MoE, dense, LM head, communication and accept, stacked; bars: "
        "gpu | fastest other CPU builder | sglang; hatched parts are estimated or entered, not measured.",
        "throughput:figure_round_parts_for_report",
    ),
    FigureSpec(
        "tree_shape",
        "Tree shape",
        "Nodes per depth of reference's trees (mean over all requests of each trace), a line per budget.",
        "figures:figure_tree_shape_for_report",
    ),
    FigureSpec(
        "acceptance_tau",
        "tau per budget beside the DDTree paper",
        "tau (tokens per verify round, bonus included): expected (lines), simulated (x, 2 s.e.), beside the "
        "DDTree paper's Fig. 3.",
        "acceptance:figure_tau_for_report",
    ),
    FigureSpec(
        "acceptance_histogram",
        "Per-round acceptance",
        "P(tau >= k) of the simulated rounds (drafter equals target) beside the paper's Fig. 4.",
        "acceptance:figure_histogram_for_report",
    ),
)
FIGURE_NAMES = tuple(spec.name for spec in FIGURES)
#: The figures of the tree build (drawn from summary.parquet).
BUILD_FIGURES = ("time_vs_budget", "time_vs_batch", "speedup", "timing_variants", "tree_shape")
#: The main figures: at most one line per builder in each panel.
PER_BUILDER_FIGURES = ("step_share", "time_vs_budget", "speedup", "time_vs_batch", "which_budget")
