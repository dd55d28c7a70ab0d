"""Building the ``native`` C++ tree builder (``kernels/native/tree_build_cpu.cpp``) into a shared library.

The flags are portable and keep floating point exact: no ``-march=native`` (results must not depend on the
machine that built them), no ``-ffast-math``, and ``-ffp-contract=off`` so that the sibling score
``logw - a + b`` is never contracted into a fused multiply-add. The compiler is ``$CXX`` (may hold
arguments, e.g. ``"ccache g++"``), else the first of ``c++``, ``g++``, ``clang++`` on ``PATH``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from ddtree_bench.compile_cache import cached_path, toolchain_key
from ddtree_bench.io import atomic_output
from ddtree_bench.paths import NATIVE_SOURCE

CXX_FLAGS = ("-O3", "-fPIC", "-shared", "-std=c++17", "-pthread", "-ffp-contract=off", "-fno-fast-math")
DEFAULT_SOURCE = Path(__file__).resolve().parents[2] / NATIVE_SOURCE


def find_compiler() -> list[str] | None:
    """The C++ compiler command (``$CXX`` split like a shell would, else c++/g++/clang++), or ``None``."""
    env = os.environ.get("CXX", "").strip()
    if env:
        command = shlex.split(env)
        return command if shutil.which(command[0]) else None
    for name in ("c++", "g++", "clang++"):
        path = shutil.which(name)
        if path:
            return [path]
    return None


def compiler_unavailable_reason() -> str | None:
    if find_compiler() is not None:
        return None
    env = os.environ.get("CXX", "").strip()
    if env:
        return f"the C++ compiler $CXX={env!r} is not on PATH"
    return "no C++ compiler found (set $CXX, or install c++/g++/clang++)"


def build_native_library(source: Path, output: Path) -> None:
    """Compile ``source`` into the shared library ``output``, atomically (a temporary file in the same
    directory, renamed into place, so a reader never sees a half-written library). Raises
    ``RuntimeError`` with the compiler's message when there is no compiler or compilation fails."""
    source, output = Path(source), Path(output)
    compiler = find_compiler()
    if compiler is None:
        raise RuntimeError(compiler_unavailable_reason())
    if not source.is_file():
        raise RuntimeError(f"C++ source not found: {source}")
    with atomic_output(output) as tmp:
        command = [*compiler, *CXX_FLAGS, "-o", str(tmp), str(source)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            message = (result.stderr or result.stdout).strip()
            raise RuntimeError(
                f"compiling {source} failed (exit {result.returncode}): {shlex.join(command)}\n{message}"
            )
        os.chmod(tmp, 0o755)


def toolchain() -> str:
    """``compile_cache.toolchain_key`` of the library's build here: the compiler, its version, every flag."""
    return toolchain_key(find_compiler() or ["?"], CXX_FLAGS)


def cached_library_path(source: Path = DEFAULT_SOURCE) -> Path:
    """Where the cached build of ``source`` lives (``compile_cache.cached_path``): keyed by the source text,
    the compiler command, its ``--version`` output and the flags, so an edit, another compiler or another
    version of it gives another file."""
    return cached_path(source, ".so", find_compiler() or ["?"], CXX_FLAGS)


def cached_native_library(source: Path = DEFAULT_SOURCE) -> Path:
    """A built library for ``source`` (default: the package's ``kernels/native/tree_build_cpu.cpp``),
    compiled into the cache on first use and reused after."""
    source = Path(source)
    if not source.is_file():
        raise RuntimeError(f"C++ source not found: {source}")
    output = cached_library_path(source)
    if not output.is_file():
        build_native_library(source, output)
    return output
