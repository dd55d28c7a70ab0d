"""Nothing stale: a summary holds exactly the configured grid, and machines set side by side say whether they
ran on the same traces.

``check_summary(summary, grid)`` raises ``ValueError`` (one line) when the tree-build summary holds rows of a
distribution, depth, budget, batch size or builder the configuration does not name, or lacks a configured
one: the report refuses to show numbers under headings they do not belong to. ``grid`` is
``configured_grid(config)``: the five lists that decide which timing jobs run.

``trace_identity(machines)``: per machine set beside the first (this run), whether the traces behind both
are the same, compared by the ``trace_sha256`` every row records (``traces.arrays_sha256``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

#: The configuration keys that decide the tree-build grid, and the summary column each one fills.
GRID_KEYS = {
    "distributions": "distribution",
    "depths": "depth",
    "budgets": "budget",
    "batch_sizes": "batch",
    "builders": "builder",
}
#: How many missing grid points a message names before "and N more".
SHOWN = 3


def configured_grid(config: dict) -> dict:
    """The five grid lists of a configuration (``GRID_KEYS``), as plain lists; a key it lacks is an error."""
    missing = [key for key in GRID_KEYS if not isinstance(config.get(key), list | tuple)]
    if missing:
        raise ValueError(f"configuration: no {', '.join(missing)} list to check the summary against")
    grid = {key: list(config[key]) for key in GRID_KEYS}
    grid["depth_follows_budget"] = bool(config.get("depth_follows_budget", False))
    given = config.get("extra_shapes")  # a grid made here already holds them
    grid["extra_shapes"] = [tuple(p) for p in given] if given is not None else extra_shape_points(config)
    return grid


def extra_shape_points(config: dict) -> list[tuple]:
    """The tree shapes beyond the grid's that tau needs, sorted: where ``step.round.stacks`` names some,
    (the step's distribution, its depth, each step budget), nulls resolved as ``Settings`` resolves them
    (the first configured distribution and depth, the configured budgets); and for each acceptance profile
    with its own drafter (``acceptance_profiles``), its distribution at the first configured depth (and the
    step's) and every budget (and step budget)."""
    from ddtree_bench import catalog  # noqa: PLC0415

    step = config.get("step") if isinstance(config.get("step"), dict) else {}
    round_ = step.get("round") if isinstance(step.get("round"), dict) else {}
    first_depth = (config.get("depths") or [None])[0]
    depth = step.get("depth") or first_depth
    budgets = [int(n) for n in config.get("budgets") or []]
    step_budgets = [int(n) for n in step.get("budgets") or budgets]
    points = set()
    if round_.get("stacks") and step.get("enabled") is not False:
        distribution = step.get("distribution") or (config.get("distributions") or [None])[0]
        points |= {(str(distribution), int(depth), n) for n in step_budgets}
    for name in config.get("acceptance_profiles") or ():
        profile = catalog.ACCEPTANCE_PROFILES.get(name)
        if profile is None or profile.params is None or first_depth is None:
            continue
        if config.get("depth_follows_budget"):  # SGLang's regime: each budget its own depth, L = N
            points |= {(profile.distribution, n, n) for n in budgets}
            continue
        for d in dict.fromkeys([int(first_depth), int(depth)]):
            points |= {(profile.distribution, d, n) for n in sorted(set(budgets) | set(step_budgets))}
    grid_points = {
        (str(d), int(dep), int(n))
        for d in config.get("distributions") or ()
        for dep in config.get("depths") or ()
        for n in budgets
    }
    return sorted(points - grid_points, key=str)


def _depth_budgets(grid: dict) -> list[tuple]:
    """The grid's (depth, budget) points: all pairs, or each budget with L = N in SGLang's regime."""
    if grid.get("depth_follows_budget"):
        return [(n, n) for n in grid["budgets"]]
    return [(depth, n) for depth in grid["depths"] for n in grid["budgets"]]


def _value(value):
    """A cell as a comparable plain value (numpy ints to int)."""
    try:
        return int(value) if float(value) == int(value) else value
    except (TypeError, ValueError):
        return value


def check_summary(summary: pd.DataFrame, grid: dict, *, where: str = "summary") -> None:
    """Raise ``ValueError`` (one line naming ``where``) unless ``summary``'s rows are exactly the configured
    grid: no row of an unconfigured value, every configured builder present (timed, or one "unavailable"
    row), and every timed builder with rows for every configured (distribution, depth, budget, batch)."""
    grid = configured_grid(grid)
    if summary is None or len(summary) == 0:
        raise ValueError(f"{where}: holds no rows, but the configuration asks for {_describe(grid)}")
    fix = "rerun the workflow (snakemake ... report) to rebuild it for this configuration"
    grid_rows = summary[summary["status"] != "unavailable"] if "status" in summary else summary
    for key, column in GRID_KEYS.items():
        rows = summary if column == "builder" else grid_rows
        present = sorted({_value(v) for v in rows[column].dropna()}, key=str)
        extra = [v for v in present if v not in grid[key]]
        if extra:
            raise ValueError(
                f"{where}: holds rows of {column} {extra[0]!r}, which is not among the configured "
                f"{key} {grid[key]}: it is stale; {fix}"
            )
    builders = {_value(v) for v in summary["builder"].dropna()}
    absent = [builder for builder in grid["builders"] if builder not in builders]
    if absent:
        raise ValueError(f"{where}: has no rows of builder {absent[0]!r}, which is configured; {fix}")
    points = [
        (distribution, depth, budget, batch)
        for distribution in grid["distributions"]
        for depth, budget in _depth_budgets(grid)
        for batch in grid["batch_sizes"]
    ]
    for builder in grid["builders"]:
        rows = grid_rows[grid_rows["builder"] == builder]
        if rows.empty:
            continue  # left out here, with its "unavailable" row
        have = {
            (str(d), _value(depth), _value(n), _value(b))
            for d, depth, n, b in zip(
                rows["distribution"], rows["depth"], rows["budget"], rows["batch"], strict=True
            )
        }
        lacking = [p for p in points if (str(p[0]), p[1], p[2], p[3]) not in have]
        if lacking:
            named = ", ".join(f"{d} L={depth} N={n} B={b}" for d, depth, n, b in lacking[:SHOWN])
            more = f" and {len(lacking) - SHOWN} more" if len(lacking) > SHOWN else ""
            raise ValueError(f"{where}: lacks builder {builder}'s rows for {named}{more}; {fix}")


def check_shapes(shapes: pd.DataFrame, grid: dict, *, where: str = "tree shapes") -> None:
    """The tree-shape table holds exactly the configured (distribution, depth, budget) points (where it has
    rows at all: an older publication may have none)."""
    if shapes is None or len(shapes) == 0:
        return
    grid = configured_grid(grid)
    have = {
        (str(d), _value(depth), _value(n))
        for d, depth, n in zip(shapes["distribution"], shapes["depth"], shapes["budget"], strict=True)
    }
    want = {(str(d), depth, n) for d in grid["distributions"] for depth, n in _depth_budgets(grid)}
    want |= {tuple(point) for point in grid.get("extra_shapes", ())}
    if have - want:
        d, depth, n = sorted(have - want, key=str)[0]
        raise ValueError(f"{where}: holds rows of {d} L={depth} N={n}, which the configuration does not name")
    if want - have:
        d, depth, n = sorted(want - have, key=str)[0]
        raise ValueError(f"{where}: lacks the configured {d} L={depth} N={n}")


def _describe(grid: dict) -> str:
    return "; ".join(f"{key} {values}" for key, values in grid.items())


# ----------------------------------------------------------------------------------------- trace identity


def trace_digests(summary: pd.DataFrame) -> dict:
    """``{(distribution, depth): {sha256, ...}}`` of a summary's timed rows (empty without the column)."""
    if summary is None or "trace_sha256" not in summary:
        return {}
    out: dict = {}
    for distribution, depth, digest in zip(
        summary["distribution"], summary["depth"], summary["trace_sha256"], strict=True
    ):
        if isinstance(digest, str) and digest:
            out.setdefault((str(distribution), _value(depth)), set()).add(digest)
    return out


def trace_identity(machines) -> list[str]:
    """One sentence per machine set beside the first: same traces (every shared distribution and depth has
    equal sha256 sets), other traces (naming where they differ), or not known (a side records no sha256)."""
    if len(machines) < 2:
        return []
    first = machines[0]
    mine = trace_digests(first.summary)
    lines = []
    for other in machines[1:]:
        theirs = trace_digests(other.summary)
        pair = f"{other.label} and {first.label}"
        if not mine or not theirs:
            lacking = ", ".join(m.label for m, d in ((first, mine), (other, theirs)) if not d)
            lines.append(
                f"Traces of {pair}: not known to be the same ({lacking} records no trace sha256, measured "
                "before rows recorded it); compare their numbers with that in mind."
            )
            continue
        shared = sorted(set(mine) & set(theirs), key=str)
        if not shared:
            lines.append(f"Traces of {pair}: no distribution and depth in common; nothing to compare.")
            continue
        differ = [f"{d} L={depth}" for d, depth in shared if mine[(d, depth)] != theirs[(d, depth)]]
        names = ", ".join(f"{d} L={depth}" for d, depth in shared)
        if differ:
            lines.append(
                f"Traces of {pair}: different for {', '.join(differ)} (sha256 differ): their numbers are not "
                "of the same inputs."
            )
        else:
            lines.append(f"Traces of {pair}: identical (equal sha256) for {names}.")
    return lines


__all__ = ["GRID_KEYS", "check_shapes", "check_summary", "configured_grid", "trace_digests", "trace_identity"]
