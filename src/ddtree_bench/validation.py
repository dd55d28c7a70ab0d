"""Input checks shared by the library, the CLI and the workflow. Every failure is a ``ValueError`` whose
message is one line naming the problem."""

from __future__ import annotations

import numbers

import numpy as np


def check_budget(budget) -> int:
    if isinstance(budget, bool) or not isinstance(budget, numbers.Integral):
        raise ValueError(f"budget must be an integer, got {budget!r}")
    if budget <= 0:
        raise ValueError(f"budget must be >= 1, got {budget}")
    return int(budget)


def check_topk_arrays(
    top_log_probs, top_token_ids, *, where: str = "inputs", vocab_size=None, first_request: int = 0
) -> None:
    """Validate a batch ``[B, L, K]`` (or a trace ``[R, L, K]``) of top-k log-probs and token ids; with
    ``vocab_size``, every token id must be below it. ``first_request``: the index of the first request, where
    the arrays are a slice of a larger trace (positions in messages are the trace's)."""
    lp, ids = top_log_probs, top_token_ids

    def at(index) -> tuple:
        index = tuple(int(i) for i in index)
        return (index[0] + first_request, *index[1:])

    if not isinstance(lp, np.ndarray) or not isinstance(ids, np.ndarray):
        raise ValueError(f"{where}: top_log_probs and top_token_ids must be numpy arrays")
    if lp.dtype != np.float32:
        raise ValueError(f"{where}: top_log_probs must be float32, got {lp.dtype}")
    if ids.dtype != np.int64:
        raise ValueError(f"{where}: top_token_ids must be int64, got {ids.dtype}")
    if lp.ndim != 3:
        raise ValueError(f"{where}: top_log_probs must be 3-D [R, L, K], got shape {lp.shape}")
    if ids.shape != lp.shape:
        raise ValueError(f"{where}: top_token_ids shape {ids.shape} != top_log_probs shape {lp.shape}")
    rows, depth, k = lp.shape
    if rows == 0:
        raise ValueError(f"{where}: no requests (R = 0)")
    if depth == 0:
        raise ValueError(f"{where}: L = 0 (no block positions)")
    if k == 0:
        raise ValueError(f"{where}: K = 0 (no top-k columns)")
    if not np.isfinite(lp).all():
        bad = at(np.argwhere(~np.isfinite(lp))[0])
        raise ValueError(f"{where}: top_log_probs has a non-finite value (NaN or inf) at {bad}")
    if (lp > 0).any():
        bad = at(np.argwhere(lp > 0)[0])
        raise ValueError(f"{where}: top_log_probs has a positive log-probability at {bad}")
    if k > 1 and (np.diff(lp, axis=-1) > 0).any():
        bad = at(np.argwhere(np.diff(lp, axis=-1) > 0)[0])
        raise ValueError(f"{where}: top_log_probs rows must be sorted descending; row {bad[:2]} is not")
    if (ids < 0).any():
        bad = at(np.argwhere(ids < 0)[0])
        raise ValueError(f"{where}: top_token_ids has a negative token id at {bad}")
    if vocab_size is not None and (ids >= vocab_size).any():
        index = tuple(int(i) for i in np.argwhere(ids >= vocab_size)[0])
        raise ValueError(
            f"{where}: top_token_ids has token id {int(ids[index])} at {at(index)}, not below the vocabulary "
            f"size {int(vocab_size)}"
        )


def check_positive_int_list(values, name: str) -> list[int]:
    if not isinstance(values, list | tuple) or len(values) == 0:
        raise ValueError(f"{name} must be a non-empty list")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must hold integers >= 1, got {v!r}")
        out.append(int(v))
    if len(set(out)) != len(out):
        raise ValueError(f"{name} has duplicate values: {out}")
    return out
