"""Equality before timing: ``check_builder``."""

from __future__ import annotations

import numpy as np
import pytest

from ddtree_bench.builders import Builder, BuilderUnavailable, get_builder
from ddtree_bench.stages import check
from ddtree_bench.stages.check import TreeMismatch, check_builder
from ddtree_bench.traces import TraceSpec, generate, load_trace, save_trace


@pytest.fixture
def trace_path(tmp_path):
    trace = generate(TraceSpec("bf16", 6, 4, 8, 512, 1), device="cpu")
    path = tmp_path / "trace.npz"
    save_trace(path, trace.top_log_probs, trace.top_token_ids, **trace.metadata)
    return path


class WrongBuilder(Builder):
    """The reference builder, but one field of one request is altered afterwards."""

    name = "wrong"
    label = "deliberately wrong"

    def __init__(self, request=2, field="node_token_ids"):
        self.request, self.field = request, field
        self.calls = []

    def build(self, top_log_probs, top_token_ids, budget):
        self.calls.append(top_log_probs.shape[0])
        trees = get_builder("reference").build(top_log_probs, top_token_ids, budget)
        if self.request < trees.batch_size:
            array = getattr(trees, self.field)
            array[self.request, 1] = (
                ~array[self.request, 1] if array.dtype == bool else array[self.request, 1] + 1
            )
        return trees


class MissingBuilder(Builder):
    name = "missing"

    def unavailable_reason(self):
        return "not installed here"

    def build(self, top_log_probs, top_token_ids, budget):
        raise AssertionError("an unavailable builder must not be called")


class LateFailingBuilder(Builder):
    name = "late"

    def build(self, top_log_probs, top_token_ids, budget):
        raise BuilderUnavailable("library vanished")


def _patch(monkeypatch, **builders):
    def fake_get_builder(name, **options):
        if name in builders:
            return builders[name]
        return get_builder(name, **options)

    monkeypatch.setattr(check, "get_builder", fake_get_builder)


def test_reference_equals_reference(trace_path):
    summary = check_builder("reference", trace_path, 16)
    assert summary["status"] == "ok"
    assert summary["builder"] == "reference" and summary["against"] == "reference"
    assert summary["budget"] == 16 and summary["requests"] == 6
    assert summary["depth"] == 4 and summary["topk"] == 8
    assert summary["nodes_mean"] == 16.0
    assert summary["reason"] is None
    assert summary["trace_sha256"] == load_trace(trace_path).sha256  # which inputs this check saw


def test_batch_checks_the_first_requests(trace_path, monkeypatch):
    wrong = WrongBuilder(request=4)
    _patch(monkeypatch, wrong=wrong)
    summary = check_builder("wrong", trace_path, 8, batch=3)  # request 4 is outside the batch
    assert summary["status"] == "ok" and summary["requests"] == 3
    assert wrong.calls == [3]
    with pytest.raises(TreeMismatch, match="request 4"):
        check_builder("wrong", trace_path, 8, batch=5)


@pytest.mark.parametrize("field", ["node_token_ids", "parents", "retrieve_next_token", "visibility"])
def test_a_wrong_builder_is_named_with_request_and_field(trace_path, monkeypatch, field):
    _patch(monkeypatch, wrong=WrongBuilder(request=2, field=field))
    with pytest.raises(TreeMismatch) as info:
        check_builder("wrong", trace_path, 12)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert message.startswith(f"builder wrong differs from reference on trace {trace_path}, budget 12: ")
    assert "request 2" in message and f"field {field}" in message
    assert "\n" not in message


def test_a_builder_object_can_be_checked(trace_path):
    with pytest.raises(TreeMismatch, match="request 0, field parents"):
        check_builder(WrongBuilder(request=0, field="parents"), trace_path, 8)
    assert check_builder(get_builder("reference"), trace_path, 8)["status"] == "ok"


def test_builder_options_reach_the_builder(trace_path, monkeypatch):
    seen = {}

    def fake_get_builder(name, **options):
        seen[name] = options
        return get_builder("reference")

    monkeypatch.setattr(check, "get_builder", fake_get_builder)
    check_builder("native", trace_path, 8, builder_options={"threads": 1})
    assert seen == {"native": {"threads": 1}, "reference": {}}


def test_unavailable_builder_is_reported_not_raised(trace_path, monkeypatch):
    _patch(monkeypatch, missing=MissingBuilder(), late=LateFailingBuilder())
    summary = check_builder("missing", trace_path, 8)
    assert summary["status"] == "unavailable"
    assert "not installed here" in summary["reason"] and "missing" in summary["reason"]
    summary = check_builder("reference", trace_path, 8, against="missing")
    assert summary["status"] == "unavailable"
    summary = check_builder("late", trace_path, 8)
    assert summary["status"] == "unavailable" and "library vanished" in summary["reason"]


@pytest.mark.parametrize(
    "kwargs, problem",
    [
        ({"budget": 0}, "budget must be >= 1"),
        ({"budget": 2.5}, "budget must be an integer"),
        ({"budget": 8, "batch": 7}, "batch 7 is larger than the 6 requests"),
        ({"budget": 8, "batch": 0}, "batch must be >= 1"),
        ({"budget": 8, "builder": "nonesuch"}, "unknown builder 'nonesuch'"),
        ({"budget": 8, "against": "nonesuch"}, "unknown builder 'nonesuch'"),
    ],
)
def test_bad_input_is_a_value_error(trace_path, kwargs, problem):
    kwargs = {"builder": "reference", **kwargs}
    builder = kwargs.pop("builder")
    budget = kwargs.pop("budget")
    with pytest.raises(ValueError, match=problem):
        check_builder(builder, trace_path, budget, **kwargs)


def test_missing_trace_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="file not found"):
        check_builder("reference", tmp_path / "nope.npz", 8)


def test_identical_trees_on_ties(tmp_path):
    """All-equal rows: every tie is decided by the ranks tuple; reference must agree with itself."""
    lp = np.full((2, 3, 4), -1.0, np.float32)
    ids = np.tile(np.arange(4, dtype=np.int64), (2, 3, 1))
    path = tmp_path / "ties.npz"
    save_trace(path, lp, ids)
    assert check_builder("reference", path, 30)["nodes_mean"] == 30.0
