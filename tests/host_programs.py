"""Building the host programs that run our kernels' code on the CPU (tests/host_emulator.h and the emulator
tests): one compile with a sanitizer, the fallback without one, and the pytest fixture's skip."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddtree_bench.cuda import KERNEL_DIR

SANITIZERS = {
    "address": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"],
    "thread": ["-fsanitize=thread", "-fno-omit-frame-pointer"],
}


def compile_host_program(source: str, output: Path, flags, sanitizer: str = "address") -> bool:
    """Compile the C++ ``source`` to ``output`` (headers from kernels/ and tests/, pthreads, C++17, plus
    ``flags``); True when built with the sanitizer. For ``address`` a compiler without it still builds
    the program (unchecked); ``thread`` never falls back."""
    from ddtree_bench.native_build import find_compiler

    main = Path(output).with_suffix(".cpp")
    main.write_text(source)
    base = [
        "-std=c++17",
        "-O1",
        "-g",
        "-pthread",
        f"-I{KERNEL_DIR}",
        f"-I{Path(__file__).parent}",
        *flags,
        "-o",
        str(output),
        str(main),
    ]
    compiler = find_compiler()
    proc = subprocess.run([*compiler, *SANITIZERS[sanitizer], *base], capture_output=True, text=True)
    if proc.returncode == 0:
        return True
    if sanitizer == "thread":
        return False
    proc = subprocess.run([*compiler, *base], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return False


def host_program(tmp_path_factory, name: str, source: str, flags=(), sanitizer: str = "address"):
    """For a module-scoped fixture: the built program as ``SimpleNamespace(path, sanitized)``, or a skip
    with the reason where there is no C++ compiler."""
    from ddtree_bench.native_build import compiler_unavailable_reason

    reason = compiler_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    output = tmp_path_factory.mktemp(name) / name
    sanitized = compile_host_program(source, output, flags, sanitizer)
    return SimpleNamespace(path=output, sanitized=sanitized)
