"""The ``sglang`` builder without SGLang: a fake DDTree module injected into ``sys.modules``.

The fake's ``build_ddtree_tree_from_topk`` follows SGLang's function (DDTree branches of sgl-project/sglang)
line for line: torch tensors in, ``.to(device="cpu", dtype=...).numpy()``, ``heapq`` over
``(-logw, ranks, parent, depth, rank, logw)``, and the unpadded 7-tuple out. It runs on real torch where
torch is installed and, everywhere, on a tiny torch stand-in (the few calls the function and the builder
make), so the builder's calling convention and its normalisation into the padded TreeBatch are tested
without the optional extra. The builder's output must equal ``reference`` element for element.
"""

from __future__ import annotations

import heapq
import importlib.machinery
import importlib.util
import subprocess
import sys
import types

import numpy as np
import pytest

from ddtree_bench.builders import BuilderUnavailable, get_builder
from ddtree_bench.builders import sglang as sglang_builder
from ddtree_bench.tree import first_difference

HAS_TORCH = importlib.util.find_spec("torch") is not None
DDTREE_MODULE = "sglang.srt.speculative.dflash_ddtree_utils"
OTHER_MODULE = "sglang.srt.speculative.ddtree_utils"


# -- a tiny torch stand-in --------------------------------------------------------------------------------


class FakeTensor:
    """The part of torch.Tensor SGLang's tree builder and our builder use."""

    def __init__(self, array):
        self._array = np.asarray(array)

    shape = property(lambda self: self._array.shape)
    dtype = property(lambda self: self._array.dtype)

    def __getitem__(self, key):
        return FakeTensor(self._array[key])

    def __len__(self):
        return len(self._array)

    def to(self, device=None, dtype=None, non_blocking=False):
        assert device in (None, "cpu")
        return FakeTensor(self._array if dtype is None else self._array.astype(dtype))

    def numpy(self):
        return self._array

    def numel(self):
        return int(self._array.size)

    def tolist(self):
        return self._array.tolist()


def make_fake_torch() -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.__spec__ = importlib.machinery.ModuleSpec("torch", None)
    torch.__version__ = "0.0-fake"
    torch.Tensor = FakeTensor
    torch.float32, torch.long, torch.int64, torch.bool = np.float32, np.int64, np.int64, np.bool_
    torch.from_numpy = FakeTensor
    torch.empty = lambda n, dtype=None: FakeTensor(np.empty(n, dtype))
    torch.zeros = lambda shape, dtype=None: FakeTensor(np.zeros(shape, dtype))
    torch.full = lambda shape, value, dtype=None: FakeTensor(np.full(shape, value, dtype))
    return torch


def torch_for(kind: str):
    if kind == "fake":
        return make_fake_torch()
    import torch  # noqa: PLC0415 - only where installed

    return torch


# -- SGLang's function, on whichever torch ------------------------------------------------------------


def make_sglang_function(torch, calls: list | None = None):
    """``build_ddtree_tree_from_topk`` as in SGLang's DDTree branches (same statements, same order)."""

    def build_ddtree_tree_from_topk(top_log_probs, top_token_ids, budget):
        if calls is not None:
            calls.append((top_log_probs, top_token_ids, budget))
        if budget <= 0 or top_log_probs.shape[0] == 0:
            visibility = torch.zeros((1, 1), dtype=torch.bool)
            visibility[0, 0] = True
            retrieve_next_token = torch.full((1,), -1, dtype=torch.long)
            retrieve_next_sibling = torch.full((1,), -1, dtype=torch.long)
            return (
                torch.empty(0, dtype=torch.long),
                torch.empty(0, dtype=torch.long),
                [-1],
                [dict()],
                visibility,
                retrieve_next_token,
                retrieve_next_sibling,
            )

        topk = min(int(budget), int(top_log_probs.shape[-1]))
        depth_limit = int(top_log_probs.shape[0])

        top_log_probs_np = top_log_probs[:, :topk].to(device="cpu", dtype=torch.float32).numpy()
        top_token_ids_np = top_token_ids[:, :topk].to(device="cpu", dtype=torch.long).numpy()

        first_logw = float(top_log_probs_np[0, 0])
        heap = [(-first_logw, (0,), 0, 1, 0, first_logw)]

        node_token_ids_np = np.empty(int(budget), dtype=np.int64)
        node_depths_np = np.empty(int(budget), dtype=np.int64)
        parents_np = np.empty(int(budget) + 1, dtype=np.int32)
        parents_np[0] = -1
        child_maps = [dict()]
        node_count = 0

        while heap and node_count < int(budget):
            _, ranks, parent_index, depth, rank, logw = heapq.heappop(heap)

            token_id = int(top_token_ids_np[depth - 1, rank])
            current_index = node_count + 1
            node_token_ids_np[node_count] = token_id
            node_depths_np[node_count] = depth
            parents_np[current_index] = parent_index
            child_maps.append(dict())
            child_maps[parent_index][token_id] = current_index
            node_count += 1

            if rank + 1 < topk:
                sibling_ranks = ranks[:-1] + (rank + 1,)
                sibling_logw = (
                    logw
                    - float(top_log_probs_np[depth - 1, rank])
                    + float(top_log_probs_np[depth - 1, rank + 1])
                )
                heapq.heappush(
                    heap, (-sibling_logw, sibling_ranks, parent_index, depth, rank + 1, sibling_logw)
                )

            if depth < depth_limit:
                child_ranks = ranks + (0,)
                child_logw = logw + float(top_log_probs_np[depth, 0])
                heapq.heappush(heap, (-child_logw, child_ranks, current_index, depth + 1, 0, child_logw))

        current_length = 1 + node_count
        visibility_np = np.zeros((current_length, current_length), dtype=np.bool_)
        visibility_np[0, 0] = True
        for index in range(1, current_length):
            parent_index = int(parents_np[index])
            visibility_np[index, :index] = visibility_np[parent_index, :index]
            visibility_np[index, index] = True

        retrieve_next_token_np = np.full(current_length, -1, dtype=np.int64)
        retrieve_next_sibling_np = np.full(current_length, -1, dtype=np.int64)
        prev_sibling_of_parent = np.full(current_length, -1, dtype=np.int64)
        for child in range(1, current_length):
            parent = int(parents_np[child])
            if retrieve_next_token_np[parent] == -1:
                retrieve_next_token_np[parent] = child
            else:
                retrieve_next_sibling_np[prev_sibling_of_parent[parent]] = child
            prev_sibling_of_parent[parent] = child

        node_token_ids = torch.from_numpy(node_token_ids_np[:node_count])
        node_depths = torch.from_numpy(node_depths_np[:node_count])
        visibility = torch.from_numpy(visibility_np)
        parents = parents_np[:current_length].tolist()
        retrieve_next_token = torch.from_numpy(retrieve_next_token_np)
        retrieve_next_sibling = torch.from_numpy(retrieve_next_sibling_np)

        return (
            node_token_ids,
            node_depths,
            parents,
            child_maps,
            visibility,
            retrieve_next_token,
            retrieve_next_sibling,
        )

    return build_ddtree_tree_from_topk


def _package(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__path__ = []
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


def install(
    monkeypatch, *, torch="fake", version="0.0-ddtree-fake", ddtree_module=DDTREE_MODULE, function=None
):
    """Fake torch (unless real or absent), a fake ``sglang`` package, and optionally a DDTree module."""
    if torch == "absent":
        monkeypatch.setitem(sys.modules, "torch", None)  # "import torch" fails, find_spec says absent
        torch_module = None
    else:
        torch_module = torch_for(torch)
        if torch == "fake":
            monkeypatch.setitem(sys.modules, "torch", torch_module)
    if version is None:
        monkeypatch.setitem(sys.modules, "sglang", None)
    else:
        monkeypatch.setitem(sys.modules, "sglang", _package("sglang", __version__=version))
    monkeypatch.setattr(sglang_builder.importlib.metadata, "version", _no_metadata)
    if ddtree_module is not None:
        parts = ddtree_module.split(".")
        for i in range(2, len(parts)):
            monkeypatch.setitem(sys.modules, ".".join(parts[:i]), _package(".".join(parts[:i])))
        module = types.ModuleType(ddtree_module)
        if function is None and torch_module is not None:
            function = make_sglang_function(torch_module)
        if function is not None:
            module.build_ddtree_tree_from_topk = function
        monkeypatch.setitem(sys.modules, ddtree_module, module)
    return torch_module


def _no_metadata(name):
    raise sglang_builder.importlib.metadata.PackageNotFoundError(name)


TORCH_KINDS = [
    "fake",
    pytest.param("real", marks=pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")),
]


# -- normalisation and the calling convention -------------------------------------------------------------


@pytest.mark.parametrize("torch_kind", TORCH_KINDS)
@pytest.mark.parametrize(
    "kind,batch,depth,k,budget",
    [
        ("uniform", 3, 6, 16, 16),  # K = N
        ("bf16", 4, 8, 5, 24),  # K < N
        ("tied", 2, 4, 40, 12),  # K > N
        ("equal", 2, 3, 3, 64),  # heap drain: 39 nodes of 64
        ("peaked", 2, 1, 9, 4),  # L = 1
        ("uniform", 1, 5, 8, 1),  # budget 1
    ],
)
def test_equals_reference(monkeypatch, topk_inputs, torch_kind, kind, batch, depth, k, budget):
    install(monkeypatch, torch=torch_kind)
    lp, ids = topk_inputs(kind, batch, depth, k, seed=budget)
    builder = get_builder("sglang")
    assert builder.unavailable_reason() is None
    expected = get_builder("reference").build(lp, ids, budget)
    actual = builder.build(lp, ids, budget)
    diff = first_difference(expected, actual)
    assert diff is None, diff


@pytest.mark.parametrize("torch_kind", TORCH_KINDS)
def test_called_per_request_with_cpu_tensors(monkeypatch, topk_inputs, torch_kind):
    torch = torch_for(torch_kind)
    calls = []
    install(monkeypatch, torch=torch_kind, function=make_sglang_function(torch, calls))
    if torch_kind == "fake":
        torch = sys.modules["torch"]
    lp, ids = topk_inputs("uniform", 3, 4, 6)
    get_builder("sglang").build(lp, ids, 5)
    assert len(calls) == 3
    for b, (lp_b, ids_b, budget) in enumerate(calls):
        assert isinstance(lp_b, torch.Tensor) and isinstance(ids_b, torch.Tensor)
        assert tuple(lp_b.shape) == (4, 6) and tuple(ids_b.shape) == (4, 6)
        assert str(lp_b.dtype).endswith("float32") and str(ids_b.dtype).endswith("int64")
        assert np.array_equal(np.asarray(lp_b.numpy()), lp[b]) and np.array_equal(
            np.asarray(ids_b.numpy()), ids[b]
        )
        assert budget == 5 and type(budget) is int


def test_found_at_the_second_known_path(monkeypatch):
    install(monkeypatch, ddtree_module=OTHER_MODULE)
    builder = get_builder("sglang")
    assert builder.unavailable_reason() is None
    assert builder.module_path == OTHER_MODULE
    info = builder.info()
    assert (
        info["module"] == OTHER_MODULE and info["sglang"] == "0.0-ddtree-fake" and info["torch"] == "0.0-fake"
    )


def test_given_module_path_is_tried_first(monkeypatch, topk_inputs):
    install(monkeypatch)  # the known path works too
    fork = types.ModuleType("myfork.ddtree")
    calls = []
    fork.build_ddtree_tree_from_topk = make_sglang_function(sys.modules["torch"], calls)
    monkeypatch.setitem(sys.modules, "myfork", _package("myfork"))
    monkeypatch.setitem(sys.modules, "myfork.ddtree", fork)
    builder = get_builder("sglang", module_paths=["myfork.ddtree"])
    assert builder.module_path == "myfork.ddtree"
    assert builder.module_paths == ("myfork.ddtree", DDTREE_MODULE, OTHER_MODULE)
    lp, ids = topk_inputs("uniform", 2, 3, 4)
    builder.build(lp, ids, 4)
    assert len(calls) == 2


def test_outputs_that_break_the_contract_are_reported(monkeypatch, topk_inputs):
    torch = install(monkeypatch)
    good = make_sglang_function(torch)

    def too_many_nodes(lp, ids, budget):
        return good(lp, ids, budget + 1)

    def inconsistent(lp, ids, budget):
        result = list(good(lp, ids, budget))
        result[4] = FakeTensor(np.ones((2, 2), np.bool_))
        return tuple(result)

    lp, ids = topk_inputs("uniform", 1, 3, 4)
    for function, message in [(too_many_nodes, "over the budget"), (inconsistent, "visibility has shape")]:
        sys.modules[DDTREE_MODULE].build_ddtree_tree_from_topk = function
        with pytest.raises(RuntimeError, match=message):
            get_builder("sglang").build(lp, ids, 4)


# -- unavailable, and why ---------------------------------------------------------------------------------


def test_neither_torch_nor_sglang(monkeypatch):
    install(monkeypatch, torch="absent", version=None, ddtree_module=None)
    reason = get_builder("sglang").unavailable_reason()
    assert reason == "neither torch nor sglang is installed (install the extra: pip install .[sglang])"


def test_torch_without_sglang(monkeypatch):
    install(monkeypatch, version=None, ddtree_module=None)
    assert get_builder("sglang").unavailable_reason().startswith("sglang is not installed")


def test_sglang_without_torch(monkeypatch):
    install(monkeypatch, torch="absent", version="0.5.23", ddtree_module=None)
    assert (
        get_builder("sglang").unavailable_reason().startswith("sglang 0.5.23 is installed but torch is not")
    )


def test_sglang_release_without_ddtree(monkeypatch, topk_inputs):
    install(monkeypatch, version="0.5.23", ddtree_module=None)
    builder = get_builder("sglang")
    reason = builder.unavailable_reason()
    assert reason.startswith(
        "sglang 0.5.23 is installed but has no DDTree build_ddtree_tree_from_topk; tried: "
    )
    assert DDTREE_MODULE in reason and OTHER_MODULE in reason
    assert builder.info()["sglang"] == "0.5.23" and builder.info()["unavailable"] == reason
    lp, ids = topk_inputs("uniform", 1, 2, 2)
    with pytest.raises(BuilderUnavailable, match="0.5.23"):
        builder.build(lp, ids, 2)


def test_module_without_the_function(monkeypatch):
    install(monkeypatch, version="0.6.0", function=None, torch="fake")
    del sys.modules[DDTREE_MODULE].build_ddtree_tree_from_topk
    reason = get_builder("sglang").unavailable_reason()
    assert f"{DDTREE_MODULE} (no build_ddtree_tree_from_topk)" in reason and "0.6.0" in reason


def test_this_environment_says_why(monkeypatch):
    # no fakes: whatever is installed here, the builder either works or gives a reason naming what is missing
    builder = get_builder("sglang")
    reason = builder.unavailable_reason()
    if reason is not None:
        assert any(word in reason for word in ("torch", "sglang"))
        assert builder.info()["unavailable"] == reason


def test_default_install_does_not_import_torch_or_sglang():
    code = (
        "import sys, ddtree_bench, ddtree_bench.builders, ddtree_bench.builders.sglang, "
        "ddtree_bench.builders.native, ddtree_bench.builders.reference; "
        "from ddtree_bench.builders import get_builder; get_builder('sglang'); "
        "print(sorted(m for m in ('torch', 'sglang') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
