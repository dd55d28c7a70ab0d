"""Which budget? A model of one decode round of a batch, and the tokens per second it gives per budget and
per tree builder.

One round of a batch of ``B`` requests with trees of budget ``N``::

    round = draft + build + verify + accept
    verify = attention_per_layer x layers + rest_fixed + rest_per_token x B x (N + 1)
    tokens/s = B x tau(N) / round

- ``draft``: a configured constant (``throughput.draft_ms``; default 0: the drafter's forward left out).
- ``build``: the builder's measured median per call (``summary.parquet``): its ``in-situ`` timing where the
  builder has such rows (what the round's critical path pays from the drafter's top-K on the GPU to the tree
  on the GPU), else the GPU kernel's time (CUDA events, warm) for ``gpu`` and the wall time for the CPU
  builders. Which one was used is on every row (``build_from``).
- ``attention_per_layer``: our verify attention (impl ``ours``, warm device time) at (B, N, S, H), from the
  step summary; ``layers`` from the step section (Kimi K2.6: 61).
- ``rest_*``: the target's forward besides the attention core, linear in the round's tokens B x (N + 1)
  (configured: ``throughput.rest.fixed_ms``, ``throughput.rest.per_token_us``).
- ``accept``: the measured tree accept (the GPU accept kernel) at (B, N).
- ``tau(N)``: 1 + the expected accepted draft tokens of the budget's trees (``tree_shape.parquet``'s
  ``expected_accept_mean``: the sum over the tree's nodes of the path probability), i.e. the paper's
  acceptance length with the bonus token.

Only (B, N) where every measured term exists are modelled: nothing is interpolated or filled in.
``paper_example()`` is the worked example of docs/throughput.md.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import pandas as pd

from ddtree_bench.summary.step import preferred

#: The configuration's defaults (docs/throughput.md says where they come from).
DEFAULT_DRAFT_MS = 0.0
DEFAULT_REST_FIXED_MS = 1.0
DEFAULT_REST_PER_TOKEN_US = 10.0

IN_SITU = "in-situ"
#: The builders the model compares: (builder, label, fallback timing, its name) where no in-situ rows exist.
BUILDERS = (
    ("sglang", "sglang (SGLang's CPU builder)", "wall", "wall clock"),
    ("reference", "reference (ours, Python)", "wall", "wall clock"),
    ("native", "native (C++, 1 thread)", "wall", "wall clock"),
    ("native-mt", "native-mt (C++, all cores)", "wall", "wall clock"),
    ("gpu", "gpu (our CUDA kernel)", "kernel-events", "kernel (CUDA events)"),
)
BUILDER_LABELS = {builder: label for builder, label, *_ in BUILDERS}
IN_SITU_NAME = "in-situ"

#: The model's assumptions, said wherever its numbers are shown (three lines).
ASSUMPTIONS = (
    "A round is draft + tree build + verify + accept, one after the other (no overlap); the draft is a "
    "configured constant, the build, verify attention and accept are this machine's medians.",
    "The target's forward besides the attention core is rest.fixed + rest.per_token x B x (N + 1), linear in "
    "the round's tokens (a MoE target touches more experts as the round grows; enter measured step times).",
    "tau(N) = 1 + the expected accepted draft tokens of the budget's trees under the drafter's own "
    "distributions (the drafter-equals-target case); a real target accepts less where they differ.",
)

TABLE_COLUMNS = (
    "batch",
    "budget",
    "builder",
    "label",
    "build_from",
    "tau",
    "draft_s",
    "build_s",
    "attention_layer_s",
    "attention_s",
    "rest_s",
    "accept_s",
    "round_s",
    "tokens_per_s",
)


# ----------------------------------------------------------------------------------------------- model


@dataclass(frozen=True)
class RoundModel:
    """The configured terms of a round (seconds) and the target's layers."""

    draft_s: float = DEFAULT_DRAFT_MS * 1e-3
    rest_fixed_s: float = DEFAULT_REST_FIXED_MS * 1e-3
    rest_per_token_s: float = DEFAULT_REST_PER_TOKEN_US * 1e-6
    layers: int = 61

    def __post_init__(self):
        for name in ("draft_s", "rest_fixed_s", "rest_per_token_s"):
            _non_negative(getattr(self, name), name)
        layers = self.layers
        if isinstance(layers, bool) or not isinstance(layers, numbers.Integral) or layers < 1:
            raise ValueError(f"layers: must be an integer >= 1, got {layers!r}")

    @classmethod
    def from_config(cls, section: dict | None, layers: int) -> RoundModel:
        """From the configuration's ``throughput`` section (missing keys: the defaults)."""
        section = section or {}
        rest = section.get("rest") or {}
        return cls(
            draft_s=_ms(section.get("draft_ms", DEFAULT_DRAFT_MS), "throughput.draft_ms") * 1e-3,
            rest_fixed_s=_ms(rest.get("fixed_ms", DEFAULT_REST_FIXED_MS), "throughput.rest.fixed_ms") * 1e-3,
            rest_per_token_s=_ms(
                rest.get("per_token_us", DEFAULT_REST_PER_TOKEN_US), "throughput.rest.per_token_us"
            )
            * 1e-6,
            layers=layers,
        )

    def rest_s(self, batch: int, budget: int) -> float:
        """The target's forward besides the attention core, for B x (N + 1) tokens."""
        return self.rest_fixed_s + self.rest_per_token_s * batch * (budget + 1)

    def round_s(self, batch: int, budget: int, *, build_s, attention_layer_s, accept_s) -> float:
        """draft + build + attention x layers + rest + accept."""
        for name, value in (
            ("build_s", build_s),
            ("attention_layer_s", attention_layer_s),
            ("accept_s", accept_s),
        ):
            _non_negative(value, name)
        return (
            self.draft_s
            + float(build_s)
            + float(attention_layer_s) * self.layers
            + self.rest_s(batch, budget)
            + float(accept_s)
        )

    def describe(self) -> str:
        return (
            f"draft {self.draft_s * 1e3:g} ms, rest {self.rest_fixed_s * 1e3:g} ms + "
            f"{self.rest_per_token_s * 1e6:g} µs x B x (N + 1), verify attention x {self.layers} layers"
        )


def _non_negative(value, name: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
    return float(value)


def _ms(value, name: str) -> float:
    return _non_negative(value, name)


def tokens_per_second(tau: float, batch: int, round_s: float) -> float:
    """B x tau / round: the tokens a batch commits per second."""
    if not (isinstance(tau, numbers.Real) and math.isfinite(tau) and tau >= 1):
        raise ValueError(f"tau: must be a number >= 1 (the bonus token is always committed), got {tau!r}")
    if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 1:
        raise ValueError(f"batch: must be an integer >= 1, got {batch!r}")
    if not (isinstance(round_s, numbers.Real) and math.isfinite(round_s) and round_s > 0):
        raise ValueError(f"round time: must be a number > 0, got {round_s!r}")
    return batch * float(tau) / float(round_s)


# ----------------------------------------------------------------------------------------------- inputs


def tau_per_budget(shapes: pd.DataFrame | None, distribution: str, depth: int) -> pd.Series:
    """tau(N) = 1 + expected_accept_mean of the trees at ``distribution`` and ``depth``, indexed by budget
    (empty where the shapes do not hold it)."""
    if shapes is None or shapes.empty or "expected_accept_mean" not in shapes:
        return pd.Series(dtype="float64")
    sel = shapes[(shapes["distribution"] == distribution) & (shapes["depth"] == depth)]
    sel = sel[sel["expected_accept_mean"].notna()].drop_duplicates("budget")
    return (
        1.0 + sel.set_index(sel["budget"].astype("int64"))["expected_accept_mean"].astype("float64")
    ).sort_index()


def build_costs(summary: pd.DataFrame | None, distribution: str, depth: int) -> pd.DataFrame:
    """Per builder, (batch, budget): ``build_s`` and ``build_from``. A builder with in-situ rows at this
    distribution and depth uses only those (warm before n/a; of several rows of one configuration, e.g. the
    GPU's bool-mask and packed-bits variants, the fastest); otherwise its fallback timing (``BUILDERS``)."""
    columns = ["builder", "label", "build_from", "batch", "budget", "build_s"]
    if summary is None or summary.empty:
        return pd.DataFrame(columns=columns)
    ok = summary[
        (summary["status"] == "ok")
        & (summary["n"] > 0)
        & (summary["distribution"] == distribution)
        & (summary["depth"] == depth)
        & (summary["cache"] != "cold")
        & summary["median_s"].notna()
    ]
    frames = []
    for builder, label, fallback, fallback_name in BUILDERS:
        rows = ok[ok["builder"] == builder]
        in_situ = rows[rows["timing"] == IN_SITU]
        if len(in_situ):
            rows, source = in_situ, IN_SITU_NAME
        else:
            rows, source = rows[rows["timing"] == fallback], fallback_name
        if rows.empty:
            continue
        rank = rows["cache"].map({"warm": 0, "n/a": 1}).fillna(2)
        rows = rows.assign(_rank=rank)
        best_rank = rows.groupby(["batch", "budget"])["_rank"].transform("min")
        rows = rows[rows["_rank"] == best_rank]
        costs = rows.groupby(["batch", "budget"], as_index=False)["median_s"].min()
        frames.append(
            costs.rename(columns={"median_s": "build_s"}).assign(
                builder=builder, label=label, build_from=source
            )
        )
    if not frames:
        return pd.DataFrame(columns=columns)
    out = pd.concat(frames, ignore_index=True)[columns]
    out["batch"] = out["batch"].astype("int64")
    out["budget"] = out["budget"].astype("int64")
    return out


@dataclass
class VerifyCosts:
    """The measured verify attention (per layer) and accept per (batch, budget), and where they come from."""

    costs: pd.DataFrame  # batch, budget, attention_layer_s, accept_s
    prefix: int | None
    heads: int | None
    distribution: str | None  # the trees the step stages measured
    missing: str | None = None  # why there are none


def verify_costs(
    step: pd.DataFrame | None, distribution: str, depth: int, prefix: int | None = None
) -> VerifyCosts:
    """Our verify attention (impl ``ours``) and the GPU accept kernel at ``depth``, on ``distribution``'s
    trees where the step stages measured them, else on the step's own trees (``distribution`` says which).
    ``prefix``: the prefix length S (None: the largest measured); heads: 8 where measured, else the fewest."""
    empty = pd.DataFrame(columns=["batch", "budget", "attention_layer_s", "accept_s"])
    measured = preferred(step) if step is not None and not step.empty else pd.DataFrame()
    if measured.empty:
        why = _unavailable(step)
        missing = "no measured verify attention or tree accept" + (f" ({why})" if why else "")
        return VerifyCosts(empty, None, None, None, missing)
    measured = measured[measured["depth"] == depth]
    attention = measured[(measured["stage"] == "verify-attention") & (measured["impl"] == "ours")]
    if attention.empty:
        return VerifyCosts(empty, None, None, None, f"no measured verify attention (ours) at L = {depth}")
    trees = distribution if (attention["distribution"] == distribution).any() else None
    if trees is None:
        trees = str(attention["distribution"].dropna().iloc[0])
    attention = attention[attention["distribution"] == trees]
    prefixes = sorted(int(p) for p in attention["prefix"].dropna().unique())
    if prefix is None:
        prefix = prefixes[-1]
    elif prefix not in prefixes:
        return VerifyCosts(
            empty, prefix, None, trees, f"no verify attention measured at S = {prefix} (measured: {prefixes})"
        )
    attention = attention[attention["prefix"] == prefix]
    heads_measured = sorted(int(h) for h in attention["heads"].dropna().unique())
    heads = 8 if 8 in heads_measured else heads_measured[0]
    attention = attention[attention["heads"] == heads]
    accept = measured[
        (measured["stage"] == "accept")
        & (measured["impl"] == "gpu-kernel")
        & (measured["distribution"] == trees)
    ]
    if accept.empty:
        return VerifyCosts(empty, prefix, heads, trees, "no measured tree accept (GPU kernel)")
    costs = attention[["batch", "budget", "median_s"]].rename(columns={"median_s": "attention_layer_s"})
    costs = costs.merge(
        accept[["batch", "budget", "median_s"]].rename(columns={"median_s": "accept_s"}),
        on=["batch", "budget"],
    )
    costs = costs.drop_duplicates(["batch", "budget"]).astype(
        {"batch": "int64", "budget": "int64", "attention_layer_s": "float64", "accept_s": "float64"}
    )
    return VerifyCosts(costs.reset_index(drop=True), prefix, heads, trees)


def _unavailable(step: pd.DataFrame | None) -> str:
    """Why our verify attention could not run, from its rows' status (empty where none says)."""
    if step is None or step.empty or "status_reason" not in step:
        return ""
    rows = step[(step["stage"] == "verify-attention") & (step["impl"] == "ours") & (step["status"] != "ok")]
    reasons = list(dict.fromkeys(str(r) for r in rows["status_reason"].dropna()))
    return "; ".join(f"ours: {r}" for r in reasons[:2])


# ----------------------------------------------------------------------------------------------- tables


@dataclass
class Throughput:
    """``table`` (``TABLE_COLUMNS``: one row per batch, budget and builder), the verify's source, and why the
    table is empty where it is."""

    table: pd.DataFrame
    verify: VerifyCosts
    distribution: str
    depth: int
    missing: str | None = None


def throughput(
    summary: pd.DataFrame | None,
    step: pd.DataFrame | None,
    shapes: pd.DataFrame | None,
    model: RoundModel,
    *,
    distribution: str,
    depth: int,
    prefix: int | None = None,
) -> Throughput:
    """The modelled tokens per second of every builder at every (batch, budget) where the build, the verify
    attention, the accept and tau(N) were all measured."""
    verify = verify_costs(step, distribution, depth, prefix)
    empty = pd.DataFrame(columns=list(TABLE_COLUMNS))
    if verify.missing:
        return Throughput(empty, verify, distribution, depth, f"needs the step stages: {verify.missing}")
    tau = tau_per_budget(shapes, distribution, depth)
    if tau.empty:
        return Throughput(
            empty,
            verify,
            distribution,
            depth,
            f"no expected acceptance of the {distribution} trees (L = {depth})",
        )
    builds = build_costs(summary, distribution, depth)
    if builds.empty:
        return Throughput(
            empty, verify, distribution, depth, f"no tree-build timings on the {distribution} trees"
        )
    rows = builds.merge(verify.costs, on=["batch", "budget"])
    rows = rows[rows["budget"].isin(tau.index)]
    if rows.empty:
        return Throughput(
            empty,
            verify,
            distribution,
            depth,
            "no (batch, budget) with a tree build, a verify attention and an accept all measured",
        )
    rows = rows.assign(tau=rows["budget"].map(tau).astype("float64"))
    records = []
    for row in rows.itertuples(index=False):
        batch, budget = int(row.batch), int(row.budget)
        round_s = model.round_s(
            batch, budget, build_s=row.build_s, attention_layer_s=row.attention_layer_s, accept_s=row.accept_s
        )
        records.append(
            {
                "batch": batch,
                "budget": budget,
                "builder": row.builder,
                "label": row.label,
                "build_from": row.build_from,
                "tau": float(row.tau),
                "draft_s": model.draft_s,
                "build_s": float(row.build_s),
                "attention_layer_s": float(row.attention_layer_s),
                "attention_s": float(row.attention_layer_s) * model.layers,
                "rest_s": model.rest_s(batch, budget),
                "accept_s": float(row.accept_s),
                "round_s": round_s,
                "tokens_per_s": tokens_per_second(float(row.tau), batch, round_s),
            }
        )
    order = {builder: i for i, (builder, *_) in enumerate(BUILDERS)}
    table = pd.DataFrame.from_records(records, columns=list(TABLE_COLUMNS))
    table = (
        table.assign(_o=table["builder"].map(order)).sort_values(["batch", "_o", "budget"]).drop(columns="_o")
    )
    return Throughput(table.reset_index(drop=True), verify, distribution, depth)


def best_budgets(table: pd.DataFrame) -> pd.DataFrame:
    """Per (batch, builder): the budget with the most modelled tokens per second (the smaller budget on a
    tie), with its tokens/s, tau and round time, and the budgets compared."""
    columns = [
        "batch",
        "builder",
        "label",
        "build_from",
        "best_budget",
        "tokens_per_s",
        "tau",
        "round_s",
        "budgets",
    ]
    if table is None or table.empty:
        return pd.DataFrame(columns=columns)
    records = []
    for (batch, builder), group in table.groupby(["batch", "builder"], sort=False):
        group = group.sort_values("budget")
        best = group.loc[group["tokens_per_s"].idxmax()]
        records.append(
            {
                "batch": int(batch),
                "builder": builder,
                "label": best["label"],
                "build_from": best["build_from"],
                "best_budget": int(best["budget"]),
                "tokens_per_s": float(best["tokens_per_s"]),
                "tau": float(best["tau"]),
                "round_s": float(best["round_s"]),
                "budgets": tuple(int(b) for b in group["budget"]),
            }
        )
    return pd.DataFrame.from_records(records, columns=columns)


def gpu_gains(best: pd.DataFrame) -> pd.DataFrame:
    """Per batch: the GPU builder's tokens/s at its own best budget over the baseline's at the baseline's
    own best budget. The baseline is SGLang's builder where it has rows, else ``reference`` (``baseline``
    says which)."""
    columns = [
        "batch",
        "baseline",
        "baseline_label",
        "baseline_budget",
        "baseline_tokens_per_s",
        "gpu_budget",
        "gpu_tokens_per_s",
        "gain",
    ]
    if best is None or best.empty or not (best["builder"] == "gpu").any():
        return pd.DataFrame(columns=columns)
    base = "sglang" if (best["builder"] == "sglang").any() else "reference"
    records = []
    for batch, group in best.groupby("batch", sort=True):
        gpu, other = group[group["builder"] == "gpu"], group[group["builder"] == base]
        if gpu.empty or other.empty:
            continue
        gpu, other = gpu.iloc[0], other.iloc[0]
        records.append(
            {
                "batch": int(batch),
                "baseline": base,
                "baseline_label": BASELINE_LABELS[base],
                "baseline_budget": int(other["best_budget"]),
                "baseline_tokens_per_s": float(other["tokens_per_s"]),
                "gpu_budget": int(gpu["best_budget"]),
                "gpu_tokens_per_s": float(gpu["tokens_per_s"]),
                "gain": float(gpu["tokens_per_s"]) / float(other["tokens_per_s"]),
            }
        )
    return pd.DataFrame.from_records(records, columns=columns)


BASELINE_LABELS = {
    "sglang": "SGLang's CPU builder",
    "reference": "reference (ours, Python; a stand-in for SGLang's builder, which was not measured here)",
}


# ----------------------------------------------------------------------------------------- worked example

#: The DDTree paper's Fig. 3 (Qwen3-8B, MATH-500, H200, block 16): tau and speedup over autoregressive per
#: budget, and the round's cost in autoregressive steps (tau / speedup: 1.40 up to N = 256, 1.43, 1.61).
PAPER_TAU = {16: 8.61, 32: 9.27, 64: 9.75, 128: 10.20, 256: 10.43, 512: 10.73, 1024: 10.98}
PAPER_SPEEDUP = {16: 6.09, 32: 6.60, 64: 6.97, 128: 7.33, 256: 7.43, 512: 7.52, 1024: 6.82}
PAPER_ROUND_STEPS = {16: 1.40, 32: 1.40, 64: 1.40, 128: 1.40, 256: 1.40, 512: 1.43, 1024: 1.61}


def paper_example() -> pd.DataFrame:
    """The model fed the paper's tau(N) and its measured round costs, in units of one autoregressive step
    (batch 1; draft, build and accept inside the measured round, so 0 here; rest.fixed = 1.40 steps, the
    round at small budgets; the measured verify growth beyond it, 0 up to N = 256, 0.03 at 512, 0.21 at 1024,
    in the verify term as one "layer"). Its tokens per step is the modelled speedup over autoregressive
    decoding, beside the paper's own."""
    base = PAPER_ROUND_STEPS[16]
    model = RoundModel(draft_s=0.0, rest_fixed_s=base, rest_per_token_s=0.0, layers=1)
    records = []
    for budget, tau in PAPER_TAU.items():
        growth = PAPER_ROUND_STEPS[budget] - base
        round_steps = model.round_s(1, budget, build_s=0.0, attention_layer_s=growth, accept_s=0.0)
        records.append(
            {
                "budget": budget,
                "tau": tau,
                "round_steps": round_steps,
                "modelled_speedup": tokens_per_second(tau, 1, round_steps),
                "paper_speedup": PAPER_SPEEDUP[budget],
            }
        )
    return pd.DataFrame.from_records(records)
