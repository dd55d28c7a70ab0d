"""An interrupted run: ``ddtree-bench workflow`` stops Snakemake and its jobs on SIGINT and SIGTERM (real
signals to a real Snakemake run of a tiny workflow), says so in one line, exits 130 or 143, leaves no process
behind, and the same command then completes with no extra flag (no --rerun-incomplete, no --unlock)."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from workflow_copy import ROOT, needs_snakemake

from ddtree_bench.supervise import Outcome, clear_leftovers, directory_argument, living

#: Three jobs on two cores: two run when the signal comes, one waits.
SNAKEFILE = """
rule all:
    input:
        expand("out/{i}.txt", i=range(3)),


rule one:
    output:
        "out/{i}.txt",
    script:
        "job.py"
"""
#: A job records its pid, then sleeps (JOB_SLEEP) and writes its output; with JOB_IGNORE_TERM it ignores
#: SIGTERM (the wrapper must then kill it after its bound).
JOB = """
import os, pathlib, signal, time
if os.environ.get("JOB_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path("pids").mkdir(exist_ok=True)
pathlib.Path("pids", str(os.getpid())).write_text("")
time.sleep(float(os.environ.get("JOB_SLEEP", "60")))
pathlib.Path(snakemake.output[0]).write_text("done")
"""


def tiny_workflow(base: Path) -> Path:
    work = base / "tiny"
    work.mkdir()
    (work / "Snakefile").write_text(SNAKEFILE)
    (work / "job.py").write_text(JOB)
    return work


def environment(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    return {**env, **extra}


def start(work: Path, **extra) -> subprocess.Popen:
    command = [sys.executable, "-m", "ddtree_bench.cli", "workflow", "--cores", "2", "--logger", "ddtree"]
    return subprocess.Popen(
        command, cwd=work, env=environment(**extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for_jobs(work: Path, process: subprocess.Popen, count: int = 2, timeout: float = 60) -> list[int]:
    """The pids of the first ``count`` jobs, once they run."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        pids = [int(p.name) for p in (work / "pids").iterdir()] if (work / "pids").is_dir() else []
        if len(pids) >= count:
            return pids
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    raise AssertionError("the jobs did not start")


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"  # a zombie waits for its parent (init) only


def interrupted(work: Path, signum: int, **extra) -> tuple[subprocess.CompletedProcess, list[int]]:
    """A run of the tiny workflow, sent ``signum`` once its jobs run; the result and the jobs' pids."""
    process = start(work, **extra)
    pids = wait_for_jobs(work, process)
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), pids


def assert_clean_end(work: Path, result, pids, code: int, name: str) -> None:
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(f"ddtree-bench: interrupted ({name}): Snakemake and its jobs "), result.stderr
    assert lines[-1].endswith("the same command goes on from here")
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr
    assert all(gone(pid) for pid in pids)  # no job of the run is left
    assert not list((work / ".snakemake" / "locks").glob("*.lock"))
    assert not [p for p in (work / ".snakemake" / "incomplete").rglob("*") if p.is_file()]


def rerun_completes(work: Path) -> None:
    """The same command, with nothing added, makes every output."""
    process = start(work, JOB_SLEEP="0")
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert sorted(p.name for p in (work / "out").iterdir()) == ["0.txt", "1.txt", "2.txt"]


@needs_snakemake
def test_ctrl_c_stops_the_run_in_one_line_and_the_same_command_goes_on(tmp_path):
    work = tiny_workflow(tmp_path)
    result, pids = interrupted(work, signal.SIGINT)
    assert_clean_end(work, result, pids, 130, "SIGINT")
    assert "stopped" in result.stderr.strip().splitlines()[-1]  # Snakemake's own shutdown, within the bound
    assert not (work / "out").exists() or not list((work / "out").iterdir())
    rerun_completes(work)


@needs_snakemake
def test_sigterm_kills_jobs_that_ignore_it_after_the_bound_and_clears_their_markers(tmp_path):
    """A batch scheduler's SIGTERM: the wrapper forwards it; a job that ignores it keeps Snakemake waiting, so
    after the bound (here 1 s) both are killed, and the killed jobs' incomplete markers and the lock, which
    Snakemake had no time to clear, are cleared by the wrapper, which says so."""
    work = tiny_workflow(tmp_path)
    result, pids = interrupted(work, signal.SIGTERM, JOB_IGNORE_TERM="1", DDTREE_BENCH_SHUTDOWN_SECONDS="1")
    assert_clean_end(work, result, pids, 143, "SIGTERM")
    line = result.stderr.strip().splitlines()[-1]
    assert "killed; cleared the 2 killed jobs' incomplete outputs (out/0.txt, out/1.txt)" in line, line
    rerun_completes(work)


# ----------------------------------------------------------------------------------------- the pieces


def test_only_this_runs_markers_and_locks_are_cleared(tmp_path):
    state = tmp_path / ".snakemake"
    (state / "incomplete").mkdir(parents=True)
    (state / "locks").mkdir()
    old, new = "results/old.parquet", "results/new.parquet"
    for output in (old, new):
        (tmp_path / output).parent.mkdir(exist_ok=True)
        (tmp_path / output).write_text("x")
        (state / "incomplete" / base64.urlsafe_b64encode(output.encode()).decode()).write_text("{}")
    (tmp_path / "results" / ".new.parquet.0123456789ab.tmp.parquet").write_text("half")
    (state / "locks" / "0.input.lock").write_text("x")
    before = time.time() - 3600
    os.utime(state / "incomplete" / base64.urlsafe_b64encode(old.encode()).decode(), (before, before))
    os.utime(state / "locks" / "0.input.lock", (before, before))
    (state / "locks" / "1.output.lock").write_text("y")
    cleared, unlocked = clear_leftovers(tmp_path, time.time() - 60)
    assert cleared == [new] and unlocked == 1
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["old.parquet"]  # its temp file too
    assert [p.name for p in (state / "locks").iterdir()] == ["0.input.lock"]  # an older run's: kept


def test_living_sees_a_process_group_until_it_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], process_group=0)
    try:
        assert living(child.pid) == [child.pid]
    finally:
        child.kill()
        child.wait()
    assert living(child.pid) == []


def test_the_exit_status_is_128_plus_the_signal_and_the_working_directory_is_snakemakes():
    assert Outcome(1, signum=signal.SIGINT).exit_status == 130
    assert Outcome(1, signum=signal.SIGTERM).exit_status == 143
    assert Outcome(3).exit_status == 3
    assert directory_argument(["--cores", "1", "-d", "runs/a", "--", "report"]) == "runs/a"
    assert directory_argument(["--directory=runs/b"]) == "runs/b"
    assert directory_argument(["--", "-d"]) is None
