"""CUDA side: compile the kernels to a fatbin with nvcc, find out whether a GPU is usable, and load the
fatbin with ``cupy.RawModule``.

A fatbin holds machine code (SASS) for every configured architecture plus PTX of the newest one, so a newer
GPU still runs it (the driver compiles the PTX at load). Next to each fatbin a JSON file records what it
holds; ``load_kernels`` reports which of it runs on the current device.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ddtree_bench.compile_cache import cached_path, compiler_version, toolchain_key
from ddtree_bench.io import atomic_output

REPO_ROOT = Path(__file__).resolve().parents[3]
KERNEL_DIR = REPO_ROOT / "kernels"


def kernel_source(name: str) -> Path:
    """The CUDA source of kernel ``name``: ``kernels/NAME/NAME.cu`` (its headers beside it)."""
    return KERNEL_DIR / name / f"{name}.cu"


def kernel_constant(source: Path, name: str) -> int:
    """The integer a kernel's source ``#define``s as ``name``: a kernel's own launch or shared-memory figure,
    read from the kernel rather than copied into Python (ValueError where the source does not define it)."""
    text = Path(source).read_text()
    match = re.search(rf"^[ \t]*#define[ \t]+{re.escape(name)}[ \t]+(\d+)(?:[uU]?[lL]{{0,2}})\b", text, re.M)
    if match is None:
        raise ValueError(f"{source} does not #define {name} as an integer")
    return int(match.group(1))


TREE_BUILD_SOURCE = kernel_source("tree_build")
BENCH_UTIL_SOURCE = kernel_source("bench_util")
DEFAULT_ARCHS = ("sm_90", "sm_120")
NVCC_FLAGS = ("-O3", "-std=c++17", "--fmad=false", "-lineinfo")
# Sources with a path for arch-specific features (wgmma on sm_90a): their sm_90 machine code is built as
# sm_90a, which runs on exactly the GPUs sm_90 code runs on (compute capability 9.0).
ARCH_SPECIFIC_SOURCES = frozenset({"verify_attn.cu"})
ARCH_SPECIFIC = {90: "90a"}


def _arch_number(arch: str) -> int:
    match = re.fullmatch(r"(?:sm|compute)_(\d+)[a-z]?", arch)
    if not match:
        raise ValueError(f"unknown CUDA architecture {arch!r}; expected e.g. sm_90 or sm_120")
    return int(match.group(1))


def find_nvcc() -> str | None:
    for candidate in (
        os.environ.get("NVCC"),
        shutil.which("nvcc"),
        "/usr/local/cuda/bin/nvcc",
        "/usr/local/bin/nvcc",
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def gencode_flags(archs, ptx: bool = True, arch_specific: bool = False) -> list[str]:
    """``-gencode`` flags: SASS for every ``sm_XX`` plus PTX of the newest (when ``ptx``); with
    ``arch_specific``, sm_90 is built as sm_90a (``ARCH_SPECIFIC``)."""
    archs = list(archs)
    if not archs:
        raise ValueError("cuda_archs must name at least one architecture")
    numbers = sorted({_arch_number(a) for a in archs})
    flags = []
    for arch in archs:
        suffix = re.fullmatch(r"(?:sm|compute)_(\d+[a-z]?)", arch).group(1)
        if arch_specific:
            suffix = ARCH_SPECIFIC.get(_arch_number(arch), suffix)
        flags.append(f"-gencode=arch=compute_{suffix},code=sm_{suffix}")
    if ptx:
        flags.append(f"-gencode=arch=compute_{numbers[-1]},code=compute_{numbers[-1]}")
    return flags


def nvcc_flags(source: Path, archs=DEFAULT_ARCHS, ptx: bool = True) -> list[str]:
    """Every flag nvcc gets to compile ``source`` to a fatbin: ``NVCC_FLAGS``, then the ``-gencode`` ones."""
    return [*NVCC_FLAGS, "-fatbin", *gencode_flags(archs, ptx, Path(source).name in ARCH_SPECIFIC_SOURCES)]


def fatbin_toolchain(source: Path, archs=DEFAULT_ARCHS, ptx: bool = True) -> str:
    """``compile_cache.toolchain_key`` of a fatbin build of ``source`` here: nvcc, its version, every flag."""
    return toolchain_key([find_nvcc() or "nvcc"], nvcc_flags(source, archs, ptx))


def build_fatbin(source: Path, output: Path, archs=DEFAULT_ARCHS, ptx: bool = True, defines=()) -> dict:
    """Compile ``source`` to ``output`` (a fatbin) atomically; writes ``output + '.json'`` describing it.
    ``defines``: ``NAME=VALUE`` macros for a variant build (measurements; never cached). Raises RuntimeError
    with nvcc's message when the compile fails."""
    source, output = Path(source), Path(output)
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found (set $NVCC or put CUDA's bin directory on PATH)")
    flags = [*nvcc_flags(source, archs, ptx), *(f"-D{d}" for d in defines)]
    with atomic_output(output) as tmp_out:
        cmd = [nvcc, *flags, "-o", str(tmp_out), str(source)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed on {source}:\n{proc.stderr.strip()}")
        version = compiler_version((nvcc,))
        info = {
            "source": str(source),
            "source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
            "archs": sorted({re.search(r"code=(sm_\w+)", f).group(1) for f in flags if "code=sm_" in f}),
            "ptx": f"compute_{max(_arch_number(a) for a in archs)}" if ptx else None,
            "nvcc": version.splitlines()[-1] if version else "unknown",
            "command": " ".join(cmd[:-3] + ["-o", str(output), str(source)]),
        }
    with atomic_output(str(output) + ".json") as tmp_json:
        Path(tmp_json).write_text(json.dumps(info, indent=2) + "\n")
    return info


def cached_fatbin(source: Path = TREE_BUILD_SOURCE, archs=DEFAULT_ARCHS) -> Path:
    """A fatbin of ``source`` in the cache directory, built on first use: keyed by the source, the headers
    next to it, nvcc, its ``--version`` output and every flag (``compile_cache.cached_path``), so a fatbin
    built under other flags or by another nvcc is never reused."""
    source = Path(source)
    output = cached_path(
        source, ".fatbin", [find_nvcc() or "nvcc"], nvcc_flags(source, archs), headers=(".cuh", ".h")
    )
    if not output.exists():
        build_fatbin(source, output, archs)
    return output


@lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str | None:
    """``None`` when CuPy imports and sees a CUDA device, else why not (no GPU is not a failure)."""
    try:
        import cupy  # noqa: PLC0415
    except Exception as exc:  # ImportError, or a broken CUDA install
        return f"CuPy is not installed or does not import ({type(exc).__name__}: {exc}); pip install .[gpu]"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # cudaErrorInsufficientDriver / NoDevice on machines without a GPU
        return f"no usable CUDA device ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    if count < 1:
        return "no CUDA device found"
    return None


def fatbin_runs(fatbin: Path, cc: int) -> str:
    """Which of a fatbin's code runs on a device of compute capability ``cc`` (from its build record)."""
    meta_path = Path(str(fatbin) + ".json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    for arch in (f"sm_{cc}", f"sm_{cc}a"):
        if arch in meta.get("archs", []):
            return f"{arch} SASS"
    if meta.get("ptx"):
        return f"PTX {meta['ptx']} compiled by the driver for sm_{cc}"
    return f"unknown (no build record next to {Path(fatbin).name})"


@dataclass
class LoadedKernels:
    module: object
    build: object
    build_warp: dict  # heap slots per lane (1, 2, 4) -> the warp-heap kernel
    build_wide: object  # the wide single-tree path (any depth)
    expand_visibility: object
    empty: object
    spin: object
    flush_l2: object
    device_name: str
    compute_capability: int
    runs: str  # e.g. "sm_90 SASS" or "PTX compute_120 compiled by the driver"
    fatbin: Path
    max_shared_bytes: int
    sm_count: int
    l2_bytes: int


def load_kernels(fatbin: Path, util_fatbin: Path | None = None) -> LoadedKernels:
    """Load the tree-build fatbin (and the benchmark utilities: empty, spin and L2-flush kernels)."""
    import cupy  # noqa: PLC0415

    fatbin = Path(fatbin)
    module = cupy.RawModule(path=str(fatbin))
    util = cupy.RawModule(path=str(util_fatbin or cached_fatbin(BENCH_UTIL_SOURCE)))
    build = module.get_function("ddtree_build_tree")
    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    cc = int(props["major"]) * 10 + int(props["minor"])
    runs = fatbin_runs(fatbin, cc)
    optin = cupy.cuda.runtime.deviceGetAttribute(
        cupy.cuda.runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin, dev.id
    )
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return LoadedKernels(
        module=module,
        build=build,
        build_warp={s: module.get_function(f"ddtree_build_tree_warp{s}") for s in (1, 2, 4)},
        build_wide=module.get_function("ddtree_build_tree_wide"),
        expand_visibility=module.get_function("ddtree_expand_visibility"),
        empty=util.get_function("ddtree_empty_kernel"),
        spin=util.get_function("ddtree_spin_kernel"),
        flush_l2=util.get_function("ddtree_flush_l2"),
        device_name=name,
        compute_capability=cc,
        runs=runs,
        fatbin=fatbin,
        max_shared_bytes=int(optin),
        sm_count=int(props["multiProcessorCount"]),
        l2_bytes=int(props["l2CacheSize"]),
    )
