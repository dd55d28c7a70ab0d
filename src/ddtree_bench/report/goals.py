"""The project's goals (targets), each named by what it measures, evaluated on the measured medians."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.report import acceptance as acceptance_report
from ddtree_bench.report import round_goals
from ddtree_bench.report import step as step_report
from ddtree_bench.report.fmt import fmt_us, fmt_x, where
from ddtree_bench.report.load import Machine, medians_of, ratio_pairs, sglang_rows
from ddtree_bench.report.names import CPU_BUILDERS
from ddtree_bench.timing.records import ROUND_STAGES

# ----------------------------------------------------------------------------------------- targets

# The public Triton builder as measured on our H200 (batch 64, L = 16, K = N), in µs; 1024 does not build.
TRITON_US = {32: 28.0, 64: 52.0, 256: 214.0, 512: 547.0}


@dataclass
class TargetResult:
    machine: str
    target: str
    source: str
    status: str  # met | not met | no data
    measured: str


def _status_minimum(pairs: pd.DataFrame, threshold: float) -> tuple[str, str]:
    worst = pairs.loc[pairs["ratio"].idxmin()]
    status = "met" if worst["ratio"] >= threshold else "not met"
    return status, f"min {fmt_x(worst['ratio'])} ({where(worst)}) over {len(pairs)} configurations"


def evaluate_targets(machines: list[Machine]) -> list[TargetResult]:
    """The project's goals, per machine, on the measured medians."""
    results = _build_targets(machines) + sglang_function_targets(machines)
    for machine in machines:  # verify attention and tree accept (step_summary.parquet)
        for target, source, status, measured in step_report.step_targets(
            machine.step, missing=machine.step_missing
        ):
            results.append(TargetResult(machine.label, target, source, status, measured))
    for machine in machines:  # the rest of the round (the model, draft and round stages)
        if (
            machine.step is not None
            and not machine.step.empty
            and machine.step["stage"].isin(ROUND_STAGES).any()
        ):
            for target, source, status, measured in round_goals.round_targets(machine.step):
                results.append(TargetResult(machine.label, target, source, status, measured))
    for machine in machines:  # the drafter distribution's acceptance (tree_shape.parquet)
        if not machine.shapes.empty and "drafter" in set(machine.shapes["distribution"]):
            for target, source, status, measured in acceptance_report.acceptance_targets(machine.shapes):
                results.append(TargetResult(machine.label, target, source, status, measured))
    order = {m.label: i for i, m in enumerate(machines)}
    return sorted(results, key=lambda r: order.get(r.machine, len(order)))


#: What each goal is about (the ``from`` column of the goals table).
BUILD_SOURCE = "tree build"
SGLANG_SOURCE = "SGLang's function"
GPU_1024_LIMIT_US = 100.0
BATCH1_N64_LIMIT_US = 8.0
GPU_1024_TARGET = f"gpu kernel <= {GPU_1024_LIMIT_US:g} µs at budget 1024, batch 64"
TRITON_TARGET = "gpu kernel vs the public Triton builder (H200, batch 64): >= 1.5x at 32, >= 5x from 256"


def _build_targets(machines: list[Machine]) -> list[TargetResult]:
    """The tree build's goals, per machine: the kernel's time at budget 1024, the kernel against the public
    Triton builder, and the decode round's in-situ goals. Each is evaluated on every row that holds its
    (budget, batch), whatever the distribution, depth or trace width K; the text names where the worst is."""
    results = []
    for machine in machines:
        df = machine.summary
        ok = df[(df["status"] == "ok") & (df["n"] > 0)] if not df.empty else df
        label = machine.label

        def add(target, source, status, measured, label=label):
            results.append(TargetResult(label, target, source, status, measured))

        if ok.empty:
            add("any timing", "-", "no data", "no timings on this machine")
            continue
        # the kernel's own time (CUDA events, warm L2), on every distribution and depth measured
        kernel = medians_of(ok, catalog.SUBJECT, "kernel-events")
        nodata = "no gpu kernel timings at batch 64"

        sel = kernel[(kernel["batch"] == 64) & (kernel["budget"] == 1024)]
        if sel.empty:
            add(GPU_1024_TARGET, BUILD_SOURCE, "no data", f"{nodata}, budget 1024")
        else:
            worst = sel.loc[sel["median_s"].idxmax()]
            limit_us, worst_us = GPU_1024_LIMIT_US, worst["median_s"] * 1e6
            text = f"{worst_us:.1f} µs (worst: {where(worst)}) over {len(sel)} configurations"
            if worst_us > limit_us:
                text += f", {worst_us - limit_us:.1f} µs over"
            add(GPU_1024_TARGET, BUILD_SOURCE, "met" if worst_us <= limit_us else "not met", text)

        for target, status, measured in in_situ_targets(ok):
            add(target, IN_SITU_SOURCE, status, measured)

        sel = kernel[kernel["batch"] == 64]
        if sel.empty:
            add(TRITON_TARGET, BUILD_SOURCE, "no data", nodata)
            continue
        notes, status = [], "met"
        for budget, factor in ((32, 1.5), (256, 5.0), (512, 5.0)):
            at = sel[sel["budget"] == budget]
            if at.empty:
                notes.append(f"N={budget}: no data")
                status = "no data" if status == "met" else status
                continue
            worst = at.loc[at["median_s"].idxmax()]
            ratio = TRITON_US[budget] / (worst["median_s"] * 1e6)
            short = f", {(1 - ratio / factor) * 100:.0f}% short of {fmt_x(factor)}" if ratio < factor else ""
            notes.append(f"N={budget}: {fmt_x(ratio)} (worst: {worst['distribution']}){short}")
            if ratio < factor:
                status = "not met"
        if (sel["budget"] == 1024).any():
            notes.append("N=1024: builds (Triton does not)")
        notes.append("Triton's times: its own H200 measurement at L = 16, K = N")
        add(TRITON_TARGET, BUILD_SOURCE, status, "; ".join(notes))
    return results


# ------------------------------------------------------------------- SGLang's measured function

REF_VS_SGLANG_TITLE = "reference (ours) / SGLang's function"
REF_VS_SGLANG_NOTE = (
    "Where SGLang's own build_ddtree_tree_from_topk ran beside our Python stand-in reference, on the same "
    "inputs: median per call of each and their ratio (below 1: the stand-in is faster). Speedups over "
    "reference on a machine without SGLang relate to SGLang's function by this ratio (the host CPU is "
    "shared, so it moves between runs)."
)

SGLANG_FUNCTION_TARGET = (
    "GPU kernel vs SGLang's measured function, batch 64: >= 500x at every budget <= 64, >= 1000x from 256 up"
)
#: (budgets, factor) of that target: every budget up to 64 needs 500x, every budget from 256 up 1000x.
SGLANG_FUNCTION_FACTORS = ((lambda budget: budget <= 64, 500.0), (lambda budget: budget >= 256, 1000.0))


def sglang_function_targets(machines: list[Machine]) -> list[TargetResult]:
    """The kernel against SGLang's function where it was measured on the machine (its own rows, never our
    stand-in): batch 64, every trace both ran on (the text names the distribution), kernel time by CUDA
    events (warm)."""
    results = []
    source = SGLANG_SOURCE
    measured_on = [m.label for m in machines if not sglang_rows(m.summary).empty]
    for machine in machines:
        df = machine.summary
        sglang = sglang_rows(df)
        if sglang.empty:
            elsewhere = f" (measured on {', '.join(measured_on)})" if measured_on else ""
            why = f"SGLang's function did not run on this machine{elsewhere}"
            results.append(TargetResult(machine.label, SGLANG_FUNCTION_TARGET, source, "no data", why))
            continue
        ok = df[(df["status"] == "ok") & (df["n"] > 0)]
        kernel = medians_of(ok, catalog.SUBJECT, "kernel-events")
        kernel = kernel[kernel["batch"] == 64]  # every distribution, depth and trace width measured
        pairs = ratio_pairs(sglang, kernel, "median_s") if len(kernel) else pd.DataFrame()
        if pairs.empty:
            results.append(
                TargetResult(
                    machine.label,
                    SGLANG_FUNCTION_TARGET,
                    source,
                    "no data",
                    "needs gpu kernel and sglang timings at batch 64 on the same traces",
                )
            )
            continue
        notes, short, checked = [], [], 0
        for wanted, factor in SGLANG_FUNCTION_FACTORS:
            sel = pairs[pairs["budget"].map(wanted)]
            if sel.empty:
                continue
            checked += len(sel)
            worst = sel.loc[sel["ratio"].idxmin()]
            notes.append(f"min {fmt_x(worst['ratio'])} where {fmt_x(factor)} is asked ({where(worst)})")
            for _, row in sel[sel["ratio"] < factor].sort_values(["budget", "distribution"]).iterrows():
                need_us = row["median_s_num"] / factor * 1e6
                short.append(
                    f"{where(row)}: {fmt_x(row['ratio'])}, {(1 - row['ratio'] / factor) * 100:.0f}% short "
                    f"(the kernel took {row['median_s_den'] * 1e6:.1f} µs; {factor:.0f}x needs "
                    f"<= {need_us:.1f} µs)"
                )
        outside = sorted({int(b) for b in pairs["budget"] if 64 < b < 256})
        if outside:
            notes.append(f"budgets {outside} are between the two bands and not judged")
        if checked == 0:
            results.append(
                TargetResult(machine.label, SGLANG_FUNCTION_TARGET, source, "no data", "; ".join(notes))
            )
            continue
        status = "not met" if short else "met"
        measured = "; ".join(notes) + f" ({checked} configurations)"
        if short:
            measured += "; short: " + "; ".join(short)
        results.append(TargetResult(machine.label, SGLANG_FUNCTION_TARGET, source, status, measured))
    return results


IN_SITU_SOURCE = "decode round (in-situ)"


def _in_situ_medians(ok: pd.DataFrame, builder: str) -> pd.DataFrame:
    keys = ["budget", "batch", "depth", "distribution"]
    sel = ok[(ok["builder"] == builder) & (ok["timing"] == catalog.IN_SITU)] if not ok.empty else ok
    return sel[keys + ["median_s"]] if len(sel) else pd.DataFrame(columns=keys + ["median_s"])


def _factor_target(pairs: pd.DataFrame, need, other: str) -> tuple[str, str]:
    """``pairs`` (ratio = other's time / gpu's, per configuration) against the factor ``need(budget)``: the
    status and the measured text; where not met, each configuration short of it with what the gpu took and
    what it would have to take."""
    pairs = pairs.assign(need=pairs["budget"].map(need))
    pairs = pairs.assign(margin=pairs["ratio"] / pairs["need"])
    worst = pairs.loc[pairs["margin"].idxmin()]
    text = (
        f"min {fmt_x(worst['ratio'])} against {fmt_x(worst['need'])} needed ({where(worst)}) over "
        f"{len(pairs)} configurations"
    )
    short = pairs[pairs["margin"] < 1.0].sort_values(["batch", "budget", "distribution"])
    if short.empty:
        return "met", text
    each = "; ".join(
        f"N={int(r['budget'])} {r['distribution']}: {fmt_x(r['ratio'])} of {fmt_x(r['need'])}, gpu "
        f"{fmt_us(r['median_s_den'])} where {fmt_us(r['median_s_num'] / r['need'])} is needed"
        for _, r in short.iterrows()
    )
    return "not met", f"{text}; short at {len(short)}: {each} (against {other})"


def in_situ_targets(ok: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The decode round's targets on the in-situ rows (``gpu``: its bool-mask graph replay, the outputs the
    CPU builders hand over): ``(target, status, measured)``; a target not met says by how much."""
    out = []
    gpu = _in_situ_medians(ok, catalog.SUBJECT)
    nodata = "no gpu in-situ timings on this machine (timing.in_situ needs a CUDA GPU)"

    def versus(other: pd.DataFrame, batch: int, budgets) -> pd.DataFrame:
        sel = gpu[(gpu["batch"] == batch) & budgets(gpu["budget"])]
        if sel.empty or other.empty:
            return pd.DataFrame()
        return ratio_pairs(other, sel, "median_s")

    target = "in-situ, batch 64: gpu >= 10x native-mt at every budget >= 64, and >= 5x below"
    pairs = versus(_in_situ_medians(ok, catalog.NATIVE_MT), 64, lambda b: b > 0)
    if pairs.empty:
        why = nodata if gpu.empty else "needs native-mt in-situ timings at batch 64"
        out.append((target, "no data", why))
    else:
        out.append((target, *_factor_target(pairs, lambda n: 10.0 if n >= 64 else 5.0, catalog.NATIVE_MT)))

    target = "in-situ, batch 64: gpu >= 1000x sglang (SGLang's function) at every budget >= 32"
    pairs = versus(_in_situ_medians(ok, catalog.BASELINE), 64, lambda b: b >= 32)
    if pairs.empty:
        why = nodata if gpu.empty else "needs sglang in-situ timings at batch 64, budgets >= 32"
        ref = versus(_in_situ_medians(ok, catalog.REFERENCE), 64, lambda b: b >= 32)
        if len(ref):
            why += f"; gpu vs reference (ours) in-situ: min {fmt_x(ref['ratio'].min())} (not SGLang)"
        out.append((target, "no data", why))
    else:
        out.append((target, *_factor_target(pairs, lambda n: 1000.0, catalog.BASELINE)))

    target = "in-situ, batch 1: gpu >= 3x the fastest CPU builder at every budget"
    cpu = pd.concat([_in_situ_medians(ok, b).assign(builder=b) for b in CPU_BUILDERS], ignore_index=True)
    if len(cpu):
        keys = ["budget", "batch", "depth", "distribution"]
        cpu = cpu.loc[cpu.groupby(keys)["median_s"].idxmin()]
    pairs = versus(cpu, 1, lambda b: b > 0)
    if pairs.empty:
        out.append((target, "no data", nodata if gpu.empty else "needs CPU in-situ timings at batch 1"))
    else:
        fastest = cpu.set_index(["budget", "batch", "depth", "distribution"])["builder"]
        names = sorted(
            {str(fastest.get((r.budget, r.batch, r.depth, r.distribution))) for r in pairs.itertuples()}
        )
        status, measured = _factor_target(pairs, lambda n: 3.0, "the fastest CPU builder")
        out.append((target, status, f"{measured}; fastest CPU builder: {', '.join(names)}"))

    target = f"in-situ, batch 1: gpu <= {BATCH1_N64_LIMIT_US:g} µs at N = 64"
    at = _in_situ_medians(ok, catalog.SUBJECT)
    at = at[(at["batch"] == 1) & (at["budget"] == 64)] if len(at) else at
    if at.empty:
        why = nodata if gpu.empty else "needs gpu in-situ timings at batch 1, N = 64"
        out.append((target, "no data", why))
    else:
        worst = at.loc[at["median_s"].idxmax()]
        us = float(worst["median_s"]) * 1e6
        status = "met" if us <= BATCH1_N64_LIMIT_US else "not met"
        text = f"{us:.1f} µs ({where(worst)})" + (
            f", {us - BATCH1_N64_LIMIT_US:.1f} µs over" if us > BATCH1_N64_LIMIT_US else ""
        )
        out.append((target, status, text))
    return out


def target_frame(results: list[TargetResult]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "machine": r.machine,
                "target": r.target,
                "from": r.source,
                "status": r.status,
                "measured": r.measured,
            }
            for r in results
        ],
        columns=["machine", "target", "from", "status", "measured"],
    )
