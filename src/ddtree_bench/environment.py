"""What a benchmark row records about the machine it ran on, and the default machine label.

Everything here is cheap (no GPU context is created, no optional library is imported): versions come from
the installed distributions' metadata and the GPU from ``nvidia-smi`` when it is on ``PATH``.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from importlib import metadata as _metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

#: The clock every CPU timing uses, as recorded in the ``clock`` column.
CLOCK = "time.perf_counter_ns"

#: Distributions whose versions every row records (``None`` where not installed).
LIBRARIES = {"numpy": "numpy", "cupy": None, "torch": "torch", "sglang": "sglang"}
CUPY_DISTRIBUTIONS = ("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy")


def _version(distribution: str) -> str | None:
    try:
        return _metadata.version(distribution)
    except _metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str | None]:
    """Installed versions of numpy, cupy, torch and sglang (``None`` where absent), without importing them."""
    versions = {}
    for key, distribution in LIBRARIES.items():
        if key == "cupy":
            versions[key] = next((v for d in CUPY_DISTRIBUTIONS if (v := _version(d))), None)
        else:
            versions[key] = _version(distribution)
    return versions


def cpu_model() -> str:
    """The CPU model name (``/proc/cpuinfo`` on Linux, else ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _nvidia_smi(query: str, fmt: str) -> str | None:
    """The first line ``nvidia-smi --query-gpu=QUERY --format=FMT`` prints (the first GPU's), stripped; None
    where there is no ``nvidia-smi``, it fails or prints nothing."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        result = subprocess.run(
            [smi, f"--query-gpu={query}", f"--format={fmt}"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return lines[0] if result.returncode == 0 and lines else None


@functools.lru_cache(maxsize=1)
def gpu_info() -> tuple[str | None, str | None]:
    """``(gpu name, driver version)`` of the first GPU ``nvidia-smi`` lists, or ``(None, None)``."""
    line = _nvidia_smi("name,driver_version", "csv,noheader")
    if line is None:
        return None, None
    name, _, driver = line.partition(",")
    return name.strip() or None, driver.strip() or None


@functools.lru_cache(maxsize=1)
def gpu_memory_bytes() -> int | None:
    """The first GPU's memory in bytes as ``nvidia-smi`` lists it (None: no GPU, or it does not say)."""
    line = _nvidia_smi("memory.total", "csv,noheader,nounits")
    try:
        mib = float(line) if line is not None else None
    except ValueError:
        return None
    return int(mib * (1 << 20)) if mib and mib > 0 else None


#: Set to the commit a run's code is, where the tree's own git metadata cannot say it (a copy of a checkout
#: without its ``.git``, or with a stale one): every record's ``git_commit`` is then this value, verbatim.
GIT_COMMIT_ENV = "DDTREE_BENCH_GIT_COMMIT"


def git_commit(root: Path = REPO_ROOT) -> str | None:
    """The checkout's commit (with ``-dirty`` when tracked files are modified), or ``None`` outside git;
    ``$DDTREE_BENCH_GIT_COMMIT`` where set."""
    override = os.environ.get(GIT_COMMIT_ENV, "").strip()
    if override:
        return override
    git = shutil.which("git")
    if git is None:
        return None
    try:
        head = subprocess.run(
            [git, "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            [git, "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = head.stdout.strip()
    return commit + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def clock_description() -> str:
    """``time.perf_counter_ns`` and what it is on this OS (implementation, resolution)."""
    info = time.get_clock_info("perf_counter")
    return f"{CLOCK} ({info.implementation}, resolution {info.resolution:g} s, monotonic)"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


GPU_SHORT_NAMES = (
    ("h200", "h200"),
    ("h100", "h100"),
    ("b200", "b200"),
    ("gb200", "gb200"),
    ("a100", "a100"),
    ("l40s", "l40s"),
    ("rtx pro 6000", "rtxpro6000"),
)


def gpu_short_name(name: str | None) -> str:
    """``"h200"`` for "NVIDIA H200", the slug of anything else, ``"cpu"`` without a GPU."""
    if not name:
        return "cpu"
    lowered = name.lower()
    for needle, short in GPU_SHORT_NAMES:
        if needle in lowered:
            return short
    return _slug(name.replace("NVIDIA", "")) or "gpu"


def default_machine_label() -> str:
    """``<host>-<gpu>`` (e.g. ``node7-h200``; ``laptop-cpu`` without a GPU): safe as one path component."""
    host = _slug(socket.gethostname().split(".")[0]) or "host"
    return f"{host}-{gpu_short_name(gpu_info()[0])}"


def collect_environment(machine: str | None = None) -> dict:
    """The environment columns of a benchmark row (see docs/CONTRACTS.md)."""
    gpu_name, gpu_driver = gpu_info()
    return {
        "machine": machine or default_machine_label(),
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": cpu_count(),
        "gpu_name": gpu_name,
        "gpu_driver": gpu_driver,
        "python": platform.python_version(),
        **library_versions(),
        "git_commit": git_commit(),
        "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "clock": clock_description(),
        "platform": platform.platform(),
        "executable": sys.executable,
    }


ENVIRONMENT_COLUMNS = (
    "machine",
    "hostname",
    "cpu_model",
    "cpu_count",
    "gpu_name",
    "gpu_driver",
    "python",
    "numpy",
    "cupy",
    "torch",
    "sglang",
    "git_commit",
    "timestamp",
    "clock",
)
