"""The report's step part: the verify attention and tree accept tables, the GPU's peaks, the step-time
breakdown (table and figure), the expected acceptance per budget, and the goals of verify attention and
tree accept.

Everything here takes a machine's step summary (``step.summarize_steps``; empty where the machine has none,
e.g. a publication from before the step stages) and gives DataFrames or text; ``report`` renders them.
"""

from __future__ import annotations

import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.config import STREAM_IMPL
from ddtree_bench.report.document import Bullets, Section, Table, Text
from ddtree_bench.report.figures import (
    budget_axis,
    builder_facets,
    builder_series,
    empty_figure,
    facet_panels,
    finish,
    log_y,
)
from ddtree_bench.report.fmt import fmt_us, missing, regime
from ddtree_bench.summary.step import (
    BUILD_LABELS,
    BUILD_SERIES,
    IN_SITU_BUILD_SERIES,
    LEFT_OUT,
    expected_acceptance,
    preferred,
    step_breakdown,
)

__all__ = [
    "LEFT_OUT",
    "accept_table",
    "acceptance_table",
    "acceptance_from_accept",
    "attention_table",
    "breakdown_table",
    "figure_step_share",
    "fmt_us",
    "peaks_line",
    "backends_line",
    "step_targets",
]

STEP_SOURCE = "tree accept"
TARGET_ACCEPT = "tree accept (GPU kernel) <= 2x the empty-kernel floor at batch 64, every budget <= 1024"
STEP_TARGETS = (TARGET_ACCEPT,)

# The real peers in the same run (attention_peers: FlashMLA, causal with no tree mask; SGLang's Triton
# extend-attention kernel and its FA3 two-pass tree verify, both with the tree mask), evaluated on the run's
# own rows
PEER_SOURCE = "verify attention"
OUR_IMPLS = (catalog.OURS, catalog.OURS_MMA)
#: a call is compute-bound once its query rows B·(N+1)·H reach this: then its row tiles fill the GPU and the
#: tensor cores set the pace. With fewer (on the H200 grid: B = 1 at N = 64 and 256, 520 and 2056 rows) the
#: few row tiles do, whatever the kernel
COMPUTE_BOUND_ROWS = 4096
TARGET_VS_FLASHMLA = (
    "verify attention (ours, tree mask) >= 1.0x FlashMLA (causal, no tree mask) at every shape FlashMLA runs"
)
TARGET_COMPUTE_700 = (
    "verify attention (ours) >= 700 TFLOP/s at every compute-bound shape "
    f"(B·(N+1)·H >= {COMPUTE_BOUND_ROWS} query rows) with N >= 64, S = 32768"
)
TARGET_STREAM_85 = (
    "verify attention (ours) >= 85% of the read stream's rate (same run) at N = 8, S = 32768, batch >= 8"
)
TARGET_VS_SGLANG = "verify attention (ours) >= 10x SGLang's Triton tree kernel (custom_mask) at every shape"
#: batch 1 at S = 4096 is latency-bound: a layer's time against the read stream of its bytes
BATCH1_STREAM_FACTOR, BATCH1_STREAM_PREFIX, BATCH1_STREAM_MAX_BUDGET = 2.0, 4096, 64
TARGET_BATCH1_STREAM = (
    f"verify attention (ours) within {BATCH1_STREAM_FACTOR:g}x the read stream (same run) at batch 1, "
    f"S = {BATCH1_STREAM_PREFIX}, every budget <= {BATCH1_STREAM_MAX_BUDGET}"
)
# Verify attention at the memory limit, where the round spends it (its best budgets, 8 to 32): the call's
# bytes against the read stream at batch 1, FlashMLA at batch 8, the tensor cores at batch 64
LIMIT_BUDGETS = (8, 16, 32)
LIMIT_B1_PREFIX, LIMIT_B8_FLASHMLA, LIMIT_B64_TFLOPS = 32768, 1.15, 600.0
TARGET_LIMIT_B1 = (
    f"verify attention (ours) within {BATCH1_STREAM_FACTOR:g}x the read stream (same run) at batch 1, "
    f"S = {LIMIT_B1_PREFIX}, N = 8, 16 and 32"
)
TARGET_LIMIT_B8 = (
    f"verify attention (ours, tree mask) >= {LIMIT_B8_FLASHMLA:g}x FlashMLA at batch 8, N = 8 to 32, "
    "S = 4096 and 32768"
)
TARGET_LIMIT_B64 = f"verify attention (ours) >= {LIMIT_B64_TFLOPS:g} TFLOP/s at batch 64, N = 16, S = 4096"
PEER_TARGETS = (
    TARGET_VS_FLASHMLA,
    TARGET_COMPUTE_700,
    TARGET_STREAM_85,
    TARGET_VS_SGLANG,
    TARGET_BATCH1_STREAM,
    TARGET_LIMIT_B1,
    TARGET_LIMIT_B8,
    TARGET_LIMIT_B64,
)


# ----------------------------------------------------------------------------------------------- format


def _band(median, p10, p90) -> str:
    if missing(median):
        return "-"
    return f"{fmt_us(median)} [{fmt_us(p10)}-{fmt_us(p90)}]"


def _num(value, digits: int = 1, suffix: str = "") -> str:
    if missing(value):
        return "-"
    return f"{float(value):,.{digits}f}{suffix}"


def _pct(value) -> str:
    if missing(value):
        return "-"
    value = float(value)
    return f"{value:.1f}%" if value >= 1 else f"{value:.2g}%"


def _all(value) -> str:
    """Grid values of an "every configuration" row (0 or null) as "all"."""
    if missing(value) or value == 0:
        return "all"
    return str(int(value))


BACKEND_PREFIX = "backend: "


def _backends(reason) -> list[str]:
    """The backends a status reason records: its "backend: ..." parts (aggregates join reasons with "; ")."""
    if missing(reason):
        return []
    return [r[len(BACKEND_PREFIX) :] for r in str(reason).split("; ") if r.startswith(BACKEND_PREFIX)]


def _backend(row) -> str:
    """How a measured row's impl ran (our kernel's path and tiles, a peer's PyTorch backend), or "-"."""
    if row["status"] != "ok":
        return "-"
    return " / ".join(_backends(row.get("status_reason"))) or "-"


def _status(row) -> str:
    if row["status"] == "ok":
        correct = row.get("correct")
        return "ok, output WRONG" if not missing(correct) and not bool(correct) else "ok"
    reason = row.get("status_reason")
    return f"{row['status']}: {reason}" if not missing(reason) else str(row["status"])


# ----------------------------------------------------------------------------------------------- tables


def _not_ok(step: pd.DataFrame, stage: str) -> pd.DataFrame:
    if step.empty:
        return step
    return step[(step["stage"] == stage) & (step["status"] != "ok")]


_ATTENTION_COLUMNS = (
    "machine",
    "impl",
    "B",
    "N",
    "S",
    "H",
    "median [p10-p90] per layer",
    "timed",
    "as launched (eager)",
    "TFLOP/s",
    "TB/s",
    "% GEMM peak",
    "% copy peak",
    "vs flexattention",
    "% of read stream",
    "mask",
    "ours / FlashMLA",
    "ours / SGLang Triton",
    "ours / SGLang FA3",
    "kernel",
    "status",
)
#: How a verify-attention row's call was timed (its ``timing``): the layer's call replayed from a CUDA
#: graph, as a round runs it, or as launched (a PyTorch peer's launches then cost host time a graph does not).
TIMED_AS = {"cuda-graph": "graph replay", "cuda-events": "as launched"}
#: The attention rows' keys: one shape of one run, which an impl's row and its peers' share.
_SHAPE_KEYS = ["batch", "budget", "prefix", "heads", "depth", "distribution"]


def attention_table(step: pd.DataFrame, machine: str) -> pd.DataFrame:
    """Every verify-attention configuration of one machine (warm device time where measured): median
    [p10-p90] per layer, TFLOP/s, TB/s, their % of the GPU's peaks, speedup over FlexAttention, the mask
    the impl applies, on our kernel's rows its speed over FlashMLA's and SGLang Triton's (their time over
    ours, same shape, same run), how the impl ran (its rows' recorded backend) and status."""
    columns = list(_ATTENTION_COLUMNS)
    rows = _attention_rows(step)
    if rows.empty:
        return pd.DataFrame(columns=columns)
    return pd.DataFrame(
        {
            "machine": machine,
            "impl": rows["impl"],
            "B": rows["batch"].map(_all),
            "N": rows["budget"].map(_all),
            "S": rows["prefix"].map(_all),
            "H": rows["heads"].map(_all),
            "median [p10-p90] per layer": [
                _band(m, a, b) for m, a, b in zip(rows["median_s"], rows["p10_s"], rows["p90_s"], strict=True)
            ],
            "timed": rows["timing"].map(TIMED_AS).fillna("-"),
            "as launched (eager)": [
                fmt_us(e) if t == "cuda-graph" and not missing(e) else "-"
                for t, e in zip(rows["timing"], rows["eager_s"], strict=True)
            ],
            "TFLOP/s": rows["median_tflops"].map(lambda v: _num(v, 1)),
            "TB/s": rows["median_tbps"].map(lambda v: _num(v, 2)),
            "% GEMM peak": rows["pct_gemm_peak"].map(_pct),
            "% copy peak": rows["pct_copy_peak"].map(_pct),
            "vs flexattention": [
                "-"
                if impl in (catalog.FLEXATTENTION, STREAM_IMPL) or missing(f) or missing(m)
                else f"{f / m:.2f}x"
                for impl, f, m in zip(rows["impl"], rows["flex_s"], rows["median_s"], strict=True)
            ],
            "% of read stream": [
                "-" if impl == STREAM_IMPL or missing(r) or missing(m) else _pct(100.0 * r / m)
                for impl, r, m in zip(rows["impl"], rows["stream_s"], rows["median_s"], strict=True)
            ],
            "mask": [_mask(row) for _, row in rows.iterrows()],
            "ours / FlashMLA": _ours_over(rows, "flashmla_s"),
            "ours / SGLang Triton": _ours_over(rows, "sglang_s"),
            "ours / SGLang FA3": _ours_over(rows, "fa3_s"),
            "kernel": [_backend(row) for _, row in rows.iterrows()],
            "status": [_status(row) for _, row in rows.iterrows()],
        },
        columns=columns,
    ).reset_index(drop=True)


def _attention_rows(step: pd.DataFrame) -> pd.DataFrame:
    """The verify-attention rows (measured and not ok), each with the same shape's times of FlexAttention
    (``flex_s``), the read stream (``stream_s``), FlashMLA (``flashmla_s``), SGLang's Triton kernel
    (``sglang_s``) and its FA3 (``fa3_s``), sorted by prefix, heads, batch, budget and impl."""
    if step is None or step.empty:
        return pd.DataFrame()
    measured = preferred(step)
    measured = measured[measured["stage"] == "verify-attention"]
    rows = pd.concat([measured, _not_ok(step, "verify-attention")], ignore_index=True)
    if rows.empty:
        return rows
    keys = _SHAPE_KEYS
    flex = measured[measured["impl"] == catalog.FLEXATTENTION][keys + ["median_s"]].rename(
        columns={"median_s": "flex_s"}
    )
    stream = measured[measured["impl"] == STREAM_IMPL][keys + ["median_s"]].rename(
        columns={"median_s": "stream_s"}
    )
    rows = rows.merge(flex, on=keys, how="left").merge(stream, on=keys, how="left")
    ok = step[(step["stage"] == "verify-attention") & (step["status"] == "ok")]
    eager = ok[(ok["timing"] == "cuda-events") & (ok["cache"] == "warm")][[*keys, "impl", "median_s"]]
    rows = rows.merge(
        eager.rename(columns={"median_s": "eager_s"}).drop_duplicates([*keys, "impl"]),
        on=[*keys, "impl"],
        how="left",
    )
    for impl, column in (
        (catalog.FLASHMLA, "flashmla_s"),
        (catalog.SGLANG_TRITON_ATTENTION, "sglang_s"),
        (catalog.SGLANG_FA3_ATTENTION, "fa3_s"),
    ):
        peer = measured[measured["impl"] == impl][keys + ["median_s"]].rename(columns={"median_s": column})
        rows = rows.merge(peer.drop_duplicates(keys), on=keys, how="left")
    return rows.sort_values(["prefix", "heads", "batch", "budget", "impl"], na_position="first")


def _mask(row) -> str:
    """The mask an attention row's impl applies: its recorded ``mask``, or for a summary from before the
    column was kept, the impl's (every impl then applied the tree mask; the read stream none)."""
    value = row.get("mask")
    if not missing(value):
        return str(value)
    if row["impl"] == STREAM_IMPL:
        return "-"
    from ddtree_bench.ops.attention_peers import PEER_MASKS, TREE_MASK  # noqa: PLC0415

    return PEER_MASKS.get(row["impl"], TREE_MASK)


def _ours_over(rows: pd.DataFrame, peer_column: str) -> list[str]:
    """On our kernel's rows: the peer's median time over ours (how many times faster ours is; > 1: ours is
    faster); "-" on other rows and where either did not run."""
    return [
        f"{p / m:.2f}x" if impl in OUR_IMPLS and not missing(p) and not missing(m) and m > 0 else "-"
        for impl, p, m in zip(rows["impl"], rows[peer_column], rows["median_s"], strict=True)
    ]


def accept_table(step: pd.DataFrame, machine: str) -> pd.DataFrame:
    """Every tree-accept configuration of one machine: median [p10-p90], the GPU kernel as a multiple of the
    empty-kernel floor of the same run, the mean accepted length and expected acceptance, status."""
    columns = [
        "machine",
        "impl",
        "timing",
        "B",
        "N",
        "median [p10-p90]",
        "x floor",
        "tokens committed, bonus included (mean of these draws)",
        "E[accepted draft tokens] (mean)",
        "status",
    ]
    if step is None or step.empty:
        return pd.DataFrame(columns=columns)
    measured = preferred(step)
    measured = measured[measured["stage"] == "accept"]
    rows = pd.concat([measured, _not_ok(step, "accept")], ignore_index=True)
    if rows.empty:
        return pd.DataFrame(columns=columns)
    floors = _accept_floors(step)
    rows = rows.merge(floors, on=["batch", "budget"], how="left")
    order = {"gpu-kernel": 0, "gpu-host-inclusive": 1, "cpu-walk": 2, "floor": 3}
    rows = rows.assign(_order=rows["impl"].map(order)).sort_values(["batch", "budget", "_order"])
    return pd.DataFrame(
        {
            "machine": machine,
            "impl": rows["impl"],
            "timing": rows["timing"].fillna("-"),
            "B": rows["batch"].map(_all),
            "N": rows["budget"].map(_all),
            "median [p10-p90]": [
                _band(m, a, b) for m, a, b in zip(rows["median_s"], rows["p10_s"], rows["p90_s"], strict=True)
            ],
            "x floor": [
                f"{m / f:.2f}x" if impl == "gpu-kernel" and not missing(m) and not missing(f) else "-"
                for impl, m, f in zip(rows["impl"], rows["median_s"], rows["floor_s"], strict=True)
            ],
            columns[7]: rows["accept_length_mean"].map(lambda v: _num(v, 2)),
            columns[8]: rows["expected_accept_mean"].map(lambda v: _num(v, 2)),
            "status": [_status(row) for _, row in rows.iterrows()],
        },
        columns=columns,
    ).reset_index(drop=True)


def _accept_floors(step: pd.DataFrame) -> pd.DataFrame:
    """Per (batch, budget): the empty-kernel floor to compare the accept kernel with: the accept job's own
    (same run), else the peaks job's."""
    measured = preferred(step)
    own = measured[(measured["stage"] == "accept") & (measured["impl"] == "floor")]
    own = own[["batch", "budget", "median_s"]].rename(columns={"median_s": "floor_s"})
    accepts = measured[(measured["stage"] == "accept") & (measured["impl"] == "gpu-kernel")]
    grid = accepts[["batch", "budget"]].drop_duplicates().merge(own, on=["batch", "budget"], how="left")
    peak = _peak_floor(step)
    if peak is not None:
        grid["floor_s"] = grid["floor_s"].fillna(peak)
    return grid.drop_duplicates(["batch", "budget"])


def _peak_floor(step: pd.DataFrame) -> float | None:
    values = step["peak_floor_s"].dropna() if "peak_floor_s" in step else pd.Series(dtype=float)
    return float(values.iloc[0]) if len(values) else None


def peaks_line(step: pd.DataFrame) -> str:
    """The GPU's measured peaks (the denominators of the attention's % columns), or why there are none."""
    if step is None or step.empty:
        return "no data"
    values = {}
    for column in ("peak_gemm_tflops", "peak_copy_tbps", "peak_floor_s"):
        present = step[column].dropna() if column in step else pd.Series(dtype=float)
        values[column] = float(present.iloc[0]) if len(present) else None
    if all(v is None for v in values.values()):
        bad = step[(step["stage"] == "peak") & (step["status"] != "ok")]
        reason = "; ".join(sorted({str(r) for r in bad["status_reason"].dropna()}))
        return f"not measured ({reason})" if reason else "not measured"
    gemm, copy, floor = values["peak_gemm_tflops"], values["peak_copy_tbps"], values["peak_floor_s"]
    return (
        f"bf16 GEMM {_num(gemm, 0)} TFLOP/s, device copy {_num(copy, 2)} TB/s, "
        f"empty-kernel floor {fmt_us(floor)} (medians of this machine's peak job, the same run)"
    )


def backends_line(step: pd.DataFrame) -> str:
    """How each verify-attention impl ran, from the backend its measured rows record (our kernel's path; a
    peer's PyTorch backend and any kernel options it was given), or "" where none is recorded."""
    if step is None or step.empty:
        return ""
    rows = step[(step["stage"] == "verify-attention") & (step["status"] == "ok")]
    parts = []
    for impl in sorted(rows["impl"].dropna().unique()):
        reasons = rows.loc[rows["impl"] == impl, "status_reason"].dropna()
        backends = sorted({backend for r in reasons for backend in _backends(r)})
        if backends:
            parts.append(f"{impl}: {' / '.join(backends)}")
    return "; ".join(parts)


def breakdown_table(breakdown: pd.DataFrame, machine: str, layers: int) -> pd.DataFrame:
    """One row per (S, H, B, N): the budget's expected acceptance, attention x layers, accept, and per
    builder "build time (share of build + attention + accept)"."""
    if breakdown is None or breakdown.empty:
        return pd.DataFrame()
    keys = ["prefix", "heads", "batch", "budget"]
    first = breakdown.drop_duplicates(keys).set_index(keys)
    table = pd.DataFrame(
        {
            "machine": machine,
            "S": first.index.get_level_values("prefix"),
            "H": first.index.get_level_values("heads"),
            "B": first.index.get_level_values("batch"),
            "N": first.index.get_level_values("budget"),
            "E[accepted], this batch's requests": first["expected_accept_mean"]
            .map(lambda v: _num(v, 2))
            .to_numpy(),
            f"attention x {layers}": first["attention_s"].map(fmt_us).to_numpy(),
            "accept": first["accept_s"].map(fmt_us).to_numpy(),
        }
    )
    labels = list(BUILD_LABELS)
    present = [label for label in labels if label in set(breakdown["builder"].dropna())]
    for label in present:
        sel = breakdown[breakdown["builder"] == label].set_index(keys)
        sel = sel.reindex(first.index)
        table[f"{label}: build (share)"] = [
            "-" if missing(b) else f"{fmt_us(b)} ({_pct(100 * s)})" if not missing(s) else fmt_us(b)
            for b, s in zip(sel["build_s"], sel["share"], strict=True)
        ]
    return table.reset_index(drop=True)


def acceptance_table(shapes: pd.DataFrame, machine: str, depth=None, distribution=None) -> pd.DataFrame:
    """What a larger budget buys: per budget, the expected accepted draft tokens of reference's trees."""
    accepts = expected_acceptance(shapes, depth, distribution)
    if accepts.empty:
        return pd.DataFrame()
    return pd.DataFrame(
        {
            "machine": machine,
            "distribution": accepts["distribution"],
            "L": accepts["depth"],
            "N": accepts["budget"],
            "nodes": accepts["tree_nodes_mean"].map(lambda v: _num(v, 1)),
            "E[accepted draft tokens] mean [p10-p90]": [
                f"{m:.2f} [{a:.2f}-{b:.2f}]"
                for m, a, b in zip(
                    accepts["expected_accept_mean"],
                    accepts["expected_accept_p10"],
                    accepts["expected_accept_p90"],
                    strict=True,
                )
            ],
        }
    )


def breakdown_for(machine, *, layers: int, depth=None, distribution=None) -> pd.DataFrame:
    """``step.step_breakdown`` of a report ``Machine`` (its build summary, step summary and shapes)."""
    return step_breakdown(
        machine.summary, machine.step, machine.shapes, layers=layers, depth=depth, distribution=distribution
    )


# ----------------------------------------------------------------------------------------------- figure


def figure_step_share(breakdowns: dict[str, pd.DataFrame], path) -> str:
    """The tree build's share of build + attention + accept vs budget, one line per builder (its in-situ
    build where measured); a panel per (machine, S) and batch size. ``breakdowns``: machine label ->
    ``step_breakdown``."""
    frames = [df.assign(machine=label) for label, df in breakdowns.items() if not df.empty]
    data = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if not data.empty:
        data = data[data["share"].notna()]
    if data.empty:
        empty_figure(path, "no step data: no step-time breakdown")
        return "No step data."
    heads = 8 if (data["heads"] == 8).any() else int(data["heads"].iloc[0])
    data = data[data["heads"] == heads]
    builder_of = {label: builder for builder, *_, label in IN_SITU_BUILD_SERIES + BUILD_SERIES}
    data = data.assign(
        builder_name=data["builder"],
        builder=data["builder"].map(builder_of),
        panel=[f"{m}: S = {p}" for m, p in zip(data["machine"], data["prefix"], strict=True)],
        percent=100 * data["share"],
    )
    # each builder's one line: its in-situ build where measured (the first of BUILD_LABELS present)
    rank = {label: k for k, label in enumerate(BUILD_LABELS)}
    data = data.assign(rank=data["builder_name"].map(rank))
    keys = ["panel", "batch", "builder"]
    data = data[data["rank"] == data.groupby(keys)["rank"].transform("min")]
    g = builder_facets(
        data, row="panel", col="batch", row_order=list(dict.fromkeys(data["panel"])), sharey=True
    )
    g.map_dataframe(builder_series, x="budget", y="percent", name="builder_name")
    ticks = sorted(int(b) for b in data["budget"].unique())
    for ax, panel in facet_panels(g, data, "panel", "batch"):
        budget_axis(ax, ticks)
        log_y(ax)
        ax.set_title(f"{panel['panel'].iloc[0]}, B = {panel['batch'].iloc[0]}")
    finish(
        g.figure,
        g.axes,
        path,
        xlabel="budget N (nodes per tree)",
        ylabel="tree build, % of build +\nverify attention x layers + accept",
    )
    return f"{heads} heads."


def figure_for_report(inputs, path) -> str:
    return figure_step_share(inputs.breakdowns, path)


# ----------------------------------------------------------------------------------------------- targets


def _where(row) -> str:
    parts = [f"N={int(row['budget'])}", f"B={int(row['batch'])}"]
    if not missing(row.get("prefix")):
        parts.append(f"S={int(row['prefix'])}")
    if not missing(row.get("heads")):
        parts.append(f"H={int(row['heads'])}")
    return ", ".join(parts)


def _wrong(sel: pd.DataFrame) -> int:
    correct = sel["correct"]
    return int((correct.notna() & ~correct.fillna(True).astype(bool)).sum())


def step_targets(step: pd.DataFrame, *, missing: str = "no step data") -> list[tuple[str, str, str, str]]:
    """The goals of tree accept and verify attention (against its real peers) on one machine's step summary:
    ``(target, source, status, measured)`` each, status
    met / not met / no data. ``missing``: what "measured" says where the machine has no step summary."""
    if step is None or step.empty:
        return [(target, STEP_SOURCE, "no data", missing) for target in STEP_TARGETS] + [
            (target, PEER_SOURCE, "no data", missing) for target in PEER_TARGETS
        ]
    measured = preferred(step)
    results = []

    accepts = measured[(measured["stage"] == "accept") & (measured["impl"] == "gpu-kernel")]
    sel = accepts[(accepts["batch"] == 64) & (accepts["budget"] <= 1024)]
    sel = sel.merge(_accept_floors(step), on=["batch", "budget"], how="left")
    if sel.empty:
        results.append((TARGET_ACCEPT, STEP_SOURCE, "no data", "no GPU accept timings at batch 64"))
    elif sel["floor_s"].isna().all():
        results.append((TARGET_ACCEPT, STEP_SOURCE, "no data", "no empty-kernel floor measured"))
    else:
        sel = sel[sel["floor_s"].notna()].assign(ratio=lambda d: d["median_s"] / d["floor_s"])
        worst = sel.loc[sel["ratio"].idxmax()]
        status = "met" if worst["ratio"] <= 2.0 else "not met"
        text = (
            f"worst {worst['ratio']:.2f}x the floor ({fmt_us(worst['median_s'])} vs "
            f"{fmt_us(worst['floor_s'])}; {_where(worst)}) over {len(sel)} budgets"
        )
        wrong = _wrong(sel)
        if wrong:
            status, text = "not met", f"{text}; output wrong at {wrong} budgets"
        results.append((TARGET_ACCEPT, STEP_SOURCE, status, text))
    return results + peer_targets(step)


def acceptance_from_accept(step: pd.DataFrame, machine: str) -> pd.DataFrame:
    """The expected acceptance the accept jobs recorded (their first ``B`` requests' trees), per budget and
    batch: for machines whose tree-shape table predates the expected acceptance."""
    rows = step[
        (step["stage"] == "accept") & (step["impl"] == "gpu-kernel") & step["expected_accept_mean"].notna()
    ]
    if rows.empty:
        return pd.DataFrame()
    rows = rows.drop_duplicates(["distribution", "depth", "budget", "batch"]).sort_values(["budget", "batch"])
    return pd.DataFrame(
        {
            "machine": machine,
            "distribution": rows["distribution"].to_numpy(),
            "L": rows["depth"].to_numpy(),
            "N": rows["budget"].to_numpy(),
            "requests": rows["batch"].to_numpy(),
            "E[accepted draft tokens] mean": rows["expected_accept_mean"]
            .map(lambda v: _num(v, 2))
            .to_numpy(),
        }
    )


# ------------------------------------------------------------------------------------ peer targets


def peer_targets(step: pd.DataFrame) -> list[tuple[str, str, str, str]]:
    """The targets against the real peers, each on this machine's own rows (the same run, the same
    inputs): ``(target, source, status, measured)``; a target not met says by how much (the worst shape's
    shortfall) and where it is met."""
    measured = preferred(step)
    attention = measured[measured["stage"] == "verify-attention"]
    ours = attention[attention["impl"] == catalog.OURS]
    stream = attention[(attention["impl"] == STREAM_IMPL) & attention["median_s"].notna()]
    compute_bound = ours[
        (ours["budget"] >= 64)
        & (ours["prefix"] == 32768)
        & (ours["batch"] * (ours["budget"] + 1) * ours["heads"] >= COMPUTE_BOUND_ROWS)
        & ours["median_tflops"].notna()
    ]
    wide = ours[(ours["budget"] == 8) & (ours["prefix"] == 32768) & (ours["batch"] >= 8)]
    batch1 = ours[
        (ours["batch"] == 1)
        & (ours["prefix"] == BATCH1_STREAM_PREFIX)
        & (ours["budget"] <= BATCH1_STREAM_MAX_BUDGET)
    ]
    return [
        _minimum(
            TARGET_VS_FLASHMLA,
            _pairs_with(attention, ours, catalog.FLASHMLA),
            "ratio",
            1.0,
            _times,
            "no shape where both ours and FlashMLA ran in this run",
            note="FlashMLA's time / ours; FlashMLA applies a causal mask, not the tree's",
        ),
        _minimum(
            TARGET_COMPUTE_700,
            compute_bound,
            "median_tflops",
            700.0,
            lambda v: f"{v:,.0f} TFLOP/s",
            f"no timings of ours at N >= 64, S = 32768 with B·(N+1)·H >= {COMPUTE_BOUND_ROWS}",
        ),
        _minimum(
            TARGET_STREAM_85,
            _stream_share(wide, stream),
            "share",
            85.0,
            _percent,
            "no shape at N = 8, S = 32768, batch >= 8 with both ours and the read stream",
            note="the read stream's time / ours (the same bytes)",
        ),
        _minimum(
            TARGET_VS_SGLANG,
            _pairs_with(attention, ours, catalog.SGLANG_TRITON_ATTENTION),
            "ratio",
            10.0,
            _times,
            "no shape where both ours and SGLang's Triton kernel ran in this run",
            note="SGLang Triton's time / ours",
        ),
        # the stream's share of our time, so that the worst shape is the minimum (2x the stream = 50 %)
        _minimum(
            TARGET_BATCH1_STREAM,
            _stream_share(batch1, stream),
            "share",
            100.0 / BATCH1_STREAM_FACTOR,
            _percent,
            f"no shape at batch 1, S = {BATCH1_STREAM_PREFIX}, N <= {BATCH1_STREAM_MAX_BUDGET} with both "
            "ours and the read stream",
            note="the read stream's time / ours (50% is 2x the stream)",
        ),
        *_memory_limit_targets(attention, ours, stream),
    ]


def _memory_limit_targets(attention: pd.DataFrame, ours: pd.DataFrame, stream: pd.DataFrame) -> list:
    """The goals at the memory limit (``TARGET_LIMIT_*``), each on the shapes it names that this run has."""
    at_budgets = ours[ours["budget"].isin(LIMIT_BUDGETS)]
    batch1 = at_budgets[(at_budgets["batch"] == 1) & (at_budgets["prefix"] == LIMIT_B1_PREFIX)]
    batch8 = at_budgets[(at_budgets["batch"] == 8) & at_budgets["prefix"].isin((4096, 32768))]
    batch64 = ours[(ours["batch"] == 64) & (ours["budget"] == 16) & (ours["prefix"] == 4096)]
    batch64 = batch64[batch64["median_tflops"].notna()]
    b1, b8 = _stream_share(batch1, stream), _pairs_with(attention, batch8, catalog.FLASHMLA)
    return [
        _minimum(
            TARGET_LIMIT_B1,
            b1,
            "share",
            100.0 / BATCH1_STREAM_FACTOR,
            _percent,
            f"no shape at batch 1, S = {LIMIT_B1_PREFIX}, N = 8-32 with both ours and the read stream",
            note="the read stream's time / ours (50% is 2x the stream)"
            + _asks(b1, BATCH1_STREAM_FACTOR * b1["median_s_stream"], ours),
        ),
        _minimum(
            TARGET_LIMIT_B8,
            b8,
            "ratio",
            LIMIT_B8_FLASHMLA,
            _times,
            "no shape at batch 8, N = 8-32 where both ours and FlashMLA ran in this run",
            note="FlashMLA's time / ours" + _asks(b8, b8["median_s_peer"] / LIMIT_B8_FLASHMLA, ours),
        ),
        _minimum(
            TARGET_LIMIT_B64,
            batch64,
            "median_tflops",
            LIMIT_B64_TFLOPS,
            lambda v: f"{v:,.0f} TFLOP/s",
            "no timing of ours at batch 64, N = 16, S = 4096",
        ),
    ]


def _asks(sel: pd.DataFrame, goal_s, ours: pd.DataFrame) -> str:
    """What a goal asks of the GPU, as a note: the rate of useful math (the call's FLOPs over the goal's time
    ``goal_s``, a Series aligned with ``sel``) at the shape that asks the most, beside the run's bf16 GEMM
    peak where it was measured; "" where ``sel`` has no rows or no FLOPs."""
    if sel.empty:
        return ""
    rate = sel["flops"] / goal_s / 1e12
    if rate.dropna().empty:
        return ""
    worst = sel.loc[rate.idxmax()]
    text = f"; the goal's time asks up to {rate.max():,.0f} TFLOP/s of useful math ({_where(worst)})"
    peak = ours["peak_gemm_tflops"].dropna() if "peak_gemm_tflops" in ours else pd.Series(dtype=float)
    return text + (f", the run's bf16 GEMM {peak.iloc[0]:,.0f}" if len(peak) else "")


def _times(value) -> str:
    return f"{value:,.2f}x"


def _percent(value) -> str:
    return f"{value:.1f}%"


def _pairs_with(attention: pd.DataFrame, ours: pd.DataFrame, impl: str) -> pd.DataFrame:
    """Our timed rows beside ``impl``'s of the same shape (``_peer`` columns), with ``ratio``: its time over
    ours."""
    peer = attention[(attention["impl"] == impl) & attention["median_s"].notna()]
    pairs = ours[ours["median_s"].notna()][_SHAPE_KEYS + ["median_s", "correct", "flops"]].merge(
        peer[_SHAPE_KEYS + ["median_s", "correct"]], on=_SHAPE_KEYS, suffixes=("", "_peer")
    )
    return pairs.assign(ratio=pairs["median_s_peer"] / pairs["median_s"])


def _stream_share(ours: pd.DataFrame, stream: pd.DataFrame) -> pd.DataFrame:
    """Our timed rows beside the read stream's of the same shape, with ``share``: its time over ours, in
    %."""
    sel = ours[ours["median_s"].notna()][_SHAPE_KEYS + ["median_s", "correct", "flops"]].merge(
        stream[_SHAPE_KEYS + ["median_s"]], on=_SHAPE_KEYS, suffixes=("", "_stream")
    )
    return sel.assign(share=100.0 * sel["median_s_stream"] / sel["median_s"])


def _minimum(target: str, sel: pd.DataFrame, column: str, limit: float, fmt, nodata: str, note: str = ""):
    """``(target, source, status, measured)`` of a target that ``column`` meets at every row of ``sel``: at
    least ``limit`` (``fmt`` writes a value). Says the worst row, by how much it falls short and where the
    target is met, and the rows where our or the peer's output was wrong; ``nodata`` where ``sel`` is
    empty."""
    if sel.empty:
        return (target, PEER_SOURCE, "no data", nodata)
    worst = sel.loc[sel[column].idxmin()]
    status = "met" if worst[column] >= limit else "not met"
    text = f"min {fmt(worst[column])} ({_where(worst)}) over {len(sel)} configurations"
    if status == "not met":
        text += f", {fmt(limit - worst[column])} short"
        met = sel[sel[column] >= limit]
        if len(met):
            named = "; ".join(_where(row) for _, row in met.iterrows()) if len(met) <= 3 else ""
            text += f", met at {len(met)}" + (f" ({named})" if named else "")
    wrong = _wrong(sel)
    if wrong:
        status, text = "not met", f"{text}; our output wrong at {wrong} configurations"
    if "correct_peer" in sel:
        peer_wrong = int((sel["correct_peer"].notna() & ~sel["correct_peer"].fillna(True).astype(bool)).sum())
        if peer_wrong:
            text += f"; the peer's output failed its own check at {peer_wrong} configurations"
    if note:
        text += f"; {note}"
    return (target, PEER_SOURCE, status, text)


# ----------------------------------------------------------------------------------------------- the sections

STEP_INTRO = (
    "The decode step around the tree build, measured on the same GPU in the same run: the tree-verify "
    "attention of one layer at Kimi K2.6's shapes (absorbed MLA: 576-wide latent keys, 512-wide values, one "
    "shared latent KV head; every request's N+1 tree queries see its S prefix keys and their tree "
    "ancestors), by our kernel and its peers (PyTorch's; FlashMLA, which has no tree mask and runs causal, "
    "as its rows' mask says; SGLang's Triton tree kernel and its FA3 tree verify), timed by CUDA events "
    "(warm L2; cold-L2 samples are in step_summary.parquet), each layer's call captured in a CUDA graph and "
    'replayed, as a round runs it, where the run recorded it so ("timed": graph replay; a peer\'s call as '
    "launched, its Python and launches included, is the eager column; earlier runs timed every call as "
    "launched); the tree accept walk; and the GPU's peaks. TFLOP/s and TB/s are the work "
    "of one call (FLOPs of the visible keys; bytes moved at least once) over its time, median over the "
    "calls, and as % of the measured bf16 GEMM and device-copy peaks."
)
BREAKDOWN_INTRO = (
    "Per (S, batch B, budget N): each builder's tree build (median per call; in-situ where measured: what "
    "the decode round pays from the drafter's top-K on the GPU to the tree on the GPU; else CPU builders "
    "by wall clock and the GPU builder both kernel-only and host-inclusive), our verify attention for all "
    "layers (per-layer median x layers), and the accept (the GPU kernel); in brackets the build's share of "
    "build + attention + accept. E[accepted], this batch's requests, is the expected number of accepted "
    "draft tokens of the trees of this batch's B requests (the sum over nodes of the path probability under "
    "the drafter's distributions; at B = 1 the first request's alone): what a larger budget buys, beside "
    'what it costs. It is not tau: tau, the tokens per round in the answer and in "Which budget?", is 1 + '
    "E[accepted] averaged over every request of the trace (the accepted draft tokens plus the target's "
    'bonus token; "Acceptance per budget"), the same at every batch size.'
)
ACCEPT_INTRO = (
    "GPU kernel (CUDA events), host-inclusive (launch, copies out, sync), the CPU walk including the "
    "device-to-host copy of the target's tokens, and the empty-kernel floor of the same run. Its inputs: "
    "the trees of the batch's B requests and one draw of the target's tokens per request; tokens committed "
    "is what the walk committed on those draws (accepted draft tokens plus the bonus token), E[accepted "
    "draft tokens] their expectation on the same trees (no bonus). Neither is tau, which is over every "
    "request of the trace."
)


def _concat(frames) -> pd.DataFrame:
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def report_sections(machines, breakdowns: dict, settings: dict) -> list[Section]:
    """The step part: verify attention (with the GPU's peaks and how each impl ran), tree accept, and the
    step-time breakdown per machine with the expected acceptance per budget; a machine without step data
    is named with why."""
    attention, accept, acceptance, peaks, backends, breakdown = [], [], [], [], [], []
    missing_lines = []
    for machine in machines:
        label = machine.label
        layers, depth, distribution = (settings[label][k] for k in ("layers", "depth", "distribution"))
        if machine.step.empty:
            missing_lines.append(f"{label}: no data ({machine.step_missing})")
        else:
            attention.append(attention_table(machine.step, label))
            accept.append(accept_table(machine.step, label))
            peaks.append(f"{label}: {peaks_line(machine.step)}")
            line = backends_line(machine.step)
            if line:
                backends.append(f"How each impl ran ({label}): {line}")
            table = breakdown_table(breakdowns[label], label, layers)
            budgets = table["N"] if not table.empty else ()
            where = f"{regime(depth, budgets)}, {distribution} trees" if depth else str(distribution or "")
            breakdown.append((f"{label} ({layers} layers; {where})", table))
        table = acceptance_table(machine.shapes, label, depth, distribution)
        if table.empty and not machine.step.empty:  # shapes from before the expected acceptance was kept
            table = acceptance_from_accept(machine.step, label)
        acceptance.append(table)
    missing = Bullets(missing_lines) if missing_lines else None
    no_data = "no data"
    verify = Section("Verify attention").add(
        Text(STEP_INTRO),
        missing,
        Text(f"GPU peaks: {'; '.join(peaks) or 'no data'}"),
        *(Text(line) for line in backends),
        Table(_concat(attention), collapsed=True, empty=no_data),
    )
    accept_section = Section("Tree accept").add(
        Text(ACCEPT_INTRO), Table(_concat(accept), collapsed=True, empty=no_data)
    )
    shares = Section("Step-time breakdown").add(
        Text(BREAKDOWN_INTRO), Text(f"**Left out:** {LEFT_OUT}"), missing
    )
    for heading, table in breakdown:
        shares.add(Section(heading).add(Table(table, collapsed=True, empty=no_data)))
    shares.add(
        Section("Expected acceptance per budget").add(
            Table(_concat(acceptance), collapsed=True, empty=no_data)
        )
    )
    return [verify, accept_section, shares]
