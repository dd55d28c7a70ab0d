"""Building the host programs that run our kernels' code on the CPU (tests/host_emulator.h and the emulator
tests): one compile with a sanitizer, the fallback without one, and the pytest fixture's skip; running an
emulated tree-build launch and reading its outputs back; comparing them with the reference."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ddtree_bench.builders import get_builder
from ddtree_bench.cuda.loader import KERNEL_DIR
from ddtree_bench.native_build import compiler_unavailable_reason, find_compiler
from ddtree_bench.tree import TreeBatch, packed_visibility

SANITIZERS = {
    "address": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"],
    "thread": ["-fsanitize=thread", "-fno-omit-frame-pointer"],
}


def compile_host_program(source: str, output: Path, flags, sanitizer: str = "address") -> bool:
    """Compile the C++ ``source`` to ``output`` (headers from each kernels/ folder and tests/, pthreads,
    C++17, plus ``flags``); True when built with the sanitizer. For ``address`` a compiler without it still
    builds the program (unchecked); ``thread`` never falls back."""
    main = Path(output).with_suffix(".cpp")
    main.write_text(source)
    base = [
        "-std=c++17",
        "-O1",
        "-g",
        "-pthread",
        *(f"-I{folder}" for folder in sorted(KERNEL_DIR.iterdir()) if folder.is_dir()),
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
    reason = compiler_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    output = tmp_path_factory.mktemp(name) / name
    sanitized = compile_host_program(source, output, flags, sanitizer)
    return SimpleNamespace(path=output, sanitized=sanitized)


def one_cpu() -> None:
    """Keep the calling process on one CPU: pytest-xdist's worker n on the n-th CPU it may use. An emulated
    block's host threads (up to 1024) all wake at every barrier; on one CPU that costs the kernel less than
    across CPUs, and two workers' emulators keep off each other's CPU."""
    if not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    os.sched_setaffinity(0, {cpus[int(worker) % len(cpus) if worker.isdigit() else 0]})


def run_tree_emulator(emulator, data: Path, out: Path, batch: int, budget: int, with_bool: bool):
    """Run an emulated tree-build launch (input file ``data``, outputs to ``out``, in the order of the
    kernels' parameter list; on one CPU, ``one_cpu``) and read back ``(TreeBatch, packed bits, path
    codes)``."""
    proc = subprocess.run(
        [str(emulator.path), str(data), str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        preexec_fn=one_cpu,
    )
    assert proc.returncode == 0, f"emulator exit {proc.returncode}: {proc.stderr[-3000:]}"
    n1 = budget + 1
    words = (n1 + 31) // 32
    raw = out.read_bytes()
    fields = [
        ("node_count", np.int32, (batch,)),
        ("node_token_ids", np.int64, (batch, budget)),
        ("node_depths", np.int64, (batch, budget)),
        ("parents", np.int32, (batch, n1)),
        ("bits", np.uint32, (batch, n1, words)),
        ("retrieve_next_token", np.int64, (batch, n1)),
        ("retrieve_next_sibling", np.int64, (batch, n1)),
        ("stats", np.int32, (batch,)),
    ]
    if with_bool:
        fields.append(("visibility", np.bool_, (batch, n1, n1)))
    got, at = {}, 0
    for name, dtype, shape in fields:
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        array = np.frombuffer(raw, np.uint8, size, at)
        if name == "visibility":
            assert set(np.unique(array).tolist()) <= {0, 1}, "bool mask bytes other than 0 and 1 (unwritten?)"
        got[name] = array.view(dtype).reshape(shape)
        at += size
    assert at == len(raw)
    bits, stats = got.pop("bits"), got.pop("stats")
    if not with_bool:
        got["visibility"] = np.zeros((batch, n1, n1), np.bool_)
    return TreeBatch(**got), bits, stats


def assert_trees_equal_reference(trees, bits, lp, ids, budget: int, with_bool: bool):
    """Every output of an emulated launch equals the reference builder's on the same inputs (the bool mask
    where it was written), and the packed bits are the reference's mask packed."""
    want = get_builder("reference").build(lp, ids, budget)
    fields = ["node_count", "node_token_ids", "node_depths", "parents", "retrieve_next_token"]
    fields += ["retrieve_next_sibling"] + (["visibility"] if with_bool else [])
    for name in fields:
        g, w = getattr(trees, name), getattr(want, name)
        if not np.array_equal(g, w):
            at = tuple(int(i) for i in np.argwhere(g != w)[0])
            raise AssertionError(f"{name} differs at {at}: got {g[at]}, expected {w[at]}")
    np.testing.assert_array_equal(bits, packed_visibility(want.visibility))
