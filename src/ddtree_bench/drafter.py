"""The ``drafter`` distribution: top-K log-probs shaped like a block-diffusion drafter's.

Every request (one verify round) is a block of ``L`` drafted positions, either *confident* or *uncertain*.
The kinds are interleaved so that every run of requests holds the fraction ``confident_fraction`` of
confident ones to within one request: request ``r`` is confident when
``floor((r + 1) * f + phase) > floor(r * f + phase)`` (``f = confident_fraction``, ``phase`` in [0, 1)
drawn from the seed), which keeps a batch's acceptance from swinging with a coin's luck. Each kind has its
own top-1 curve along the block::

    base[d] = top1 * decay ** d                         (d = 0 .. L-1, the block position)
    p1[r, d] = sigmoid(logit(base[d]) + top1_spread * z[r, d])    z ~ N(0, 1) per (request, position)

so blocks of one kind still differ from one another. The mass ``1 - p1`` after the top-1 token is split:

- ``alt_mass`` of it goes to ``alt_ranks`` alternatives, geometric with ratio ``alt_ratio`` (the second
  token gets the most, each next one ``alt_ratio`` times that);
- the rest, the tail, is spread over the other ``V - 1 - alt_ranks`` tokens of the vocabulary, decaying
  smoothly by a factor ``e`` from the first tail token to the last (tail token ``j`` of ``T`` gets
  ``tail * exp(-j / T) / Z``, ``Z`` the exact normaliser), so every row is a proper log-softmax over the
  ``V`` tokens, and the trace holds its ``K`` largest entries, sorted descending, all finite.

Token ids: ``K`` distinct ids per row, drawn uniformly from the vocabulary. Values are computed in float64
and stored as float32 log-probs; ``drafter-bf16`` rounds them to bfloat16 (as a bf16 model's
``log_softmax`` output), which makes exact ties. Either way rows are in the canonical order of the other
traces: largest value first, equal values by increasing token id.

Determinism: request ``r`` draws its ``z`` and then its ids from
``PCG64(SeedSequence(seed, spawn_key=(r, 2)))`` (the phase comes from ``spawn_key=(0, 3)``), so a trace
is a function of its arguments and its first ``b`` requests equal a trace of ``b`` requests. Generated on
the CPU only (no full-vocabulary logits are needed: it is cheap).

The defaults are fitted (``calibrate.py``, docs/drafter.md) so that trees on these traces at depth 15 (the
paper's block 16: 15 drafted positions) reproduce the DDTree paper's acceptance per budget on MATH-500 with
Qwen3-8B, and their top-1 chain DFlash's.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields

import numpy as np

from ddtree_bench.bf16 import bf16_round

DRAFTER_DISTRIBUTIONS = ("drafter", "drafter-bf16", "drafter-k2.6")
TAIL_SLOPE = 1.0  # the tail's log-probability falls by this much from its first token to its last
STREAM = 2  # the SeedSequence spawn_key stream of the drafter's draws (uniform/peaked use 0 and 1)


@dataclass(frozen=True)
class DrafterParams:
    """The drafter distribution's parameters (module docstring); the defaults are the fitted ones."""

    confident_fraction: float = 0.4526
    confident_top1: float = 0.9952
    confident_decay: float = 0.9997
    uncertain_top1: float = 0.5122
    uncertain_decay: float = 0.9315
    top1_spread: float = 1.588
    alt_mass: float = 0.8473
    alt_ratio: float = 0.0757
    alt_ranks: int = 8

    def as_dict(self) -> dict:
        return asdict(self)


# (name, low, high, low_open, high_open): the allowed range of every float parameter
_RANGES = {
    "confident_fraction": (0.0, 1.0, False, False),
    "confident_top1": (0.0, 1.0, True, True),
    "confident_decay": (0.0, 1.0, True, False),
    "uncertain_top1": (0.0, 1.0, True, True),
    "uncertain_decay": (0.0, 1.0, True, False),
    "top1_spread": (0.0, 10.0, False, False),
    "alt_mass": (0.0, 1.0, False, False),
    "alt_ratio": (0.0, 1.0, True, False),
}
PARAM_NAMES = tuple(f.name for f in fields(DrafterParams))


def _range_text(name: str) -> str:
    low, high, low_open, high_open = _RANGES[name]
    return f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def check_params(params=None, *, where: str = "drafter") -> DrafterParams:
    """``params`` (a mapping of some parameters, a ``DrafterParams`` or ``None``) as checked
    ``DrafterParams`` (missing keys take the defaults). One-line ValueError naming the first bad value."""
    if params is None:
        return DrafterParams()
    if isinstance(params, DrafterParams):
        params = params.as_dict()
    if not isinstance(params, dict):
        raise ValueError(f"{where}: must be a mapping of parameters, got {type(params).__name__}")
    unknown = sorted(set(params) - set(PARAM_NAMES))
    if unknown:
        raise ValueError(
            f"{where}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(PARAM_NAMES)}"
        )
    values = {}
    for name, value in params.items():
        if name == "alt_ranks":
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{where}.alt_ranks: must be an integer >= 1, got {value!r}")
            values[name] = int(value)
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"{where}.{name}: must be a finite number, got {value!r}")
        low, high, low_open, high_open = _RANGES[name]
        if value < low or value > high or (low_open and value == low) or (high_open and value == high):
            raise ValueError(f"{where}.{name}: must be in {_range_text(name)}, got {value!r}")
        values[name] = float(value)
    return DrafterParams(**values)


def _rng(seed: int, request: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(request, STREAM))))


def _logit(p):
    return np.log(p) - np.log1p(-p)


def top1_probabilities(params: DrafterParams, confident: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``float64 [R, L]``: every row's top-1 probability, given each request's kind (``confident`` bool
    ``[R]``) and its noise ``z`` ``[R, L]``."""
    depth = z.shape[1]
    d = np.arange(depth, dtype=np.float64)
    conf = params.confident_top1 * params.confident_decay**d
    unc = params.uncertain_top1 * params.uncertain_decay**d
    base = np.where(confident[:, None], conf[None, :], unc[None, :])
    base = np.clip(base, 1e-12, 1.0 - 1e-12)
    x = _logit(base) + params.top1_spread * z
    return 1.0 / (1.0 + np.exp(-x))


def row_probabilities(params: DrafterParams, p1: np.ndarray, topk: int, vocab_size: int) -> np.ndarray:
    """``float64 [..., min(topk, V)]``: the largest probabilities of rows with top-1 probability ``p1``
    (any shape), sorted descending (module docstring)."""
    p1 = np.asarray(p1, dtype=np.float64)
    ranks = min(params.alt_ranks, vocab_size - 1)
    tail_tokens = vocab_size - 1 - ranks
    rest = 1.0 - p1
    alt_mass = params.alt_mass if tail_tokens > 0 else 1.0
    if ranks > 0:
        if params.alt_ratio == 1.0:
            shape = np.full(ranks, 1.0 / ranks)
        else:
            shape = params.alt_ratio ** np.arange(ranks) * (1.0 - params.alt_ratio)
            shape /= 1.0 - params.alt_ratio**ranks
        alts = (alt_mass * rest)[..., None] * shape
    else:
        alts = np.zeros((*p1.shape, 0))
    shown_tail = min(tail_tokens, topk)
    if shown_tail > 0:
        step = TAIL_SLOPE / tail_tokens
        norm = -math.expm1(-step) / -math.expm1(-TAIL_SLOPE)  # 1 / sum_j exp(-j * step), j < tail_tokens
        tail_shape = np.exp(-step * np.arange(shown_tail)) * norm
        tail = ((1.0 - alt_mass) * rest)[..., None] * tail_shape
    else:
        tail = np.zeros((*p1.shape, 0))
    rows = np.concatenate([p1[..., None], alts, tail], axis=-1)
    rows = -np.sort(-rows, axis=-1)
    return rows[..., : min(topk, vocab_size)]


def confident_requests(fraction: float, first: int, count: int, seed: int) -> np.ndarray:
    """``bool [count]``: which of requests ``first .. first + count - 1`` are confident (module docstring)."""
    phase = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(0, 3)))).random()
    r = np.arange(first, first + count, dtype=np.float64)
    return np.floor((r + 1) * fraction + phase) > np.floor(r * fraction + phase)


def draws(params: DrafterParams, first: int, count: int, depth: int, seed: int):
    """Per request ``first .. first + count - 1``: ``(confident bool [count], z float64 [count, L],
    rngs)``, the rngs positioned after those draws (the token ids come next)."""
    z = np.empty((count, depth))
    rngs = []
    for i in range(count):
        rng = _rng(seed, first + i)
        z[i] = rng.standard_normal(depth)
        rngs.append(rng)
    return confident_requests(params.confident_fraction, first, count, seed), z, rngs


def log_probs_from_probs(probs: np.ndarray, bf16: bool) -> np.ndarray:
    """float32 log-probs of ``probs``, rounded to bfloat16 when ``bf16``."""
    with np.errstate(divide="ignore"):
        lp = np.log(probs).astype(np.float32)
    if bf16:
        bf16_round(lp, out=lp)
    return lp


def generate_drafter(
    distribution: str,
    requests: int,
    depth: int,
    topk: int,
    vocab_size: int,
    seed: int,
    params=None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(top_log_probs float32 [R, L, K], top_token_ids int64 [R, L, K])`` of the ``drafter`` (or
    ``drafter-bf16``) distribution; arguments already checked by ``traces.generate`` except ``params``."""
    if distribution not in DRAFTER_DISTRIBUTIONS:
        raise ValueError(f"not a drafter distribution: {distribution!r}")
    params = check_params(params)
    confident, z, rngs = draws(params, 0, requests, depth, seed)
    probs = row_probabilities(params, top1_probabilities(params, confident, z), topk, vocab_size)
    lp = log_probs_from_probs(probs, distribution == "drafter-bf16")
    ids = np.empty((requests, depth, topk), np.int64)
    for r, rng in enumerate(rngs):
        for d in range(depth):
            ids[r, d] = rng.choice(vocab_size, size=topk, replace=False)
    # canonical order: largest value first, equal values by increasing token id
    order = np.lexsort((ids, np.negative(lp)), axis=-1)
    return np.take_along_axis(lp, order, -1), np.take_along_axis(ids, order, -1)


__all__ = [
    "DRAFTER_DISTRIBUTIONS",
    "DrafterParams",
    "PARAM_NAMES",
    "check_params",
    "generate_drafter",
    "row_probabilities",
    "top1_probabilities",
]
