"""SGLang's files, imported WITHOUT running ``import sglang`` (which pulls in transformers and most of
SGLang's dependencies): one import finder (``SglangFiles``) over a folder holding ``sglang/`` at its package
paths (the files extracted from the sglang wheel, a checkout's ``python/``, or an installed ``sglang``'s
parent).

Under the finder, ``sglang.*`` and ``sgl_kernel.*`` names resolve to our stand-ins first (``stubs``), then to
the files under the folder: packages are empty modules (no ``__init__.py`` runs, except the few in
``_RUN_INIT`` that only re-export their own submodules), modules are the ``.py`` files. It is used two ways:

- ``files_on_path(root)``: for one ``with`` block (SGLang's Triton attention file): ``sys.modules`` is
  restored afterwards, a real ``sglang`` imported before or after left alone;
- ``install_files(root)``: for the rest of the process (the MoE kernels: SGLang's functions import modules
  lazily at call time), one folder a process, refused where a real ``sglang`` is imported already. Where
  ``SGLANG_JIT_PREBUILT`` names a folder, SGLang's JIT modules are loaded from it (``jit.use_prebuilt``).

``load_sglang_moe`` loads the MoE impls' entry points (``fused_marlin_moe``, ``fused_experts_impl``) this way
from ``sglang_moe_root``'s folder.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from pathlib import Path

from ddtree_bench.catalog import MOE_IMPLS
from ddtree_bench.integrations.sglang import jit
from ddtree_bench.integrations.sglang.errors import SglangUnavailable, describe
from ddtree_bench.integrations.sglang.stubs import stand_ins

MARLIN, TRITON = MOE_IMPLS[:2]
#: files each SGLang MoE impl needs, relative to the folder that holds ``sglang/`` (named in reasons)
REQUIRED_FILES = {
    MARLIN: (
        "sglang/srt/layers/moe/fused_moe_triton/fused_marlin_moe.py",
        "sglang/kernels/ops/moe/moe_wna16_marlin.py",
        "sglang/kernels/jit/csrc/gemm/marlin_moe/moe_wna16_marlin.cuh",
        "sglang/kernels/ops/moe/moe_align.py",
        "sglang/kernels/jit/csrc/moe/moe_align_kernel.cu",
        "sglang/kernels/jit/utils/compile/loader.py",
    ),
    TRITON: (
        "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py",
        "sglang/kernels/ops/moe/fused_moe_triton_kernels.py",
        "sglang/srt/layers/moe/moe_runner/triton_utils/moe_align_block_size.py",
    ),
}
#: each SGLang MoE impl's entry point: (module, function)
MOE_ENTRY_POINTS = {
    MARLIN: ("sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe", "fused_marlin_moe"),
    TRITON: ("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe", "fused_experts_impl"),
}
#: SGLang's JIT Marlin repack (what the tests compare our Marlin layout against)
REPACK_MODULE = "sglang.kernels.ops.quantization.gptq_marlin_repack"
#: packages whose ``__init__.py`` does run: they only re-export their own submodules (SGLang's JIT helpers)
_RUN_INIT = frozenset({"sglang.kernels.jit.utils", "sglang.kernels.jit.utils.compile"})


def sglang_roots(source) -> list[Path]:
    """Folders that may hold the ``sglang`` package, given a user's path: the path itself, a checkout's
    ``python/``, or the parent of an ``sglang`` package folder."""
    source = Path(source)
    roots = [source, source / "python"]
    if source.name == "sglang":
        roots.append(source.parent)
    return roots


def installed_spec():
    """The installed ``sglang`` package's spec (``importlib.util.find_spec``, which does not import it), or
    None where none is installed; ``SglangUnavailable`` (one line) where looking fails."""
    try:
        spec = importlib.util.find_spec("sglang")
    except Exception as exc:
        raise SglangUnavailable(f"no usable installed sglang ({describe(exc)})") from exc
    return spec if spec is not None and spec.submodule_search_locations else None


def installed_roots(spec) -> list[Path]:
    """The folders holding the ``sglang`` package of ``spec`` (``installed_spec``)."""
    return [Path(location).parent for location in spec.submodule_search_locations]


def files_version(root: Path) -> str | None:
    """The version of the sglang distribution whose metadata sits beside ``root/sglang``, if any."""
    metas = sorted(Path(root).glob("sglang-*.dist-info"))
    if metas:
        return metas[-1].name[len("sglang-") : -len(".dist-info")]
    return None


def ours(name: str) -> bool:
    """Whether the finder serves module ``name`` (``sglang``, ``sgl_kernel`` and their submodules)."""
    return name in ("sglang", "sgl_kernel") or name.startswith(("sglang.", "sgl_kernel."))


class _EmptyPackage(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        pass


class _StubLoader(importlib.abc.Loader):
    def __init__(self, factory):
        self.factory = factory

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__doc__ = f"ddtree_bench's stand-in for {spec.name}"
        for key, value in self.factory().items():
            setattr(module, key, value)
        return module

    def exec_module(self, module):
        pass


class SglangFiles(importlib.abc.MetaPathFinder):
    """``sglang.*`` / ``sgl_kernel.*`` names: stand-ins first, then the files under ``root`` (packages as
    empty modules whose search path is their folder)."""

    def __init__(self, root: Path, stubs: dict | None = None):
        self.root = Path(root)
        self.stubs = stand_ins() if stubs is None else stubs

    def find_spec(self, fullname, path=None, target=None):
        if not ours(fullname):
            return None
        base = self.root.joinpath(*fullname.split("."))
        parent_of_stub = any(stub.startswith(fullname + ".") for stub in self.stubs)
        if fullname in self.stubs:
            package = base.is_dir() or parent_of_stub
            spec = importlib.machinery.ModuleSpec(
                fullname, _StubLoader(self.stubs[fullname]), is_package=package
            )
            if package:
                spec.submodule_search_locations = [str(base)] if base.is_dir() else []
            return spec
        if fullname in _RUN_INIT and (base / "__init__.py").is_file():
            return importlib.util.spec_from_file_location(
                fullname, base / "__init__.py", submodule_search_locations=[str(base)]
            )
        if base.is_dir() or parent_of_stub:
            # origin names the (unexecuted) __init__.py: SGLang's JIT finds its sources from it
            init = base / "__init__.py"
            origin = str(init) if init.is_file() else None
            spec = importlib.machinery.ModuleSpec(fullname, _EmptyPackage(), origin=origin, is_package=True)
            spec.submodule_search_locations = [str(base)] if base.is_dir() else []
            return spec
        if base.with_suffix(".py").is_file():
            return importlib.util.spec_from_file_location(fullname, base.with_suffix(".py"))
        raise ModuleNotFoundError(f"{fullname} is not under {self.root}", name=fullname)


@contextlib.contextmanager
def files_on_path(root: Path):
    """SGLang's files under ``root`` importable inside the block only; afterwards ``sys.modules`` holds the
    ``sglang.*`` / ``sgl_kernel.*`` modules it held before, and only those."""
    saved = {name: module for name, module in sys.modules.items() if ours(name)}
    for name in saved:
        del sys.modules[name]
    finder = SglangFiles(root)
    sys.meta_path.insert(0, finder)
    try:
        yield finder
    finally:
        sys.meta_path.remove(finder)
        for name in [name for name in sys.modules if ours(name)]:
            del sys.modules[name]
        sys.modules.update(saved)


_INSTALLED: dict = {"root": None, "finder": None, "modules": {}}


def install_files(root: Path) -> None:
    """SGLang's files under ``root`` importable for the rest of the process (module docstring);
    ``SglangUnavailable`` where another folder is installed already or a real ``sglang`` is imported."""
    if _INSTALLED["root"] is not None:
        if _INSTALLED["root"] != root:
            raise SglangUnavailable(
                f"SGLang's files from {_INSTALLED['root']} are already loaded in this process; cannot also "
                f"load {root} (one folder a process)"
            )
        if _INSTALLED["finder"] not in sys.meta_path:
            sys.meta_path.insert(0, _INSTALLED["finder"])
        return
    present = sys.modules.get("sglang")
    if present is not None:
        raise SglangUnavailable(
            "a sglang package is already imported in this process "
            f"({getattr(present, '__file__', present)}); load SGLang's MoE files in a process without it"
        )
    finder = SglangFiles(root)
    sys.meta_path.insert(0, finder)
    _INSTALLED.update(root=root, finder=finder)
    prebuilt = os.environ.get(jit.PREBUILT_ENV)
    if prebuilt:  # SGLang's JIT modules built ahead of time: loaded, never compiled here
        jit.use_prebuilt(prebuilt)


# ------------------------------------------------------------------------------------- the MoE kernels


def sglang_moe_root(sglang_files=None) -> Path:
    """The folder holding ``sglang/`` with SGLang's MoE files: ``sglang_files`` (the folder itself, a
    checkout whose ``python/`` holds it, or the ``sglang`` package folder), or when None the folder already
    installed in this process, else the installed ``sglang``'s parent. ``SglangUnavailable`` naming the path
    where the MoE files are not there."""
    needed = REQUIRED_FILES[MARLIN][0], REQUIRED_FILES[TRITON][0]
    if sglang_files is not None:
        source = Path(sglang_files).expanduser()
        for root in sglang_roots(source):
            if any((root / rel).is_file() for rel in needed):
                return root.resolve()
        raise SglangUnavailable(
            f"SGLang's MoE files not found at {source} (looked for {' or '.join(needed)} there and under "
            "its python/); extract them from the sglang 0.5.23 wheel (docs/k26_model.md)"
        )
    if _INSTALLED["finder"] is not None:
        return _INSTALLED["root"]
    spec = installed_spec()
    if spec is None:
        raise SglangUnavailable(
            "no installed sglang and no sglang_files folder given (SGLang's MoE files extracted from the "
            "sglang 0.5.23 wheel, docs/k26_model.md)"
        )
    for root in installed_roots(spec):
        if any((root / rel).is_file() for rel in needed):
            return root.resolve()
    raise SglangUnavailable(f"the installed sglang ({spec.origin}) has none of {list(needed)}")


def install_sglang_files(sglang_files=None) -> Path:
    """Put SGLang's files (``sglang_moe_root``) on this process's import path, as the MoE impls load them;
    returns their root."""
    root = sglang_moe_root(sglang_files)
    install_files(root)
    return root


def load_sglang_moe(impl: str, sglang_files=None):
    """The SGLang entry point of MoE impl ``impl`` (``MOE_ENTRY_POINTS``), loaded from ``sglang_files`` with
    the finder installed for the process. Loaded once per process. ``ValueError`` for an impl that is not
    SGLang's; ``SglangUnavailable`` (one line) where the files, a package or a stand-in are missing."""
    if impl not in MOE_ENTRY_POINTS:
        if impl in MOE_IMPLS:
            raise ValueError(f"{impl} runs PyTorch only; it loads nothing from SGLang")
        raise ValueError(f"unknown MoE impl {impl!r}; expected one of {list(MOE_IMPLS)}")
    root = sglang_moe_root(sglang_files)
    missing = [rel for rel in REQUIRED_FILES[impl] if not (root / rel).is_file()]
    if missing:
        raise SglangUnavailable(f"{impl}: SGLang's files under {root} lack {', '.join(missing)}")
    key = (str(root), impl)
    if key in _INSTALLED["modules"]:
        return _INSTALLED["modules"][key]
    install_files(root)
    name, attribute = MOE_ENTRY_POINTS[impl]
    try:
        function = getattr(importlib.import_module(name), attribute)
    except Exception as exc:
        raise SglangUnavailable(f"{impl}: {name} does not load from {root} ({describe(exc)})") from exc
    _INSTALLED["modules"][key] = function
    return function
