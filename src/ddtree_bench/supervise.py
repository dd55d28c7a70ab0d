"""Snakemake under ``ddtree-bench workflow``, stopped cleanly by an interrupt.

Snakemake runs in a process group of its own, so an interrupt (Ctrl-C, SIGTERM from a batch scheduler's time
limit or ``timeout``, SIGHUP from a closed terminal) reaches the wrapper alone, which then stops Snakemake and
its jobs itself (``run``):

1. SIGTERM to Snakemake's process group: its jobs end at once (SIGTERM's default action: no traceback), and
   Snakemake, on SIGTERM, starts no other job, records each killed job as failed (removing its outputs and
   its incomplete marker), removes its lock and exits.
2. Bounded: where Snakemake has not exited ``shutdown_seconds`` later (``SHUTDOWN_ENV``, default
   ``DEFAULT_SHUTDOWN_SECONDS``), or at a second interrupt, SIGKILL to the group.
3. Whatever is left of the group, and of the processes it started in other groups, is killed and waited for:
   no process of the run outlives the wrapper. The incomplete markers and locks this run made that Snakemake
   could not clear (``clear_leftovers``) are removed, with the killed jobs' outputs, so the same command goes
   on with no extra flag (no ``--rerun-incomplete``, no ``--unlock``).

Forwarding SIGINT instead would leave the killed jobs' incomplete markers (Snakemake keeps them on SIGINT) and
print a KeyboardInterrupt traceback per Python job. Linux (``/proc``) for the processes outside the group;
elsewhere the group alone."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

#: How long Snakemake may take to stop after the interrupt before it and its jobs are killed (seconds).
SHUTDOWN_ENV = "DDTREE_BENCH_SHUTDOWN_SECONDS"
DEFAULT_SHUTDOWN_SECONDS = 60.0
#: The interrupts the wrapper stops the run on; its exit status is 128 + the signal's number (130, 143, 129).
INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: How often the wrapper looks at Snakemake while it waits (seconds).
POLL_SECONDS = 0.1
#: How long the wrapper waits for killed processes to be gone (seconds).
REAP_SECONDS = 10.0


@dataclass
class Outcome:
    """How a supervised run ended: Snakemake's exit status, or the interrupt that stopped it and what the
    wrapper did about it."""

    returncode: int
    #: the first interrupt received (None: the run ended by itself)
    signum: int | None = None
    #: Snakemake and its jobs were killed (SIGKILL) after the bound or a second interrupt
    killed: bool = False
    #: the outputs of killed jobs whose incomplete markers the wrapper cleared (with the outputs)
    cleared: list[str] = field(default_factory=list)
    #: the locks of this run the wrapper removed (Snakemake had no time to)
    unlocked: int = 0
    #: processes of the run still there after the kill (none, unless the kernel could not end them)
    lingering: list[int] = field(default_factory=list)

    @property
    def exit_status(self) -> int:
        return 128 + self.signum if self.signum is not None else self.returncode


def shutdown_seconds() -> float:
    """``SHUTDOWN_ENV`` as a number of seconds >= 0, else ``DEFAULT_SHUTDOWN_SECONDS``."""
    try:
        value = float(os.environ.get(SHUTDOWN_ENV, DEFAULT_SHUTDOWN_SECONDS))
    except ValueError:
        return DEFAULT_SHUTDOWN_SECONDS
    return value if value >= 0 else DEFAULT_SHUTDOWN_SECONDS


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# ----------------------------------------------------------------------------------------- processes


def _stat(pid: int) -> tuple[int, int, str, int] | None:
    """``(ppid, pgid, state, start time)`` of a process from ``/proc`` (None: gone, or no ``/proc``)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return int(fields[1]), int(fields[2]), fields[0], int(fields[19])


def _processes() -> dict[int, tuple[int, int, str, int]]:
    found = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                info = _stat(int(entry.name))
                if info is not None:
                    found[int(entry.name)] = info
    return found


def descendants(pid: int) -> set[tuple[int, int]]:
    """Every living descendant of ``pid`` as ``(pid, start time)`` (the start time tells a reused pid)."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for child, (parent, *_rest) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if table[child][2] != "Z":
                found.add((child, table[child][3]))
                todo.append(child)
    return found


def living(pgid: int, tracked=()) -> list[int]:
    """The processes of group ``pgid`` and of ``tracked`` (``(pid, start time)``) that still run (zombies,
    which only wait for their parent to reap them, do not count)."""
    table = _processes()
    if not table:  # no /proc: the group as the kernel says
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    alive = {pid for pid, (_, group, state, _) in table.items() if group == pgid and state != "Z"}
    alive |= {
        pid for pid, start in tracked if pid in table and table[pid][3] == start and table[pid][2] != "Z"
    }
    return sorted(alive)


def _kill(pids, signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _killpg(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


# ----------------------------------------------------------------------------------------- the run


class _Supervisor:
    """The run's state, shared with the signal handler."""

    def __init__(self):
        self.process: subprocess.Popen | None = None
        self.signum: int | None = None
        self.interrupts = 0
        self.killed = False
        self.tracked: set[tuple[int, int]] = set()

    def handle(self, signum, _frame) -> None:
        """An interrupt: the first stops Snakemake's group (SIGTERM), a second kills it."""
        self.interrupts += 1
        if self.signum is None:
            self.signum = signum
        if self.process is not None:
            self.stop()

    def stop(self) -> None:
        if self.interrupts > 1:
            self.kill()
        else:
            _killpg(self.process.pid, signal.SIGTERM)

    def kill(self) -> None:
        self.killed = True
        _killpg(self.process.pid, signal.SIGKILL)
        _kill((pid for pid, _ in self.tracked), signal.SIGKILL)

    def wait(self, bound: float) -> int:
        """Snakemake's exit status; once interrupted, at most ``bound`` seconds before the kill."""
        deadline = None
        while True:
            try:
                return self.process.wait(timeout=POLL_SECONDS)
            except subprocess.TimeoutExpired:
                pass
            if self.signum is None:
                continue
            self.tracked |= descendants(self.process.pid)  # those outside the group too (another session)
            deadline = deadline if deadline is not None else time.monotonic() + bound
            if not self.killed and time.monotonic() >= deadline:
                self.kill()

    def reap(self) -> list[int]:
        """Kill what is left of the run and wait (``REAP_SECONDS`` at most) until it is gone."""
        pgid = self.process.pid
        end = time.monotonic() + REAP_SECONDS
        left = living(pgid, self.tracked)
        while left and time.monotonic() < end:
            self.killed = True
            _killpg(pgid, signal.SIGKILL)
            _kill(left, signal.SIGKILL)
            time.sleep(POLL_SECONDS)
            left = living(pgid, self.tracked)
        return left


def run(argv: list[str], workdir: str | Path | None = None, bound: float | None = None) -> Outcome:
    """Run ``argv`` (Snakemake and its arguments) in a process group of its own until it ends, stopping it as
    the module says on an interrupt. ``workdir``: Snakemake's working directory (its ``.snakemake/``; None:
    this one); ``bound``: seconds Snakemake has to stop (None: ``shutdown_seconds()``)."""
    bound = shutdown_seconds() if bound is None else bound
    supervisor = _Supervisor()
    previous = {signum: signal.signal(signum, supervisor.handle) for signum in INTERRUPTS}
    since = time.time()
    try:
        # its own group: a terminal's Ctrl-C reaches the wrapper alone; no stdin (a background group that
        # read the terminal would be stopped)
        supervisor.process = subprocess.Popen(argv, process_group=0, stdin=subprocess.DEVNULL)
        if supervisor.signum is not None:  # an interrupt while it started
            supervisor.stop()
        returncode = supervisor.wait(bound)
        if supervisor.signum is None:
            return Outcome(returncode)
        lingering = supervisor.reap()
        cleared, unlocked = clear_leftovers(Path(workdir or "."), since) if not lingering else ([], 0)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return Outcome(returncode, supervisor.signum, supervisor.killed, cleared, unlocked, lingering)


# ----------------------------------------------------------------------------------------- leftovers


def _marker_output(marker: Path, root: Path) -> str | None:
    """The output a Snakemake incomplete marker names (its path under ``root``: the output's path, URL-safe
    base64, split into folders named ``@<part>`` where it is longer than a file name may be)."""
    parts = marker.relative_to(root).parts
    text = "".join(part.removeprefix("@") for part in parts)
    try:
        return base64.urlsafe_b64decode(text.encode()).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def clear_leftovers(workdir: Path, since: float) -> tuple[list[str], int]:
    """After an interrupted run whose processes are all gone: the incomplete markers made since ``since``
    (``time.time()``), each with the output it names and that output's temporary files
    (``io.atomic_output``'s ``.<name>.<token>.tmp<suffix>``), and the locks made since then. Markers and locks
    from before the run are left alone. Returns the outputs cleared and the number of locks removed."""
    state = workdir / ".snakemake"
    root = state / "incomplete"
    cleared = []
    for marker in sorted(root.rglob("*")) if root.is_dir() else ():
        if not marker.is_file() or marker.stat().st_mtime < since:
            continue
        output = _marker_output(marker, root)
        if output is not None:
            target = Path(output) if Path(output).is_absolute() else workdir / output
            for path in [target, *target.parent.glob(f".{target.name}.*.tmp*")]:
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    path.unlink()
            cleared.append(output)
        marker.unlink()
    unlocked = 0
    for lock in sorted((state / "locks").glob("*.lock")) if (state / "locks").is_dir() else ():
        if lock.is_file() and lock.stat().st_mtime >= since:
            lock.unlink()
            unlocked += 1
    return cleared, unlocked


def directory_argument(args: list[str]) -> str | None:
    """Snakemake's ``-d``/``--directory`` of a command line (its working directory), or None."""
    for index, arg in enumerate(args):
        if arg == "--":
            break
        if arg in ("-d", "--directory") and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith("--directory="):
            return arg.split("=", 1)[1]
    return None
