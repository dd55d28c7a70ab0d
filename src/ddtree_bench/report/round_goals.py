"""The goals of the rest of the round (docs/round_stages.md) on one machine's step summary, each
``(target, source, status, measured)`` with status met / not met / no data: the MoE's share of the
device-copy peak, the forward graph against the sum of its parts, and whole rounds per builder."""

from __future__ import annotations

import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.report.fmt import fmt_us

SOURCE = "rest of the round"
MOE_FULL = "moe where nearly all experts are touched (>= 380 a layer): >= 70% of the device-copy peak"
MOE_SMALL = "moe at T = 9 (batch 1, N = 8): >= 50% of the device-copy peak"
FORWARD = "forward graph <= 1.15x the sum of its measured parts (moe + dense + lm-head + attention x layers)"
ROUND_BEATS = "batch 1: the gpu round (one graph) beats the native-mt round at every budget"
ROUND_PARTS = "the gpu round <= 1.05x the sum of its parts"
TARGETS = (MOE_FULL, MOE_SMALL, FORWARD, ROUND_BEATS, ROUND_PARTS)


def _ok(step: pd.DataFrame, stage: str) -> pd.DataFrame:
    rows = step[(step["stage"] == stage) & (step["status"] == "ok") & (step["n"] > 0)]
    return rows[rows["median_s"].notna()]


def _best_moe(step: pd.DataFrame) -> pd.DataFrame:
    """Per (batch, budget), the MoE impl with the highest share of the copy peak."""
    moe = _ok(step, "moe")
    moe = moe[moe["pct_copy_peak"].notna()]
    if moe.empty:
        return moe
    return moe.loc[moe.groupby(["batch", "budget"])["pct_copy_peak"].idxmax()]


def _tokens(row) -> int:
    """The tree tokens of a (batch, budget) row: B x (N + 1)."""
    return int(row["batch"]) * (int(row["budget"]) + 1)


def round_targets(step: pd.DataFrame | None, layers: int = 61) -> list[tuple[str, str, str, str]]:
    if step is None or step.empty:
        return [(t, SOURCE, "no data", "no step summary") for t in TARGETS]
    out = []
    moe = _best_moe(step)
    full = moe[moe["experts_touched"] >= 380] if not moe.empty else moe
    if full.empty:
        out.append((MOE_FULL, SOURCE, "no data", "no moe rows touching >= 380 experts a layer"))
    else:
        worst = full.loc[full["pct_copy_peak"].idxmin()]
        best = full.loc[full["pct_copy_peak"].idxmax()]
        out.append(
            (
                MOE_FULL,
                SOURCE,
                "met" if worst["pct_copy_peak"] >= 70 else "not met",
                f"min {worst['pct_copy_peak']:.0f}% ({worst['impl']}, B = {worst['batch']}, N = "
                f"{worst['budget']}: T = {_tokens(worst):,} tokens), max {best['pct_copy_peak']:.0f}% "
                f"({best['impl']}, B = {best['batch']}, N = {best['budget']}: T = {_tokens(best):,}) over "
                f"{len(full)} configurations",
            )
        )
    small = moe[(moe["batch"] == 1) & (moe["budget"] == 8)] if not moe.empty else moe
    if small.empty:
        out.append((MOE_SMALL, SOURCE, "no data", "no moe rows at batch 1, N = 8"))
    else:
        row = small.iloc[0]
        out.append(
            (
                MOE_SMALL,
                SOURCE,
                "met" if row["pct_copy_peak"] >= 50 else "not met",
                f"{row['pct_copy_peak']:.0f}% ({row['impl']}, {fmt_us(row['median_s'])})",
            )
        )
    out.append(_forward_target(step, layers))
    out += _round_targets(step)
    return out


def _forward_target(step: pd.DataFrame, layers: int) -> tuple[str, str, str, str]:
    forward = _ok(step, "forward")
    parts = {stage: _ok(step, stage) for stage in ("moe", "dense", "lm-head")}
    attention = _ok(step, "verify-attention")
    attention = attention[(attention["impl"] == catalog.OURS) & (attention["cache"] == "warm")]
    ratios = []
    for row in forward.itertuples():
        key = (row.batch, row.budget)
        moe = parts["moe"][(parts["moe"]["batch"] == key[0]) & (parts["moe"]["budget"] == key[1])]
        moe = moe[moe["impl"] == row.impl]
        others = [
            parts[s][(parts[s]["batch"] == key[0]) & (parts[s]["budget"] == key[1])]
            for s in ("dense", "lm-head")
        ]
        att = attention[
            (attention["batch"] == key[0])
            & (attention["budget"] == key[1])
            & (attention["prefix"] == row.prefix)
            & (attention["heads"] == row.heads)
        ]
        if moe.empty or att.empty or any(o.empty for o in others):
            continue
        total = moe["median_s"].iloc[0] + sum(o["median_s"].iloc[0] for o in others)
        total += layers * att["median_s"].iloc[0]
        ratios.append((row.median_s / total, row.batch, row.budget, row.prefix))
    if not ratios:
        return (FORWARD, SOURCE, "no data", "no forward with every part measured at its shape")
    worst = max(ratios)
    return (
        FORWARD,
        SOURCE,
        "met" if worst[0] <= 1.15 else "not met",
        f"worst {worst[0]:.3f}x (B = {worst[1]}, N = {worst[2]}, S = {worst[3]}), best {min(ratios)[0]:.3f}x "
        f"over {len(ratios)} shapes",
    )


def _round_targets(step: pd.DataFrame) -> list[tuple[str, str, str, str]]:
    rounds = _ok(step, "round")
    wall = rounds[rounds["timing"] == "wall"]
    gpu = wall[(wall["impl"] == catalog.SUBJECT) & (wall["batch"] == 1)].set_index(["budget", "prefix"])[
        "median_s"
    ]
    cpu = wall[(wall["impl"] == catalog.NATIVE_MT) & (wall["batch"] == 1)].set_index(["budget", "prefix"])[
        "median_s"
    ]
    common = gpu.index.intersection(cpu.index)
    if common.empty:
        beats = (ROUND_BEATS, SOURCE, "no data", "no gpu and native-mt rounds at batch 1")
    else:
        wins = [(gpu[k] < cpu[k], k, gpu[k] / cpu[k]) for k in common]
        lost = [f"N = {k[0]} ({r:.3f}x)" for won, k, r in wins if not won]
        beats = (
            ROUND_BEATS,
            SOURCE,
            "met" if not lost else "not met",
            f"gpu / native-mt {min(r for *_, r in wins):.3f}-{max(r for *_, r in wins):.3f}x over "
            f"{len(wins)} budgets" + (f"; not faster at {', '.join(lost)}" if lost else ""),
        )
    pivot = rounds[rounds["impl"] == catalog.SUBJECT].pivot_table(
        index=["batch", "budget", "prefix"], columns="timing", values="median_s"
    )
    if pivot.empty or not {"wall", "sum-of-parts"} <= set(pivot.columns):
        parts = (ROUND_PARTS, SOURCE, "no data", "no gpu rounds with their parts")
    else:
        ratio = (pivot["wall"] / pivot["sum-of-parts"]).dropna()
        worst = ratio.idxmax()
        parts = (
            ROUND_PARTS,
            SOURCE,
            "met" if ratio.max() <= 1.05 else "not met",
            f"worst {ratio.max():.3f}x (B = {worst[0]}, N = {worst[1]}), {len(ratio)} rounds; "
            f"median {fmt_us(pivot['wall'].median())} a round",
        )
    return [beats, parts]
