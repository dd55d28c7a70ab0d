"""Shared fixtures: a native library built once per session from the tree's C++ source, and a small
generator of top-k inputs (numpy only, independent of ddtree_bench.traces)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from ddtree_bench.native_build import DEFAULT_SOURCE, build_native_library, compiler_unavailable_reason

# The tests' helpers (input generators, synthetic rows, the emulator host programs, the workflow copy) live
# in tests/support/, on the path for every test; test modules never import each other.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

TOPK_KINDS = ("uniform", "peaked", "bf16", "equal", "tied")


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (round to nearest even), kept as float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def make_topk(kind: str, batch: int, depth: int, k: int, *, vocab: int | None = None, seed: int = 0):
    """``(top_log_probs float32 [B, L, K], top_token_ids int64 [B, L, K])``, rows sorted descending.

    kinds: ``uniform`` (log-softmax of Gaussian logits), ``peaked`` (confident early positions, flatter
    later), ``bf16`` (logits and log-probs rounded through bfloat16: many exact ties), ``equal`` (every
    log-prob of every row the same value), ``tied`` (a few distinct values per row: ties everywhere)."""
    rng = np.random.default_rng(seed)
    vocab = max(vocab or 4 * k, k, 8)
    shape = (batch, depth, vocab)
    if kind == "equal":
        value = np.float32(-np.log(vocab))
        lp = np.full((batch, depth, k), value, np.float32)
        ids = np.stack([rng.permutation(vocab)[:k] for _ in range(batch * depth)]).reshape(batch, depth, k)
        return lp, ids.astype(np.int64)
    if kind == "tied":
        grid = np.array([0.0, -0.25, -0.5, -1.0, -1.5, -2.0, -4.0], np.float32)
        lp = -np.sort(-rng.choice(grid, size=(batch, depth, k)), axis=-1)
        ids = rng.integers(0, vocab, size=(batch, depth, k))
        return np.ascontiguousarray(lp, np.float32), ids.astype(np.int64)
    logits = rng.normal(size=shape)
    if kind == "peaked":
        logits *= (8.0 / (1.0 + np.arange(depth)))[None, :, None] + 0.5
    elif kind not in ("uniform", "bf16"):
        raise ValueError(f"unknown kind {kind!r}")
    logits = logits.astype(np.float32)
    if kind == "bf16":
        logits = _bf16(logits)
    shifted = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    log_probs = (shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))).astype(np.float32)
    if kind == "bf16":
        log_probs = _bf16(log_probs)
    log_probs = np.minimum(log_probs, np.float32(0.0))
    order = np.argsort(-log_probs, axis=-1, kind="stable")[..., :k]
    lp = np.take_along_axis(log_probs, order, axis=-1)
    return np.ascontiguousarray(lp, np.float32), np.ascontiguousarray(order, np.int64)


@pytest.fixture(scope="session")
def topk_inputs():
    """``make_topk(kind, batch, depth, k, *, vocab=None, seed=0) -> (lp, ids)``; kinds in ``TOPK_KINDS``."""
    return make_topk


@pytest.fixture(scope="session")
def native_library(tmp_path_factory):
    """The tree's ``kernels/native/tree_build_cpu.cpp`` built once for the session (skips where no C++
    compiler)."""
    reason = compiler_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    output = tmp_path_factory.mktemp("native") / "tree_build_cpu.so"
    build_native_library(DEFAULT_SOURCE, output)
    return output
