"""A run's progress in lines a person reads: Snakemake's logger plugin ``ddtree`` (``--logger ddtree``, the
module ``snakemake_logger_plugin_ddtree``; ``make report`` and ``make smoke`` use it).

Instead of a block of lines per job it prints the jobs to run per rule once, one line when a rule's jobs are
all done, and one line at every tenth of the run with the rules still going. Errors, warnings and every
message it does not know pass through in full, as Snakemake's own logger writes them; a dry run, ``--verbose``
and ``--printshellcmds`` get Snakemake's own output whole. Snakemake's full log is still written
(``.snakemake/log/``; its path is the last line)."""

from __future__ import annotations

import logging
import re
import sys
import time

from snakemake_interface_logger_plugins.base import LogHandlerBase
from snakemake_interface_logger_plugins.common import LogEvent

#: Snakemake's scheduling chatter, left out of the compact view (information only, never a problem).
CHATTER = re.compile(
    r"^(Select jobs to execute|Execute \d+ jobs|Building DAG of jobs|Using shell:|Provided cores:|"
    r"Provided resources:|Rules claiming more threads|Conda environments: ignored|Singularity containers: "
    r"ignored|Assuming unrestricted shared filesystem|Config file .* is extended by|Elapsed time:)"
)
#: Events the compact view replaces with its own lines (or leaves out: the banner, resources, job starts).
COMPACT_EVENTS = {
    LogEvent.WORKFLOW_STARTED,
    LogEvent.RUN_INFO,
    LogEvent.JOB_INFO,
    LogEvent.JOB_STARTED,
    LogEvent.JOB_FINISHED,
    LogEvent.PROGRESS,
    LogEvent.RESOURCES_INFO,
    LogEvent.SHELLCMD,
}
#: A progress line at every this fraction of the jobs.
STEP = 0.1
#: Snakemake stopping on an interrupt (SIGTERM: ``ddtree-bench workflow`` stops it so; SIGINT).
STOPPING = re.compile(
    r"^(Will exit after finishing currently running jobs|Terminating processes on user request)"
)
#: What Snakemake says of the jobs an interrupt killed, once it stops: left out (the wrapper says it in one
#: line; the full log keeps it).
STOP_NOISE = re.compile(
    r"died with <Signals\.SIG|At least one job did not complete successfully|^Shutting down"
)


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class CompactProgress:
    """The compact view's state: jobs per rule, started and done; ``lines(record)`` gives what to print."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.start = clock()
        self.total: dict[str, int] = {}  # jobs to run per rule
        self.rule_of: dict[int, str] = {}  # jobid -> rule
        self.started: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.finished: list[str] = []  # rules whose last job finished since the last progress line
        self.next_step = STEP

    def lines(self, record: logging.LogRecord) -> list[str]:
        event = getattr(record, "event", None)
        if event == LogEvent.RUN_INFO:
            stats = dict(getattr(record, "stats", {}) or {})
            total = stats.pop("total", sum(stats.values()))
            self.total = {rule: int(count) for rule, count in stats.items()}
            counts = ", ".join(f"{rule} {count}" for rule, count in self.total.items())
            return [f"ddtree-bench: {total} jobs to run: {counts}"]
        if event == LogEvent.JOB_INFO:
            self.rule_of[int(record.jobid)] = record.rule_name
            self.started[record.rule_name] = self.started.get(record.rule_name, 0) + 1
            return []
        if event == LogEvent.JOB_FINISHED:
            rule = self.rule_of.get(int(record.job_id))
            if rule is not None:
                self.done[rule] = self.done.get(rule, 0) + 1
                if self.done[rule] == self.total.get(rule):
                    self.finished.append(rule)
            return []
        if event == LogEvent.PROGRESS:
            return self._progress(int(record.done), int(record.total))
        return []

    def _progress(self, done: int, total: int) -> list[str]:
        elapsed = _clock(self.clock() - self.start)
        head = f"[{100 * done // max(total, 1):3d}%] {done:>{len(str(total))}}/{total} jobs  {elapsed}"
        out = [f"{head}  {rule}: all {self.total[rule]} done" for rule in self.finished]
        self.finished = []
        if done >= self.next_step * total and not out:  # the rules going: done of their jobs
            going = [
                f"{rule} {self.done.get(rule, 0)}/{count}"
                for rule, count in self.total.items()
                if self.started.get(rule) and self.done.get(rule, 0) < count
            ]
            out.append(f"{head}  {', '.join(going)}" if going else head)
        while done >= self.next_step * total and self.next_step <= 1:
            self.next_step += STEP
        return out


class CompactLogHandler(LogHandlerBase):
    """Snakemake's logger plugin: ``CompactProgress``' lines, and everything else in full (Snakemake's own
    stream handler, filter and formatter)."""

    def __post_init__(self) -> None:
        from snakemake.logging import (  # noqa: PLC0415 (Snakemake's own, at run time)
            ColorizingTextHandler,
            DefaultFilter,
            DefaultFormatter,
        )

        settings = self.common_settings
        self.stream = sys.stdout if settings.stdout else sys.stderr
        self.full = ColorizingTextHandler(nocolor=settings.nocolor, stream=self.stream)
        self.full.addFilter(
            DefaultFilter(
                settings.quiet, settings.debug_dag, settings.verbose, settings.dryrun, settings.printshellcmds
            )
        )
        self.full.setFormatter(DefaultFormatter(settings.quiet, settings.show_failed_logs))
        self.whole = bool(settings.dryrun or settings.verbose or settings.printshellcmds)
        self.silent = bool({str(q) for q in settings.quiet or ()} & {"all", "progress"})
        self.progress = CompactProgress()
        self.stopping = False

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", None)
        if self.whole:
            self.full.handle(record)
            return
        if self.stopped_noise(record, event):
            return
        if event in COMPACT_EVENTS:
            lines = self.progress.lines(record)
            if lines and not self.silent:
                self.stream.write("".join(f"{line}\n" for line in lines))
                self.stream.flush()
            return
        if event is None and record.levelno <= logging.INFO and CHATTER.match(str(record.msg or "")):
            return
        self.full.handle(record)

    def stopped_noise(self, record: logging.LogRecord, event) -> bool:
        """Whether ``record`` is Snakemake stopping on an interrupt, or an error of a job the interrupt killed
        (after it said it stops): one line of the first, none of the others."""
        text = str(record.msg or "")
        if STOPPING.match(text):
            seen, self.stopping = self.stopping, True
            return seen
        return self.stopping and (event == LogEvent.JOB_ERROR or bool(STOP_NOISE.search(text)))

    @property
    def writes_to_stream(self) -> bool:
        return True

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return True

    @property
    def has_formatter(self) -> bool:
        return True

    @property
    def needs_rulegraph(self) -> bool:
        return False
