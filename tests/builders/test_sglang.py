"""The ``sglang`` builder without SGLang: a fake DDTree module injected into ``sys.modules``.

The fake's ``build_ddtree_tree_from_topk`` follows SGLang's function (DDTree branches of sgl-project/sglang)
line for line: torch tensors in, ``.to(device="cpu", dtype=...).numpy()``, ``heapq`` over
``(-logw, ranks, parent, depth, rank, logw)``, and the unpadded 7-tuple out. It runs on real torch where
torch is installed and, everywhere, on a tiny torch stand-in (the few calls the function and the builder
make), so the builder's calling convention and its normalisation into the padded TreeBatch are tested
without the optional extra. The builder's output must equal ``reference`` element for element.
"""

from __future__ import annotations

import hashlib
import heapq
import importlib.machinery
import importlib.metadata
import importlib.util
import inspect
import os
import shutil
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from ddtree_bench.builders import BuilderUnavailable, get_builder
from ddtree_bench.builders.sglang import sglang_call
from ddtree_bench.cli import main
from ddtree_bench.config import check_config
from ddtree_bench.integrations.sglang import source as sglang_source
from ddtree_bench.stages.build import run_benchmark
from ddtree_bench.stages.timing_job import TimingJob
from ddtree_bench.summary.build import summarize
from ddtree_bench.traces import save_trace
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
    import torch  # noqa: PLC0415

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
    monkeypatch.setattr(importlib.metadata, "version", _no_metadata)
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
    raise importlib.metadata.PackageNotFoundError(name)


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


# -- SGLang's function from a source path (a checkout or the file), loaded by path ---------------------------

STAND_IN_HEAD = '''"""A stand-in for SGLang's DDTree file, written by the test."""
import heapq

import numpy as np
import torch

CALLS = []
'''

WORKSPACE_PART = """

class DFlashDDTreeBuildWorkspace:
    made = 0

    def __init__(self):
        DFlashDDTreeBuildWorkspace.made += 1


def build_ddtree_tree_from_topk(top_log_probs, top_token_ids, budget, workspace=None):
    CALLS.append(workspace)
    return _build(top_log_probs, top_token_ids, budget)


def pad_ddtree_build_outputs(visibility, retrieve_next_token, retrieve_next_sibling, target_q_len):
    return "padded"
"""

PLAIN_PART = """

def build_ddtree_tree_from_topk(top_log_probs, top_token_ids, budget):
    CALLS.append(None)
    return _build(top_log_probs, top_token_ids, budget)
"""


def stand_in_text(*, workspace: bool = True) -> str:
    """A module file defining ``build_ddtree_tree_from_topk`` (SGLang's statements: ``make_sglang_function``),
    with ``workspace=``, ``DFlashDDTreeBuildWorkspace`` and ``pad_ddtree_build_outputs`` where asked."""
    body = textwrap.dedent(inspect.getsource(make_sglang_function))
    return (
        STAND_IN_HEAD
        + "\n\n"
        + body
        + "\n\n_build = make_sglang_function(torch)\n"
        + (WORKSPACE_PART if workspace else PLAIN_PART)
    )


def write_stand_in(path, *, workspace: bool = True, text: str | None = None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(stand_in_text(workspace=workspace) if text is None else text)
    return path


CHECKOUT_FILE = "python/sglang/srt/speculative/dflash_ddtree_utils.py"


@pytest.fixture
def fake_torch_only(monkeypatch):
    """Fake torch, and no sglang package at all: the source route must not need it."""
    monkeypatch.setitem(sys.modules, "torch", make_fake_torch())
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    return sys.modules["torch"]


@pytest.mark.parametrize("workspace", [True, False])
def test_source_file_loads_by_path_and_equals_reference(fake_torch_only, tmp_path, topk_inputs, workspace):
    path = write_stand_in(tmp_path / "my_ddtree.py", workspace=workspace)
    builder = get_builder("sglang", source=path)
    assert builder.unavailable_reason() is None
    assert callable(builder.function) and builder.function.__name__ == "build_ddtree_tree_from_topk"
    module = sys.modules[builder.function.__module__]
    assert builder.function.__module__.startswith("_ddtree_bench_sglang_source_")
    lp, ids = topk_inputs("bf16", 3, 6, 8, seed=4)
    expected = get_builder("reference").build(lp, ids, 12)
    assert first_difference(expected, builder.build(lp, ids, 12)) is None
    builder.build(lp, ids, 12)
    info = builder.source_info
    assert info["kind"] == "file" and info["source"] == str(path.resolve())
    assert info["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert info["git_commit"] is None  # not tracked by any git work tree
    assert info["workspace"] is workspace
    if workspace:
        # one workspace, made with the builder, passed to every per-request call
        assert isinstance(builder.workspace, module.DFlashDDTreeBuildWorkspace)
        assert module.DFlashDDTreeBuildWorkspace.made == 1
        assert len(module.CALLS) == 6 and all(w is builder.workspace for w in module.CALLS)
        assert builder.pad_function is module.pad_ddtree_build_outputs
    else:
        assert builder.workspace is None and builder.pad_function is None
        assert module.CALLS == [None] * 6
    assert builder.info()["source"]["sha256"] == info["sha256"]
    assert "sglang" not in sys.modules  # loaded by path: the sglang package was never imported


@pytest.mark.parametrize("workspace", [True, False])
def test_sglang_call_is_how_the_worker_calls_the_function(fake_torch_only, tmp_path, workspace):
    builder = get_builder("sglang", source=write_stand_in(tmp_path / "ddtree.py", workspace=workspace))
    function, pad_function, extra = sglang_call(builder)
    assert function is builder.function and pad_function is builder.pad_function
    assert extra == ({"workspace": builder.workspace} if workspace else {})


def test_sglang_call_without_the_function_says_why(monkeypatch):
    install(monkeypatch, version=None, ddtree_module=None)
    with pytest.raises(BuilderUnavailable, match="sglang is not installed"):
        sglang_call(get_builder("sglang"))


@pytest.mark.parametrize("given", ["", "python"])
@pytest.mark.parametrize("relative", [CHECKOUT_FILE, "python/sglang/srt/speculative/ddtree_utils.py"])
def test_source_checkout_folder_finds_the_file(fake_torch_only, tmp_path, topk_inputs, given, relative):
    checkout = tmp_path / "sglang-checkout"
    path = write_stand_in(checkout / relative)
    builder = get_builder("sglang", source=checkout / given if given else checkout)
    assert builder.source_info["source"] == str(path.resolve())
    lp, ids = topk_inputs("uniform", 2, 4, 6)
    assert first_difference(get_builder("reference").build(lp, ids, 6), builder.build(lp, ids, 6)) is None


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_source_in_a_git_checkout_records_its_commit(fake_torch_only, tmp_path):
    checkout = tmp_path / "checkout"
    path = write_stand_in(checkout / CHECKOUT_FILE)
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }

    def git(*args):
        return subprocess.run(
            ["git", "-C", str(checkout), *args],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, **env},
        ).stdout.strip()

    git("init", "-q")
    git("add", CHECKOUT_FILE)
    git("commit", "-q", "-m", "stand-in")
    head = git("rev-parse", "HEAD")
    info = get_builder("sglang", source=checkout).source_info
    assert info["git_commit"] == head and info["git_modified"] is False
    path.write_text(path.read_text() + "\n# edited\n")
    info = get_builder("sglang", source=checkout).source_info
    assert info["git_commit"] == head and info["git_modified"] is True
    ignored = checkout / "copies" / "dflash_ddtree_utils.py"  # untracked inside the repo: no commit
    write_stand_in(ignored)
    assert get_builder("sglang", source=ignored).source_info["git_commit"] is None


BROKEN = "import no_such_module_xyz\n\n\ndef build_ddtree_tree_from_topk(a, b, c):\n    pass\n"


def test_source_bad_inputs_raise_one_line_value_errors(fake_torch_only, tmp_path):
    cases = [
        (tmp_path / "nowhere", "no such file or folder"),
        ((tmp_path / "empty").mkdir() or tmp_path / "empty", "a folder without SGLang's DDTree file; tried"),
        (write_stand_in(tmp_path / "other.py", text="def something():\n    pass\n"), "defines no"),
        (write_stand_in(tmp_path / "broken.py", text=BROKEN), "loading it failed: ModuleNotFoundError"),
        (
            write_stand_in(
                tmp_path / "late.py",
                text="def build_ddtree_tree_from_topk(a, b, c): pass\nraise RuntimeError('boom')\n",
            ),
            "loading it failed: RuntimeError: boom",
        ),
    ]
    for source, needle in cases:
        with pytest.raises(ValueError) as error:
            get_builder("sglang", source=source)
        text = str(error.value)
        assert "\n" not in text and text.startswith("sglang source ") and needle in text, text


def test_source_without_torch_is_one_line_error(monkeypatch, tmp_path):
    path = write_stand_in(tmp_path / "ddtree.py")
    monkeypatch.setattr(sglang_source, "torch_present", lambda: False)
    with pytest.raises(ValueError, match=r"^sglang source .*ddtree\.py: torch is not installed"):
        get_builder("sglang", source=path)


def test_source_errors_on_the_command_line_exit_2(
    fake_torch_only, monkeypatch, tmp_path, topk_inputs, capsys
):
    lp, ids = topk_inputs("uniform", 2, 4, 8)
    trace = tmp_path / "t.npz"
    save_trace(trace, lp, ids)
    good = write_stand_in(tmp_path / "checkout" / CHECKOUT_FILE)
    out = tmp_path / "trees.npz"

    def run(*args):
        code = main([str(a) for a in args])
        return code, capsys.readouterr()

    base = ("--builder", "sglang", "--trace", trace, "--budget", 8)
    for command, extra in (("build", ("-o", out)), ("check", ()), ("bench", ("--batch", 1, "-o", out))):
        code, captured = run(command, *base, "--sglang-source", tmp_path / "missing", *extra)
        lines = captured.err.strip().splitlines()
        assert code == 2 and len(lines) == 1, captured.err
        assert lines[0].startswith("ddtree-bench: error: sglang source ") and "no such file" in lines[0]
        assert not out.exists()
    code, captured = run(
        "build", "--builder", "native", "--trace", trace, "--budget", 8, "--sglang-source", good, "-o", out
    )
    assert code == 2 and "--sglang-source goes with --builder sglang" in captured.err and not out.exists()
    monkeypatch.setattr(sglang_source, "torch_present", lambda: False)
    code, captured = run("build", *base, "--sglang-source", tmp_path / "checkout", "-o", out)
    assert (
        code == 2 and "torch is not installed" in captured.err and len(captured.err.strip().splitlines()) == 1
    )
    assert not out.exists()
    monkeypatch.setattr(sglang_source, "torch_present", lambda: True)
    code, captured = run("check", *base, "--sglang-source", tmp_path / "checkout")
    assert code == 0 and "ok: sglang equals reference" in captured.out


def test_source_provenance_is_in_every_row_and_the_summary(fake_torch_only, tmp_path, topk_inputs):
    lp, ids = topk_inputs("peaked", 2, 4, 8)
    trace = tmp_path / "t.npz"
    save_trace(trace, lp, ids)
    path = write_stand_in(tmp_path / "ddtree.py")
    timing = dict(warmup=1, repeats=2, min_seconds=0.0, max_seconds=None, min_repeats=1, max_repeats=None)
    rows = run_benchmark(
        TimingJob(
            "sglang",
            trace,
            8,
            2,
            timing,
            machine="m",
            distribution="peaked",
            builder_options={"source": str(path)},
        )
    )
    sha = sglang_source.file_sha256(path)
    assert (rows["builder_source"] == str(path.resolve())).all() and (
        rows["builder_source_sha256"] == sha
    ).all()
    assert rows["builder_workspace"].all() and rows["builder_source_git_commit"].isna().all()
    summary = summarize(rows)
    assert summary["builder_source_sha256"].tolist() == [sha] and summary["builder_workspace"].tolist() == [
        True
    ]
    ref = run_benchmark(
        TimingJob(
            "reference",
            trace,
            8,
            2,
            {**timing, "warmup": 0, "repeats": 1},
            machine="m",
            distribution="peaked",
        )
    )
    assert ref["builder_source"].isna().all() and ref["builder_workspace"].isna().all()


def test_config_sglang_source_is_checked_before_any_job(fake_torch_only, tmp_path, monkeypatch):
    def config(**sglang):
        return {"builders": ["sglang", "reference"], "sglang": sglang, "step": {"enabled": False}}

    assert check_config(config())["sglang"]["source"] is None
    with pytest.raises(ValueError) as error:
        check_config(config(source=str(tmp_path / "nowhere")))
    assert str(error.value).startswith("config: sglang.source: sglang source ") and "no such file" in str(
        error.value
    )
    empty = write_stand_in(tmp_path / "empty.py", text="x = 1\n")
    with pytest.raises(ValueError, match="^config: sglang.source: .*defines no build_ddtree_tree_from_topk"):
        check_config(config(source=str(empty)))
    good = write_stand_in(tmp_path / "checkout" / CHECKOUT_FILE)
    assert check_config(config(source=str(tmp_path / "checkout")))["sglang"]["source"] == str(
        tmp_path / "checkout"
    )
    unrunnable = write_stand_in(
        tmp_path / "unrunnable.py",
        text="def build_ddtree_tree_from_topk(a, b, c):\n    pass\n\nraise SystemExit\n",
    )
    check_config(config(source=str(unrunnable)))  # the check reads the file, never runs it
    monkeypatch.setattr(sglang_source, "torch_present", lambda: False)
    with pytest.raises(ValueError, match="^config: sglang.source: .*torch is not installed"):
        check_config(config(source=str(good)))
    unused = {
        "builders": ["reference"],
        "sglang": {"source": str(tmp_path / "nowhere")},
        "step": {"enabled": False},
    }
    check_config(unused)  # the sglang builder is not configured: its source is not looked at


SGLANG_SOURCE_ENV = "DDTREE_BENCH_SGLANG_SOURCE"


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
@pytest.mark.skipif(
    not os.environ.get(SGLANG_SOURCE_ENV),
    reason=f"{SGLANG_SOURCE_ENV} is not set (an SGLang checkout or its DDTree .py file)",
)
@pytest.mark.parametrize(
    "kind,depth,k,budget", [("bf16", 16, 64, 64), ("tied", 8, 40, 24), ("peaked", 16, 8, 8)]
)
def test_real_sglang_source_equals_reference(topk_inputs, kind, depth, k, budget):
    """SGLang's own file, where the environment names it: its trees equal reference's, ties included."""
    builder = get_builder("sglang", source=os.environ[SGLANG_SOURCE_ENV])
    info = builder.source_info
    assert info["kind"] == "file" and len(info["sha256"]) == 64
    assert builder.pad_function is not None
    lp, ids = topk_inputs(kind, 4, depth, k, seed=budget)
    diff = first_difference(get_builder("reference").build(lp, ids, budget), builder.build(lp, ids, budget))
    assert diff is None, diff
