"""The ``ddtree-bench`` console script: subcommands, bad input (one line, exit 2, no output file)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from workflow_copy import snakemake, workdir_copy

import ddtree_bench.builders
from ddtree_bench import __version__
from ddtree_bench.builders import Builder, get_builder
from ddtree_bench.cli import main
from ddtree_bench.config import REPO_ROOT as ROOT
from ddtree_bench.config import TIMING_KEYS, configfile_arguments, load_config, one_configfile_list
from ddtree_bench.report import FIGURE_NAMES
from ddtree_bench.stages import check
from ddtree_bench.traces import generate_trace, load_trace, save_trace
from ddtree_bench.tree import TreeBatch

V = 512


def run(argv, capsys):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err, *needles):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ddtree-bench: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def trace_path(tmp_path, capsys):
    path = tmp_path / "trace.npz"
    argv = ["trace", "--distribution", "bf16", "--requests", 5, "--depth", 4, "--topk", 8]
    code, out, err = run([*argv, "--vocab-size", V, "--seed", 3, "-o", path], capsys)
    assert code == 0, err
    return path


# ----------------------------------------------------------------------------------------- trace


def test_trace_writes_a_valid_deterministic_file(trace_path, capsys):
    trace = load_trace(trace_path)
    lp, ids = generate_trace("bf16", 5, 4, 8, V, 3, device="cpu")
    np.testing.assert_array_equal(trace.top_log_probs, lp)
    np.testing.assert_array_equal(trace.top_token_ids, ids)
    assert trace.metadata["distribution"] == "bf16"
    assert trace.metadata["seed"] == 3 and trace.metadata["vocab_size"] == V
    assert trace.metadata["device"] == "cpu"
    assert sorted(p.name for p in trace_path.parent.iterdir()) == ["trace.npz"]


def test_trace_imports_a_recorded_file(tmp_path, trace_path, capsys):
    out = tmp_path / "rec" / "recorded.npz"
    code, stdout, err = run(["trace", "--recorded", trace_path, "--depth", 2, "--topk", 4, "-o", out], capsys)
    assert code == 0, err
    trace = load_trace(out)
    assert trace.top_log_probs.shape == (5, 2, 4)
    assert trace.metadata["distribution"] == "recorded"
    assert "recorded" in stdout


# ----------------------------------------------------------------------------------------- build / check


def test_build_writes_the_builders_trees(tmp_path, trace_path, capsys):
    out = tmp_path / "trees.npz"
    code, stdout, err = run(
        ["build", "--builder", "reference", "--trace", trace_path, "--budget", 8, "--batch", 3, "-o", out],
        capsys,
    )
    assert code == 0, err
    trees = TreeBatch.load(out)
    lp, ids = load_trace(trace_path).batch(3)
    expected = get_builder("reference").build(lp, ids, 8)
    assert trees.batch_size == 3
    for name, value in expected.as_dict().items():
        np.testing.assert_array_equal(getattr(trees, name), value)
        assert getattr(trees, name).dtype == value.dtype


def test_build_output_without_npz_suffix_is_written_where_asked(tmp_path, trace_path, capsys):
    out = tmp_path / "trees"
    code, _, err = run(
        ["build", "--builder", "reference", "--trace", trace_path, "--budget", 4, "-o", out], capsys
    )
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.npz", "trees"]
    assert TreeBatch.load(out).batch_size == 5


def test_check_ok_writes_a_summary(tmp_path, trace_path, capsys):
    out = tmp_path / "check" / "summary.json"
    code, stdout, err = run(
        ["check", "--builder", "reference", "--trace", trace_path, "--budget", 8, "-o", out], capsys
    )
    assert code == 0, err
    summary = json.loads(out.read_text())
    assert summary["status"] == "ok" and summary["budget"] == 8 and summary["requests"] == 5
    assert "ok" in stdout


class _Wrong(Builder):
    name = "wrong"

    def build(self, lp, ids, budget):
        trees = get_builder("reference").build(lp, ids, budget)
        trees.parents[1, 2] += 1
        return trees


class _Missing(Builder):
    name = "missing"

    def unavailable_reason(self):
        return "SGLang has no DDTree module here"


def _fake_builders(monkeypatch, **fakes):
    real = ddtree_bench.builders.get_builder

    def fake(name, **options):
        return fakes[name] if name in fakes else real(name, **options)

    monkeypatch.setattr(check, "get_builder", fake)
    monkeypatch.setattr(ddtree_bench.builders, "get_builder", fake)


def test_check_mismatch_is_one_line_exit_2_and_no_summary(tmp_path, trace_path, capsys, monkeypatch):
    _fake_builders(monkeypatch, wrong=_Wrong())
    out = tmp_path / "summary.json"
    code, _, err = run(
        ["check", "--builder", "wrong", "--trace", trace_path, "--budget", 8, "-o", out], capsys
    )
    assert_one_line_error(code, err, "builder wrong differs from reference", "request 1", "field parents")
    assert not out.exists()


@pytest.mark.parametrize(
    ("command", "option"),
    [("check", "--builder"), ("check", "--against"), ("bench", "--builder"), ("build", "--builder")],
)
def test_an_unavailable_builder_on_the_command_line_is_one_line_exit_2(
    tmp_path, trace_path, capsys, monkeypatch, command, option
):
    # asked for by name, a builder that cannot run here is bad input (the workflow instead records an
    # "unavailable" row for it): one line saying why, exit 2, no output
    _fake_builders(monkeypatch, missing=_Missing())
    out = tmp_path / "out" / "result"
    argv = [command, "--builder", "reference", "--trace", trace_path, "--budget", 8, "--batch", 2]
    code, stdout, err = run([*argv, option, "missing", "-o", out], capsys)
    assert_one_line_error(code, err, f"{option} missing", "unavailable", "SGLang has no DDTree module here")
    assert not out.parent.exists() and stdout == ""


def test_the_gpu_builder_without_a_gpu_is_one_line_exit_2(tmp_path, trace_path, capsys):
    from ddtree_bench.cuda.loader import gpu_unavailable_reason  # noqa: PLC0415

    reason = gpu_unavailable_reason()
    if reason is None:
        pytest.skip("a GPU is present here: the gpu builder is available")
    for argv in (
        ["check", "--builder", "gpu"],
        ["check", "--builder", "reference", "--against", "gpu"],
        ["bench", "--builder", "gpu", "--batch", 2],
    ):
        out = tmp_path / "out.json"
        code, _, err = run([*argv, "--trace", trace_path, "--budget", 8, "-o", out], capsys)
        assert_one_line_error(code, err, "gpu is unavailable here", " ".join(reason.split())[:40])
        assert not out.exists()


def test_build_unavailable_builder_is_one_line_exit_2(tmp_path, trace_path, capsys, monkeypatch):
    _fake_builders(monkeypatch, missing=_Missing())
    out = tmp_path / "trees.npz"
    code, _, err = run(
        ["build", "--builder", "missing", "--trace", trace_path, "--budget", 8, "-o", out], capsys
    )
    assert_one_line_error(code, err, "builder missing is unavailable", "SGLang has no DDTree module here")
    assert not out.exists()


def test_builder_options_are_passed(tmp_path, trace_path, capsys, monkeypatch):
    seen = {}
    real = ddtree_bench.builders.get_builder

    def fake(name, **options):
        seen[name] = options
        return real("reference")

    monkeypatch.setattr(ddtree_bench.builders, "get_builder", fake)
    out = tmp_path / "trees.npz"
    argv = ["build", "--builder", "native", "--trace", trace_path, "--budget", 4, "-o", out]
    code, _, err = run(
        [*argv, "--builder-option", "threads=1", "--builder-option", "library=/x/lib.so"], capsys
    )
    assert code == 0, err
    assert seen["native"] == {"threads": 1, "library": "/x/lib.so"}
    code, _, err = run([*argv, "--builder-option", "threads"], capsys)
    assert_one_line_error(code, err, "KEY=VALUE")


# ----------------------------------------------------------------------------------------- bad input


TRACE_ARGS = [
    "--distribution",
    "uniform",
    "--requests",
    "2",
    "--depth",
    "2",
    "--topk",
    "4",
    "--vocab-size",
    "64",
]


def _replace(args, option, value):
    args = list(args)
    args[args.index(option) + 1] = value
    return args


@pytest.mark.parametrize(
    "args, needles",
    [
        (_replace(TRACE_ARGS, "--distribution", "zipf"), ["unknown distribution 'zipf'"]),
        (_replace(TRACE_ARGS, "--depth", "0"), ["depth must be >= 1, got 0"]),
        (_replace(TRACE_ARGS, "--depth", "-2"), ["depth must be >= 1"]),
        (_replace(TRACE_ARGS, "--requests", "0"), ["requests must be >= 1"]),
        (_replace(TRACE_ARGS, "--topk", "0"), ["topk must be >= 1"]),
        (_replace(TRACE_ARGS, "--topk", "65"), ["topk 65 is larger than the vocabulary size 64"]),
        (_replace(TRACE_ARGS, "--topk", "1.5"), ["--topk", "must be an integer, got '1.5'"]),
        ([*TRACE_ARGS, "--seed", "-1"], ["seed must be an integer >= 0"]),
        (_replace(TRACE_ARGS, "--distribution", "recorded"), ["--recorded FILE"]),
        (TRACE_ARGS[2:], ["--distribution is required"]),
        (TRACE_ARGS[:6], ["--topk required"]),
        ([*TRACE_ARGS, "--device", "tpu"], ["unknown device 'tpu'"]),
        (
            [*TRACE_ARGS, "--recorded", "/nonexistent/x.npz"],
            ["--recorded FILE goes with --distribution recorded"],
        ),
        (["--distribution", "recorded", "--recorded", "/nonexistent/x.npz"], ["file not found"]),
    ],
)
def test_trace_bad_input(tmp_path, capsys, args, needles):
    out = tmp_path / "out" / "t.npz"
    code, stdout, err = run(["trace", *args, "-o", out], capsys)
    assert_one_line_error(code, err, *needles)
    assert not out.exists()
    assert stdout == ""


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--budget", "0"], ["budget must be >= 1, got 0"]),
        (["--budget", "-1"], ["budget must be >= 1, got -1"]),
        (["--budget", "1.5"], ["--budget", "must be an integer, got '1.5'"]),
        (["--budget", "eight"], ["--budget", "must be an integer, got 'eight'"]),
        (["--budget", "4", "--batch", "6"], ["batch 6 is larger than the 5 requests"]),
        (["--budget", "4", "--batch", "0"], ["batch must be >= 1"]),
        (["--budget", "4", "--builder", "nonesuch"], ["unknown builder 'nonesuch'"]),
    ],
)
@pytest.mark.parametrize("command", ["build", "check"])
def test_build_and_check_bad_input(tmp_path, trace_path, capsys, command, args, needles):
    out = tmp_path / "out" / "result"
    argv = [command, "--builder", "reference", "--trace", trace_path, *args, "-o", out]
    code, _, err = run(argv, capsys)  # a later --builder overrides the first
    assert_one_line_error(code, err, *needles)
    assert not out.exists()


def test_missing_trace_file(tmp_path, capsys):
    out = tmp_path / "trees.npz"
    argv = ["build", "--builder", "reference", "--trace", tmp_path / "nope.npz", "--budget", 4, "-o", out]
    code, _, err = run(argv, capsys)
    assert_one_line_error(code, err, "file not found", "nope.npz")
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, needle",
    [
        ([], "required: COMMAND"),
        (["frobnicate"], "invalid choice"),
        (["build", "--builder", "reference"], "required"),
        (["trace", "--distribution", "uniform"], "-o/--output"),
        (
            ["bench", "--builder", "reference", "--trace", "t.npz", "--budget", "4", "-o", "x.parquet"],
            "--batch",
        ),
    ],
)
def test_usage_errors_are_one_line_exit_2(capsys, argv, needle):
    code, _, err = run(argv, capsys)
    assert_one_line_error(code, err, needle)


def test_help_exits_0(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    for command in ("trace", "build", "check", "bench"):
        assert command in out


def test_module_entry_point_in_a_subprocess(tmp_path):
    out = tmp_path / "t.npz"
    ok = subprocess.run(
        [sys.executable, "-m", "ddtree_bench.cli", "trace", *TRACE_ARGS, "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert load_trace(out).top_log_probs.shape == (2, 2, 4)
    bad = tmp_path / "bad.npz"
    failed = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddtree_bench.cli",
            "trace",
            *_replace(TRACE_ARGS, "--depth", "0"),
            "-o",
            str(bad),
        ],
        capture_output=True,
        text=True,
    )
    assert failed.returncode == 2
    assert failed.stderr.strip().splitlines() == ["ddtree-bench: error: depth must be >= 1, got 0"]
    assert not bad.exists()


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "ddtree-bench"
    if not script.exists():
        pytest.skip(f"no console script next to {sys.executable} (package not installed in this environment)")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "bench" in done.stdout


# ----------------------------------------------------------------------------------------- bench


def _fake_bench_module(monkeypatch, module_name, function_name, calls):
    """Replace the runner ``module_name.function_name`` with one recording the job it is given."""

    def fake_run(job):
        calls.append(job)
        return pd.DataFrame(
            {
                "builder": [job.builder] * 2,
                "phase": ["warmup", "timed"],
                "per_tree_seconds": [2e-6, 1e-6],
                "seconds": [2e-6 * job.batch, 1e-6 * job.batch],
                "status": ["ok", "ok"],
            }
        )

    monkeypatch.setattr(f"{module_name}.{function_name}", fake_run)


@pytest.mark.parametrize(
    "builder, module_name, function_name",
    [
        ("native", "ddtree_bench.stages.build", "run_benchmark"),
        ("gpu", "ddtree_bench.stages.build_gpu", "run_gpu_benchmark"),
    ],
)
def test_bench_calls_the_benchmark_and_writes_parquet(
    tmp_path, trace_path, capsys, monkeypatch, builder, module_name, function_name
):
    calls = []
    _fake_bench_module(monkeypatch, module_name, function_name, calls)
    monkeypatch.setattr("ddtree_bench.cuda.loader.gpu_unavailable_reason", lambda: None)  # a GPU "here"
    out = tmp_path / "results" / "bench.parquet"
    argv = ["bench", "--builder", builder, "--trace", trace_path, "--budget", 8, "--batch", 4]
    code, stdout, err = run([*argv, "--warmup", 1, "--repeats", 5, "--machine", "m1", "-o", out], capsys)
    assert code == 0, err
    (job,) = calls
    assert (job.builder, str(job.trace_path), job.budget, job.batch) == (builder, str(trace_path), 8, 4)
    assert job.timing == {
        "warmup": 1,
        "repeats": 5,
        "min_seconds": 0.05,  # the workflow's timing defaults where not given
        "max_seconds": 1.0,
        "min_repeats": 3,
        "max_repeats": 500,
    }
    assert (job.machine, job.distribution, job.builder_options) == ("m1", "bf16", {})  # bf16: the trace's
    # the timing job's defaults (stages.timing_job)
    assert (job.correct, job.input_columns, job.job, job.in_situ) == (None, "trace", 1, False)
    frame = pd.read_parquet(out)
    assert list(frame["phase"]) == ["warmup", "timed"] and list(frame["job"]) == [1, 1]
    assert "1.0 us per tree" in stdout


def test_bench_failure_leaves_no_parquet(tmp_path, trace_path, capsys, monkeypatch):
    def failing(job):
        raise ValueError("batch 64 is larger than the 5 requests in trace x")

    monkeypatch.setattr("ddtree_bench.stages.build.run_benchmark", failing)
    out = tmp_path / "bench.parquet"
    argv = [
        "bench",
        "--builder",
        "reference",
        "--trace",
        trace_path,
        "--budget",
        8,
        "--batch",
        64,
        "-o",
        out,
    ]
    code, _, err = run(argv, capsys)
    assert_one_line_error(code, err, "batch 64 is larger")
    assert not out.exists()
    code, _, err = run([*argv[:-2], "--min-seconds", "-1", "-o", out], capsys)
    assert_one_line_error(code, err, "--min-seconds")


def test_bench_timing_defaults_are_the_workflows(tmp_path, trace_path, capsys, monkeypatch):
    calls = []
    _fake_bench_module(monkeypatch, "ddtree_bench.stages.build", "run_benchmark", calls)
    out = tmp_path / "bench.parquet"
    argv = ["bench", "--builder", "reference", "--trace", trace_path, "--budget", 4, "--batch", 2, "-o", out]
    assert run([*argv, "--max-seconds", "2.5", "--max-repeats", "50"], capsys)[0] == 0
    assert calls[-1].timing["max_seconds"] == 2.5 and calls[-1].timing["max_repeats"] == 50
    assert run([*argv, "--distribution", "peaked"], capsys)[0] == 0
    assert calls[-1].distribution == "peaked"
    timing = load_config(ROOT / "config" / "config.yaml")["timing"]
    assert calls[-1].timing == {key: timing[key] for key in TIMING_KEYS}
    code, help_text, _ = run(["bench", "--help"], capsys)
    help_text = " ".join(help_text.split())
    assert f"warm-up calls (default {timing['warmup']})" in help_text
    assert f"timed calls, at least (default {timing['repeats']})" in help_text


@pytest.mark.skipif(
    importlib.util.find_spec("ddtree_bench.stages.build") is None,
    reason="ddtree_bench/stages/build.py does not exist yet",
)
def test_bench_end_to_end_with_the_real_benchmark(tmp_path, trace_path, capsys):
    out = tmp_path / "bench.parquet"
    argv = ["bench", "--builder", "reference", "--trace", trace_path, "--budget", 8, "--batch", 2]
    code, _, err = run([*argv, "--warmup", 1, "--repeats", 3, "--machine", "test-machine", "-o", out], capsys)
    assert code == 0, err
    frame = pd.read_parquet(out)
    for column in ("builder", "budget", "batch", "depth", "topk", "distribution", "repetition", "seconds"):
        assert column in frame.columns
    assert set(frame["builder"]) == {"reference"}
    assert (frame["budget"] == 8).all() and (frame["batch"] == 2).all()
    assert (frame.loc[frame["phase"] == "timed", "repetition"].nunique()) >= 3
    assert set(frame["distribution"]) == {"bf16"}
    assert set(frame["machine"]) == {"test-machine"}


# ----------------------------------------------------------------------------------------- honest CLI


def test_version(capsys):
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.strip() == f"ddtree-bench {__version__}"


@pytest.mark.parametrize("command", ["build", "check", "bench"])
@pytest.mark.parametrize(("builder", "takes"), [("reference", "it takes no options"), ("native", "threads")])
def test_an_option_a_builder_does_not_take_is_one_line_exit_2(
    trace_path, tmp_path, capsys, command, builder, takes
):
    argv = [command, "--builder", builder, "--trace", trace_path, "--budget", 4, "--batch", 2]
    argv += ["--builder-option", "foo=bar", "-o", tmp_path / "out"]
    code, _, err = run(argv, capsys)
    assert_one_line_error(code, err, f"builder {builder} takes no option 'foo'", takes)
    assert not (tmp_path / "out").exists()


def test_help_texts_say_what_the_commands_do(capsys):
    code, out, _ = run(["bench", "--help"], capsys)
    assert code == 0
    assert "first b requests (required)" in " ".join(out.split())  # bench needs --batch: no "default: all"
    code, out, _ = run(["build", "--help"], capsys)
    assert "first b requests (default: all)" in " ".join(out.split())
    code, out, _ = run(["trace", "--help"], capsys)
    assert "cpu (default: bit-identical traces on every machine)" in " ".join(out.split())
    code, out, _ = run(["--help"], capsys)
    assert "report" in out


def test_trace_prints_its_sha256(tmp_path, capsys):
    argv = [
        "trace",
        "--distribution",
        "uniform",
        "--requests",
        2,
        "--depth",
        2,
        "--topk",
        4,
        "--vocab-size",
        V,
    ]
    code, out, _ = run([*argv, "-o", tmp_path / "t.npz"], capsys)
    assert code == 0 and out.strip().endswith(f"sha256 {load_trace(tmp_path / 't.npz').sha256}")


PUBLISHED = Path(__file__).resolve().parents[1] / "results" / "published" / "h200"


def test_report_renders_published_results_without_running_anything(tmp_path, capsys, monkeypatch):
    # one render for both: the report's files, and its progress lines on stderr while it renders
    monkeypatch.setattr("ddtree_bench.cli.PROGRESS_SECONDS", 0.05)  # a line every 50 ms, for the test
    out = tmp_path / "report"
    code, stdout, err = run(["report", "--results", PUBLISHED, "-o", out], capsys)
    assert code == 0, err
    assert f"{out / 'index.html'}" in stdout  # the result line stays on stdout
    html = (out / "index.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "h200" in html
    assert (out / "summary.md").read_text().startswith("# ddtree-bench report")
    assert sorted(p.name for p in (out / "figures").iterdir()) == sorted(
        f"{name}.png" for name in FIGURE_NAMES
    )
    lines = err.strip().splitlines()
    assert lines, "no progress line"
    assert all(
        re.fullmatch(rf"ddtree-bench: report: rendering {out} from {PUBLISHED}: \d+ s", x) for x in lines
    ), lines


def _stale_copy(tmp_path, **config_changes) -> Path:
    folder = tmp_path / "h200"
    folder.mkdir()
    for name in ("summary.parquet", "tree_shape.parquet", "environment.json"):
        (folder / name).write_bytes((PUBLISHED / name).read_bytes())
    environment = json.loads((folder / "environment.json").read_text())
    environment["config"].update(config_changes)
    (folder / "environment.json").write_text(json.dumps(environment))
    return folder


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"distributions": ["peaked"]}, "holds rows of distribution 'drafter', which is not among"),
        (
            {"budgets": [8, 12, 16, 32, 64, 128, 256, 512, 1024]},
            "lacks builder sglang's rows for drafter L=16 N=12",
        ),
        ({"batch_sizes": [1, 8, 64]}, "lacks builder sglang's rows for drafter L=16 N=8 B=8"),
        ({"depths": [8]}, "holds rows of depth 16, which is not among the configured depths [8]"),
        ({"builders": ["reference", "native", "native-mt", "gpu"]}, "holds rows of builder 'sglang'"),
    ],
)
def test_report_refuses_a_summary_that_does_not_match_its_configuration(tmp_path, capsys, changes, needle):
    folder = _stale_copy(tmp_path, **changes)
    out = tmp_path / "report"
    code, _, err = run(["report", "--results", folder, "-o", out], capsys)
    assert_one_line_error(code, err, needle, "stale" if "holds rows" in needle else "rerun")
    assert not out.exists()  # nothing written


def test_report_names_a_folder_without_a_summary(tmp_path, capsys):
    code, _, err = run(["report", "--results", tmp_path, "-o", tmp_path / "r"], capsys)
    assert_one_line_error(code, err, f"--results {tmp_path}: no summary.parquet")


# ----------------------------------------------------------------------------------------- what a user types


def test_budget_distribution_must_be_one_the_results_hold(tmp_path, capsys):
    code, stdout, err = run(["budget", PUBLISHED, "--distribution", "zzz"], capsys)
    assert_one_line_error(
        code, err, "--distribution 'zzz'", "no tree-build rows of it; choose one of drafter"
    )
    assert stdout == ""


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--depth", "99"], ["--depth 99: not among the configured depths", "choose one of 16"]),
        (["--distribution", "zzz"], ["--distribution zzz", "choose one of drafter"]),
    ],
)
def test_report_depth_and_distribution_must_be_configured_ones(tmp_path, capsys, args, needles):
    out = tmp_path / "report"
    code, _, err = run(["report", "--results", PUBLISHED, *args, "-o", out], capsys)
    assert_one_line_error(code, err, *needles)
    assert not out.exists()


def test_report_blames_published_for_a_missing_published_folder(tmp_path, capsys):
    out = tmp_path / "report"
    missing = tmp_path / "nope"
    code, _, err = run(["report", "--results", PUBLISHED, "--published", missing, "-o", out], capsys)
    assert_one_line_error(code, err, f"--published {missing}: no such folder")
    assert "--results" not in err and not out.exists()


@pytest.mark.parametrize("threads", ["0", "-3"])
def test_trace_threads_must_be_at_least_one(tmp_path, capsys, threads):
    out = tmp_path / "t.npz"
    code, _, err = run(["trace", *TRACE_ARGS, "--threads", threads, "-o", out], capsys)
    assert_one_line_error(code, err, f"--threads must be an integer >= 1, got {threads}")
    assert not out.exists()


@pytest.mark.parametrize("command", ["build", "check", "bench"])
def test_a_budget_above_the_traces_k_is_refused(tmp_path, trace_path, capsys, command):
    out = tmp_path / "out" / "result"
    argv = [command, "--builder", "reference", "--trace", trace_path, "--budget", 16, "--batch", 2, "-o", out]
    code, _, err = run(argv, capsys)
    assert_one_line_error(code, err, "--budget 16 is above the 8 top-K columns of trace", "--topk")
    assert not out.parent.exists()


def test_a_token_id_above_the_vocabulary_is_refused(tmp_path, trace_path, capsys):
    trace = load_trace(trace_path)  # generated with --vocab-size 512, which it records
    ids = trace.top_token_ids.copy()
    ids[1, 2, 3] = V + 7
    edited = tmp_path / "edited.npz"
    save_trace(edited, trace.top_log_probs, ids, **{k: v for k, v in trace.metadata.items() if k != "sha256"})
    out = tmp_path / "out" / "trees.npz"
    argv = ["build", "--builder", "reference", "--trace", edited, "--budget", 8, "-o", out]
    code, _, err = run(argv, capsys)
    assert_one_line_error(code, err, f"token id {V + 7} at (1, 2, 3), not below the vocabulary size {V}")
    assert not out.parent.exists()
    # importing a recorded file: against --vocab-size where given
    code, _, err = run(["trace", "--recorded", trace_path, "--vocab-size", 100, "-o", out], capsys)
    assert_one_line_error(code, err, "not below the vocabulary size 100")
    assert not out.parent.exists()


def _unwritable(tmp_path) -> Path:
    """A path no file can be written at: under a regular file (as unwritable for root as for anyone)."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    return blocker / "out" / "result"


@pytest.mark.parametrize(
    "argv",
    [
        ["trace", *TRACE_ARGS],
        ["build", "--builder", "reference", "--budget", 4],
        ["check", "--builder", "reference", "--budget", 4],
        ["bench", "--builder", "reference", "--budget", 4, "--batch", 2],
        ["calibrate", "--tau", "4:4.0", "8:4.6", "--depth", "6", "--requests", "16", "--iterations", "10"],
        ["report", "--results", PUBLISHED],
    ],
    ids=lambda argv: argv[0],
)
def test_an_unwritable_output_fails_before_any_work(tmp_path, trace_path, capsys, argv):
    out = _unwritable(tmp_path)
    if argv[0] in ("build", "check", "bench"):
        argv = [*argv, "--trace", trace_path]
    code, stdout, err = run([*argv, "-o", out], capsys)
    assert_one_line_error(code, err, f"-o/--output {out}", "blocker is not a folder")
    assert stdout == ""  # nothing ran: no progress, no result line


def test_budget_without_step_stages_refuses_in_one_line_saying_why_and_what_would_produce_them(
    tmp_path, capsys
):
    folder = tmp_path / "smoke"  # tree-build results without step stages, as a machine without a GPU has
    folder.mkdir()
    for name in ("summary.parquet", "tree_shape.parquet", "environment.json"):
        (folder / name).write_bytes((PUBLISHED / name).read_bytes())
    code, stdout, err = run(["budget", folder], capsys)
    assert_one_line_error(
        code,
        err,
        f"{folder}: no modelled tokens/s: it has no GPU step stages (no step_summary.parquet",
        "step.enabled: true",
        "CUDA GPU",
        "ddtree-bench budget results/published/h200",
    )
    assert stdout == ""  # no partial model: no tokens/s of another machine's terms
    # the same folder with the step stages' summary models its own tokens/s
    (folder / "step_summary.parquet").write_bytes((PUBLISHED / "step_summary.parquet").read_bytes())
    code, stdout, err = run(["budget", folder], capsys)
    assert code == 0, err
    assert "Best budget per builder:" in stdout and "| B | builder |" in stdout


def test_calibrate_prints_progress_on_stderr(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("ddtree_bench.cli.PROGRESS_SECONDS", 0.0)  # every evaluation, for the test
    out = tmp_path / "fit.yaml"
    args = ["calibrate", "--tau", "4:4.0", "8:4.6", "--depth", "6", "--requests", "16", "--iterations", "5"]
    code, stdout, err = run([*args, "--vocab-size", "1024", "-o", out], capsys)
    assert code == 0, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("ddtree-bench: calibrate: fitting to 2 budgets (16 requests")
    assert len(lines) > 3 and all(line.startswith("ddtree-bench: calibrate: run ") for line in lines[1:])
    assert "run 2/2" in lines[-1] and "best loss" in lines[-1]
    assert "worst residual" in stdout


def test_a_quick_report_refusal_is_still_one_line(tmp_path, capsys, monkeypatch):
    """The progress lines come only after PROGRESS_SECONDS: a refusal before that stays one line."""
    monkeypatch.setattr("ddtree_bench.cli.PROGRESS_SECONDS", 60.0)
    folder = _stale_copy(tmp_path, distributions=["peaked"])
    code, _, err = run(["report", "--results", folder, "-o", tmp_path / "r"], capsys)
    assert_one_line_error(code, err, "holds rows of distribution 'drafter'")
    assert not (tmp_path / "r").exists()


# ----------------------------------------------------------------------------------------- workflow


def test_the_configfile_arguments_of_a_snakemake_command_line():
    args = ["-n", "--configfile", "a.yaml", "b.yaml", "--cores", "1", "--configfile=c.yaml", "--", "report"]
    assert configfile_arguments(args) == ["a.yaml", "b.yaml", "c.yaml"]
    assert configfile_arguments(["--configfiles", "d.yaml", "-n"]) == ["d.yaml"]
    assert configfile_arguments(["--cores", "1", "report"]) == []
    # given as one list (Snakemake keeps only the last of several), before the targets
    assert one_configfile_list(args) == [
        "-n",
        "--cores",
        "1",
        "--configfiles",
        "a.yaml",
        "b.yaml",
        "c.yaml",
        "--",
        "report",
    ]
    assert one_configfile_list(["report", "--configfile", "a.yaml", "-n", "--configfile", "b.yaml"]) == [
        "report",
        "-n",
        "--configfiles",
        "a.yaml",
        "b.yaml",
    ]
    assert one_configfile_list(["--configfile", "a.yaml", "--", "report"]) == [
        "--configfile",
        "a.yaml",
        "--",
        "report",
    ]


def test_workflow_names_the_file_and_line_of_a_yaml_error_and_runs_nothing(tmp_path, capsys, monkeypatch):
    """Snakemake itself says only "Config file is not valid JSON or YAML" (it reads --configfile before the
    Snakefile runs, so the workflow cannot say more); ``ddtree-bench workflow`` reads the files first."""
    from ddtree_bench.supervise import Outcome  # noqa: PLC0415

    started = []
    monkeypatch.setattr(
        "ddtree_bench.supervise.run", lambda argv, workdir=None: started.append(argv) or Outcome(0)
    )
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("budgets: [8, 16]\n")
    bad.write_text("budgets: [8, 16\nseed: 1\n")
    code, stdout, err = run(
        ["workflow", "-n", "--cores", "1", "--configfile", good, bad, "--", "report"], capsys
    )
    assert_one_line_error(code, err, f"config {bad}: not valid YAML at line 2, column 5")
    assert not started and stdout == ""
    code, _, err = run(["workflow", "-n", "--configfile", tmp_path / "missing.yaml"], capsys)
    assert_one_line_error(code, err, f"config {tmp_path / 'missing.yaml'}: cannot read it")
    twice = tmp_path / "twice.yaml"
    twice.write_text("budgets: [8]\nstep:\n  layers: 3\n  layers: 4\n")
    code, _, err = run(["workflow", "-n", "--configfile", twice], capsys)
    assert_one_line_error(code, err, f"config {twice}: line 4: key 'layers' is given twice (first at line 3)")
    assert not started
    # good files: snakemake runs with the arguments exactly as given, and its exit status is the command's
    code, _, err = run(["workflow", "-n", "--cores", "1", "--configfile", good, "--", "report"], capsys)
    assert code == 0, err
    (argv,) = started
    assert Path(argv[0]).name == "snakemake"
    assert argv[1:] == ["-n", "--cores", "1", "--configfile", str(good), "--", "report"]


def test_workflow_runs_snakemake_and_snakemake_alone_does_not_name_the_file(tmp_path):
    work = workdir_copy(tmp_path)
    (work / "bad.yaml").write_text("budgets: [8, 16\nseed: 1\n")
    alone = snakemake(work, "-n", "--cores", "1", "--configfile", "bad.yaml")
    assert alone.returncode != 0 and "bad.yaml" not in alone.stdout + alone.stderr  # why the wrapper exists
    command = [sys.executable, "-m", "ddtree_bench.cli", "workflow", "-n", "--cores", "1"]
    wrapped = subprocess.run([*command, "--configfile", "bad.yaml"], cwd=work, capture_output=True, text=True)
    assert wrapped.returncode == 2
    assert wrapped.stderr.strip() == (
        "ddtree-bench: error: config bad.yaml: not valid YAML at line 2, column 5: "
        "while parsing a flow sequence: expected ',' or ']', but got ':'"
    )
    dry = subprocess.run(
        [*command, "--configfile", "config/smoke.yaml", "--", "report"],
        cwd=work,
        capture_output=True,
        text=True,
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "rule bench:" in dry.stdout + dry.stderr and not (work / "results").exists()


def test_sglang_asked_for_by_name_where_it_cannot_run_is_one_line_exit_2(tmp_path, trace_path, capsys):
    reason = get_builder("sglang").unavailable_reason()
    if reason is None:
        pytest.skip("SGLang's DDTree builder can run here")
    for argv in (
        ["bench", "--builder", "sglang", "--batch", 2],
        ["check", "--builder", "sglang"],
        ["check", "--builder", "reference", "--against", "sglang"],
    ):
        out = tmp_path / "out" / "result"
        code, stdout, err = run([*argv, "--trace", trace_path, "--budget", 8, "-o", out], capsys)
        assert_one_line_error(code, err, "sglang is unavailable here", " ".join(reason.split())[:40])
        assert not out.parent.exists() and stdout == ""


# ----------------------------------------------------------------------------------------- the README


README = (ROOT / "README.md").read_text()


def test_the_readmes_render_command_shows_every_published_run():
    # the marked one is run and compared byte for byte in tests/report/test_published_snapshot.py
    text = " ".join(README.replace("\\\n", " ").split())
    published = sorted(p.name for p in (ROOT / "results" / "published").iterdir() if p.is_dir())
    command = text[text.index("ddtree-bench report --results results/published/h200") :].split(" -o ")[0]
    for name in published:
        assert f"results/published/{name}" in command, name
    assert "ddtree-bench report --results results/published/h200 -o" not in text  # none without them


def test_the_readmes_first_screen_holds_the_answer_the_commands_and_the_words():
    """A user reads the question, the answer and the two commands in the first 60 lines, each term defined
    where it is first used, in a README of at most 250 lines."""
    lines = README.splitlines()
    assert len(lines) <= 250, len(lines)
    first = " ".join(" ".join(lines[:60]).split())
    assert "| batch B, prefix S |" in first and "tokens/s" in first
    assert "make report" in first and "make test" in first
    for word in ("DDTree", "DFlash", "budget", "accept", "FA3", "chain", "tokens/s", "tau", "round"):
        assert f"**{word}**" in first, word


# -------------------------------------------------------------------------- bad input that once got through


@pytest.mark.parametrize("name", ["notes.txt", "notes.npz"])
@pytest.mark.parametrize("command", ["build", "check", "bench", "trace"])
def test_a_text_file_given_as_a_trace_is_one_line_naming_it(tmp_path, capsys, command, name):
    """Before: numpy's "This file contains pickled (object) data ..." for every command that takes a trace."""
    text = tmp_path / name
    text.write_text("top_log_probs, top_token_ids\n-0.1, 42\n")
    out = tmp_path / "out" / "result"
    trace = ["--recorded", text] if command == "trace" else ["--builder", "reference", "--trace", text]
    budget = [] if command == "trace" else ["--budget", 4, "--batch", 1]
    if command in ("build", "check"):
        budget = budget[:2]
    code, stdout, err = run([command, *trace, *budget, "-o", out], capsys)
    assert_one_line_error(
        code,
        err,
        f"trace {text}: not an .npz trace (not a zip archive; a trace is an .npz of top_log_probs and "
        "top_token_ids, as `ddtree-bench trace` writes)",
    )
    assert "pickle" not in err and stdout == ""
    assert not out.parent.exists()


@pytest.mark.parametrize("value", ["-1", "0", "-0", "nan", "inf"])
def test_budget_bandwidth_says_the_same_rule_for_every_value_it_refuses(tmp_path, capsys, value):
    """Before: "must be a finite number >= 0" for -1 but "> 0" for 0 (the configuration's rule)."""
    code, stdout, err = run(["budget", PUBLISHED, "--bandwidth-tbps", value], capsys)
    assert_one_line_error(code, err, f"argument --bandwidth-tbps: must be a finite number > 0, got '{value}'")
    assert stdout == ""
    fragment = tmp_path / "what-if.yaml"  # the same setting from a config fragment: the same rule
    fragment.write_text("throughput:\n  what_if:\n    bandwidth_tbps: 0\n")
    code, stdout, err = run(["budget", PUBLISHED, "--configfile", fragment], capsys)
    assert_one_line_error(
        code, err, "throughput.what_if.bandwidth_tbps: 0 is less than or equal to the minimum of 0"
    )
    assert stdout == ""


def test_report_refuses_a_published_answer_that_names_no_published_folder(tmp_path, capsys):
    out = tmp_path / "report"
    code, _, err = run(
        ["report", "--results", PUBLISHED, "--published", PUBLISHED.parent / "h200-sglang"]
        + ["--published-answer", "h100", "-o", out],
        capsys,
    )
    assert_one_line_error(code, err, "--published-answer h100: not the folder name of any --published folder")
    assert "(h200-sglang)" in err and not out.exists()
