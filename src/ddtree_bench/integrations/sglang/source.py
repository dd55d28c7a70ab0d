"""SGLang's ``build_ddtree_tree_from_topk``: found in an installed ``sglang`` (``find_function``) or loaded by
path from a checkout or its file (``load_function``), with where it came from (``Found.provenance``).

An installed module is imported by its dotted path, from the ``module_paths`` given and then the known ones
(``KNOWN_MODULE_PATHS``), in order; where none has the function, ``SglangUnavailable`` says what each try
found. A ``source`` path (an SGLang checkout, its ``python/`` folder, or the ``.py`` file) is loaded under a
private module name, never through ``import sglang`` (the package's ``__init__`` pulls in much more); only
torch is needed. A source that does not exist, a file without the function, torch missing or the file failing
to execute are ``ValueError`` (one line): the user asked for that file.
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
import types
from dataclasses import dataclass
from pathlib import Path

from ddtree_bench.integrations.sglang.errors import SglangUnavailable

KNOWN_MODULE_PATHS = (
    "sglang.srt.speculative.dflash_ddtree_utils",
    "sglang.srt.speculative.ddtree_utils",
)
FUNCTION_NAME = "build_ddtree_tree_from_topk"
PAD_FUNCTION_NAME = "pad_ddtree_build_outputs"
WORKSPACE_CLASS_NAME = "DFlashDDTreeBuildWorkspace"
#: Where the DDTree file lies inside an SGLang checkout (its root), in the order tried.
KNOWN_FILE_PATHS = tuple("python/" + path.replace(".", "/") + ".py" for path in KNOWN_MODULE_PATHS)
INSTALL_HINT = "pip install .[sglang]"


def module_present(name: str) -> bool:
    """Whether ``name`` is imported or importable here (found, not imported)."""
    if sys.modules.get(name) is not None:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def torch_present() -> bool:
    """Whether torch can be imported here (without importing it)."""
    return module_present("torch")


def installed_version() -> str | None:
    """The installed sglang distribution's version from its metadata (nothing imported), or ``None``."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def sglang_version() -> str | None:
    """The installed SGLang's version (its metadata, else its ``__version__``), or ``None`` when it is not
    installed."""
    version = installed_version()
    if version is not None:
        return version
    if not module_present("sglang"):
        return None
    try:
        module = importlib.import_module("sglang")
    except Exception:  # noqa: BLE001 - a broken install still has "some" version
        return "unknown"
    return str(getattr(module, "__version__", "unknown"))


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
    if not torch_present():
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


def load_source(path: Path) -> types.ModuleType:
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


@dataclass(frozen=True)
class Found:
    """SGLang's function as found: ``torch`` (imported), its ``module``, the ``function``, ``kind``
    ("module" or "file") and ``source`` (the module path, or the file given)."""

    torch: types.ModuleType
    module: types.ModuleType
    function: object
    kind: str
    source: str

    @property
    def pad_function(self):
        """``pad_ddtree_build_outputs`` from the same module (``None`` where it has none)."""
        pad = getattr(self.module, PAD_FUNCTION_NAME, None)
        return pad if callable(pad) else None

    def make_workspace(self):
        """A ``DFlashDDTreeBuildWorkspace`` where the module defines one and the function takes
        ``workspace=`` (newer states of the DDTree branch), else ``None``."""
        workspace_class = getattr(self.module, WORKSPACE_CLASS_NAME, None)
        if callable(workspace_class) and _takes_workspace(self.function):
            return workspace_class()
        return None

    def provenance(self) -> dict:
        """``kind``, ``source``, ``file``, its ``sha256``, and ``git_commit`` / ``git_modified`` of the git
        work tree that tracks the file (else None)."""
        file = getattr(self.module, "__file__", None)
        info = {"kind": self.kind, "source": self.source, "file": file, "sha256": None}
        info.update(git_commit=None, git_modified=None)
        if file and Path(file).is_file():
            info["sha256"] = file_sha256(file)
            info.update(git_provenance(file))
        return info


def load_function(path: Path) -> Found:
    """The function from the file ``path`` (``check_source``'s result), loaded by path; ``ValueError`` (one
    line) where torch fails to import, the file fails to execute or it defines no function."""
    try:
        torch = importlib.import_module("torch")
    except Exception as error:  # noqa: BLE001
        message = " ".join(str(error).split())
        raise ValueError(
            f"sglang source {path}: torch fails to import: {type(error).__name__}: {message}"
        ) from None
    module = load_source(path)
    function = getattr(module, FUNCTION_NAME, None)
    if not callable(function):
        raise ValueError(f"sglang source {path}: defines no {FUNCTION_NAME}")
    return Found(torch, module, function, "file", str(path))


def _import_torch():
    """torch imported, or ``SglangUnavailable`` saying what of torch and sglang is missing."""
    has_torch = module_present("torch")
    version = sglang_version()
    if not has_torch and version is None:
        raise SglangUnavailable(f"neither torch nor sglang is installed (install the extra: {INSTALL_HINT})")
    if not has_torch:
        raise SglangUnavailable(f"sglang {version} is installed but torch is not ({INSTALL_HINT})")
    if version is None:
        raise SglangUnavailable(f"sglang is not installed (install the extra: {INSTALL_HINT})")
    try:
        return importlib.import_module("torch"), version
    except Exception as error:  # noqa: BLE001 - report any import failure as the reason
        raise SglangUnavailable(
            f"torch is installed but fails to import: {type(error).__name__}: {error}"
        ) from error


def find_function(module_paths) -> Found:
    """The function from the first of ``module_paths`` (dotted) that imports and defines it;
    ``SglangUnavailable`` (one line) naming what is missing or what each path gave."""
    torch, version = _import_torch()
    tried = []
    for path in module_paths:
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
        return Found(torch, module, function, "module", path)
    raise SglangUnavailable(
        f"sglang {version} is installed but has no DDTree {FUNCTION_NAME}; tried: " + "; ".join(tried)
    )
