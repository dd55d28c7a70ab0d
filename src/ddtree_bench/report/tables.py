"""The report's tables (pandas frames) and the one Markdown and one HTML table writer."""

from __future__ import annotations

import re
from html import escape

import numpy as np
import pandas as pd

from ddtree_bench.catalog import BUILDERS, GPU_BUILDER, IN_SITU, NATIVE, NATIVE_MT, REFERENCE
from ddtree_bench.environment import ENVIRONMENT_COLUMNS
from ddtree_bench.report.fmt import fmt_us, fmt_x
from ddtree_bench.report.load import (
    Machine,
    medians_of,
    ratio_pairs,
    select_rows,
    sglang_rows,
    speedups,
)
from ddtree_bench.report.names import CPU_BUILDERS, IN_SITU_TIMINGS, SERIES_ORDER

# ----------------------------------------------------------------------------------------- tables


def medians_table(data: pd.DataFrame) -> pd.DataFrame:
    """Every configuration: median, p10, p90 per call and per tree, n, and the speedup over the baseline."""
    if data.empty:
        return pd.DataFrame()
    sp = speedups(data)
    keys = ["machine", "series", "budget", "batch", "depth", "distribution", "cache"]
    if sp.empty:
        data = data.assign(speedup=np.nan)
    else:
        data = data.merge(sp[keys + ["speedup"]], on=keys, how="left")
    data = data.sort_values(
        ["machine", "depth", "distribution", "budget", "batch", "series"],
        ascending=[True, False, True, True, True, True],
    )
    return pd.DataFrame(
        {
            "machine": data["machine"],
            "builder": data["series"],
            "distribution": data["distribution"],
            "L": data["depth"],
            "N": data["budget"],
            "B": data["batch"],
            "n": data["n"],
            "median / call": data["median_s"].map(fmt_us),
            "p10": data["p10_s"].map(fmt_us),
            "p90": data["p90_s"].map(fmt_us),
            "median / tree": data["median_per_tree_s"].map(fmt_us),
            "speedup": data["speedup"].map(lambda v: "-" if pd.isna(v) else fmt_x(v)),
        }
    )


def compact_table(data: pd.DataFrame, machine: str, depth, distribution) -> pd.DataFrame:
    """One machine, one depth and distribution: rows (N, B), a column per builder, "median (p10-p90)"."""
    sel, _, _ = select_rows(data[data["machine"] == machine], depth, distribution)
    if sel.empty:
        return pd.DataFrame()
    sel = sel.assign(
        cell=[
            f"{fmt_us(m)} ({fmt_us(a)}-{fmt_us(b)})"
            for m, a, b in zip(sel["median_s"], sel["p10_s"], sel["p90_s"], strict=True)
        ]
    )
    table = sel.pivot_table(index=["budget", "batch"], columns="series", values="cell", aggfunc="first")
    order = [c for c in SERIES_ORDER if c in table.columns]
    table = table[order + [c for c in table.columns if c not in SERIES_ORDER]]
    table = table.reset_index().rename(columns={"budget": "N", "batch": "B"})
    table.columns.name = None
    return table.fillna("-")


IN_SITU_INTRO = (
    "From the drafter's top-K on the GPU to the padded tree on the GPU, what the decode round's critical "
    "path pays, per builder, on the same inputs (docs/in_situ.md): sglang and reference as SGLang's worker "
    "does it (pageable copies of the top-K to the host, build and pad per request, the padded visibility, "
    "links, token ids and depths back to the device, synchronise; wall clock); native and native-mt with "
    "pinned buffers allocated once (one copy each way on one stream; wall clock); gpu with inputs and "
    "outputs on the device, its time on the stream (CUDA events around a CUDA-graph replay), with the bool "
    "mask and with packed bits only, and the launch + synchronise wall time as a secondary column."
)


def in_situ_tables(data: pd.DataFrame, machines: list[Machine], depth, distribution) -> dict:
    """Per machine, the in-situ series as ``compact_table`` lays them out, or a line saying why none."""
    out = {}
    for machine in machines:
        sel = data[data["timing"].isin(IN_SITU_TIMINGS)] if not data.empty else data
        table = compact_table(sel, machine.label, depth, distribution) if not sel.empty else pd.DataFrame()
        if table.empty:
            failed = machine.summary
            if not failed.empty:
                failed = failed[(failed["timing"] == IN_SITU) & (failed["status"] != "ok")]
            reasons = sorted({str(r) for r in failed["status_reason"].dropna()}) if len(failed) else []
            why = "; ".join(reasons) or "timing.in_situ off, or results from before the mode existed"
            table = f"no in-situ rows ({why})"
        out[machine.label] = table
    return out


def cpu_builders_table(data: pd.DataFrame, label: str, depth, distribution) -> tuple[pd.DataFrame, dict]:
    """One machine's CPU builders against its baseline (SGLang's function, else our ``reference``), per
    (B, N) at the report's depth and distribution: the baseline's median per call and each other CPU
    builder's with its speedup over the baseline (and its range across timing jobs where it has several).
    In-situ where the baseline has in-situ rows, else wall clock (``load.speedups(headline=True)``).
    Returns the table and ``{"baseline", "mode", "depth", "distribution", "low", "high"}`` (the fastest C++
    builder's speedups' smallest and largest); an empty table where nothing compares."""

    rows = data[data["machine"] == label] if not data.empty else data
    sp = speedups(rows, headline=True) if not rows.empty else pd.DataFrame()
    if sp.empty:
        return pd.DataFrame(), {}
    sp = sp[sp["builder"].isin(CPU_BUILDERS) & sp["cache"].isin(["warm", "n/a"])]
    sp, used_depth, used_distribution = select_rows(sp, depth, distribution)
    if sp.empty:
        return pd.DataFrame(), {}
    base, mode = str(sp["baseline"].iloc[0]), str(sp["mode"].iloc[0])
    keys = ["batch", "budget"]
    grid = sp[keys + ["baseline_s"]].drop_duplicates(keys).sort_values(keys)
    out = pd.DataFrame(
        {"B": grid["batch"], "N": grid["budget"], BUILDERS[base].column_name: grid["baseline_s"].map(fmt_us)}
    )
    fastest = None
    for builder in [b for b in CPU_BUILDERS if b != base and b in set(sp["builder"])]:
        sel = (
            sp[sp["builder"] == builder]
            .set_index(keys)
            .reindex(list(zip(grid["batch"], grid["budget"], strict=True)))
        )
        out[BUILDERS[builder].column_name] = [
            "-"
            if pd.isna(m)
            else f"{fmt_us(m)} ({fmt_x(x)}"
            + (f", {fmt_x(lo)}-{fmt_x(hi)} across jobs" if jobs > 1 or bjobs > 1 else "")
            + ")"
            for m, x, lo, hi, jobs, bjobs in zip(
                sel["median_s"],
                sel["speedup"],
                sel["speedup_low"],
                sel["speedup_high"],
                sel["series_jobs"].fillna(1),
                sel["baseline_jobs"].fillna(1),
                strict=True,
            )
        ]
        if builder in (NATIVE, NATIVE_MT):
            fastest = sel["speedup"] if fastest is None else np.fmax(fastest, sel["speedup"].to_numpy())
    summary = {"baseline": base, "mode": mode, "depth": used_depth, "distribution": used_distribution}
    if fastest is not None and np.isfinite(np.asarray(fastest, dtype=float)).any():
        values = np.asarray(fastest, dtype=float)
        summary |= {"low": float(np.nanmin(values)), "high": float(np.nanmax(values))}
    return out.reset_index(drop=True), summary


def unavailable_table(machines: list[Machine]) -> pd.DataFrame:
    """What could not run, per machine: a builder none of whose timings ran ("every timing"), or one timing
    of a builder whose other timings ran (e.g. in-situ, which needs a CUDA GPU, of a CPU builder timed per
    call), with its status and reason."""
    rows = []
    columns = ["machine", "builder", "what did not run", "status", "reason"]
    for machine in machines:
        df = machine.summary
        seen = set()
        if not df.empty:
            ran = df[df["status"] == "ok"].groupby("builder")["timing"].agg(lambda t: sorted(set(t)))
            bad = df[df["status"] != "ok"]
            for _, row in bad.iterrows():
                builder, timing = row["builder"], row.get("timing")
                done = ran.get(builder, [])
                what = (
                    f"{timing} timing ({', '.join(done)} ran)"
                    if done and isinstance(timing, str)
                    else "its timings (none ran)"
                    if not done
                    else "some timings"
                )
                key = (builder, what, row["status"], row["status_reason"])
                if key in seen:
                    continue
                seen.add(key)
                rows.append(
                    {
                        "machine": machine.label,
                        "builder": builder,
                        "what did not run": what,
                        "status": row["status"],
                        "reason": row["status_reason"] or "-",
                    }
                )
        env = machine.environment
        wanted = GPU_BUILDER in (env.get("config") or {}).get("builders", [])
        if wanted and not (env.get("builds") or {}).get("fatbin"):
            rows.append(
                {
                    "machine": machine.label,
                    "builder": GPU_BUILDER,
                    "what did not run": "its kernel build",
                    "status": "not compiled",
                    "reason": "no nvcc found" if not env.get("nvcc") else "gpu: off",
                }
            )
    return pd.DataFrame(rows, columns=columns)


def correctness_table(machines: list[Machine]) -> pd.DataFrame:
    rows = []
    for machine in machines:
        df = machine.summary
        if df.empty:
            continue
        ok = df[(df["status"] == "ok") & (df["n"] > 0)]
        for builder, group in ok.groupby("builder", sort=False):
            correct = group["correct"]
            verdict = "yes" if correct.notna().all() and correct.astype(bool).all() else "NO"
            rows.append(
                {
                    "machine": machine.label,
                    "builder": builder,
                    "configurations": len(group),
                    "trees equal reference's": verdict,
                }
            )
    return pd.DataFrame(rows)


ENV_KEYS = (*ENVIRONMENT_COLUMNS, "platform")  # the benchmark rows' environment, and the platform


def environment_table(machines: list[Machine]) -> pd.DataFrame:
    table = {}
    for machine in machines:
        env = machine.environment
        table[f"{machine.label} ({machine.source})"] = [
            "-" if env.get(key) in (None, "") else str(env.get(key)) for key in ENV_KEYS
        ]
    return pd.DataFrame(table, index=list(ENV_KEYS)).reset_index(names="")


# ----------------------------------------------------------------------------------------- output


def reference_vs_sglang_table(machines: list[Machine]) -> pd.DataFrame:
    """Per configuration where both ran: our Python stand-in ``reference`` against SGLang's own function,
    medians per call, and their ratio (< 1: the stand-in is faster than SGLang's function)."""
    rows = []
    for machine in machines:
        sglang = sglang_rows(machine.summary)
        if sglang.empty:
            continue
        ok = machine.summary[(machine.summary["status"] == "ok") & (machine.summary["n"] > 0)]
        ref = medians_of(ok, REFERENCE)
        pairs = ratio_pairs(ref, sglang, "median_s") if len(ref) else pd.DataFrame()
        for _, row in pairs.sort_values(["depth", "distribution", "budget", "batch"]).iterrows():
            rows.append(
                {
                    "machine": machine.label,
                    "distribution": row["distribution"],
                    "L": int(row["depth"]),
                    "N": int(row["budget"]),
                    "B": int(row["batch"]),
                    "reference (ours)": fmt_us(row["median_s_num"]),
                    "SGLang's function": fmt_us(row["median_s_den"]),
                    "reference / SGLang": f"{row['ratio']:.2f}",
                }
            )
    return pd.DataFrame(rows)


def sglang_source_table(machines: list[Machine]) -> pd.DataFrame:
    """Where each machine's SGLang function came from (the provenance columns of its sglang rows)."""
    rows = []
    for machine in machines:
        sglang = sglang_rows(machine.summary)
        if sglang.empty:
            continue

        def last(column, sglang=sglang):
            if column not in sglang:
                return None
            values = sglang[column].dropna()
            return values.iloc[-1] if len(values) else None

        where = last("builder_source")
        if where is None:
            rows.append(
                {
                    "machine": machine.label,
                    "SGLang's function from": "not recorded in these rows (published before provenance was "
                    "recorded; see the publication's README)",
                    "file sha256": "-",
                    "git checkout": "-",
                    "workspace passed": "-",
                }
            )
            continue
        sha = last("builder_source_sha256")
        workspace = last("builder_workspace")
        rows.append(
            {
                "machine": machine.label,
                "SGLang's function from": str(where),
                "file sha256": str(sha) if sha else "-",
                "git checkout": "file tracked; commit in summary.parquet"
                if last("builder_source_git_commit")
                else "none (the file is not tracked by git)",
                "workspace passed": "-" if workspace is None else ("yes" if bool(workspace) else "no"),
            }
        )
    return pd.DataFrame(rows)


#: A time in a cell: a number and its unit (not "s.e." or "/s").
_TIME = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?) (ns|µs|ms|s)(?![\w./])")
_SCALE = {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def _in_unit(seconds: float, unit: str) -> str:
    value = seconds / _SCALE[unit]
    if value >= 100:
        text = f"{value:,.0f}"
    elif value >= 10:
        text = f"{value:.1f}"
    elif value >= 0.1:
        text = f"{value:.2f}"
    else:
        text = f"{value:.2g}"
    return f"{text} {unit}"


def one_unit_per_column(df: pd.DataFrame) -> pd.DataFrame:
    """Every column whose cells all start with a time ("193 µs (14%)", "5.5 µs (5.1 µs-5.9 µs)") written in
    one unit: µs where its largest time is below 10 ms, else ms where below 10 s, else s. Other columns
    (prose, counts) are left as they are."""
    out = df.copy()
    for column in df.columns:
        cells = [str(v) for v in df[column]]
        filled = [c for c in cells if c not in ("-", "", "nan", "None")]
        if not filled or not all(_TIME.match(c.strip()) for c in filled):
            continue
        units = {u for c in filled for _, u in _TIME.findall(c)}
        if len(units) <= 1:
            continue
        largest = max(float(n.replace(",", "")) * _SCALE[u] for c in filled for n, u in _TIME.findall(c))
        unit = "µs" if largest < 1e-2 else "ms" if largest < 10 else "s"
        out[column] = [
            c
            if c not in filled
            else _TIME.sub(
                lambda m, unit=unit: _in_unit(float(m[1].replace(",", "")) * _SCALE[m[2]], unit), c
            )
            for c in cells
        ]
    return out


def markdown_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "_(none)_\n"
    df = one_unit_per_column(df)

    def cell(value) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    header = "| " + " | ".join(cell(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


#: A cell up to this many characters is kept on one line (longer ones are prose and wrap).
NOWRAP_CHARS = 40
#: A table of more columns than this scrolls sideways with its first column fixed (class "wide"), and its
#: second too where the first is short (class "key2": at most KEY_CHARS characters, the second at most
#: KEY2_CHARS): then (N, B) or (batch, prefix) stay in view together.
WIDE_COLUMNS = 8
KEY_CHARS = 5
KEY2_CHARS = 12


def html_table(df: pd.DataFrame, *, status_column: str | None = None) -> str:
    if df.empty:
        return "<p><em>(none)</em></p>"
    df = one_unit_per_column(df)
    head = "".join(f"<th>{escape(str(c))}</th>" for c in df.columns)
    rows = []
    for row in df.itertuples(index=False):
        cells = []
        for column, value in zip(df.columns, row, strict=True):
            text = str(value)
            classes = [text.replace(" ", "-")] if column == status_column else []
            if len(text) <= NOWRAP_CHARS:  # numbers and short labels stay on one line
                classes.append("nw")
            cls = f' class="{" ".join(classes)}"' if classes else ""
            cells.append(f"<td{cls}>{escape(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    return f"<div class='{' '.join(_wrapper_classes(df))}'>{table}</div>"


def _wrapper_classes(df: pd.DataFrame) -> list[str]:
    if len(df.columns) <= WIDE_COLUMNS:
        return ["scroll"]

    def longest(k: int) -> int:
        return max(len(str(v)) for v in [df.columns[k], *df.iloc[:, k]])

    return ["scroll", "wide", *(["key2"] if longest(0) <= KEY_CHARS and longest(1) <= KEY2_CHARS else [])]
