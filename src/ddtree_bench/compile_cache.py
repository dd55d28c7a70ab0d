"""The cache of compiled kernels (the CUDA fatbins, the native C++ library) and the one key of a build.

A build is keyed by its source (and the headers beside it), the compiler's command, the compiler's
``--version`` output and the full list of flags: a build under other flags or by another compiler is
another file, never reused. ``toolchain_key`` is the part without the source: the workflow's build rules take
it as a parameter, so Snakemake rebuilds a kernel when the compiler or a flag changes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path


def cache_dir() -> Path:
    """``$DDTREE_CACHE``, else ``~/.cache/ddtree-bench``."""
    env = os.environ.get("DDTREE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "ddtree-bench"


@cache
def compiler_version(command: tuple[str, ...]) -> str:
    """``COMMAND --version``'s output, read once per process (per command). Where it does not run, a line
    saying why: such a key matches no real build, and the build itself reports the compiler's error."""
    try:
        result = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        return f"{' '.join(command)} --version did not run: {error}"
    text = (result.stdout + result.stderr).strip()
    return text if result.returncode == 0 else f"{text}\n(exit {result.returncode})"


def toolchain_key(compiler: Sequence[str], flags: Sequence[str]) -> str:
    """The sha256 (hex) of the compiler's command, its ``--version`` output and every flag, in order."""
    compiler = tuple(str(part) for part in compiler)
    text = "\0".join([*compiler, compiler_version(compiler), *(str(flag) for flag in flags)])
    return hashlib.sha256(text.encode()).hexdigest()


def cached_path(
    source: str | Path,
    suffix: str,
    compiler: Sequence[str],
    flags: Sequence[str],
    headers: Sequence[str] = (),
) -> Path:
    """Where the build of ``source`` by ``compiler`` with ``flags`` lives in the cache: ``STEM-KEY.SUFFIX``,
    KEY from the source, the files beside it ending in one of ``headers``, and ``toolchain_key``."""
    source = Path(source)
    digest = hashlib.sha256(source.read_bytes())
    for header in sorted(p for p in source.parent.iterdir() if p.suffix in headers and p != source):
        digest.update(header.name.encode() + b"\0" + header.read_bytes())
    digest.update(toolchain_key(compiler, flags).encode())
    return cache_dir() / f"{source.stem}-{digest.hexdigest()[:16]}{suffix}"
