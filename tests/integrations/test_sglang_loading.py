"""Loading SGLang's code (``ddtree_bench.integrations.sglang``), on the CPU: one error type with one-line
messages, one import finder over SGLang's files (stand-ins first, packages never run, ``sys.modules`` restored
after a temporary load), the MoE files' lookup, the accept file, the ``moe_align_block_size`` stand-in, and
the package sitting below the rest of the benchmark."""

from __future__ import annotations

import ast
import importlib
import sys
import types
from pathlib import Path

import pytest

from ddtree_bench.integrations import sglang
from ddtree_bench.integrations.sglang import files, stubs
from ddtree_bench.integrations.sglang.files import MARLIN, TRITON

PACKAGE = Path(sglang.__file__).parent
#: what the integration may import of the benchmark (it sits below builders, ops, k26 and stages)
ALLOWED = ("ddtree_bench.catalog", "ddtree_bench.io", "ddtree_bench.validation", "ddtree_bench.traces")


def test_the_package_imports_nothing_above_it():
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.startswith("ddtree_bench") and not name.startswith("ddtree_bench.integrations"):
                    assert name in ALLOWED, f"{path.name} imports {name}"


def test_one_error_type_with_one_line():
    assert issubclass(sglang.SglangUnavailable, RuntimeError)
    assert str(sglang.SglangUnavailable("a\n  b\tc")) == "a b c"
    assert sglang.describe(ValueError("x" * 400), limit=20) == "ValueError: xxxxx..."


def write(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def fake_files(root: Path) -> Path:
    """A folder holding ``sglang/``: a package whose ``__init__.py`` must never run, a module importing a
    sibling and a stand-in, and the JIT helpers' package whose ``__init__.py`` does run."""
    for package in ("sglang", "sglang/kernels", "sglang/kernels/ops"):
        write(root / package / "__init__.py", "raise RuntimeError('must not run')\n")
    write(root / "sglang/kernels/ops/helper.py", "VALUE = 42\n")
    write(
        root / "sglang/kernels/ops/user.py",
        "from sglang.kernels.ops.helper import VALUE\nfrom sglang.utils import is_in_ci\n",
    )
    write(root / "sglang/kernels/jit/utils/__init__.py", "RAN = True\n")
    return root


def test_files_on_path_serves_files_and_stand_ins_and_restores_sys_modules(tmp_path, monkeypatch):
    root = fake_files(tmp_path / "files")
    real = types.ModuleType("sglang")  # a real sglang imported before: left exactly as it was
    monkeypatch.setitem(sys.modules, "sglang", real)
    before = dict(sys.modules)
    finders = [f for f in sys.meta_path if isinstance(f, files.SglangFiles)]  # (the MoE files', where loaded)
    with files.files_on_path(root):
        user = importlib.import_module("sglang.kernels.ops.user")
        assert user.VALUE == 42 and user.is_in_ci() is False  # a stand-in: sglang.utils is ours
        assert sys.modules["sglang"] is not real
        assert sys.modules["sglang.utils"].__doc__ == "ddtree_bench's stand-in for sglang.utils"
        assert importlib.import_module("sglang.kernels.jit.utils").RAN  # a package whose __init__ runs
        with pytest.raises(ModuleNotFoundError, match=r"sglang.kernels.nothing is not under"):
            importlib.import_module("sglang.kernels.nothing")
    after = {n: m for n, m in sys.modules.items() if files.ours(n)}
    assert after == {n: m for n, m in before.items() if files.ours(n)} and sys.modules["sglang"] is real
    assert [f for f in sys.meta_path if isinstance(f, files.SglangFiles)] == finders


@pytest.mark.parametrize("given", ["root", "python", "package"])
def test_moe_files_are_found_from_any_form_of_the_path(tmp_path, given):
    root = tmp_path / "checkout" / "python"
    write(root / sglang.REQUIRED_FILES[TRITON][0])
    source = {"root": root, "python": tmp_path / "checkout", "package": root / "sglang"}[given]
    assert sglang.sglang_moe_root(source) == root.resolve()


def test_moe_files_missing_are_one_line(tmp_path):
    with pytest.raises(sglang.SglangUnavailable, match=r"^SGLang's MoE files not found at .*nowhere"):
        sglang.sglang_moe_root(tmp_path / "nowhere")
    write(tmp_path / "files" / sglang.REQUIRED_FILES[MARLIN][0])
    with pytest.raises(sglang.SglangUnavailable) as info:
        sglang.load_sglang_moe(MARLIN, tmp_path / "files")
    text = str(info.value)
    assert text.startswith(f"{MARLIN}: SGLang's files under ") and sglang.REQUIRED_FILES[MARLIN][1] in text
    assert "\n" not in text


def test_the_moe_align_stand_in_forwards_sglangs_arguments(monkeypatch):
    calls = []
    moe_align = types.ModuleType("sglang.kernels.ops.moe.moe_align")
    moe_align.moe_align_block_size = lambda *args: calls.append(args)
    monkeypatch.setitem(sys.modules, moe_align.__name__, moe_align)
    align = stubs.stand_ins()["sglang.kernels.ops.moe"]()["moe_align_block_size"]
    align(*range(7))
    align(*range(8))
    align(*range(8), False)  # the dispatcher's ninth argument: ignore_invalid_expert
    assert calls == [tuple(range(7)), tuple(range(8)), tuple(range(8))]
    with pytest.raises(RuntimeError, match="ignore_invalid_expert needs sgl_kernel's AOT"):
        align(*range(8), True)
    with pytest.raises(RuntimeError, match="ignore_invalid_expert needs sgl_kernel's AOT"):
        align(*range(8), ignore_invalid_expert=True)


def test_the_accept_file_is_found_and_loaded_or_said_why(tmp_path):
    utils = write(tmp_path / "dflash_ddtree_utils.py", "def build_ddtree_tree_from_topk(a, b, c): pass\n")
    with pytest.raises(ValueError, match=r"no triton_ops/ddtree.py beside it"):
        sglang.find_accept_file(utils)
    accept = write(tmp_path / "triton_ops" / "ddtree.py", "def other():\n    pass\n")
    assert sglang.find_accept_file(utils) == accept.resolve()
    missing = rf"ddtree.py: AttributeError: .*{sglang.ACCEPT_FUNCTION}"
    with pytest.raises(sglang.SglangUnavailable, match=missing):
        sglang.load_accept(utils)
    write(accept, f"def {sglang.ACCEPT_FUNCTION}(*args):\n    return len(args)\n")
    function, path = sglang.load_accept(utils)
    assert function(1, 2) == 2 and path == accept.resolve()


def test_no_installed_sglang_is_one_line(monkeypatch):
    monkeypatch.setattr(files.importlib.util, "find_spec", lambda name: None)
    # no MoE files loaded in this process either (an earlier test on a GPU machine may have loaded them)
    monkeypatch.setattr(files, "_INSTALLED", {"root": None, "finder": None, "modules": {}})
    with pytest.raises(sglang.SglangUnavailable, match=r"^no installed sglang package; pip install"):
        sglang.find_attention_file(None)
    with pytest.raises(sglang.SglangUnavailable, match=r"^no installed sglang and no sglang_files folder"):
        sglang.sglang_moe_root(None)
