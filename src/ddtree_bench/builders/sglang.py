"""``sglang``: SGLang's own ``build_ddtree_tree_from_topk``, called the way its DDTree worker calls it.

Per request ``b``, with CPU torch tensors ``top_log_probs[b]`` (float32 [L, K]) and ``top_token_ids[b]``
(int64 [L, K]) and the budget; the function returns, unpadded, ``(node_token_ids, node_depths, parents,
child_maps, visibility, retrieve_next_token, retrieve_next_sibling)``, which this builder copies into the
padded :class:`~ddtree_bench.tree.TreeBatch`.

A build's time includes that copy into the padded batch, as SGLang's worker pays for its own padding
(``pad_ddtree_build_outputs``) after each call.

SGLang and torch come only with the optional extra (``pip install .[sglang]``); nothing here imports
either until the builder is asked whether it is available or to build. The DDTree module is looked for at
the ``module_paths`` given (first) and then at the known paths, in order.

``source``: a path to an SGLang checkout (its root or its ``python/`` folder) or to the ``.py`` file defining
``build_ddtree_tree_from_topk``. The file is loaded under a private module name (no ``import sglang``: the
package's ``__init__`` pulls in much more); only torch is needed. A source that does not exist, a file without
the function, or torch missing raise ``ValueError`` when the builder is made: the user asked for it.

Where the function takes ``workspace=`` and its module defines ``DFlashDDTreeBuildWorkspace`` (newer states of
the DDTree branch), one workspace made with the builder is passed to every call, as SGLang's worker does.
``source_info`` records where the function came from (module or file, the file's sha256, the checkout's git
commit where the file is tracked in one) and whether a workspace is passed; the timing rows carry it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import numpy as np

from ddtree_bench.builders.base import Builder, BuilderUnavailable
from ddtree_bench.tree import TreeBatch

KNOWN_MODULE_PATHS = (
    "sglang.srt.speculative.dflash_ddtree_utils",
    "sglang.srt.speculative.ddtree_utils",
)
FUNCTION_NAME = "build_ddtree_tree_from_topk"
PAD_FUNCTION_NAME = "pad_ddtree_build_outputs"
WORKSPACE_CLASS_NAME = "DFlashDDTreeBuildWorkspace"
#: Where the DDTree file lies inside an SGLang checkout (its root), in the order tried.
KNOWN_FILE_PATHS = tuple("python/" + path.replace(".", "/") + ".py" for path in KNOWN_MODULE_PATHS)


def _module_present(name: str) -> bool:
    if sys.modules.get(name) is not None:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def sglang_version() -> str | None:
    """The installed SGLang's version, or ``None`` when it is not installed."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        pass
    if not _module_present("sglang"):
        return None
    try:
        module = importlib.import_module("sglang")
    except Exception:  # noqa: BLE001 - a broken install still has "some" version
        return "unknown"
    return str(getattr(module, "__version__", "unknown"))


def _torch_present() -> bool:
    """Whether torch can be imported here (without importing it)."""
    return _module_present("torch")


def resolve_source(source) -> Path:
    """The DDTree ``.py`` file that ``source`` names: the file itself, or the known file paths inside an
    SGLang checkout (its root or its ``python/`` folder). Raises ``ValueError`` with one line."""
    path = Path(str(source)).expanduser()
    if not path.exists():
        raise ValueError(f"sglang source {path}: no such file or folder")
    if path.is_file():
        return path.resolve()
    tried = []
    for relative in KNOWN_FILE_PATHS:
        for candidate in (path / relative, path / relative.removeprefix("python/")):
            if candidate.is_file():
                return candidate.resolve()
            tried.append(str(candidate))
    raise ValueError(f"sglang source {path}: a folder without SGLang's DDTree file; tried {', '.join(tried)}")


def _defines_function(path: Path) -> bool:
    """Whether the file's top level defines ``build_ddtree_tree_from_topk`` (read, not executed)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return False
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == FUNCTION_NAME
        for node in tree.body
    )


def check_source(source) -> Path:
    """What the configuration check asks of ``sglang.source`` before any job: the file is found, defines
    the function (read, not run) and torch is installed. Returns the file; raises ``ValueError``."""
    path = resolve_source(source)
    if not _defines_function(path):
        raise ValueError(f"sglang source {path}: defines no {FUNCTION_NAME}")
    if not _torch_present():
        raise ValueError(f"sglang source {path}: torch is not installed, and SGLang's DDTree file needs it")
    return path


def file_sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None


def git_provenance(path) -> dict:
    """``{"git_commit", "git_modified"}`` of the git work tree that tracks the file ``path`` (the HEAD commit,
    and whether the file differs from it), or ``None`` values where git is absent or the file is not tracked
    (an ignored copy inside another repository gets no commit: that commit says nothing about the file)."""
    path = Path(path).resolve()
    none = {"git_commit": None, "git_modified": None}
    tracked = _git(path.parent, "ls-files", "--error-unmatch", "--", path.name)
    if tracked is None or tracked.returncode != 0:
        return none
    head = _git(path.parent, "rev-parse", "HEAD")
    if head is None or head.returncode != 0 or not head.stdout.strip():
        return none
    diff = _git(path.parent, "diff", "--quiet", "HEAD", "--", path.name)
    modified = None if diff is None or diff.returncode not in (0, 1) else diff.returncode == 1
    return {"git_commit": head.stdout.strip(), "git_modified": modified}


def load_source(path: Path):
    """The module at ``path``, executed under a private name (``sys.modules`` keeps it, so that classes and
    annotations resolve). Raises ``ValueError`` with one line where executing it fails."""
    key = hashlib.sha256(f"{Path(path).resolve()}\n{file_sha256(path)}".encode()).hexdigest()
    name = f"_ddtree_bench_sglang_source_{key[:16]}"  # the same file, unchanged, is loaded once
    if sys.modules.get(name) is not None:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"sglang source {path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001 - any failure of the user's file is bad input
        del sys.modules[name]
        message = " ".join(str(error).split()) or type(error).__name__
        raise ValueError(
            f"sglang source {path}: loading it failed: {type(error).__name__}: {message}"
        ) from None
    return module


def _takes_workspace(function) -> bool:
    try:
        return "workspace" in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def _as_numpy(value) -> np.ndarray:
    """A CPU numpy view of a torch tensor (or anything array-like)."""
    for method in ("detach", "cpu"):
        if hasattr(value, method):
            value = getattr(value, method)()
    if hasattr(value, "numpy"):
        return np.asarray(value.numpy())
    return np.asarray(value)


class SGLangBuilder(Builder):
    name = "sglang"
    label = "SGLang build_ddtree_tree_from_topk (Python heapq)"
    device = "cpu"

    def __init__(
        self,
        module_paths: list[str] | tuple[str, ...] | str | None = None,
        source: str | Path | None = None,
    ):
        if isinstance(module_paths, str):
            module_paths = [module_paths]
        given = [str(p) for p in (module_paths or [])]
        self.module_paths: tuple[str, ...] = tuple(dict.fromkeys([*given, *KNOWN_MODULE_PATHS]))
        self._function = None
        self._pad_function = None
        self._workspace = None
        self._source_info: dict | None = None
        self._module_path: str | None = None
        self._torch = None
        self._reason: str | None = None
        self._resolved = False
        self.source: Path | None = None
        if source is not None and str(source) != "":
            # asked for explicitly: every problem is bad input now, never a quiet "unavailable"
            self.source = check_source(source)
            self._resolve()

    def _adopt(self, module, function, where: str, kind: str) -> None:
        """Take ``function`` (from ``module``, found at ``where``), its pad function and, where the function
        takes one, a workspace made once; record where it came from."""
        self._function = function
        pad = getattr(module, PAD_FUNCTION_NAME, None)
        self._pad_function = pad if callable(pad) else None
        workspace_class = getattr(module, WORKSPACE_CLASS_NAME, None)
        if callable(workspace_class) and _takes_workspace(function):
            self._workspace = workspace_class()
        file = getattr(module, "__file__", None)
        info = {"kind": kind, "source": where, "file": file, "sha256": None, "git_commit": None}
        info["git_modified"] = None
        if file and Path(file).is_file():
            info["sha256"] = file_sha256(file)
            info.update(git_provenance(file))
        info["workspace"] = self._workspace is not None
        self._source_info = info

    def _resolve_source(self) -> None:
        path = self.source
        try:
            self._torch = importlib.import_module("torch")
        except Exception as error:  # noqa: BLE001
            message = " ".join(str(error).split())
            raise ValueError(
                f"sglang source {path}: torch fails to import: {type(error).__name__}: {message}"
            ) from None
        module = load_source(path)
        function = getattr(module, FUNCTION_NAME, None)
        if not callable(function):
            raise ValueError(f"sglang source {path}: defines no {FUNCTION_NAME}")
        self._adopt(module, function, str(path), "file")
        self._module_path = None

    def _resolve(self) -> None:
        if self._resolved:
            return
        self._resolved = True
        if self.source is not None:
            self._resolve_source()
            return
        has_torch = _module_present("torch")
        version = sglang_version()
        if not has_torch and version is None:
            self._reason = "neither torch nor sglang is installed (install the extra: pip install .[sglang])"
            return
        if not has_torch:
            self._reason = f"sglang {version} is installed but torch is not (pip install .[sglang])"
            return
        if version is None:
            self._reason = "sglang is not installed (install the extra: pip install .[sglang])"
            return
        try:
            self._torch = importlib.import_module("torch")
        except Exception as error:  # noqa: BLE001 - report any import failure as the reason
            self._reason = f"torch is installed but fails to import: {type(error).__name__}: {error}"
            return
        tried = []
        for path in self.module_paths:
            try:
                module = importlib.import_module(path)
            except ModuleNotFoundError as error:
                missing = error.name or path
                tried.append(f"{path} (no module {missing})" if missing != path else f"{path} (absent)")
                continue
            except Exception as error:  # noqa: BLE001
                tried.append(f"{path} (import failed: {type(error).__name__}: {error})")
                continue
            function = getattr(module, FUNCTION_NAME, None)
            if not callable(function):
                tried.append(f"{path} (no {FUNCTION_NAME})")
                continue
            self._adopt(module, function, path, "module")
            self._module_path = path
            return
        self._reason = (
            f"sglang {version} is installed but has no DDTree {FUNCTION_NAME}; tried: " + "; ".join(tried)
        )

    def unavailable_reason(self) -> str | None:
        self._resolve()
        return self._reason

    @property
    def module_path(self) -> str | None:
        """The module the function was found in (``None`` when unavailable)."""
        self._resolve()
        return self._module_path

    @property
    def function(self):
        """SGLang's ``build_ddtree_tree_from_topk`` as found (``None`` when unavailable)."""
        self._resolve()
        return self._function

    @property
    def pad_function(self):
        """``pad_ddtree_build_outputs`` from the same module (``None`` where it has none)."""
        self._resolve()
        return self._pad_function

    @property
    def workspace(self):
        """The one ``DFlashDDTreeBuildWorkspace`` passed to every call (``None``: the function takes none)."""
        self._resolve()
        return self._workspace

    @property
    def source_info(self) -> dict | None:
        """Where the function came from: ``kind`` ("module" or "file"), ``source`` (the module path or the
        file given), ``file``, its ``sha256``, ``git_commit`` and ``git_modified`` (the git work tree that
        tracks the file, else None) and ``workspace`` (whether one is passed); ``None`` when unavailable."""
        self._resolve()
        return None if self._source_info is None else dict(self._source_info)

    def build(self, top_log_probs, top_token_ids, budget) -> TreeBatch:
        budget = self.check(top_log_probs, top_token_ids, budget)
        self._resolve()
        if self._function is None:
            raise BuilderUnavailable(self._reason)
        torch, function = self._torch, self._function
        lp = torch.from_numpy(np.ascontiguousarray(top_log_probs))
        ids = torch.from_numpy(np.ascontiguousarray(top_token_ids))
        out = TreeBatch.empty(top_log_probs.shape[0], budget)
        extra = {} if self._workspace is None else {"workspace": self._workspace}
        for b in range(top_log_probs.shape[0]):  # the per-request loop SGLang's worker runs
            result = function(lp[b], ids[b], budget, **extra)
            normalise_into(out, b, result, budget)  # copies now: a workspace's views change next call
        return out

    def info(self) -> dict:
        info = super().info()
        self._resolve()
        if self.source is None:
            info["sglang"] = sglang_version()
        else:  # loaded by path: an installed sglang's version from its metadata, never by importing it
            try:
                info["sglang"] = importlib.metadata.version("sglang")
            except importlib.metadata.PackageNotFoundError:
                info["sglang"] = None
        info["module"] = self._module_path
        info["module_paths"] = list(self.module_paths)
        if self._source_info is not None:
            info["source"] = dict(self._source_info)
        if self._torch is not None:
            info["torch"] = str(getattr(self._torch, "__version__", "unknown"))
        if self._reason is not None:
            info["unavailable"] = self._reason
        return info


def normalise_into(out: TreeBatch, b: int, result, budget: int) -> None:
    """Copy one request's unpadded SGLang outputs into row ``b`` of the padded batch ``out`` (which holds
    padding already), checking that the shapes agree with each other and with the budget."""
    try:
        node_token_ids, node_depths, parents, _child_maps, visibility, next_token, next_sibling = result
    except (TypeError, ValueError):
        raise RuntimeError(
            f"{FUNCTION_NAME} returned {type(result).__name__}, expected the 7-tuple "
            "(node_token_ids, node_depths, parents, child_maps, visibility, retrieve_next_token, "
            "retrieve_next_sibling)"
        ) from None
    tokens = _as_numpy(node_token_ids).reshape(-1)
    depths = _as_numpy(node_depths).reshape(-1)
    parents = _as_numpy(parents).reshape(-1)
    visibility = _as_numpy(visibility)
    next_token = _as_numpy(next_token).reshape(-1)
    next_sibling = _as_numpy(next_sibling).reshape(-1)
    n = tokens.shape[0]
    shapes = {
        "node_depths": (depths.shape, (n,)),
        "parents": (parents.shape, (n + 1,)),
        "visibility": (visibility.shape, (n + 1, n + 1)),
        "retrieve_next_token": (next_token.shape, (n + 1,)),
        "retrieve_next_sibling": (next_sibling.shape, (n + 1,)),
    }
    if n > budget:
        raise RuntimeError(f"{FUNCTION_NAME} returned {n} nodes for request {b}, over the budget {budget}")
    for field, (got, want) in shapes.items():
        if tuple(got) != want:
            raise RuntimeError(f"{FUNCTION_NAME}: request {b} has {n} nodes but {field} has shape {got}")
    out.node_count[b] = n
    out.node_token_ids[b, :n] = tokens
    out.node_depths[b, :n] = depths
    out.parents[b, : n + 1] = parents
    out.visibility[b, : n + 1, : n + 1] = visibility
    out.retrieve_next_token[b, : n + 1] = next_token
    out.retrieve_next_sibling[b, : n + 1] = next_sibling
