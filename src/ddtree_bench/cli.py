"""The ``ddtree-bench`` console script: ``trace``, ``build``, ``check`` and ``bench``, the same functions the
Snakemake rules call, and ``report``, which renders the report from existing results without running anything.
``workflow`` runs Snakemake with the arguments given, after reading every ``--configfile`` (Snakemake reads
them before the Snakefile runs, and says of a YAML error neither the file nor the line).

Bad input (a library ``ValueError``, an unknown builder, an unavailable builder for ``build``, an
argument error) prints exactly one line ``ddtree-bench: error: <message>`` on stderr and exits with code 2.
Every output file is written atomically, so a failed command never leaves a partial (or any new) output
behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np

from ddtree_bench import catalog

PROG = "ddtree-bench"


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``main`` prints it and returns 2)."""

    def error(self, message):  # noqa: D401 (argparse hook)
        raise _UsageError(f"{message} (see {self.prog} --help)")


def _integer(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _number(text: str, *, positive: bool = False) -> float:
    """A finite number >= 0 (``positive``: > 0), as the configuration's field it sets must be."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not np.isfinite(value) or value < 0 or (positive and value == 0):
        raise argparse.ArgumentTypeError(
            f"must be a finite number {'>' if positive else '>='} 0, got {text!r}"
        )
    return value


def _positive_number(text: str) -> float:
    return _number(text, positive=True)


def _builder_options(pairs: list[str] | None) -> dict:
    """``KEY=VALUE`` pairs; integer-looking values become ints."""
    options = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"--builder-option must be KEY=VALUE, got {pair!r}")
        options[key] = int(value) if re.fullmatch(r"-?\d+", value) else value
    return options


def _with_sglang_source(args, options: dict) -> dict:
    """``--sglang-source PATH`` as the sglang builder's ``source`` option (only with ``--builder sglang``)."""
    source = getattr(args, "sglang_source", None)
    if source is None:
        return options
    if args.builder != catalog.SGLANG:
        raise ValueError(f"--sglang-source goes with --builder sglang, not {args.builder!r}")
    return {**options, "source": str(source)}


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _writable(path, option: str = "-o/--output", *, folder: bool = False) -> None:
    """An output that cannot be written fails before any work (one line naming the option)."""
    from ddtree_bench.io import check_writable  # noqa: PLC0415

    check_writable(path, option, folder=folder)


def _available(name: str, options: dict | None = None, option: str = "--builder") -> None:
    """A builder asked for on the command line that cannot run here is bad input: one line saying why."""
    from ddtree_bench.builders import get_builder  # noqa: PLC0415

    reason = get_builder(name, **(options or {})).unavailable_reason()
    if reason is not None:
        raise ValueError(f"{option} {name}: builder {name} is unavailable here: {_one_line(reason)}")


def _trace_columns(path, budget: int) -> tuple[int, int, int]:
    """``(R, L, K)`` of ``--trace`` (its headers only); a budget above its K is refused, as the configuration
    refuses a budget above topk (a builder would use only K columns: not the tree asked for)."""
    from ddtree_bench.traces import load_trace, peek_trace  # noqa: PLC0415

    try:
        shape = peek_trace(path)
    except ValueError:
        load_trace(path)  # the loader's own words for what is wrong with the file (as the jobs say it)
        raise
    if 0 < shape[2] < budget:  # K = 0: the loader names that problem
        raise ValueError(
            f"--budget {budget} is above the {shape[2]} top-K columns of trace {path}: a budget needs at "
            "least that many columns (make the trace with a larger --topk)"
        )
    return shape


# ----------------------------------------------------------------------------------------- subcommands


def cmd_trace(args) -> int:
    from ddtree_bench.traces import (  # noqa: PLC0415
        DEFAULT_VOCAB_SIZE,
        TraceSpec,
        check_distribution,
        generate,
        import_recorded,
        save_trace,
    )

    distribution = args.distribution or ("recorded" if args.recorded else None)
    if distribution is None:
        raise ValueError("--distribution is required (or --recorded FILE)")
    check_distribution(distribution)
    if args.recorded is not None and distribution != "recorded":
        raise ValueError(f"--recorded FILE goes with --distribution recorded, not {distribution!r}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be an integer >= 1, got {args.threads}")
    _writable(args.output)
    start = time.perf_counter()
    if distribution == "recorded":
        if args.recorded is None:
            raise ValueError("--distribution recorded needs --recorded FILE")
        trace = import_recorded(
            args.recorded,
            args.output,
            args.depth,
            args.topk,
            requests=args.requests,
            vocab_size=args.vocab_size,
        )
        device = "file"
    else:
        missing = [f"--{name}" for name in ("requests", "depth", "topk") if getattr(args, name) is None]
        if missing:
            raise ValueError(f"{', '.join(missing)} required for a generated trace")
        vocab_size = DEFAULT_VOCAB_SIZE if args.vocab_size is None else args.vocab_size
        trace = generate(
            TraceSpec(distribution, args.requests, args.depth, args.topk, vocab_size, args.seed),
            args.device,
            threads=args.threads,
            drafter=_drafter_params(args.drafter_config),
        )
        device = trace.metadata.get("device", "?")
        save_trace(args.output, trace.top_log_probs, trace.top_token_ids, **trace.metadata)
    seconds = time.perf_counter() - start
    r, depth, k = trace.top_log_probs.shape
    print(
        f"{PROG}: wrote {args.output}: {distribution}, R={r} L={depth} K={k}, {device}, {seconds:.2f} s, "
        f"sha256 {trace.sha256}"
    )
    return 0


def _drafter_params(path) -> dict | None:
    """The ``drafter:`` mapping of a config file (e.g. ``calibrate``'s output), or None without one."""
    if path is None:
        return None
    from ddtree_bench.config import strict_yaml  # noqa: PLC0415

    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ValueError(f"--drafter-config {path}: cannot read it ({error.strerror})") from None
    data = strict_yaml(text, f"--drafter-config {path}")
    if not isinstance(data, dict) or not isinstance(data.get("drafter"), dict):
        raise ValueError(f"--drafter-config {path}: needs a `drafter:` mapping of parameters")
    return data["drafter"]


def cmd_build(args) -> int:
    from ddtree_bench.builders import get_builder  # noqa: PLC0415
    from ddtree_bench.io import atomic_output  # noqa: PLC0415
    from ddtree_bench.traces import load_trace  # noqa: PLC0415
    from ddtree_bench.validation import check_budget  # noqa: PLC0415

    budget = check_budget(args.budget)
    options = _with_sglang_source(args, _builder_options(args.builder_option))
    _available(args.builder, options)
    builder = get_builder(args.builder, **options)
    _trace_columns(args.trace, budget)
    _writable(args.output)
    lp, ids = load_trace(args.trace).batch(args.batch)
    trees = builder.build(lp, ids, budget)
    with atomic_output(args.output) as tmp, open(tmp, "wb") as handle:
        np.savez_compressed(handle, **trees.as_dict())  # the TreeBatch.save format
    print(
        f"{PROG}: wrote {args.output}: {args.builder}, budget {budget}, {trees.batch_size} trees, "
        f"{float(np.mean(trees.node_count)):.1f} nodes on average"
    )
    return 0


def cmd_check(args) -> int:
    from ddtree_bench.io import atomic_output  # noqa: PLC0415
    from ddtree_bench.stages.check import check_builder  # noqa: PLC0415
    from ddtree_bench.validation import check_budget  # noqa: PLC0415

    budget = check_budget(args.budget)
    options = _with_sglang_source(args, _builder_options(args.builder_option))
    _available(args.builder, options)
    _available(args.against, None, "--against")
    _trace_columns(args.trace, budget)
    if args.output is not None:
        _writable(args.output)
    summary = check_builder(
        args.builder, args.trace, budget, against=args.against, batch=args.batch, builder_options=options
    )
    if summary["status"] != "ok":  # a builder that failed to load after all: still no summary written
        raise ValueError(summary["reason"])
    if args.output is not None:
        with atomic_output(args.output) as tmp:
            tmp.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"{PROG}: ok: {summary['builder']} equals {summary['against']} on {args.trace}, budget "
        f"{summary['budget']}, {summary['requests']} requests"
    )
    return 0


def _trace_distribution(path) -> str | None:
    try:
        with np.load(path, allow_pickle=False) as data:
            if "distribution" in data.files:
                return str(data["distribution"].item())
    except Exception:  # the benchmark itself reports an unreadable trace
        return None
    return None


def cmd_bench(args) -> int:
    from ddtree_bench.io import atomic_output  # noqa: PLC0415
    from ddtree_bench.validation import check_budget  # noqa: PLC0415

    budget = check_budget(args.budget)
    options = _with_sglang_source(args, _builder_options(args.builder_option))
    _available(args.builder, options)
    _trace_columns(args.trace, budget)
    _writable(args.output)
    from ddtree_bench.stages.timing_job import TimingJob, run  # noqa: PLC0415

    timing = {
        "warmup": args.warmup,
        "repeats": args.repeats,
        "min_seconds": args.min_seconds,
        "max_seconds": args.max_seconds,
        "min_repeats": args.min_repeats,
        "max_repeats": args.max_repeats,
    }
    job = TimingJob(
        builder=args.builder,
        trace_path=args.trace,
        budget=budget,
        batch=args.batch,
        timing=timing,
        machine=args.machine,
        distribution=args.distribution or _trace_distribution(args.trace),
        builder_options=options,
    )
    frame = run(job)
    with atomic_output(args.output) as tmp:
        frame.to_parquet(tmp, index=False)
    message = f"{PROG}: wrote {args.output}: {len(frame)} rows"
    if {"phase", "per_tree_seconds"} <= set(frame.columns):
        timed = frame.loc[frame["phase"] == "timed", "per_tree_seconds"].dropna()
        if len(timed):
            message += f", median {timed.median() * 1e6:.1f} us per tree"
    if "status" in frame.columns and len(frame) and (frame["status"] != "ok").any():
        message += f", status {frame['status'].iloc[0]}"
    print(message)
    return 0


def _budget_settings(args):
    """The settings of config/config.yaml with the --configfile fragments over it and the options over
    those (the one layering rule: ``config.layered_config``; ``settings.Settings``, checked once)."""
    from ddtree_bench.config import layered_config  # noqa: PLC0415
    from ddtree_bench.settings import Settings  # noqa: PLC0415

    throughput = {"what_if": {}}
    for key, value, where in (
        ("draft_ms", args.draft_ms, throughput),
        ("bandwidth_tbps", args.bandwidth_tbps, throughput["what_if"]),
        ("prefix_length", args.prefix_length, throughput),
    ):
        if value is not None:
            where[key] = value
    config = layered_config(args.configfile or (), {"throughput": throughput})
    return Settings.from_config(config)


def cmd_budget(args) -> int:
    """Which budget? The throughput model on one results folder, printed as Markdown tables."""
    from ddtree_bench.report import load_machine, markdown_table  # noqa: PLC0415
    from ddtree_bench.report import throughput as throughput_report  # noqa: PLC0415
    from ddtree_bench.summary.files import check_results_folder  # noqa: PLC0415

    settings = _budget_settings(args)
    options = settings.throughput_options()
    summary = Path(args.results) / "summary.parquet"
    if not summary.is_file():
        raise ValueError(f"{args.results}: no summary.parquet there (a results/<machine>/ folder has one)")
    check_results_folder(args.results)
    machine = load_machine(summary)
    if not throughput_report.has_step_stages(machine):
        raise ValueError(
            f"{args.results}: no modelled tokens/s: it has no GPU step stages "
            f"({throughput_report.no_step_reason(machine)}); the workflow's step stages (step.enabled: "
            "true) measure verify attention and accept on a CUDA GPU only, so run it on a GPU machine, or "
            "model a published GPU machine's folder, e.g. `ddtree-bench budget results/published/h200`"
        )
    if args.distribution is not None:
        present = _ok_values(machine.summary, "distribution")
        if args.distribution not in present:
            raise ValueError(
                f"--distribution {args.distribution!r}: {args.results} has no tree-build rows of it; "
                f"choose one of {', '.join(present) or '(none: no timed rows there)'}"
            )
    layers = {machine.label: {"layers": settings.step.layers}}
    distributions = [args.distribution] if args.distribution else None
    found = throughput_report.sections([machine], layers, options, distributions=distributions)
    lines = [throughput_report.model_line(options), ""]
    for section in found:
        lines.append(f"## {section.heading()}\n")
        if section.note and section.result is not None:
            lines.append(section.note + "\n")
        if section.missing:
            lines.append(f"no data: {section.missing}.\n")
            continue
        lines.append(
            f"Where each term comes from (what-if bandwidth {section.result.bandwidth}):\n\n"
            + markdown_table(throughput_report.sources_table(section))
        )
        lines += [f"not modelled: {line}" for line in throughput_report.unmodelled_lines(section)]
        lines.append("Best budget per builder:\n\n" + markdown_table(throughput_report.best_table(section)))
        gains = throughput_report.gains_table(section)
        if not gains.empty:
            lines.append("GPU builder's gain at each one's own best budget:\n\n" + markdown_table(gains))
    print("\n".join(lines))
    return 0


def _ok_values(summary, column: str) -> list:
    """The values of ``column`` among a summary's rows that hold timings (in order of appearance)."""
    if summary is None or column not in summary:
        return []
    rows = summary[summary["status"] == "ok"] if "status" in summary else summary
    values = [v.item() if hasattr(v, "item") else v for v in rows[column].dropna()]
    return list(dict.fromkeys(values))


def _results_folder(folder: Path, option: str = "--results") -> Path:
    """``folder/summary.parquet``, checked (one line naming the option and what is missing). A published
    folder may hold the step stages' summary alone (a run of the round's stacks, no tree-build timings)."""
    if not folder.is_dir():
        raise ValueError(f"{option} {folder}: no such folder")
    summary = folder / "summary.parquet"
    step_only = option == "--published" and (folder / "step_summary.parquet").is_file()
    if not summary.is_file() and not step_only:
        raise ValueError(f"{option} {folder}: no summary.parquet (a results folder holds one)")
    return summary


def _recorded_config(folder: Path) -> dict | None:
    """The configuration a results folder recorded (its environment.json's ``config``), if any."""
    path = folder / "environment.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: cannot read it as JSON ({_one_line(error)})") from None
    config = data.get("config") if isinstance(data, dict) else None
    return config if isinstance(config, dict) else None


def _report_config(args) -> tuple[dict, str]:
    """The configuration ``report`` checks the summary against, and where it came from: ``--config`` files
    layered over config/config.yaml as every command layers them, else the folder's environment.json."""
    from ddtree_bench.settings import layered_settings, merge_recorded  # noqa: PLC0415

    folder = args.results
    if args.config:
        # what a run records of its settings (environment.json's config): the same mapping either way
        settings = layered_settings(args.config)
        return merge_recorded(settings.recorded()), ", ".join(str(path) for path in args.config)
    config = _recorded_config(folder)
    if config is None:
        raise ValueError(
            f"--results {folder}: no environment.json with the run's configuration to check the summary "
            "against; give it with --config FILE"
        )
    return config, f"{folder / 'environment.json'}"


def cmd_report(args) -> int:
    from ddtree_bench import catalog  # noqa: PLC0415
    from ddtree_bench.config import schema_default  # noqa: PLC0415
    from ddtree_bench.consistency import configured_grid  # noqa: PLC0415
    from ddtree_bench.io import staged_folder  # noqa: PLC0415
    from ddtree_bench.report import ReportFiles, render_report  # noqa: PLC0415
    from ddtree_bench.summary.files import check_results_folder  # noqa: PLC0415

    folder = args.results
    summary = _results_folder(folder)
    published = [_results_folder(other, "--published") for other in args.published or ()]
    for path in (summary, *published):  # each opens, with the columns the report reads: before any work
        check_results_folder(path.parent)
    config, source = _report_config(args)
    try:
        grid = configured_grid(config)
    except ValueError as error:
        raise ValueError(f"{source}: {error}") from None
    step = config.get("step") if isinstance(config.get("step"), dict) else {}
    for option, value, choices in (
        ("--depth", args.depth, grid["depths"]),
        ("--distribution", args.distribution, grid["distributions"]),
    ):
        if value is not None and value not in choices:
            raise ValueError(
                f"{option} {value}: not among the configured {option[2:]}s of {source}; choose one of "
                f"{', '.join(str(c) for c in choices)}"
            )
    depth = args.depth if args.depth is not None else grid["depths"][0]
    distribution = args.distribution or grid["distributions"][0]
    answer = args.published_answer or schema_default("published_answer")
    if args.published_answer is not None:
        labels = [other.name for other in args.published or ()]
        if answer not in labels:
            raise ValueError(
                f"--published-answer {answer}: not the folder name of any --published folder "
                f"({', '.join(labels) or 'none given'})"
            )
    out = args.output
    _writable(out, folder=True)
    # rendered into a folder beside it, moved into place only when complete (no half-written report)
    with _heartbeat(f"report: rendering {out} from {folder}"), staged_folder(out) as stage:
        render_report(
            summary=summary,
            published=published,
            files=ReportFiles(
                stage / "index.html",
                stage / "summary.md",
                figures=[stage / "figures" / f"{name}.png" for name in catalog.FIGURES],
            ),
            depth=depth,
            distribution=distribution,
            step_layers=int(step.get("layers") or schema_default("step.layers")),
            step_depth=step.get("depth") or depth,
            step_distribution=step.get("distribution") or distribution,
            step_enabled=bool(step.get("enabled", schema_default("step.enabled"))),
            published_answer=answer,
            grid=grid,
        )
    print(f"{PROG}: report: {out / 'index.html'} (and {out / 'summary.md'}, {out / 'figures'}/)")
    return 0


#: How often a long command (calibrate, report) says how far it is, on stderr.
PROGRESS_SECONDS = 5.0


@contextlib.contextmanager
def _heartbeat(what: str, every: float | None = None):
    """While the body runs, one line on stderr every ``every`` seconds saying what runs and for how long (none
    for a body that ends sooner, so a quick refusal stays one line)."""
    every = PROGRESS_SECONDS if every is None else every
    start = time.perf_counter()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every):
            print(f"{PROG}: {what}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)

    thread = threading.Thread(target=beat, name="ddtree-bench-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _progress_printer(start: float, every: float | None = None):
    """A ``calibrate.fit`` progress callback printing one line to stderr at most every ``every`` seconds."""
    every = PROGRESS_SECONDS if every is None else every
    last = [start]

    def report(run: int, runs: int, evaluations: int, best: float) -> None:
        now = time.perf_counter()
        if now - last[0] < every:
            return
        last[0] = now
        print(
            f"{PROG}: calibrate: run {run}/{runs}, {evaluations} evaluations, best loss {best:.3g}, "
            f"{now - start:.0f} s",
            file=sys.stderr,
            flush=True,
        )

    return report


def cmd_calibrate(args) -> int:
    from ddtree_bench.calibrate import FitOptions, check_chain, fit, fragment_yaml, parse_tau_pairs  # noqa: PLC0415
    from ddtree_bench.io import atomic_output  # noqa: PLC0415
    from ddtree_bench.traces import check_positive_int  # noqa: PLC0415

    depth = check_positive_int(args.depth, "--depth")
    target = parse_tau_pairs(args.tau, depth)
    chain = None if args.chain is None else check_chain(args.chain, target, depth)
    requests = check_positive_int(args.requests, "--requests")
    iterations = check_positive_int(args.iterations, "--iterations")
    vocab_size = check_positive_int(args.vocab_size, "--vocab-size")
    if vocab_size < max(target):
        raise ValueError(f"--vocab-size {vocab_size} is smaller than the largest budget {max(target)}")
    _writable(args.output)
    start = time.perf_counter()
    print(
        f"{PROG}: calibrate: fitting to {len(target)} budgets ({requests} requests, up to {iterations} "
        f"iterations a run); progress every {PROGRESS_SECONDS:g} s",
        file=sys.stderr,
        flush=True,
    )
    options = FitOptions(
        depth=depth, requests=requests, vocab_size=vocab_size, iterations=iterations, seed=args.seed
    )
    result = fit(target, chain=chain, options=options, progress=_progress_printer(start))
    text = fragment_yaml(result)
    with atomic_output(args.output) as tmp:
        Path(tmp).write_text(text)
    seconds = time.perf_counter() - start
    print(f"{PROG}: wrote {args.output}: worst residual {result.worst():.2%}, {seconds:.1f} s")
    print("\n".join(line[2:] for line in text.splitlines() if line.startswith("#   ")))
    return 0


def cmd_sglang_profile(args) -> int:
    """SGLang's DDTree worker's DFLASH_PROFILE_VERIFY lines -> a throughput config fragment (.yaml)."""
    from ddtree_bench.integrations.sglang import budget_fragment, fragment_yaml, parse_profile_log  # noqa: PLC0415
    from ddtree_bench.io import atomic_output  # noqa: PLC0415

    _writable(args.output)
    profile = parse_profile_log(Path(args.log), label=args.label)
    text = fragment_yaml(profile)
    with atomic_output(args.output) as tmp:
        Path(tmp).write_text(text)
    terms = ", ".join(f"{key} {value:g}" for key, value in budget_fragment(profile)["throughput"].items())
    print(f"{PROG}: wrote {args.output}: {terms} ({profile.windows} windows, {profile.rounds} rounds)")
    return 0


def cmd_workflow(snakemake_args: list[str]) -> int:
    """Snakemake with these arguments, after reading every ``--configfile`` here (Snakemake reads those files
    before the workflow's Snakefile runs and reports a YAML error without the file or the line, so this names
    both: one line, exit 2, nothing started), every ``--configfile`` given as one list (Snakemake keeps only
    the last of several: the one layering rule, docs/configuration.md), and stopped cleanly on an interrupt
    (``supervise``: one line, exit 130 for SIGINT, 143 for SIGTERM, no process left behind, and the same
    command goes on)."""
    import shutil  # noqa: PLC0415

    from ddtree_bench import supervise  # noqa: PLC0415
    from ddtree_bench.config import configfile_arguments, one_configfile_list, read_config_file  # noqa: PLC0415

    for path in configfile_arguments(snakemake_args):
        read_config_file(path)  # ValueError: "config FILE: not valid YAML at line L, column C: ..."
    args = one_configfile_list(snakemake_args)
    beside = Path(sys.executable).parent / "snakemake"
    program = str(beside) if beside.is_file() else shutil.which("snakemake")
    if program is None:
        raise OSError("snakemake: not found beside this Python or on PATH")
    outcome = supervise.run([program, *args], workdir=supervise.directory_argument(args))
    if outcome.signum is not None:
        with contextlib.suppress(OSError):  # a closed terminal
            print(interrupt_line(outcome), file=sys.stderr, flush=True)
    return outcome.exit_status


def interrupt_line(outcome) -> str:
    """What an interrupted ``workflow`` says, in one line (``supervise.Outcome``)."""
    from ddtree_bench import supervise  # noqa: PLC0415

    how = "killed" if outcome.killed else "stopped"
    line = f"{PROG}: interrupted ({supervise.signal_name(outcome.signum)}): Snakemake and its jobs {how}"
    if outcome.lingering:
        return f"{line}, but processes {', '.join(map(str, outcome.lingering))} are still there"
    if outcome.cleared:
        shown = ", ".join(outcome.cleared[:3]) + (", ..." if len(outcome.cleared) > 3 else "")
        line += f"; cleared the {len(outcome.cleared)} killed jobs' incomplete outputs ({shown})"
    if outcome.unlocked:
        line += "; removed the run's lock"
    return f"{line}; the same command goes on from here"


# ----------------------------------------------------------------------------------------- parser


def _timing_defaults() -> dict:
    """``bench``'s defaults: config/config.yaml's timing section over the schema's defaults (the values a
    pipeline job samples with)."""
    from ddtree_bench.config import DEFAULT_CONFIG, TIMING_KEYS, apply_defaults, read_config_file  # noqa: PLC0415

    config = {}
    try:
        data = read_config_file(DEFAULT_CONFIG)
        if isinstance(data.get("timing"), dict):
            config["timing"] = dict(data["timing"])
    except ValueError:
        pass  # the schema's defaults (the same values); the workflow names the file's problem
    timing = apply_defaults(config)["timing"]
    return {key: timing[key] for key in TIMING_KEYS}


def _trace_command(sub) -> None:
    p = sub.add_parser("trace", help="make a trace file (.npz)", description="Generate or import a trace.")
    p.add_argument(
        "--distribution", help="uniform, peaked, bf16, drafter, drafter-bf16, drafter-k2.6 or recorded"
    )
    p.add_argument("--requests", type=_integer, help="R, number of requests")
    p.add_argument("--depth", type=_integer, help="L, block positions per request")
    p.add_argument("--topk", type=_integer, help="K, top-k columns per position")
    p.add_argument(
        "--vocab-size",
        type=_integer,
        help="V (default 163840, Kimi K2.6); with --recorded: the token ids must be below it (default: the "
        "vocab_size the file records, if any)",
    )
    p.add_argument("--seed", type=_integer, default=0, help="random seed (default 0)")
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu (default: bit-identical traces on every machine) or cuda (CuPy's generator: faster, but "
        "other traces than cpu for the same seed)",
    )
    p.add_argument("--threads", type=_integer, default=None, help="CPU threads, >= 1 (default: all cores)")
    p.add_argument("--recorded", type=Path, help="import this recorded trace file (optionally sliced)")
    p.add_argument(
        "--drafter-config",
        type=Path,
        help="a YAML file with a `drafter:` mapping (e.g. from calibrate) for the drafter distributions",
    )
    p.add_argument("-o", "--output", type=Path, required=True, help="output .npz")
    p.set_defaults(func=cmd_trace)


def _builder_arguments(p, *, batch_required=False) -> None:
    """The options ``build``, ``check`` and ``bench`` share: the builder, its trace, budget and batch."""
    names = " or ".join(", ".join(catalog.BUILDERS).rsplit(", ", 1))
    p.add_argument("--builder", required=True, help=names)
    p.add_argument("--trace", type=Path, required=True, help="trace file (.npz)")
    p.add_argument("--budget", type=_integer, required=True, help="N, nodes per tree")
    p.add_argument(
        "--batch",
        type=_integer,
        required=batch_required,
        help="the batch: the trace's first b requests (required)"
        if batch_required
        else "the trace's first b requests (default: all)",
    )
    p.add_argument(
        "--builder-option", action="append", metavar="KEY=VALUE", help="builder option (repeatable)"
    )
    p.add_argument(
        "--sglang-source",
        type=Path,
        metavar="PATH",
        help="with --builder sglang: an SGLang checkout (root or python/) or the .py file defining "
        "build_ddtree_tree_from_topk, loaded by path (only torch needed)",
    )


def _build_command(sub) -> None:
    p = sub.add_parser("build", help="run one builder on a trace, write its trees (.npz)")
    _builder_arguments(p)
    p.add_argument("-o", "--output", type=Path, required=True, help="output trees .npz (TreeBatch)")
    p.set_defaults(func=cmd_build)


def _check_command(sub) -> None:
    p = sub.add_parser("check", help="compare a builder's trees with another's on a trace")
    _builder_arguments(p)
    p.add_argument(
        "--against", default=catalog.ORACLE, help=f"builder to compare with (default {catalog.ORACLE})"
    )
    p.add_argument("-o", "--output", type=Path, help="write the summary as JSON")
    p.set_defaults(func=cmd_check)


#: ``bench``'s timing options: (option, its timing key, its type, its help before the default).
_TIMING_OPTIONS = (
    ("--warmup", "warmup", _integer, "warm-up calls"),
    ("--repeats", "repeats", _integer, "timed calls, at least"),
    ("--min-seconds", "min_seconds", _number, "time at least this long"),
    ("--max-seconds", "max_seconds", _number, "stop a slow configuration after this long"),
    ("--min-repeats", "min_repeats", _integer, "timed calls even past --max-seconds"),
    ("--max-repeats", "max_repeats", _integer, "stop a fast configuration after this many calls"),
)


def _bench_command(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="time one configuration, write one parquet file",
        description="Time one builder on one trace, budget and batch. The timing defaults are the "
        "workflow's (config/config.yaml's timing section), so a run here samples as a pipeline job does.",
    )
    _builder_arguments(p, batch_required=True)
    timing = _timing_defaults()
    for option, key, kind, text in _TIMING_OPTIONS:
        default = timing[key]
        shown = f"{default:g}" if kind is _number else f"{default}"
        p.add_argument(option, type=kind, default=default, help=f"{text} (default {shown})")
    p.add_argument("--machine", help="machine label (default: derived from host name and GPU)")
    p.add_argument("--distribution", help="distribution label (default: from the trace's metadata)")
    p.add_argument("-o", "--output", type=Path, required=True, help="output .parquet")
    p.set_defaults(func=cmd_bench)


def _budget_command(sub) -> None:
    p = sub.add_parser(
        "budget",
        help="which budget? the throughput model on a results folder",
        description='The report\'s "Which budget?" model (docs/throughput.md) on results/<machine>/: the '
        "best budget per builder and the GPU builder's gain, with config/config.yaml's throughput section, "
        "any --configfile fragments over it, and the options below over those.",
    )
    p.add_argument("results", type=Path, help="a results folder (summary.parquet, step_summary.parquet, ...)")
    p.add_argument("--configfile", action="append", type=Path, help="a config fragment (repeatable)")
    p.add_argument(
        "--distribution",
        help="the trees to model, one the results hold (default: the results' first distribution)",
    )
    p.add_argument("--draft-ms", type=_number, help="throughput.draft_ms")
    p.add_argument("--bandwidth-tbps", type=_positive_number, help="throughput.what_if.bandwidth_tbps (> 0)")
    p.add_argument("--prefix-length", type=_integer, help="throughput.prefix_length (S)")
    p.set_defaults(func=cmd_budget)


def _report_command(sub) -> None:
    p = sub.add_parser(
        "report",
        help="render the report from existing results (runs nothing)",
        description="Render the report (index.html, summary.md, figures/) from a results folder's "
        "summary.parquet (and its tree_shape.parquet, environment.json, step_summary.parquet), beside other "
        "machines' folders, without running any job. The summary must hold exactly the configured grid "
        "(the configuration recorded in its environment.json, or --config): a stale one is refused.",
    )
    p.add_argument(
        "--results", type=Path, required=True, help="a results folder, e.g. results/published/h200"
    )
    p.add_argument(
        "--published",
        type=Path,
        action="append",
        metavar="FOLDER",
        help="another machine's results folder to set beside it (repeatable)",
    )
    p.add_argument(
        "--config",
        "--configfile",
        dest="config",
        type=Path,
        action="append",
        help="check the summary against this configuration: config/config.yaml, then each of these files in "
        "order, as a run layers them (repeatable; default: the one in the folder's environment.json)",
    )
    p.add_argument(
        "--depth", type=_integer, help="L of the tables and figures (default: the first configured)"
    )
    p.add_argument("--distribution", help="their distribution (default: the first configured)")
    p.add_argument(
        "--published-answer",
        metavar="LABEL",
        help="the --published folder (by name) whose answer is shown where --results has none of its own "
        "(default: the configuration's published_answer, h200)",
    )
    p.add_argument("-o", "--output", type=Path, required=True, help="output folder (e.g. /tmp/report)")
    p.set_defaults(func=cmd_report)


def _calibrate_command(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit the drafter distribution to measured tau per budget, write a config fragment (.yaml)",
        description="Fit the drafter distribution's parameters to a measured acceptance curve.",
    )
    p.add_argument(
        "--tau",
        nargs="+",
        action="extend",  # every pair of every --tau: a budget given twice is refused, not dropped
        required=True,
        metavar="BUDGET:TAU",
        help="measured tokens per verify round (bonus included) per budget, e.g. 16:8.61 32:9.27; at most "
        "N + 1 (and depth + 1)",
    )
    p.add_argument(
        "--chain",
        type=float,
        help="the top-1 chain's (DFlash's) tau, e.g. 7.79; at most the tree's tau at every budget >= --depth",
    )
    p.add_argument(
        "--depth", type=_integer, default=15, help="drafted positions per block (default 15: block 16)"
    )
    p.add_argument("--requests", type=_integer, default=256, help="simulated requests (default 256)")
    p.add_argument("--iterations", type=_integer, default=300, help="Nelder-Mead iterations (default 300)")
    p.add_argument("--vocab-size", type=_integer, default=163840, help="V (default 163840, Kimi K2.6)")
    p.add_argument("--seed", type=_integer, default=0, help="seed of the fit's draws (default 0)")
    p.add_argument("-o", "--output", type=Path, required=True, help="output config fragment (.yaml)")
    p.set_defaults(func=cmd_calibrate)


def _sglang_profile_command(sub) -> None:
    p = sub.add_parser(
        "sglang-profile",
        help="SGLang DDTree worker's profile log -> a throughput config fragment (.yaml)",
        description="Read the per-stage lines SGLang's DDTree worker logs with DFLASH_PROFILE_VERIFY=1 and "
        "write their medians as a throughput fragment (draft_ms, forward_ms) for `ddtree-bench budget "
        "--configfile` or the pipeline's --configfile (docs/sglang.md).",
    )
    p.add_argument("log", type=Path, help="the service's log file")
    p.add_argument("--label", default="DDTREE", help="the profile lines' label (default DDTREE)")
    p.add_argument("-o", "--output", type=Path, required=True, help="output config fragment (.yaml)")
    p.set_defaults(func=cmd_sglang_profile)


def _workflow_command(sub) -> None:
    sub.add_parser(
        "workflow",
        help="run snakemake with the given arguments, naming the file and line of a YAML error in a "
        "--configfile first",
        description="ddtree-bench workflow [SNAKEMAKE ARGUMENTS]: every --configfile is read here first (a "
        "YAML error: one line with its file and line, exit 2, nothing run), then snakemake runs with the "
        "arguments as given.",
        add_help=False,
    )


def _stage_command(sub) -> None:
    p = sub.add_parser(
        "stage",
        help="run step-stage jobs of a configuration, writing their rows where the workflow does",
        description="Run the step-stage jobs the selectors pick (STAGE, or STAGE:key=value,...: the jobs "
        "with these wildcards), each made from the configuration as the workflow makes it "
        "(config/config.yaml, then each --configfile in order), and write their rows under "
        "results/<machine>/step/ (its missing trace and fatbins made first). Every --set value is checked as "
        "the configuration is, and a selection that matches no job is refused, before anything is built or "
        "written.",
    )
    p.add_argument("jobs", nargs="+", metavar="STAGE[:key=value,...]")
    p.add_argument(
        "--configfile", type=Path, action="append", help="a config file over config/config.yaml (repeatable)"
    )
    p.add_argument("--results", type=Path, help="default: results/<machine>")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a job field (YAML), after the files",
    )
    p.set_defaults(func=cmd_stage)


#: The subcommands in the order ``--help`` lists them, each added by its function.
_COMMANDS = (
    _trace_command,
    _build_command,
    _check_command,
    _bench_command,
    _budget_command,
    _report_command,
    _calibrate_command,
    _sglang_profile_command,
    _stage_command,
    _workflow_command,
)


def build_parser() -> argparse.ArgumentParser:
    from ddtree_bench import __version__  # noqa: PLC0415

    parser = _Parser(
        prog=PROG, description="DDTree tree-build benchmark: traces, builders, checks, timings, the report."
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_command in _COMMANDS:
        add_command(sub)
    return parser


def cmd_stage(args) -> int:
    from ddtree_bench import stages  # noqa: PLC0415
    from ddtree_bench.paths import layout  # noqa: PLC0415
    from ddtree_bench.settings import layered_settings  # noqa: PLC0415

    settings = layered_settings(args.configfile or ())  # config/config.yaml, then each --configfile
    fields = stages.parse_fields(args.set)
    for path in stages.run_jobs(settings, args.jobs, layout(settings, args.results), fields):
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    from ddtree_bench.builders import BuilderUnavailable  # noqa: PLC0415

    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["workflow"]:  # every later argument is Snakemake's
        try:
            return cmd_workflow(argv[1:])
        except KeyboardInterrupt:  # before Snakemake started (its run handles its own)
            print(f"{PROG}: interrupted", file=sys.stderr)
            return 130
        except ValueError as error:
            print(f"{PROG}: error: {_one_line(error)}", file=sys.stderr)
            return 2
        except OSError as error:
            print(f"{PROG}: error: {_one_line(error)}", file=sys.stderr)
            return 1
    try:
        args = parser.parse_args(argv)
    except _UsageError as error:
        print(f"{PROG}: error: {_one_line(error)}", file=sys.stderr)
        return 2
    except SystemExit as done:  # --help
        return int(done.code or 0)
    try:
        return args.func(args)
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback (outputs are written whole or not at all)
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, BuilderUnavailable) as error:
        print(f"{PROG}: error: {_one_line(error)}", file=sys.stderr)
        return 2
    except (OSError, ImportError) as error:  # an unwritable output, a missing optional module
        print(f"{PROG}: error: {_one_line(error)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
