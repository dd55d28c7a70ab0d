"""Input checks shared by the library, the CLI and the workflow."""

from __future__ import annotations

import numpy as np
import pytest

from ddtree_bench.validation import check_budget, check_positive_int_list, check_topk_arrays


@pytest.mark.parametrize("budget", [1, 8, 1024, np.int64(16), np.int32(3)])
def test_budget_ok(budget):
    assert check_budget(budget) == int(budget)
    assert type(check_budget(budget)) is int


@pytest.mark.parametrize(
    "budget, problem",
    [
        (0, "budget must be >= 1, got 0"),
        (-1, "budget must be >= 1, got -1"),
        (1.5, "budget must be an integer, got 1.5"),
        (8.0, "budget must be an integer, got 8.0"),
        (True, "budget must be an integer, got True"),
        (False, "budget must be an integer, got False"),
        ("8", "budget must be an integer, got '8'"),
        (None, "budget must be an integer, got None"),
    ],
)
def test_budget_bad(budget, problem):
    with pytest.raises(ValueError) as info:
        check_budget(budget)
    assert str(info.value) == problem


def test_positive_int_list_ok():
    assert check_positive_int_list([8, 16, 32], "budgets") == [8, 16, 32]
    assert check_positive_int_list((1,), "batch sizes") == [1]


@pytest.mark.parametrize(
    "values, problem",
    [
        ([], "budgets must be a non-empty list"),
        ((), "budgets must be a non-empty list"),
        (None, "budgets must be a non-empty list"),
        (8, "budgets must be a non-empty list"),
        ("8,16", "budgets must be a non-empty list"),
        ([8, 16, 8], "budgets has duplicate values"),
        ([8, 0], "budgets must hold integers >= 1, got 0"),
        ([8, -4], "budgets must hold integers >= 1, got -4"),
        ([8, 1.5], "budgets must hold integers >= 1, got 1.5"),
        ([True], "budgets must hold integers >= 1, got True"),
        (["8"], "budgets must hold integers >= 1, got '8'"),
    ],
)
def test_positive_int_list_bad(values, problem):
    with pytest.raises(ValueError, match=problem.replace("(", r"\(")) as info:
        check_positive_int_list(values, "budgets")
    assert "\n" not in str(info.value)


def _arrays(rows=2, depth=3, k=4):
    lp = -np.tile(np.arange(k, dtype=np.float32), (rows, depth, 1))
    ids = np.tile(np.arange(k, dtype=np.int64), (rows, depth, 1))
    return lp, ids


def test_topk_arrays_ok():
    check_topk_arrays(*_arrays())
    lp, ids = _arrays(k=1)
    check_topk_arrays(lp, ids)
    lp, ids = _arrays()
    lp[:] = -2.0  # all-equal rows are sorted (non-increasing)
    check_topk_arrays(lp, ids)


@pytest.mark.parametrize(
    "mutate, problem",
    [
        (lambda lp, ids: (lp.tolist(), ids), "must be numpy arrays"),
        (lambda lp, ids: (lp.astype(np.float16), ids), "top_log_probs must be float32, got float16"),
        (lambda lp, ids: (lp, ids.astype(np.uint64)), "top_token_ids must be int64, got uint64"),
        (lambda lp, ids: (lp[0], ids[0]), r"must be 3-D \[R, L, K\]"),
        (lambda lp, ids: (lp, ids[:, :2]), "top_token_ids shape"),
        (lambda lp, ids: (lp[:0], ids[:0]), "R = 0"),
        (lambda lp, ids: (lp[:, :0], ids[:, :0]), "L = 0"),
        (lambda lp, ids: (lp[..., :0], ids[..., :0]), "K = 0"),
    ],
)
def test_topk_arrays_bad_shapes_and_dtypes(mutate, problem):
    with pytest.raises(ValueError, match=problem):
        check_topk_arrays(*mutate(*_arrays()), where="test input")


@pytest.mark.parametrize(
    "name, index, value, problem",
    [
        ("lp", (1, 2, 3), np.nan, r"non-finite value \(NaN or inf\) at \(1, 2, 3\)"),
        ("lp", (0, 0, 0), np.inf, "non-finite"),
        ("lp", (0, 1, 2), -np.inf, "non-finite"),
        ("lp", (1, 0, 0), 1e-3, r"positive log-probability at \(1, 0, 0\)"),
        ("lp", (1, 1, 3), -0.5, r"sorted descending; row \(1, 1\)"),
        ("ids", (0, 2, 1), -1, r"negative token id at \(0, 2, 1\)"),
    ],
)
def test_topk_arrays_bad_values(name, index, value, problem):
    lp, ids = _arrays()
    (lp if name == "lp" else ids)[index] = value
    with pytest.raises(ValueError, match=problem) as info:
        check_topk_arrays(lp, ids, where="trace t.npz")
    assert str(info.value).startswith("trace t.npz: ")
