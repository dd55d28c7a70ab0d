"""The compact progress of a run (Snakemake's logger plugin ``ddtree``): the jobs per rule once, a line per
rule done and per tenth of the jobs, errors and unknown messages in full, a dry run as Snakemake prints it."""

from __future__ import annotations

import io
import logging
import re
from types import SimpleNamespace

import pytest
import yaml
from snakemake_interface_logger_plugins.common import LogEvent
from workflow_copy import snakemake, workdir_copy

from ddtree_bench.progress import CompactLogHandler, CompactProgress


def _settings(**changes) -> SimpleNamespace:
    values = dict(
        dryrun=False,
        printshellcmds=False,
        nocolor=True,
        quiet=None,
        debug_dag=False,
        verbose=False,
        show_failed_logs=False,
        stdout=True,
    )
    return SimpleNamespace(**{**values, **changes})


def _record(msg, level=logging.INFO, **extra) -> logging.LogRecord:
    record = logging.LogRecord("snakemake", level, __file__, 0, msg, None, None)
    record.__dict__.update(extra)
    return record


def _run_events(total_per_rule: dict[str, int]) -> list[logging.LogRecord]:
    """The records of a run of these rules' jobs, one after the other, as Snakemake logs them."""
    total = sum(total_per_rule.values())
    records = [_record("Building DAG of jobs...")]
    records.append(
        _record("Job stats: ...", event=LogEvent.RUN_INFO, stats={**total_per_rule, "total": total})
    )
    jobid, done = 0, 0
    for rule, count in total_per_rule.items():
        for _ in range(count):
            jobid += 1
            records.append(_record("Select jobs to execute..."))
            records.append(_record(None, event=LogEvent.JOB_INFO, jobid=jobid, rule_name=rule))
            records.append(_record(f"Finished jobid: {jobid}", event=LogEvent.JOB_FINISHED, job_id=jobid))
            done += 1
            records.append(_record(None, event=LogEvent.PROGRESS, done=done, total=total))
    return records


def _emitted(records, **settings) -> list[str]:
    handler = CompactLogHandler(_settings(**settings), None)
    handler.stream = io.StringIO()
    handler.full.setStream(handler.stream)
    for record in records:
        handler.emit(record)
    return handler.stream.getvalue().splitlines()


def test_a_run_is_a_line_per_rule_done_and_per_tenth_of_its_jobs():
    lines = _emitted(_run_events({"trace": 2, "bench": 40, "aggregate": 1}))
    assert lines[0] == "ddtree-bench: 43 jobs to run: trace 2, bench 40, aggregate 1"
    assert [line.split("  ")[-1] for line in lines if "all" in line] == [
        "trace: all 2 done",
        "bench: all 40 done",
        "aggregate: all 1 done",
    ]
    assert re.fullmatch(r"\[100%\] 43/43 jobs  0:\d\d  aggregate: all 1 done", lines[-1]), lines[-1]
    going = [line for line in lines[1:] if "all" not in line]
    assert 8 <= len(going) <= 10  # about one a tenth
    assert all(re.fullmatch(r"\[ ?\d\d%\] +\d+/43 jobs  0:\d\d  bench \d+/40", line) for line in going), going
    assert not any("Select jobs" in line or "Building DAG" in line for line in lines)  # the chatter


def test_errors_warnings_and_unknown_messages_stay_in_full():
    error = _record(
        "Error in rule check, jobid: 3",
        logging.ERROR,
        event=LogEvent.JOB_ERROR,
        rule_name="check",
        rule_msg=None,
        jobid=3,
        input=["t.npz"],
        output=["c.json"],
        log=["c.log"],
        conda_env=None,
        shellcmd=None,
        aux={},
        indent=False,
    )
    records = [
        *_run_events({"trace": 1}),
        error,
        _record("Shutting down, this might take some time.", logging.ERROR),
        _record("something new", logging.INFO),
        _record("a warning", logging.WARNING),
    ]
    text = "\n".join(_emitted(records))
    block = text[text.index("Error in rule check:") :].splitlines()  # Snakemake's own block, whole
    assert {"    jobid: 3", "    input: t.npz", "    output: c.json"} <= set(block)
    assert "    log: c.log (check log file(s) for error details)" in block
    assert "Shutting down, this might take some time." in text
    assert "something new" in text and "a warning" in text


def test_once_snakemake_stops_on_an_interrupt_its_killed_jobs_errors_are_left_out():
    """``ddtree-bench workflow`` stops Snakemake with SIGTERM and says so in one line: Snakemake's "Will exit"
    (it says it at every job it drops) is shown once, and its error blocks for the jobs the signal killed are
    left out (its log file keeps them); an error before the interrupt stays in full."""
    stop = "Will exit after finishing currently running jobs (scheduler)."
    killed = "RuleException:\nCalledProcessError:\nCommand 'x' died with <Signals.SIGTERM: 15>."
    records = [
        *_run_events({"trace": 1}),
        _record("a real failure", logging.ERROR),
        _record(stop),
        _record(killed, logging.ERROR),
        _record("Error in rule one", logging.ERROR, event=LogEvent.JOB_ERROR),
        _record(stop),
        _record("WorkflowError:\nAt least one job did not complete successfully.", logging.ERROR),
        _record("Complete log(s): /w/.snakemake/log/x.snakemake.log"),
    ]
    lines = _emitted(records)
    assert lines[-3:] == ["a real failure", stop, "Complete log(s): /w/.snakemake/log/x.snakemake.log"]
    assert not any("SIGTERM" in line or "Error in rule" in line or "At least one" in line for line in lines)


def test_a_dry_run_or_verbose_run_is_snakemakes_own_output():
    records = _run_events({"trace": 1})
    records[2] = _record(
        None,
        event=LogEvent.JOB_INFO,
        jobid=1,
        rule_name="trace",
        rule_msg=None,
        local=True,
        is_checkpoint=False,
        input=[],
        output=["t.npz"],
        log=[],
        benchmark=None,
        wildcards={},
        reason="Missing output files: t.npz",
        priority=0,
        threads=1,
        resources={},
        indent=False,
    )
    for settings in ({"dryrun": True}, {"verbose": True}):
        text = "\n".join(_emitted(records, **settings))
        assert "localrule trace:" in text and "output: t.npz" in text
        assert "Building DAG of jobs..." in text


def test_quiet_progress_leaves_out_the_compact_lines():
    assert _emitted(_run_events({"trace": 2}), quiet={"progress"}) == []


def test_the_progress_clock():
    ticks = iter([0.0, 3725.0])
    progress = CompactProgress(clock=lambda: next(ticks))
    progress.lines(_record("", event=LogEvent.RUN_INFO, stats={"a": 1, "total": 1}))
    assert progress.lines(_record(None, event=LogEvent.PROGRESS, done=1, total=1)) == [
        "[100%] 1/1 jobs  1:02:05"
    ]


@pytest.mark.slow
def test_a_real_run_prints_its_stages_and_a_failing_one_its_error_in_full(tmp_path):
    """Under ``--logger ddtree`` a small run prints a few lines (not a block per job) and ends naming the
    full log; a failing check still prints Snakemake's whole error and the job's one-line reason."""
    work = workdir_copy(tmp_path)
    config = yaml.safe_load((work / "config" / "smoke.yaml").read_text())
    config.update(builders=["reference", "native"], budgets=[16], batch_sizes=[1], distributions=["bf16"])
    config["timing"]["jobs"] = 2
    config["step"] = {"enabled": False, "batch_sizes": None}
    (work / "small.yaml").write_text(yaml.safe_dump(config))
    target = "results/smoke/summary.parquet"
    args = ("--cores", "2", "--logger", "ddtree", "--configfile", "small.yaml", "--", target)
    result = snakemake(work, *args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert lines[0].startswith("ddtree-bench: ") and " jobs to run: " in lines[0]
    done = [line.split("  ")[-1] for line in lines if line.endswith(" done")]
    assert "bench: all 4 done" in done and "aggregate: all 1 done" in done
    assert lines[-1].startswith("Complete log(s): ")
    assert len(lines) <= 30 and not any(line.startswith(("rule ", "localrule ")) for line in lines)

    source = work / "kernels" / "native" / "tree_build_cpu.cpp"
    mutated, count = re.subn(r"if \(depth < L\)", "if (depth + 1 < L)", source.read_text())
    if count != 1:
        pytest.skip("the mutation point (the child push) is not in the native source any more")
    source.write_text(mutated)
    result = snakemake(work, *args)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert re.search(r"Error in rule check:\n(    message: .*\n)?    jobid: \d+\n    input: ", output), (
        output[-3000:]
    )
    assert "ddtree-bench: rule check: TreeMismatch" in output
