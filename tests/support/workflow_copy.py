"""Running the workflow in a throwaway copy: shared by the config and workflow tests."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SNAKEMAKE = shutil.which("snakemake", path=str(BIN)) or "snakemake"
#: Tests that run Snakemake skip where it is not installed (a GPU machine may lack it).
needs_snakemake = pytest.mark.skipif(
    shutil.which(SNAKEMAKE) is None, reason="snakemake is not installed here (pip install -e '.[test]')"
)


def workdir_copy(base: Path) -> Path:
    """A copy of the workflow (Snakefile, rules, schema, config, sources) to run Snakemake in."""
    work = base / "work"
    work.mkdir()
    for name in ("Snakefile", "workflow", "config", "kernels"):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, work / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy2(source, work / name)
    return work


def snakemake(
    work: Path, *args: str, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SNAKEMAKE, *args], cwd=work, capture_output=True, text=True, timeout=timeout, env=env
    )


def ddtree_bench_workflow(
    work: Path, *args: str, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``ddtree-bench workflow ARGS`` in ``work``, as a user types it (the console script's entry point)."""
    return subprocess.run(
        [sys.executable, "-m", "ddtree_bench.cli", "workflow", *args],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def error_lines(stderr: str) -> list[str]:
    """The lines of a run's stderr but Snakemake's own notice that a --configfile extends the workflow's
    config file (it logs that before the Snakefile's checks run, on stderr outside a dry run)."""
    notice = re.compile(
        r"^Config file \S+ is (extended|replaced) by additional config specified via the command line\.$"
    )
    return [line for line in stderr.strip().splitlines() if not notice.match(line)]


def pretend_gpu(base: Path) -> dict:
    """An environment in which ``ddtree_bench.cuda.loader.gpu_unavailable_reason()`` says a GPU is here (a
    ``sitecustomize`` on PYTHONPATH replaces it, in Snakemake and in every job it starts): the workflow then
    plans its GPU jobs as on a GPU machine. For dry runs, and for runs whose GPU jobs' scripts are stubs."""
    folder = base / "pretend-gpu"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        "import ddtree_bench.cuda.loader\n\nddtree_bench.cuda.loader.gpu_unavailable_reason = lambda: None\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH")) if p)
    return env


def catalog_entry_environment(base: Path, entry: str, modules: dict[str, str]) -> dict:
    """The environment of a subprocess whose catalog holds one more entry: a ``sitecustomize`` running
    ``entry`` before anything else imports the catalog (as an entry in the file would be), beside the
    ``modules`` (name -> source) it names, and the checkout's src first on PYTHONPATH."""
    folder = base / "toy"
    folder.mkdir()
    for name, source in modules.items():
        (folder / f"{name}.py").write_text(source)
    (folder / "sitecustomize.py").write_text(entry)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(folder), str(ROOT / "src"), env.get("PYTHONPATH")) if p
    )
    return env
