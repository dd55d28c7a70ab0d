"""Running the workflow in a throwaway copy: shared by the config and workflow tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SNAKEMAKE = shutil.which("snakemake", path=str(BIN)) or "snakemake"


def workdir_copy(base: Path) -> Path:
    """A copy of the workflow (Snakefile, rules, schema, config, sources) to run Snakemake in."""
    work = base / "work"
    work.mkdir()
    for name in ("Snakefile", "workflow", "config", "csrc", "kernels"):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, work / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy2(source, work / name)
    return work


def snakemake(work: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([SNAKEMAKE, *args], cwd=work, capture_output=True, text=True, timeout=timeout)
