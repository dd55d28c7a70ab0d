"""Fitting the ``drafter`` distribution's parameters to a measured acceptance curve.

A target is ``tau(N)`` per budget ``N`` (tokens per verify round, the bonus token included, as the DDTree
paper counts it) and optionally the top-1 chain's ``tau`` (DFlash's). The model's ``tau(N)`` is the trees'
expected acceptance, ``1 + `` the sum over the tree's nodes of the path probability
(``acceptance.expected_accepted_tokens``), averaged over requests, for best-first trees built by the native
C++ builder (the reference where it cannot load) at depth ``D`` (15 for the paper's block 16) with ``K = N``.
The chain's is ``1 + sum_d prod_{j <= d} p1[j]``.

The fit holds the random draws fixed (common random numbers: the ``z`` of a drafter trace of the same
requests and seed, for every trial) and weighs the two request kinds analytically (every draw is evaluated
as confident and as uncertain, mixed with weight ``confident_fraction``), so the objective is smooth in
every parameter. It minimises the sum of squared
relative residuals with Nelder-Mead (numpy only) in an unconstrained space (logit of each fraction).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

import numpy as np

from ddtree_bench import catalog
from ddtree_bench.builders import get_builder
from ddtree_bench.builders.base import BuilderUnavailable
from ddtree_bench.drafter import DrafterParams, check_params, draws, row_probabilities, top1_probabilities

#: The DDTree paper's Fig. 3 (Qwen3-8B, MATH-500, block 16) tau per budget, and DFlash's chain.
PAPER_TAU = {16: 8.61, 32: 9.27, 64: 9.75, 128: 10.20, 256: 10.43, 512: 10.73, 1024: 10.98}
PAPER_CHAIN = 7.79
PAPER_DEPTH = 15  # block 16: the first position is the previous round's bonus token, 15 are drafted
#: The parameters the fit moves by default (``alt_ranks`` stays as given).
FIT_PARAMS = (
    "confident_fraction",
    "confident_top1",
    "confident_decay",
    "uncertain_top1",
    "uncertain_decay",
    "top1_spread",
    "alt_mass",
    "alt_ratio",
)
#: Parameters on (0, scale) rather than (0, 1): fitted as value / scale.
_SCALES = {"top1_spread": 10.0}
_EPS = 1e-6


def parse_tau_pairs(pairs, depth: int) -> dict[int, float]:
    """``["16:8.61", "32:9.27", ...]`` as ``{16: 8.61, ...}`` (sorted by budget); one-line ValueError for a
    malformed pair, a repeated budget, a tau below 1, above ``depth + 1`` or above ``N + 1`` (no tree of ``N``
    nodes verifies more), or a tau that decreases as the budget grows."""
    if not pairs:
        raise ValueError("calibrate: --tau needs at least one BUDGET:TAU pair")
    result: dict[int, float] = {}
    for text in pairs:
        parts = str(text).split(":")
        if len(parts) != 2:
            raise ValueError(f"calibrate: malformed pair {text!r}; expected BUDGET:TAU, e.g. 16:8.61")
        try:
            budget = int(parts[0])
            tau = float(parts[1])
        except ValueError:
            raise ValueError(
                f"calibrate: malformed pair {text!r}; expected an integer budget and a number, e.g. 16:8.61"
            ) from None
        if budget < 1:
            raise ValueError(f"calibrate: budget in {text!r} must be >= 1")
        if budget in result:
            raise ValueError(f"calibrate: budget {budget} is given twice")
        check_tau(tau, depth, f"tau at budget {budget}")
        if tau > budget + 1:
            raise ValueError(
                f"calibrate: tau at budget {budget} is {tau:g}, above N + 1 = {budget + 1}: a tree of "
                f"{budget} nodes verifies at most {budget + 1} tokens a round (its nodes and the bonus token)"
            )
        result[budget] = tau
    ordered = dict(sorted(result.items()))
    budgets = list(ordered)
    for small, large in zip(budgets, budgets[1:], strict=False):
        if ordered[large] < ordered[small]:
            raise ValueError(
                f"calibrate: tau decreases with the budget ({ordered[small]:g} at {small}, "
                f"{ordered[large]:g} at {large}); a larger tree never accepts less"
            )
    return ordered


def check_chain(chain, target: dict[int, float], depth: int) -> float:
    """The top-1 chain's tau (``--chain``), checked as a tau (``check_tau``) and against the trees': the chain
    is a tree of ``depth`` nodes, and the best-first tree of ``N >= depth`` nodes accepts at least as much on
    average (it holds the ``N`` most likely paths), so a chain tau above a tree's at such a budget is
    refused (one-line ValueError naming the bound)."""
    chain = check_tau(chain, depth, "--chain")
    for budget, tau in sorted(target.items()):
        if budget >= depth and chain > tau:
            raise ValueError(
                f"calibrate: --chain {chain:g} is above the tree's tau {tau:g} at budget {budget}: the chain "
                f"is a tree of {depth} nodes (one per drafted position), and the best tree of N = {budget} "
                f">= {depth} nodes accepts at least as many tokens on average (--chain at most {tau:g})"
            )
    return chain


def check_tau(tau, depth: int, what: str) -> float:
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or not math.isfinite(tau):
        raise ValueError(f"calibrate: {what} must be a finite number, got {tau!r}")
    if tau < 1.0:
        raise ValueError(f"calibrate: {what} is {tau:g}, below 1 (every round commits the bonus token)")
    if tau > depth + 1:
        raise ValueError(
            f"calibrate: {what} is {tau:g}, above depth + 1 = {depth + 1} (the most a round commits)"
        )
    return float(tau)


# ----------------------------------------------------------------------------------------- the model's tau


def _builder():
    native = get_builder(catalog.NATIVE, validate=False)
    try:
        native._ensure_loaded()
        return native
    except (BuilderUnavailable, RuntimeError, OSError):
        return get_builder(catalog.ORACLE)


def tree_accept(lp: np.ndarray, trees) -> np.ndarray:
    """``float64 [B]``: the sum over each tree's nodes of the path probability, for trees built from ``lp``
    with token ids ``arange(K)`` in every row (a node's token is its column)."""
    batch, budget = trees.node_token_ids.shape
    real = np.arange(budget)[None, :] < trees.node_count[:, None]
    depths = np.where(real, trees.node_depths, 0).astype(np.int64)
    columns = np.where(real, trees.node_token_ids, 0).astype(np.int64)
    rows = np.arange(batch)[:, None]
    own = np.where(real, lp[rows, np.maximum(depths - 1, 0), columns].astype(np.float64), -np.inf)
    scores = np.zeros((batch, budget + 1))
    parents = trees.parents.astype(np.int64)
    for d in range(1, int(depths.max(initial=0)) + 1):
        b, j = np.nonzero(real & (depths == d))
        scores[b, j + 1] = scores[b, parents[b, j + 1]] + own[b, j]
    return np.where(real, np.exp(scores[:, 1:]), 0.0).sum(axis=1)


@dataclass
class Evaluator:
    """``tau(params)`` per budget and the chain's on fixed draws (module docstring)."""

    budgets: tuple[int, ...]
    depth: int
    requests: int = 256
    vocab_size: int = 163840
    seed: int = 0

    def __post_init__(self):
        # the very draws of a drafter trace of these requests and seed (its first `depth` positions)
        _, self.z, _ = draws(DrafterParams(), 0, self.requests, self.depth, self.seed)
        self.topk = max(self.budgets)
        self.builder = _builder()
        self.ids = np.broadcast_to(
            np.arange(self.topk, dtype=np.int64), (2 * self.requests, self.depth, self.topk)
        ).copy()

    def __call__(self, params: DrafterParams) -> tuple[dict[int, float], float]:
        kinds = np.repeat([True, False], self.requests)
        z = np.concatenate([self.z, self.z])
        p1 = top1_probabilities(params, kinds, z)
        probs = row_probabilities(params, p1, self.topk, self.vocab_size)
        with np.errstate(divide="ignore"):
            lp = np.log(probs).astype(np.float32)
        lp = np.maximum(lp, np.float32(-1e30))  # never -inf (a row of exact zeros cannot occur, but be safe)
        w = params.confident_fraction

        def mix(values: np.ndarray) -> float:
            return float(w * values[: self.requests].mean() + (1 - w) * values[self.requests :].mean())

        taus = {}
        for budget in self.budgets:
            cols = min(budget, self.topk)
            sub_lp = np.ascontiguousarray(lp[:, :, :cols])
            sub_ids = np.ascontiguousarray(self.ids[:, :, :cols])
            trees = self.builder.build(sub_lp, sub_ids, budget)
            taus[budget] = 1.0 + mix(tree_accept(sub_lp, trees))
        top1 = np.exp(lp[:, :, 0].astype(np.float64))
        chain = 1.0 + mix(np.cumprod(top1, axis=1).sum(axis=1))
        return taus, chain


# ----------------------------------------------------------------------------------------- rounds' tau


def profile_params(profile: str) -> DrafterParams:
    """The drafter parameters of acceptance profile ``profile`` (``catalog.ACCEPTANCE_PROFILES``): its own,
    or the paper's fit (``DrafterParams``' defaults) for the profile that takes the configured drafter."""
    found = catalog.ACCEPTANCE_PROFILES.get(profile)
    if found is None:
        raise ValueError(
            f"unknown acceptance profile {profile!r}; expected one of {list(catalog.ACCEPTANCE_PROFILES)}"
        )
    return DrafterParams(**dict(found.params)) if found.params else DrafterParams()


_TAU_CACHE: dict = {}


def round_tau(profile: str, depth: int, budgets, requests: int = 256) -> tuple[dict[int, float], float]:
    """``({budget: tau}, chain tau)`` of a round whose trees have ``depth`` drafted positions, under
    ``profile``'s drafter: tau(N) = 1 + the expected accepted tokens of its best-first trees of budget N (K =
    N), and the top-1 chain's over the same ``depth`` positions (the linear DFlash chain of block ``depth +
    1``), each the mean over ``requests`` drafts of each kind (``Evaluator``; fewer where depth x K is large,
    to bound the draws' memory at about 0.5 GB: at least 8). Cached per process."""
    budgets = tuple(sorted({int(b) for b in budgets})) or (1,)
    requests = int(max(8, min(requests, 12_500_000 // (int(depth) * max(budgets)))))
    key = (profile, int(depth), budgets, requests)
    if key not in _TAU_CACHE:
        taus, chain = Evaluator(budgets=budgets, depth=int(depth), requests=requests)(profile_params(profile))
        _TAU_CACHE[key] = ({b: taus[b] for b in budgets}, chain)
    return _TAU_CACHE[key]


# ----------------------------------------------------------------------------------------- the fit


def _to_free(value: float) -> float:
    value = min(max(value, _EPS), 1 - _EPS)
    return math.log(value) - math.log1p(-value)


def _from_free(x: float) -> float:
    return float(min(max(1.0 / (1.0 + math.exp(-x)), _EPS), 1 - _EPS))


def nelder_mead(f, x0, *, step=0.5, iterations=200, tolerance=1e-10):
    """Minimise ``f`` from ``x0`` (standard reflection 1, expansion 2, contraction and shrink 1/2);
    ``(best x, best f, evaluations)``."""
    n = len(x0)
    simplex = [np.asarray(x0, float)]
    for i in range(n):
        x = simplex[0].copy()
        x[i] += step
        simplex.append(x)
    values = [f(x) for x in simplex]
    evaluations = n + 1
    for _ in range(iterations):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if values[-1] - values[0] <= tolerance:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        evaluations += 1
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            evaluations += 1
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            inside = fr >= values[-1]
            contracted = centroid + 0.5 * ((simplex[-1] if inside else reflected) - centroid)
            fc = f(contracted)
            evaluations += 1
            if fc < min(fr, values[-1]):
                simplex[-1], values[-1] = contracted, fc
            else:
                for i in range(1, n + 1):
                    simplex[i] = simplex[0] + 0.5 * (simplex[i] - simplex[0])
                    values[i] = f(simplex[i])
                evaluations += n
    best = int(np.argmin(values))
    return simplex[best], values[best], evaluations


@dataclass
class FitResult:
    params: DrafterParams
    target: dict[int, float]
    fitted: dict[int, float]
    chain_target: float | None
    chain_fitted: float
    depth: int
    evaluations: int

    def residuals(self) -> dict[int, float]:
        """Relative residual (fitted / target - 1) per budget."""
        return {n: self.fitted[n] / self.target[n] - 1.0 for n in self.target}

    def chain_residual(self) -> float | None:
        return None if self.chain_target is None else self.chain_fitted / self.chain_target - 1.0

    def worst(self) -> float:
        values = list(self.residuals().values())
        if self.chain_target is not None:
            values.append(self.chain_residual())
        return max(abs(v) for v in values)


@dataclass(frozen=True)
class FitOptions:
    """How ``fit`` fits: the trees' depth, the starting parameters (a ``DrafterParams``, a mapping of some,
    or None: the defaults), the parameters it moves, the simulated requests and vocabulary, Nelder-Mead's
    iterations a run and its runs (each from the last one's best: a fresh simplex escapes a collapsed one),
    and the seed of the draws."""

    depth: int = PAPER_DEPTH
    start: DrafterParams | dict | None = None
    free: tuple[str, ...] = FIT_PARAMS
    requests: int = 256
    vocab_size: int = 163840
    iterations: int = 300
    restarts: int = 2
    seed: int = 0


def fit(
    target: dict[int, float],
    *,
    chain: float | None = None,
    options: FitOptions | None = None,
    progress=None,
) -> FitResult:
    """Fit the free parameters so that the model's tau matches ``target`` (and ``chain``); ``options``: how
    (``FitOptions``; None: the defaults). ``progress``: called after every evaluation with ``(run, runs,
    evaluations, best_loss)`` (e.g. to print how far the fit is)."""
    options = options or FitOptions()
    depth, free = options.depth, options.free
    start = check_params(options.start)
    unknown = sorted(set(free) - set(FIT_PARAMS))
    if unknown:
        raise ValueError(f"calibrate: cannot fit {', '.join(unknown)}; fittable: {', '.join(FIT_PARAMS)}")
    evaluate = Evaluator(tuple(sorted(target)), depth, options.requests, options.vocab_size, options.seed)
    goal = np.array([target[n] for n in sorted(target)])

    def params_of(x) -> DrafterParams:
        values = {name: _from_free(v) * _SCALES.get(name, 1.0) for name, v in zip(free, x, strict=True)}
        return replace(start, **values)

    runs = max(1, options.restarts)
    state = {"run": 1, "evaluations": 0, "best": float("inf")}

    def loss(x) -> float:
        taus, chain_tau = evaluate(params_of(x))
        got = np.array([taus[n] for n in sorted(target)])
        value = float(np.sum((got / goal - 1.0) ** 2))
        if chain is not None:
            value += (chain_tau / chain - 1.0) ** 2
        state["evaluations"] += 1
        state["best"] = min(state["best"], value)
        if progress is not None:
            progress(state["run"], runs, state["evaluations"], state["best"])
        return value

    x = np.array([_to_free(getattr(start, name) / _SCALES.get(name, 1.0)) for name in free])
    total = 0
    for attempt in range(runs):
        state["run"] = attempt + 1
        x, _, used = nelder_mead(loss, x, step=0.5 / (attempt + 1), iterations=options.iterations)
        total += used
    params = params_of(x)
    taus, chain_tau = evaluate(params)
    return FitResult(params, dict(sorted(target.items())), taus, chain, chain_tau, depth, total)


def fragment_yaml(result: FitResult) -> str:
    """The config fragment for ``--configfile``: the ``drafter:`` mapping, with the fit as comments."""
    import yaml  # noqa: PLC0415

    lines = [
        "# drafter parameters fitted by `ddtree-bench calibrate` (expected acceptance of best-first trees",
        f"# at depth {result.depth}, K = N); use with: snakemake ... --configfile THIS_FILE",
        "# budget  target_tau  fitted_tau  residual",
    ]
    for n, residual in result.residuals().items():
        lines.append(f"#   {n:>5}  {result.target[n]:>10.3f}  {result.fitted[n]:>10.3f}  {residual:+8.2%}")
    if result.chain_target is not None:
        lines.append(
            f"#   chain  {result.chain_target:>10.3f}  {result.chain_fitted:>10.3f}  "
            f"{result.chain_residual():+8.2%}"
        )
    mapping = {
        "drafter": {
            k: (round(v, 6) if isinstance(v, float) else v) for k, v in result.params.as_dict().items()
        }
    }
    return "\n".join(lines) + "\n" + yaml.safe_dump(mapping, sort_keys=False)


__all__ = [
    "FIT_PARAMS",
    "PAPER_CHAIN",
    "PAPER_DEPTH",
    "PAPER_TAU",
    "Evaluator",
    "FitOptions",
    "FitResult",
    "fit",
    "fragment_yaml",
    "nelder_mead",
    "parse_tau_pairs",
]
