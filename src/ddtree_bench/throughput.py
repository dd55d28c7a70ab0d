"""Which budget? A model of one decode round of a batch, and the tokens per second it gives per budget and
per tree builder.

One round of a batch of ``B`` requests with trees of budget ``N`` (T = B x (N + 1) tree tokens)::

    round    = draft + build + forward + allreduce + accept
    tokens/s = B x tau(N) / round

Every term carries its source (``SOURCES``): ``measured`` (a step-summary row with status ok), ``sum of
parts`` (the forward as moe + dense + lm-head + verify attention x layers, each measured), ``estimated``
(the linear what-if or the communication formula on this module's defaults), ``entered`` (the same formulas
or the drafter time on numbers the configuration changed) or ``missing``. A (B, N) with a missing term is not
modelled; the term is named (``Throughput.unmodelled``), never taken as zero. Rows whose status is not ok
count as missing, never as zero.

- ``draft``: the measured ``draft`` row (the DFlash drafter's forward over the block, its LM head, logsumexp
  and top-K) at (B, N, S); else ``throughput.draft_ms`` (entered); else the what-if's drafter estimate.
- ``build``: the builder's measured median per call (``summary.parquet``): its ``in-situ`` timing where the
  builder has such rows, else the GPU kernel's time (CUDA events, warm) for ``gpu`` and the wall time for the
  CPU builders (``build_from``).
- ``forward``: the 61-layer target forward of the T tree tokens, our verify attention at S included: the
  measured ``forward`` row (impl ``marlin-w4a16`` first); else the sum of the measured parts (``moe`` +
  ``dense`` + ``lm-head`` + our ``verify-attention`` per layer x layers); else our measured verify attention x
  layers + the linear what-if (``WhatIf``): fixed + expert bytes x E(T) x 60 / bandwidth + per-token x T.
  ``throughput.forward_ms`` (entered), where set, comes before the sum of parts and the what-if: the forward
  as a whole, its communication included (as a live service times it), so the ``allreduce`` term is then 0.
- ``allreduce``: the measured ``allreduce`` rows (their world size) where ok; else the estimate
  (``Comm``): 122 x (latency + 2 (w - 1) / w x T x 7168 x 2 B / busbw) + the drafter's top-K all-gathers.
- ``accept``: the measured tree accept (the GPU accept kernel) at (B, N).
- ``tau(N)``: 1 + the expected accepted draft tokens of the budget's trees (``tree_shape.parquet``).

The best budget of a builder is the one with the most tokens/s (the smaller on a tie); the term that sets it
(``limiting_terms``) is the part of the round with the largest increase from the best budget to the next
larger modelled budget (where the round's growth outweighed tau's gain). ``paper_example()`` is the worked
example of docs/throughput.md.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields

import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.k26 import estimates as arithmetic
from ddtree_bench.summary.step import preferred

MEASURED, SUM_OF_PARTS, ESTIMATED, ENTERED, MISSING = (
    "measured",
    "sum of parts",
    "estimated",
    "entered",
    "missing",
)
SOURCES = (MEASURED, SUM_OF_PARTS, ESTIMATED, ENTERED, MISSING)

#: The round's terms (they add up to the round) and the forward's parts where it is not one measured graph.
ROUND_TERMS = ("draft", "build", "forward", "allreduce", "accept")
FORWARD_PARTS = ("attention", "moe", "dense", "lm_head")
TERM_LABELS = {
    "draft": "draft",
    "build": "tree build",
    "forward": "target forward",
    "attention": "verify attention",
    "moe": "MoE",
    "dense": "dense",
    "lm_head": "LM head",
    "allreduce": "communication",
    "accept": "accept",
}
#: The forward's MoE impls, preferred first (SGLang's for the W4A16 checkpoint on Hopper: Marlin).
MOE_IMPLS = catalog.MOE_IMPLS

DEFAULT_DRAFT_MS = None  # null: measured, else the what-if's drafter estimate

IN_SITU = catalog.IN_SITU
#: The builders the model compares: (builder, label, fallback timing, its name) where no in-situ rows exist.
BUILDERS = tuple((b.name, b.label, *b.fallback) for b in catalog.BUILDERS.values())
BUILDER_LABELS = {builder: label for builder, label, *_ in BUILDERS}
CPU_BUILDERS = catalog.builders_where(runner=catalog.CPU)
IN_SITU_NAME = catalog.IN_SITU

#: The model's assumptions, said wherever its numbers are shown (three lines).
ASSUMPTIONS = (
    "A round is draft + tree build + target forward + communication + accept, one after the other (no "
    "overlap); each term is measured where the step stages measured it, else estimated or entered, and says "
    "which.",
    "The what-if forward (where no forward or parts were measured) is our measured verify attention x layers "
    "+ fixed + expert bytes x E(T) x 60 / bandwidth + per-token x T: INT4 routed experts read once per "
    "distinct expert touched, E(T) under uniform top-8 routing (a skewed router touches fewer).",
    "tau(N) = 1 + the expected accepted draft tokens of the budget's trees under the drafter's own "
    "distributions (the drafter-equals-target case); a real target accepts less where they differ.",
)


# ----------------------------------------------------------------------------------------------- model


def _non_negative(value, name: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
    return float(value)


def _positive(value, name: str) -> float:
    if _non_negative(value, name) <= 0:
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class WhatIf:
    """The linear what-if of the target's forward besides the verify attention, per rank (defaults: Kimi
    K2.6 W4A16 under tensor parallel 8, from ``round.kimi_arithmetic``; docs/throughput.md)::

        moe   = expert_slice x E(T) x 60 / bandwidth + expert_per_token x T
        dense = dense_weights / bandwidth + dense_per_token x T        (the LM head included)
        draft = draft_weights / bandwidth + draft_per_token x B x L

    ``bandwidth_tbps`` None: the machine's measured device-copy peak, else ``round.H200_COPY_TBPS``."""

    dense_weights_gb: float = 4.5
    expert_slice_mb: float = 3.10
    dense_per_token_us: float = 5.75
    expert_per_token_us: float = 6.7
    draft_weights_gb: float = 1.1
    draft_per_token_us: float = 1.4
    bandwidth_tbps: float | None = None

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "bandwidth_tbps":
                if value is not None:
                    _positive(value, "what_if.bandwidth_tbps")
            else:
                _non_negative(value, f"what_if.{f.name}")

    def parts_s(self, tokens: int, bandwidth_tbps: float) -> dict[str, float]:
        """``moe`` and ``dense`` (LM head included) seconds for ``tokens`` tree tokens."""
        bandwidth = _positive(bandwidth_tbps, "bandwidth") * 1e12
        experts = arithmetic.experts_touched(tokens) * arithmetic.K26.moe_layers
        return {
            "moe": self.expert_slice_mb * 1e6 * experts / bandwidth
            + self.expert_per_token_us * 1e-6 * tokens,
            "dense": self.dense_weights_gb * 1e9 / bandwidth + self.dense_per_token_us * 1e-6 * tokens,
        }

    def draft_s(self, batch: int, positions: int, bandwidth_tbps: float) -> float:
        bandwidth = _positive(bandwidth_tbps, "bandwidth") * 1e12
        return self.draft_weights_gb * 1e9 / bandwidth + self.draft_per_token_us * 1e-6 * batch * positions


@dataclass(frozen=True)
class Comm:
    """Tensor-parallel communication per round where not measured: ``round.ALLREDUCES`` all-reduces of
    T x 7168 BF16 and the drafter's top-K all-gathers, in nccl-tests' bus-bandwidth terms (defaults: 8 x
    H200 without NVLink SHARP, about 370 GB/s at large sizes; 15 µs per small collective)."""

    world_size: int = 8
    bus_bandwidth_gbps: float = 370.0
    latency_us: float = 15.0

    def __post_init__(self):
        world = self.world_size
        if isinstance(world, bool) or not isinstance(world, numbers.Integral) or world < 1:
            raise ValueError(f"allreduce.world_size: must be an integer >= 1, got {world!r}")
        _positive(self.bus_bandwidth_gbps, "allreduce.bus_bandwidth_gbps")
        _non_negative(self.latency_us, "allreduce.latency_us")

    def allreduce_s(self, tokens: int) -> float:
        return arithmetic.allreduce_s(tokens, self.world_size, self.bus_bandwidth_gbps, self.latency_us)

    def allgather_s(self, batch: int, positions: int, k: int) -> float:
        return arithmetic.topk_allgather_s(
            batch, positions, k, self.world_size, self.bus_bandwidth_gbps, self.latency_us
        )

    def describe(self) -> str:
        return (
            f"{2 * arithmetic.K26.layers} x ({self.latency_us:g} µs + 2 (w - 1) / w x T x 7168 x 2 B / "
            f"{self.bus_bandwidth_gbps:g} GB/s) + 3 top-K all-gathers, w = {self.world_size}"
        )


@dataclass(frozen=True)
class RoundAssumptions:
    """What the round takes besides the measurements: the target's layers, an entered drafter time (None:
    measured, else estimated), the what-if, the communication estimate and K (the traces' top-K columns;
    the drafter's top-K is min(N, K))."""

    layers: int = arithmetic.K26.layers
    draft_ms: float | None = DEFAULT_DRAFT_MS
    what_if: WhatIf = field(default_factory=WhatIf)
    comm: Comm = field(default_factory=Comm)
    topk: int = 1024
    forward_ms: float | None = None

    def __post_init__(self):
        for name in ("layers", "topk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        if self.draft_ms is not None:
            _non_negative(self.draft_ms, "throughput.draft_ms")
        if self.forward_ms is not None:
            _non_negative(self.forward_ms, "throughput.forward_ms")

    @classmethod
    def from_config(cls, section: dict | None, layers: int, topk: int = 1024) -> RoundAssumptions:
        """From the configuration's ``throughput`` section (missing keys: the defaults)."""
        section = section or {}
        what_if = section.get("what_if") or {}
        comm = section.get("allreduce") or {}
        try:
            return cls(
                layers=layers,
                draft_ms=section.get("draft_ms", DEFAULT_DRAFT_MS),
                what_if=WhatIf(**what_if),
                comm=Comm(**comm),
                topk=topk,
                forward_ms=section.get("forward_ms"),
            )
        except TypeError as error:  # an unknown key
            raise ValueError(f"throughput: {error}") from None

    @classmethod
    def from_options(cls, options: dict | None, layers: int) -> RoundAssumptions:
        """From ``settings.Settings.throughput_options()`` (None: the defaults)."""
        options = options or {}
        keys = ("draft_ms", "forward_ms", "what_if", "allreduce")
        section = {key: options[key] for key in keys if key in options}
        return cls.from_config(section, layers, int(options.get("topk") or 1024))

    @property
    def what_if_source(self) -> str:
        """``estimated`` on the defaults (the INT4/BF16 arithmetic), ``entered`` where the config changed
        any of them."""
        return ESTIMATED if self.what_if == WhatIf() else ENTERED

    @property
    def comm_source(self) -> str:
        return ESTIMATED if self.comm == Comm() else ENTERED

    def describe(self) -> str:
        draft = (
            "measured, else estimated"
            if self.draft_ms is None
            else f"{self.draft_ms:g} ms where not measured"
        )
        w = self.what_if
        bandwidth = (
            "the measured device-copy peak" if w.bandwidth_tbps is None else f"{w.bandwidth_tbps:g} TB/s"
        )
        if self.forward_ms is not None:
            draft += f"; forward {self.forward_ms:g} ms where not measured (communication in it)"
        return (
            f"draft {draft}; what-if forward: verify attention x {self.layers} layers + "
            f"{w.dense_weights_gb:g} GB + {w.expert_slice_mb:g} MB x E(T) x {arithmetic.K26.moe_layers} at "
            f"{bandwidth} + ({w.dense_per_token_us:g} + {w.expert_per_token_us:g}) µs x T; communication "
            f"where not measured: {self.comm.describe()}"
        )


def tokens_per_second(tau: float, batch: int, round_s: float) -> float:
    """B x tau / round: the tokens a batch commits per second."""
    if not (isinstance(tau, numbers.Real) and math.isfinite(tau) and tau >= 1):
        raise ValueError(f"tau: must be a number >= 1 (the bonus token is always committed), got {tau!r}")
    if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 1:
        raise ValueError(f"batch: must be an integer >= 1, got {batch!r}")
    if not (isinstance(round_s, numbers.Real) and math.isfinite(round_s) and round_s > 0):
        raise ValueError(f"round time: must be a number > 0, got {round_s!r}")
    return batch * float(tau) / float(round_s)


@dataclass(frozen=True)
class Term:
    """One term of a round: seconds (None where missing), its source and a note (which impl, which
    formula, or why it is missing)."""

    seconds: float | None
    source: str
    note: str = ""

    @property
    def missing(self) -> bool:
        return self.source == MISSING or self.seconds is None


def _missing(note: str) -> Term:
    return Term(None, MISSING, note)


def _value(costs: dict, key: str) -> float | None:
    value = costs.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return None
    return float(value)


@dataclass(frozen=True)
class Bandwidth:
    """The what-if's bandwidth in TB/s and where it comes from, as said after the number (e.g.
    ``" (entered)"``)."""

    tbps: float
    source: str = ""


def _because(reasons: dict, stage: str) -> str:
    """``" (why)"`` where ``stage``'s rows were not ok (``reasons``), else ``""``."""
    return f" ({reasons[stage]})" if reasons.get(stage) else ""


def round_terms(
    model: RoundAssumptions,
    batch: int,
    budget: int,
    depth: int,
    *,
    build: Term,
    costs: dict,
    bandwidth: Bandwidth,
    reasons: dict | None = None,
) -> dict[str, Term]:
    """Every term of the round at (B, N) with its source: ``ROUND_TERMS`` and the forward's parts
    (``FORWARD_PARTS``; where the forward is one measured graph, the parts are informational). ``costs``: the
    measured values at (B, N) (``StageCosts.costs`` columns; absent or NaN: not measured); ``bandwidth``: the
    what-if's; ``reasons``: per stage, why its rows were not ok."""
    reasons = reasons or {}
    terms: dict[str, Term] = {"build": build}
    terms["draft"] = _draft_term(model, costs, batch, depth, bandwidth, reasons)
    attention_layer = _value(costs, "attention_layer_s")
    terms["attention"] = (
        Term(attention_layer * model.layers, MEASURED, f"ours x {model.layers} layers")
        if attention_layer is not None
        else _missing("no measured verify attention (ours)" + _because(reasons, "verify-attention"))
    )
    tokens = batch * (budget + 1)
    terms |= _forward_terms(model, costs, terms["attention"], tokens, bandwidth, reasons)
    terms["allreduce"] = _allreduce_term(model, costs, terms["forward"], batch, budget, depth, reasons)
    accept = _value(costs, "accept_s")
    terms["accept"] = (
        Term(accept, MEASURED, "gpu kernel")
        if accept is not None
        else _missing("no measured tree accept (GPU kernel)" + _because(reasons, "accept"))
    )
    return terms


def _draft_term(model: RoundAssumptions, costs: dict, batch: int, depth: int, bandwidth: Bandwidth, reasons):
    """The drafter: measured, else entered (``throughput.draft_ms``), else the what-if's estimate."""
    draft = _value(costs, "draft_s")
    if draft is not None:
        return Term(draft, MEASURED, "draft stage")
    if model.draft_ms is not None:
        return Term(model.draft_ms * 1e-3, ENTERED, "throughput.draft_ms" + _because(reasons, "draft"))
    return Term(
        model.what_if.draft_s(batch, depth, bandwidth.tbps),
        model.what_if_source,
        f"drafter weights / bandwidth + per token x B x L (L = {depth}){_because(reasons, 'draft')}",
    )


def _forward_terms(
    model: RoundAssumptions, costs: dict, attention: Term, tokens: int, bandwidth: Bandwidth, reasons
) -> dict[str, Term]:
    """The target forward of ``tokens`` tree tokens and its parts (moe, dense, lm_head): one measured graph,
    else entered (``throughput.forward_ms``), else the sum of the measured parts, else our verify attention
    plus the linear what-if; missing where it does not fit on the GPU or our attention was not measured."""
    measured_parts = {
        "moe": (_value(costs, "moe_s"), str(costs.get("moe_impl") or "")),
        "dense": (_value(costs, "dense_s"), "torch"),
        "lm_head": (_value(costs, "lm_head_s"), "torch"),
    }
    as_measured = {
        part: Term(seconds, MEASURED, impl) if seconds is not None else _missing("not measured")
        for part, (seconds, impl) in measured_parts.items()
    }
    not_measured = {part: _missing("not measured") for part in measured_parts}
    forward = _value(costs, "forward_s")
    unfit = costs.get("forward_unfit")
    if forward is None and isinstance(unfit, str) and unfit:
        return {"forward": _missing(f"the forward {unfit} (one GPU)"), **not_measured}
    if forward is not None:
        return {
            "forward": Term(forward, MEASURED, f"one graph, MoE {costs.get('forward_impl')}"),
            **as_measured,
        }
    if model.forward_ms is not None:
        entered = Term(
            model.forward_ms * 1e-3, ENTERED, "throughput.forward_ms" + _because(reasons, "forward")
        )
        return {"forward": entered, **as_measured}
    if attention.missing:
        return {"forward": _missing(f"no measured forward and {attention.note}"), **not_measured}
    lacking = [part for part, (seconds, _) in measured_parts.items() if seconds is None]
    if not lacking:
        total = attention.seconds + sum(seconds for seconds, _ in measured_parts.values())
        forward_term = Term(total, SUM_OF_PARTS, "moe + dense + lm-head + verify attention x layers")
        return {**as_measured, "forward": forward_term}
    source = model.what_if_source
    estimate = model.what_if.parts_s(tokens, bandwidth.tbps)
    note = f"linear what-if at {bandwidth.tbps:g} TB/s{bandwidth.source}"
    return {
        "moe": Term(
            estimate["moe"],
            source,
            note + f"; E(T = {tokens}) = {arithmetic.experts_touched(tokens):.1f} experts per layer",
        ),
        "dense": Term(estimate["dense"], source, note + "; LM head included"),
        "lm_head": Term(0.0, source, "in dense"),
        "forward": Term(
            attention.seconds + estimate["moe"] + estimate["dense"],
            source,
            "measured verify attention x layers + the linear what-if"
            + (f" (not measured: {', '.join(lacking)})" if len(lacking) < len(measured_parts) else ""),
        ),
    }


def _allreduce_term(
    model: RoundAssumptions, costs: dict, forward: Term, batch: int, budget: int, depth: int, reasons
) -> Term:
    """The communication: in an entered forward, else measured, else the estimate (``Comm``)."""
    allreduce = _value(costs, "allreduce_s")
    if forward.note.startswith("throughput.forward_ms"):
        return Term(0.0, ENTERED, "in throughput.forward_ms")
    if allreduce is not None:
        world = costs.get("world_size")
        world = "" if world is None or pd.isna(world) else f"world size {int(world)}"
        return Term(allreduce, MEASURED, world)
    k = min(budget, model.topk)
    return Term(
        model.comm.allreduce_s(batch * (budget + 1)) + model.comm.allgather_s(batch, depth, k),
        model.comm_source,
        model.comm.describe() + _because(reasons, "allreduce"),
    )


def round_parts(terms: dict[str, Term]) -> list[str]:
    """The names of the terms that add up to the round, finest first: the forward's parts unless it is one
    measured graph."""
    forward = terms.get("forward")
    whole = forward is None or forward.source == MEASURED or forward.note.startswith("throughput.forward_ms")
    inner = ["forward"] if whole else list(FORWARD_PARTS)
    return ["draft", "build", *inner, "allreduce", "accept"]


def round_seconds(terms: dict[str, Term]) -> float | None:
    """The round (the sum of ``ROUND_TERMS``), None where a term is missing."""
    if any(terms[name].missing for name in ROUND_TERMS):
        return None
    return sum(terms[name].seconds for name in ROUND_TERMS)


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


#: The step stages the round reads: (stage, impls preferred first or None for any, the column it fills).
STAGE_COLUMNS = (
    ("forward", MOE_IMPLS, "forward_s"),
    ("moe", MOE_IMPLS, "moe_s"),
    ("dense", None, "dense_s"),
    ("lm-head", None, "lm_head_s"),
    ("draft", None, "draft_s"),
    ("allreduce", None, "allreduce_s"),
    ("accept", ("gpu-kernel",), "accept_s"),
)
COST_COLUMNS = (
    "batch",
    "budget",
    "attention_layer_s",
    "accept_s",
    "forward_s",
    "forward_impl",
    "moe_s",
    "moe_impl",
    "experts_touched",
    "dense_s",
    "lm_head_s",
    "draft_s",
    "allreduce_s",
    "world_size",
    "forward_unfit",
)
#: The reason a forward row gives where the shape does not fit on the GPU (``stages.model``).
DOES_NOT_FIT = "does not fit"


@dataclass
class StageCosts:
    """The measured terms per (batch, budget) (``COST_COLUMNS``; NaN where not measured), where they come
    from, the measured device-copy peak, and per stage why its rows were not ok."""

    costs: pd.DataFrame
    prefix: int | None
    heads: int | None
    distribution: str | None  # the trees the step stages measured
    missing: str | None = None  # why there are none at all
    reasons: dict = field(default_factory=dict)
    copy_tbps: float | None = None
    #: the run rounds (``round`` stage, whole round host-inclusive on one GPU) at ``prefix``:
    #: (batch, budget, builder) -> (seconds, the same round's sum of separately timed parts, its note)
    rounds: dict = field(default_factory=dict)


VerifyCosts = StageCosts  # the former name


def _matching(rows: pd.DataFrame, column: str, value) -> pd.Series:
    """Rows whose ``column`` equals ``value`` or is null (stages without that key)."""
    if column not in rows:
        return pd.Series(True, index=rows.index)
    return rows[column].isna() | rows[column].eq(value).fillna(False).astype(bool)


def _select(measured: pd.DataFrame, stage: str, impls, *, depth: int, trees, prefix, heads) -> pd.DataFrame:
    """One row per (batch, budget) of ``stage``: at ``depth`` (or none), on ``trees`` where it has them,
    at ``prefix`` where it has a prefix, ``heads`` where it has heads, the first of ``impls`` measured."""
    rows = measured[measured["stage"] == stage]
    if rows.empty:
        return rows
    if depth is not None:
        rows = rows[_matching(rows, "depth", depth)]
    if trees is not None and "distribution" in rows and (rows["distribution"] == trees).any():
        rows = rows[_matching(rows, "distribution", trees)]
    if prefix is not None and "prefix" in rows and rows["prefix"].notna().any():
        rows = rows[_matching(rows, "prefix", prefix)]
    if heads is not None and "heads" in rows and rows["heads"].notna().any():
        rows = rows[_matching(rows, "heads", heads)]
    if impls is not None:
        order = {impl: i for i, impl in enumerate(impls)}
        rows = rows[rows["impl"].isin(order)].assign(_o=rows["impl"].map(order))
        rows = rows.sort_values("_o", kind="stable").drop(columns="_o")
    return rows.drop_duplicates(["batch", "budget"], keep="first")


def _same_impl(measured, rows, forward_impls: pd.Series, **where) -> pd.DataFrame:
    """The MoE rows (``rows``: one per (batch, budget), the preferred impl) with, where the forward was
    measured at that (batch, budget), the MoE of the forward's own impl instead (where it was measured): one
    table never sets one kernel's MoE beside a forward that ran another's."""
    out = []
    for _, row in rows.iterrows():
        impl = forward_impls.get((row["batch"], row["budget"]))
        if impl is not None and impl != row["impl"]:
            same = _select(measured, "moe", (impl,), **where)
            same = same[(same["batch"] == row["batch"]) & (same["budget"] == row["budget"])]
            if len(same):
                row = same.iloc[0]
        out.append(row)
    return pd.DataFrame(out).reset_index(drop=True) if out else rows


def _reasons(step: pd.DataFrame | None) -> dict[str, str]:
    """Per stage, why its rows were not ok (their status and reason), for naming a missing term."""
    if step is None or step.empty or "status" not in step:
        return {}
    out = {}
    bad = step[step["status"] != "ok"]
    for stage, rows in bad.groupby("stage", sort=False):
        reasons = rows["status_reason"].dropna() if "status_reason" in rows else pd.Series(dtype=str)
        texts = list(dict.fromkeys(f"{s}: {r}" for s, r in zip(rows["status"], reasons, strict=False)))
        out[str(stage)] = "; ".join(texts[:2]) or str(rows["status"].iloc[0])
    return out


def _copy_peak(measured: pd.DataFrame) -> float | None:
    """The machine's measured device-copy rate (TB/s), or None."""
    rows = measured[(measured["stage"] == "peak") & (measured["impl"] == "device-copy")]
    for column in ("median_tbps", "peak_copy_tbps"):
        if column in rows and rows[column].notna().any():
            return float(rows[column].dropna().iloc[0])
    return None


def stage_costs(
    step: pd.DataFrame | None, distribution: str, depth: int, prefix: int | None = None
) -> StageCosts:
    """The measured terms of the round per (batch, budget) at ``depth`` from the step summary: our verify
    attention per layer (impl ``ours``), the forward, its parts, the drafter, the communication and the
    accept, on ``distribution``'s trees where the step stages measured them, else on the step's own trees
    (``distribution`` says which). ``prefix``: S (None: the largest measured); heads: 8 where measured, else
    the fewest."""
    empty = pd.DataFrame(columns=list(COST_COLUMNS))
    reasons = _reasons(step)
    measured = preferred(step) if step is not None and not step.empty else pd.DataFrame()
    if measured.empty:
        why = reasons.get("verify-attention", "")
        missing = "no measured verify attention or forward" + (f" (ours: {why})" if why else "")
        return StageCosts(empty, None, None, None, missing, reasons)
    copy_tbps = _copy_peak(measured)
    at_depth = measured[_matching(measured, "depth", depth)]
    attention = at_depth[
        (at_depth["stage"] == "verify-attention")
        & (at_depth["impl"] == catalog.OURS)
        & at_depth["depth"].notna()
    ]
    forward = at_depth[at_depth["stage"] == "forward"]
    anchor = attention if not attention.empty else forward
    if anchor.empty:
        return StageCosts(
            empty, None, None, None, f"no measured verify attention (ours) at L = {depth}", reasons, copy_tbps
        )
    trees = distribution if (anchor["distribution"] == distribution).any() else None
    if trees is None and anchor["distribution"].notna().any():
        trees = str(anchor["distribution"].dropna().iloc[0])
    prefixes = sorted(int(p) for p in anchor["prefix"].dropna().unique())
    if prefix is None:  # the largest S with run rounds, else the largest measured
        run = sorted(p for p in prefixes if run_rounds(step, p))
        prefix = (run or prefixes or [None])[-1]
    elif prefix not in prefixes:
        return StageCosts(
            empty,
            prefix,
            None,
            trees,
            f"no verify attention measured at S = {prefix} (measured: {prefixes})",
            reasons,
            copy_tbps,
        )
    heads_measured = sorted(int(h) for h in anchor["heads"].dropna().unique())
    heads = 8 if 8 in heads_measured else (heads_measured[0] if heads_measured else None)
    where = {"trees": trees, "prefix": prefix, "heads": heads}
    frames = _cost_frames(measured, depth, where, with_attention=not attention.empty)
    unfit = _unfit(step, depth, prefix)
    if not unfit.empty:
        frames.append(unfit)
    return StageCosts(
        _merged_costs(frames), prefix, heads, trees, None, reasons, copy_tbps, run_rounds(step, prefix)
    )


def _cost_frames(measured: pd.DataFrame, depth: int, where: dict, *, with_attention: bool) -> list:
    """Per measured term, its (batch, budget, column...) frame: our verify attention per layer (where
    ``with_attention``), then ``STAGE_COLUMNS``' stages; ``where``: the trees, prefix and heads to
    ``_select``."""
    frames = []
    if with_attention:
        rows = _select(measured, "verify-attention", (catalog.OURS,), depth=depth, **where)
        frames.append(rows[["batch", "budget", "median_s"]].rename(columns={"median_s": "attention_layer_s"}))
    forward_impls = None
    for stage, impls, column in STAGE_COLUMNS:
        # the drafter's rows count its block's positions, not the trees' depth
        at = None if stage == "draft" else depth
        rows = _select(measured, stage, impls, depth=at, **where)
        if stage == "forward" and not rows.empty:
            forward_impls = rows.set_index(["batch", "budget"])["impl"]
        if stage == "moe" and forward_impls is not None:
            rows = _same_impl(measured, rows, forward_impls, depth=at, **where)
        if rows.empty:
            continue
        keep = {"median_s": column}
        if stage in ("forward", "moe"):
            keep["impl"] = column.replace("_s", "_impl")
        if stage == "moe" and "experts_touched" in rows:
            keep["experts_touched"] = "experts_touched"
        if stage == "allreduce" and "world_size" in rows:
            keep["world_size"] = "world_size"
        frames.append(rows[["batch", "budget", *keep]].rename(columns=keep))
    return frames


def _merged_costs(frames: list) -> pd.DataFrame:
    """The frames merged on (batch, budget) as ``COST_COLUMNS``, sorted; a measured forward (another impl)
    clears a does-not-fit reason."""
    costs = frames[0]
    for frame in frames[1:]:
        costs = costs.merge(frame, on=["batch", "budget"], how="outer")
    if "forward_unfit" in costs and "forward_s" in costs:  # a measured forward (another impl) wins
        costs.loc[costs["forward_s"].notna(), "forward_unfit"] = None
    costs = costs.reindex(columns=list(COST_COLUMNS))
    costs = costs[(costs["batch"] > 0) & (costs["budget"] > 0)]
    costs = costs.astype({"batch": "int64", "budget": "int64"}).sort_values(["batch", "budget"])
    return costs.reset_index(drop=True)


def _unfit(step: pd.DataFrame, depth: int, prefix: int | None) -> pd.DataFrame:
    """(batch, budget, forward_unfit): where the forward at ``prefix`` did not fit on the GPU, its reason.
    Such a budget is no candidate: its round is not modelled (a what-if would price a round that cannot
    run)."""
    if "status_reason" not in step or prefix is None:
        return pd.DataFrame(columns=["batch", "budget", "forward_unfit"])
    rows = step[
        (step["stage"] == "forward")
        & (step["status"] != "ok")
        & step["status_reason"].fillna("").str.startswith(DOES_NOT_FIT)
        & _matching(step, "prefix", prefix)
        & _matching(step, "depth", depth)
    ]
    rows = rows.drop_duplicates(["batch", "budget"])
    return rows[["batch", "budget", "status_reason"]].rename(columns={"status_reason": "forward_unfit"})


def run_rounds(step: pd.DataFrame | None, prefix: int | None) -> dict:
    """The measured whole rounds at ``prefix`` (``stages.round``: timing "wall", status ok):
    ``{(batch, budget, builder): (seconds, sum-of-parts seconds or None, note, (p90 - p10) / median)}``."""
    if step is None or step.empty or prefix is None:
        return {}
    rows = step[(step["stage"] == "round") & (step["status"] == "ok") & _matching(step, "prefix", prefix)]
    out = {}
    for (batch, budget, builder), group in rows.groupby(["batch", "budget", "impl"]):
        wall = group[group["timing"] == "wall"]["median_s"].dropna()
        parts = group[group["timing"] == "sum-of-parts"]["median_s"].dropna()
        if len(wall):
            note = group["note"].dropna().iloc[0] if "note" in group and group["note"].notna().any() else ""
            first = group[group["timing"] == "wall"].iloc[0]
            spread = (
                (float(first["p90_s"]) - float(first["p10_s"])) / float(first["median_s"])
                if "p90_s" in group and pd.notna(first.get("p90_s")) and pd.notna(first.get("p10_s"))
                else math.nan
            )
            out[(int(batch), int(budget), str(builder))] = (
                float(wall.iloc[0]),
                float(parts.iloc[0]) if len(parts) else None,
                str(note),
                spread,
            )
    return out


def verify_costs(step, distribution: str, depth: int, prefix: int | None = None) -> StageCosts:
    """The former name of ``stage_costs``."""
    return stage_costs(step, distribution, depth, prefix)


# ----------------------------------------------------------------------------------------------- tables

PART_TERMS = ("draft", "build", "attention", "moe", "dense", "lm_head", "forward", "allreduce", "accept")
TABLE_COLUMNS = (
    "batch",
    "budget",
    "builder",
    "label",
    "build_from",
    "tau",
    "attention_layer_s",
    *(f"{term}_s" for term in PART_TERMS),
    *(f"{term}_source" for term in PART_TERMS),
    "parts",
    "round_s",
    "round_from",
    "model_round_s",
    "run_round_s",
    "run_parts_s",
    "run_note",
    "run_spread",
    "tokens_per_s",
)
#: Where a row's round comes from: the run round (``stages.round``) + the communication term, or the sum of
#: the terms above.
RUN_ROUND, MODELLED_ROUND = "run round + allreduce", "sum of the terms"
UNMODELLED_COLUMNS = ("batch", "budget", "builder", "missing")


@dataclass
class Throughput:
    """``table`` (``TABLE_COLUMNS``: one row per modelled batch, budget and builder; ``<term>_s`` and
    ``<term>_source`` per term, ``parts`` the terms that add up to the round), ``terms`` ((batch, budget,
    builder) -> every ``Term``), ``unmodelled`` (the (B, N, builder) with a missing term, named), the
    step's source, and why the table is empty where it is."""

    table: pd.DataFrame
    verify: StageCosts
    distribution: str
    depth: int
    missing: str | None = None
    unmodelled: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(UNMODELLED_COLUMNS)))
    terms: dict = field(default_factory=dict)
    bandwidth: str = ""  # the what-if's bandwidth and where it comes from


def _bandwidth(model: RoundAssumptions, costs: StageCosts) -> Bandwidth:
    if model.what_if.bandwidth_tbps is not None:
        return Bandwidth(model.what_if.bandwidth_tbps, " (entered)")
    if costs.copy_tbps:
        return Bandwidth(costs.copy_tbps, " (the measured device-copy peak)")
    return Bandwidth(arithmetic.H200_COPY_TBPS, " (the H200's device copy; no measured peak here)")


def throughput(
    summary: pd.DataFrame | None,
    step: pd.DataFrame | None,
    shapes: pd.DataFrame | None,
    model: RoundAssumptions,
    *,
    distribution: str,
    depth: int,
    prefix: int | None = None,
    tau_from: str | None = None,
) -> Throughput:
    """The modelled tokens per second of every builder at every (batch, budget) with a measured tree build
    and tau(N) where no term of the round is missing; the others are in ``unmodelled`` with the missing
    terms named. ``tau_from``: the trees whose acceptance is tau (an acceptance profile's own drafter
    distribution; default: ``distribution``'s own)."""
    costs = stage_costs(step, distribution, depth, prefix)
    empty = pd.DataFrame(columns=list(TABLE_COLUMNS))
    if costs.missing:
        return Throughput(empty, costs, distribution, depth, f"needs the step stages: {costs.missing}")
    tau = tau_per_budget(shapes, tau_from or distribution, depth)
    if tau.empty:
        why = f"no expected acceptance of the {tau_from or distribution} trees (L = {depth})"
        return Throughput(empty, costs, distribution, depth, why)
    builds = build_costs(summary, distribution, depth)
    if builds.empty:
        why = f"no tree-build timings on the {distribution} trees"
        return Throughput(empty, costs, distribution, depth, why)
    builds = builds[builds["budget"].isin(tau.index)]
    bandwidth = _bandwidth(model, costs)
    measured = costs.costs.set_index(["batch", "budget"])
    records, unmodelled, all_terms = [], [], {}
    for row in builds.itertuples(index=False):
        batch, budget = int(row.batch), int(row.budget)
        here = measured.loc[(batch, budget)].to_dict() if (batch, budget) in measured.index else {}
        terms = round_terms(
            model,
            batch,
            budget,
            depth,
            build=Term(float(row.build_s), MEASURED, row.build_from),
            costs=here,
            bandwidth=bandwidth,
            reasons=costs.reasons,
        )
        all_terms[(batch, budget, row.builder)] = terms
        lacking = _not_modelled(terms, costs.rounds, (batch, budget, row.builder))
        if lacking:
            unmodelled.append({"batch": batch, "budget": budget, "builder": row.builder, "missing": lacking})
            continue
        run = costs.rounds.get((batch, budget, row.builder))
        records.append(_table_record(row, terms, float(tau[budget]), here, run))
    missing = None
    if not records:
        missing = "no (batch, budget) with every term of the round: " + (
            "; ".join(f"B={u['batch']} N={u['budget']}: {u['missing']}" for u in unmodelled[:2])
            or "no tree build at a budget with tau"
        )
    return Throughput(
        _in_builder_order(records),
        costs,
        distribution,
        depth,
        missing,
        pd.DataFrame.from_records(unmodelled, columns=list(UNMODELLED_COLUMNS)),
        all_terms,
        f"{bandwidth.tbps:.3g} TB/s{bandwidth.source}",
    )


def _not_modelled(terms: dict[str, Term], rounds: dict, key: tuple) -> str | None:
    """Why the round of ``key`` (batch, budget, builder) is not modelled: its missing terms, or the other
    builders' rounds at (batch, budget) were run and its own was not (rounds run beside modelled ones would
    not compare alike); None where it is modelled."""
    if round_seconds(terms) is None:
        return "; ".join(f"{TERM_LABELS[n]}: {terms[n].note}" for n in ROUND_TERMS if terms[n].missing)
    if key not in rounds and any(other[:2] == key[:2] for other in rounds):
        return "round: the other builders' rounds here were run, this one's was not (step.round.builders)"
    return None


def _table_record(row, terms: dict[str, Term], tau: float, here: dict, run: tuple | None) -> dict:
    """One ``TABLE_COLUMNS`` row: ``row`` a build (``build_costs``), ``run`` its run round (``run_rounds``)
    or None; the round is the run round plus the communication it cannot hold, else the sum of the terms."""
    model_s = round_seconds(terms)
    round_s = model_s if run is None else run[0] + terms["allreduce"].seconds
    record = {
        "batch": int(row.batch),
        "budget": int(row.budget),
        "builder": row.builder,
        "label": row.label,
        "build_from": row.build_from,
        "tau": tau,
        "attention_layer_s": _value(here, "attention_layer_s"),
        "parts": tuple(round_parts(terms)),
        "round_s": round_s,
        "round_from": RUN_ROUND if run is not None else MODELLED_ROUND,
        "model_round_s": model_s,
        "run_round_s": None if run is None else run[0],
        "run_parts_s": None if run is None else run[1],
        "run_note": None if run is None else run[2],
        "run_spread": None if run is None else run[3],
        "tokens_per_s": tokens_per_second(tau, int(row.batch), round_s),
    }
    for name in PART_TERMS:
        record[f"{name}_s"] = terms[name].seconds
        record[f"{name}_source"] = terms[name].source
    return record


def _in_builder_order(records: list[dict]) -> pd.DataFrame:
    """The records as ``TABLE_COLUMNS``, by batch, builder (``BUILDERS``' order) and budget."""
    order = {builder: i for i, (builder, *_) in enumerate(BUILDERS)}
    table = pd.DataFrame.from_records(records, columns=list(TABLE_COLUMNS))
    if table.empty:
        return table
    return (
        table.assign(_o=table["builder"].map(order))
        .sort_values(["batch", "_o", "budget"])
        .drop(columns="_o")
        .reset_index(drop=True)
    )


def term_sources(table: pd.DataFrame) -> pd.DataFrame:
    """Per term of the modelled rows (those that add up to their round): its sources and on how many of the
    (B, N, builder) rows each."""
    records = []
    if table is None or table.empty:
        return pd.DataFrame(columns=["term", "sources"])
    for name in PART_TERMS:
        rows = table if name in ROUND_TERMS else table[table["parts"].map(lambda p, n=name: n in p)]
        counts = rows[f"{name}_source"].dropna().value_counts()
        if counts.empty:
            continue
        text = ", ".join(f"{source} ({count} of {len(table)})" for source, count in counts.items())
        records.append({"term": TERM_LABELS[name], "sources": text})
    return pd.DataFrame.from_records(records, columns=["term", "sources"])


def limiting_terms(table: pd.DataFrame, batch: int, builder: str, best_budget: int) -> dict:
    """The term that sets ``builder``'s best budget at ``batch``: going from the best budget N* to the next
    larger modelled budget N+, tokens/s falls because the round grows by more than tau gains
    (round(N+) / round(N*) >= tau(N+) / tau(N*)); the term named is the part of the round whose seconds grow
    the most from N* to N+ (compared on the parts both rounds share). N* the largest compared: none."""
    rows = table[(table["batch"] == batch) & (table["builder"] == builder)].set_index("budget").sort_index()
    larger = [int(n) for n in rows.index if n > best_budget]
    if not larger:
        return {
            "set_by": None,
            "set_by_growth_s": None,
            "next_budget": None,
            "round_growth": None,
            "tau_gain": None,
            "set_by_source": None,
        }
    best, nxt = rows.loc[best_budget], rows.loc[larger[0]]
    shared = [p for p in best["parts"] if p in nxt["parts"]]
    if len(shared) < len(best["parts"]) or len(shared) < len(nxt["parts"]):
        shared = list(ROUND_TERMS)
    growth = {p: float(nxt[f"{p}_s"]) - float(best[f"{p}_s"]) for p in shared}
    term = max(growth, key=lambda p: (growth[p], -shared.index(p)))
    return {
        "set_by": term,
        "set_by_growth_s": growth[term],
        "next_budget": larger[0],
        "round_growth": float(nxt["round_s"]) / float(best["round_s"]),
        "tau_gain": float(nxt["tau"]) / float(best["tau"]),
        "set_by_source": nxt[f"{term}_source"],
    }


def best_budgets(table: pd.DataFrame) -> pd.DataFrame:
    """Per (batch, builder): the budget with the most modelled tokens per second (the smaller budget on a
    tie), with its tokens/s, tau and round time, the budgets compared and the term that sets it
    (``limiting_terms``)."""
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
        "set_by",
        "set_by_growth_s",
        "set_by_source",
        "next_budget",
        "round_growth",
        "tau_gain",
    ]
    if table is None or table.empty:
        return pd.DataFrame(columns=columns)
    records = []
    for (batch, builder), group in table.groupby(["batch", "builder"], sort=False):
        group = group.sort_values("budget")
        best = group.loc[group["tokens_per_s"].idxmax()]
        record = {
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
        if "parts" in table:
            record |= limiting_terms(table, int(batch), builder, int(best["budget"]))
        records.append(record)
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
    if best is None or best.empty or not (best["builder"] == catalog.SUBJECT).any():
        return pd.DataFrame(columns=columns)
    base = catalog.BASELINE if (best["builder"] == catalog.BASELINE).any() else catalog.REFERENCE
    records = []
    for batch, group in best.groupby("batch", sort=True):
        gpu, other = group[group["builder"] == catalog.SUBJECT], group[group["builder"] == base]
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
    catalog.BASELINE: "SGLang's CPU builder",
    catalog.REFERENCE: (
        "reference (ours, Python; a stand-in for SGLang's builder, which was not measured here)"
    ),
}


# ----------------------------------------------------------------------------------------- worked example

#: The DDTree paper's Fig. 3 (Qwen3-8B, MATH-500, H200, block 16): tau and speedup over autoregressive per
#: budget, and the round's cost in autoregressive steps (tau / speedup: 1.40 up to N = 256, 1.43, 1.61).
PAPER_TAU = {16: 8.61, 32: 9.27, 64: 9.75, 128: 10.20, 256: 10.43, 512: 10.73, 1024: 10.98}
PAPER_SPEEDUP = {16: 6.09, 32: 6.60, 64: 6.97, 128: 7.33, 256: 7.43, 512: 7.52, 1024: 6.82}
PAPER_ROUND_STEPS = {16: 1.40, 32: 1.40, 64: 1.40, 128: 1.40, 256: 1.40, 512: 1.43, 1024: 1.61}


def paper_example() -> pd.DataFrame:
    """The model fed the paper's tau(N) and its measured round costs, in units of one autoregressive step
    (batch 1; every term inside the paper's measured round): round = 1.40 steps (the round at small budgets)
    + the measured growth beyond it (0 up to N = 256, 0.03 at 512, 0.21 at 1024). Its tokens per step is the
    modelled speedup over autoregressive decoding, beside the paper's own."""
    base = PAPER_ROUND_STEPS[16]
    records = []
    for budget, tau in PAPER_TAU.items():
        round_steps = base + (PAPER_ROUND_STEPS[budget] - base)
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
