"""The Snakemake workflow: lint and formatting, the smoke configuration end to end, timing jobs that never
overlap, adding a budget scheduling only that budget's jobs (plus the summary and the report), and the step
stages (verify attention, tree accept, peaks) planned where a GPU is and left out with a reason where none
is."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import yaml
from fake_compiler import FakeCompiler
from packaging.requirements import Requirement
from workflow_copy import BIN, ROOT, ddtree_bench_workflow, error_lines, pretend_gpu, snakemake, workdir_copy

from ddtree_bench.cuda.loader import find_nvcc, gpu_unavailable_reason
from ddtree_bench.report import FIGURE_NAMES
from ddtree_bench.settings import Settings
from ddtree_bench.traces import trace_sha256

SNAKEFMT = shutil.which("snakefmt", path=str(BIN)) or "snakefmt"
TIMING_RULES = {"bench", "step_attention", "step_accept", "step_peaks"}
STEP_RULES = {"step_attention", "step_accept", "step_peaks"}
#: The rest of the round's rules: one job per (batch, prefix) or batch measures every budget.
ROUND_RULES = {"step_model", "step_draft", "step_allreduce", "step_round"}
#: Every step stage's file of rows saying why, where no GPU is (workflow/rules/common.smk STEP_STAGES).
UNAVAILABLE_STAGES = ("attention", "accept", "peaks", "model", "draft", "allreduce", "round")


def smoke_config() -> dict:
    return yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())


def jobs_of(output: str) -> list[dict]:
    """The jobs a Snakemake run or dry run prints: rule, jobid, outputs, resources, threads (in order)."""
    jobs, job = [], None
    for line in output.splitlines():
        match = re.match(r"^(?:local)?rule (\S+):$", line)
        if match:
            job = {"rule": match.group(1), "output": [], "resources": "", "threads": 1, "jobid": None}
            jobs.append(job)
            continue
        if job is None or not line.startswith("    "):
            continue
        key, _, value = line.strip().partition(": ")
        if key == "output":
            job["output"] = [v.strip() for v in value.split(",")]
        elif key == "jobid":
            job["jobid"] = int(value)
        elif key == "resources":
            job["resources"] = value
        elif key == "threads":
            job["threads"] = int(value)
    return jobs


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """The smoke configuration run for real in a copy of the workflow, on 2 cores."""
    work = workdir_copy(tmp_path_factory.mktemp("smoke"))
    start = time.monotonic()
    result = snakemake(work, "--cores", "2", "--configfile", "config/smoke.yaml", "--", "report")
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return work, result, elapsed


def test_snakefmt_formatted():
    result = subprocess.run(
        [SNAKEFMT, "--check", "Snakefile", "workflow/rules"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_snakemake_lint_is_clean(tmp_path):
    work = workdir_copy(tmp_path)
    result = snakemake(work, "--lint", "--cores", "1", "-n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (work / "results").exists()


def _bench_per_builder(jobs: list[dict]) -> dict[str, int]:
    per_builder: dict[str, int] = {}
    for job in jobs:
        if job["rule"] == "bench":
            builder = job["output"][0].split("/")[3]
            per_builder[builder] = per_builder.get(builder, 0) + 1
    return per_builder


def test_dry_run_of_the_default_configuration(tmp_path):
    """The default is CPU-sized: the published H200 run's tree-build grid (8 budgets, batch 1 and 64, depth
    16, the drafter trace), each CPU configuration timed by timing.jobs (3) jobs."""
    work = workdir_copy(tmp_path)
    result = snakemake(work, "-n", "--cores", "4", "report")
    assert result.returncode == 0, result.stderr
    jobs = jobs_of(result.stdout + result.stderr)
    rules = [job["rule"] for job in jobs]
    assert rules.count("trace") == 2  # the drafter's at depth 16, and the k2.6 profile's
    assert rules.count("build_native") == 1
    bench = [job for job in jobs if job["rule"] == "bench"]
    assert bench and all("timing_slot=1" in job["resources"] for job in bench)
    assert all(job["threads"] == min(4, len(_cpus())) for job in bench)  # the whole machine Snakemake has
    # one rule for every builder: the gpu builder's jobs take the GPU, the others none
    assert all(("gpu=1" in job["resources"]) == ("/bench/gpu/" in job["output"][0]) for job in bench)
    assert _bench_per_builder(jobs)["reference"] == 8 * 2 * 1 * 1 * 3
    names = {Path(job["output"][0]).name for job in bench if "/bench/reference/" in job["output"][0]}
    assert {f"drafter-L16-N8-B1{suffix}.parquet" for suffix in ("", "-r2", "-r3")} <= names
    assert rules.count("aggregate_step") == 1

    if gpu_unavailable_reason() is not None:  # no GPU here: one file of rows saying why per step stage
        assert rules.count("step_unavailable") == len(UNAVAILABLE_STAGES)
        assert not (STEP_RULES | ROUND_RULES) & set(rules)
    assert not (work / "results").exists()


def test_dry_run_of_the_full_configuration(tmp_path):
    """config/full.yaml over the default: every budget 1-1024, batch 1-256, depth 16 and 8, three
    distributions, timing.jobs (3) jobs per CPU configuration."""
    work = workdir_copy(tmp_path)
    result = snakemake(work, "-n", "--cores", "4", "--configfile", "config/full.yaml", "--", "report")
    assert result.returncode == 0, result.stderr
    jobs = jobs_of(result.stdout + result.stderr)
    rules = [job["rule"] for job in jobs]
    assert rules.count("trace") == 7  # one per (distribution, depth), and the k2.6 profile's at depth 16
    # budgets x batch sizes x depths x distributions, each timed by timing.jobs (3) independent jobs
    per_builder = _bench_per_builder(jobs)
    assert per_builder["reference"] == per_builder["native"] == 11 * 4 * 2 * 3 * 3
    assert not (work / "results").exists()


def test_dry_run_plans_the_step_jobs_where_a_gpu_is(tmp_path):
    """Per (budget, batch, prefix, heads) one attention job, per (budget, batch) one accept job, one peaks job
    per machine; all timing jobs on the GPU, alone; their kernels built by build_fatbin."""
    work = workdir_copy(tmp_path)
    env = pretend_gpu(tmp_path)
    result = snakemake(work, "-n", "--cores", "4", "report", env=env)
    assert result.returncode == 0, result.stderr
    jobs = jobs_of(result.stdout + result.stderr)
    rules = [job["rule"] for job in jobs]
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    step = config["step"]
    budgets, batches = len(config["budgets"]), len(step["batch_sizes"])
    grid = len(step["attention"]["prefix_lengths"]) * len(step["attention"]["heads"])
    assert rules.count("step_attention") == budgets * batches * grid
    assert rules.count("step_accept") == budgets * batches
    assert rules.count("step_peaks") == 1
    assert "step_unavailable" not in rules
    timed = [job for job in jobs if job["rule"] in STEP_RULES]
    assert all("gpu=1" in job["resources"] and "timing_slot=1" in job["resources"] for job in timed)
    assert all(job["threads"] == min(4, len(_cpus())) for job in timed)
    attention = {job["output"][0] for job in jobs if job["rule"] == "step_attention"}
    # the first distribution and depth, every budget
    assert any(path.endswith("/step/attention/drafter-L16-N1024-B64-S32768-H8.parquet") for path in attention)
    fatbins = {Path(job["output"][0]).name for job in jobs if job["rule"] == "build_fatbin"}
    assert {"verify_attn.fatbin", "tree_accept.fatbin", "bench_util.fatbin"} <= fatbins


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"step": {"enabled": False}}, set()),
        ({"gpu": "off"}, {"step_unavailable"}),
    ],
    ids=["step-off", "gpu-off"],
)
def test_step_stages_off_or_without_gpu(tmp_path, override, expected):
    work = workdir_copy(tmp_path)
    config = smoke_config()
    for key, value in override.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    (work / "step.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(
        work, "-n", "--cores", "2", "--configfile", "step.yaml", "--", "report", env=pretend_gpu(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    rules = {job["rule"] for job in jobs_of(result.stdout + result.stderr)}
    assert not STEP_RULES & rules
    assert {"step_unavailable"} & rules == expected
    assert ("aggregate_step" in rules) == bool(expected)


def test_compile_without_gpu_false_leaves_the_kernels_out_only_where_no_gpu_is(tmp_path):
    """The smoke configuration sets compile_without_gpu: false: without a GPU no kernel is compiled (with
    true, every one is, wherever nvcc is); with a GPU they are compiled either way."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found: no kernel is compiled either way")
    work = workdir_copy(tmp_path)
    env = pretend_gpu(tmp_path)
    assert smoke_config()["compile_without_gpu"] is False
    fatbins = {}
    for name, args, environment in (
        ("smoke", (), None),
        ("smoke, true", ("--config", "compile_without_gpu=True"), None),
        ("smoke, a GPU", (), env),
    ):
        if environment is None and gpu_unavailable_reason() is None:
            continue  # a GPU is here
        result = snakemake(
            work,
            "-n",
            "--cores",
            "2",
            "--configfile",
            "config/smoke.yaml",
            *args,
            "--",
            "report",
            env=environment,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        jobs = jobs_of(result.stdout + result.stderr)
        fatbins[name] = {Path(job["output"][0]).name for job in jobs if job["rule"] == "build_fatbin"}
    kernels = {"tree_build.fatbin", "bench_util.fatbin", "verify_attn.fatbin", "tree_accept.fatbin"}
    assert fatbins.get("smoke", set()) == set()
    assert fatbins.get("smoke, true", kernels) == kernels
    assert fatbins["smoke, a GPU"] == kernels


def _cpus():
    return os.sched_getaffinity(0)


@pytest.mark.slow
def test_smoke_pipeline_end_to_end(smoke_run):
    work, result, elapsed = smoke_run
    results = work / "results" / "smoke"
    config = smoke_config()
    summary = pd.read_parquet(results / "summary.parquet")
    ok = summary[summary["status"] == "ok"]
    assert {"reference", "native"} <= set(ok["builder"])
    assert ok["correct"].all() and (ok["n"] > 0).all()
    grid = (
        len(config["budgets"])
        * len(config["batch_sizes"])
        * len(config["depths"])
        * len(config["distributions"])
    )
    jobs = config["timing"]["jobs"]
    for builder in set(ok["builder"]):
        wall = ok[(ok["builder"] == builder) & (ok["timing"] == "wall")]
        assert len(wall) == grid, builder
        files = list((results / "bench" / builder).glob("*-L*-N*-B*.parquet"))
        expected_jobs = 1 if builder == "gpu" else jobs  # each CPU configuration: timing.jobs jobs
        assert len(files) == grid * expected_jobs
        assert (wall["jobs"] == expected_jobs).all(), builder
        assert (wall["job_median_min_s"] <= wall["job_median_max_s"]).all()
        rows = pd.read_parquet(files[0])
        assert {"warmup", "timed"} == set(rows["phase"])
    for builder in set(config["builders"]) - set(ok["builder"]):  # sglang / gpu where they cannot run here
        row = summary[summary["builder"] == builder].iloc[0]
        assert row["status"] == "unavailable" and row["status_reason"]
    assert (results / "environment.json").is_file()
    shapes = pd.read_parquet(results / "tree_shape.parquet")
    assert set(shapes["budget"]) == set(config["budgets"])
    report = Path(work / config["report_dir"])
    page = (report / "index.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(FIGURE_NAMES)  # every figure, embedded
    markdown = (report / "summary.md").read_text()
    assert "## Acceptance per budget" in markdown and "paper tau (Fig. 3)" in markdown
    assert shapes["simulated_tau_mean"].notna().all() and shapes["simulated_tau_se"].notna().all()
    assert "| N | B |" in markdown and "reference (ours" in markdown
    assert "## Step-time breakdown" in markdown and "## Verify attention" in markdown
    step = pd.read_parquet(results / "step_summary.parquet")
    assert set(step["stage"]) == {
        "verify-attention",
        "accept",
        "peak",
        "forward",
        "moe",
        "dense",
        "lm-head",
        "draft",
        "allreduce",
        "round",
        "stack",
    }

    if gpu_unavailable_reason() is not None:
        assert set(step["status"]) == {"unavailable"} and step["status_reason"].notna().all()
        assert "unavailable: " in markdown
    assert shapes["expected_accept_mean"].notna().all()
    print(f"smoke pipeline: {elapsed:.1f} s")


@pytest.mark.slow
def test_timing_jobs_never_overlap_other_jobs(smoke_run):
    """With --cores 2, a timing job runs alone: nothing else was running when one started, and nothing
    started until it finished."""
    _, result, _ = smoke_run
    running: set[int] = set()
    rule_of: dict[int, str] = {}
    timing = TIMING_RULES
    lines = (result.stdout + result.stderr).splitlines()
    jobs = iter(jobs_of("\n".join(lines)))
    checked = 0
    for line in lines:
        if re.match(r"^(?:local)?rule \S+:$", line):
            job = next(jobs)
            started = job["rule"]
            # the jobid line follows; jobs_of has parsed it
            if started in timing:
                assert not running, f"timing job {job['output']} started beside {running}"
                checked += 1
            elif any(rule_of[j] in timing for j in running):
                raise AssertionError(f"{started} started beside a timing job")
            running.add(job["jobid"])
            rule_of[job["jobid"]] = started
        match = re.match(r"^Finished jobid: (\d+)", line)
        if match:
            running.discard(int(match.group(1)))
    assert checked > 0


@pytest.mark.slow
def test_adding_a_budget_schedules_only_that_budgets_jobs(smoke_run):
    work, _, _ = smoke_run
    config = smoke_config()
    new = 8
    assert new not in config["budgets"] and new < max(config["budgets"])  # the traces' K stays the same
    config["budgets"] = sorted(config["budgets"] + [new])
    (work / "more.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(work, "-n", "--cores", "2", "--configfile", "more.yaml", "--", "report")
    assert result.returncode == 0, result.stderr
    jobs = jobs_of(result.stdout + result.stderr)
    rules = {job["rule"] for job in jobs}
    assert rules <= {
        "bench",
        "check",
        "tree_shape",
        "step_attention",  # where a GPU is, the step jobs of the new budget too
        "step_accept",
        "aggregate",
        "aggregate_step",
        "render_report",
        "report",
    }, rules
    assert {"bench", "aggregate", "render_report", "report"} <= rules
    summaries = ("aggregate", "aggregate_step", "render_report", "report")
    per_budget = [job for job in jobs if job["rule"] not in summaries]
    assert per_budget and all(f"-N{new}" in job["output"][0] for job in per_budget), per_budget
    summary = pd.read_parquet(work / "results" / "smoke" / "summary.parquet")
    timed = set(summary.loc[summary["status"] == "ok", "builder"])
    grid = len(config["batch_sizes"]) * len(config["depths"]) * len(config["distributions"])
    per_config = {builder: 1 if builder == "gpu" else config["timing"]["jobs"] for builder in timed}
    assert sum(job["rule"] == "bench" for job in jobs) == sum(per_config.values()) * grid
    assert sum(job["rule"] == "check" for job in jobs) == (len(timed) - 1) * grid // len(
        config["batch_sizes"]
    )
    assert not (work / "results" / "smoke" / "bench" / "reference" / f"drafter-L4-N{new}-B1.parquet").exists()


@pytest.mark.slow
def test_nothing_to_do_after_a_complete_run(smoke_run):
    work, _, _ = smoke_run
    result = snakemake(work, "-n", "--cores", "2", "--configfile", "config/smoke.yaml", "--", "report")
    assert result.returncode == 0
    assert "Nothing to be done" in result.stdout + result.stderr


@pytest.mark.slow
def test_editing_the_native_source_reruns_what_depends_on_it(smoke_run):
    work, _, _ = smoke_run
    source = work / "kernels" / "native" / "tree_build_cpu.cpp"
    original = source.read_text()
    try:
        source.write_text(original + "\n// an edit\n")
        result = snakemake(work, "-n", "--cores", "2", "--configfile", "config/smoke.yaml", "--", "report")
        assert result.returncode == 0
        rules = {job["rule"] for job in jobs_of(result.stdout + result.stderr)}
        assert "build_native" in rules and "check" in rules and "bench" in rules
        assert "trace" not in rules and "tree_shape" not in rules
    finally:
        source.write_text(original)


def python_with_a_space(base: Path) -> Path | None:
    """This venv's Python, reached through a folder whose path has a space (``base/py env/bin/python``): its
    ``sys.executable`` has the space, as a clone's venv does in ``my runs/ddtree-bench``. None where this
    Python is not a venv's."""
    prefix = Path(sys.prefix)
    if not (prefix / "pyvenv.cfg").is_file():
        return None
    env = base / "py env"
    (env / "bin").mkdir(parents=True)
    shutil.copy2(prefix / "pyvenv.cfg", env / "pyvenv.cfg")
    for name in ("lib", "lib64"):
        if (prefix / name).is_dir():
            (env / name).symlink_to(prefix / name)
    (env / "bin" / "python").symlink_to(sys.executable)
    return env / "bin" / "python"


def test_a_script_job_runs_from_a_path_with_a_space(tmp_path):
    """Snakemake runs a script job as ``{python} {script:q}``, the Python's path unquoted
    (snakemake/snakemake#2645): from a clone whose path has a space every script job failed with exit status
    127. The workflow quotes it (workflow/rules/snakemake_fixes.smk): a trace job runs."""
    python = python_with_a_space(tmp_path)
    if python is None:
        pytest.skip("this Python is not a venv's")
    check = subprocess.run(
        [python, "-c", "import sys, snakemake; print(sys.executable)"], capture_output=True
    )
    if check.returncode != 0:
        pytest.skip(f"the venv's Python does not run from another folder: {check.stderr[-300:]!r}")
    assert b" " in check.stdout
    (tmp_path / "my runs").mkdir()
    work = workdir_copy(tmp_path / "my runs")
    target = "results/smoke/traces/drafter-L4.npz"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [python, "-m", "snakemake", "--cores", "1", "--configfile", "config/smoke.yaml", "--", target],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "status 127" not in result.stderr and (work / target).is_file()


def test_configfiles_layer_over_the_default_in_order_and_none_is_dropped(tmp_path):
    """One layering rule: config/config.yaml, then every --configfile in order, then --config. Through
    ``ddtree-bench workflow`` (what make runs) a second --configfile adds to the first (smoke.yaml's machine
    stays); Snakemake alone would keep only the last, so there it is refused in one line, before any job."""
    work = workdir_copy(tmp_path)
    (work / "mine.yaml").write_text("budgets: [4]\n")
    args = ("-n", "--cores", "1", "--configfile", "config/smoke.yaml", "--configfile", "mine.yaml")
    wrapped = ddtree_bench_workflow(work, *args, "--config", "batch_sizes=[4]", "--", "report")
    assert wrapped.returncode == 0, wrapped.stderr[-3000:]
    outputs = [o for job in jobs_of(wrapped.stdout + wrapped.stderr) for o in job["output"]]
    bench = [o for o in outputs if "/bench/reference/" in o]
    assert bench and all(o.startswith("results/smoke/") for o in outputs)  # smoke.yaml's machine
    assert all("-N4-B4" in o for o in bench)  # mine.yaml's budgets, --config's batch sizes
    alone = snakemake(work, *args, "--", "report")
    assert alone.returncode == 2
    (line,) = error_lines(alone.stderr)
    assert line.startswith("config: --configfile: given 2 times: Snakemake keeps only the last, so ")
    assert "config/smoke.yaml would be dropped" in line and not (work / "results").exists()


def test_a_key_given_twice_in_a_configfile_is_one_line_naming_file_line_and_key(tmp_path):
    work = workdir_copy(tmp_path)
    (work / "twice.yaml").write_text("budgets: [4]\ntiming:\n  repeats: 3\n  warmup: 1\n  repeats: 5\n")
    result = snakemake(work, "-n", "--cores", "1", "--configfiles", "config/smoke.yaml", "twice.yaml")
    assert result.returncode == 2
    (line,) = error_lines(result.stderr)
    assert line == (
        f"config {work / 'twice.yaml'}: line 5: key 'repeats' is given twice (first at line 3); YAML would "
        "keep only the last one, silently"
    )


def test_another_compiler_or_version_rebuilds_the_kernels(tmp_path):
    """The workflow's compiled kernels carry their toolchain (the compiler, its --version, every flag) as a
    parameter: another version rebuilds them (and so reruns what they time); the same one rebuilds nothing."""
    work = workdir_copy(tmp_path)
    fake = FakeCompiler(tmp_path / "bin")
    env = {**os.environ, "NVCC": str(fake.path), "CXX": str(fake.path)}
    targets = ["results/smoke/build/libddtree_native.so", "results/smoke/build/tree_build.fatbin"]
    args = ("--cores", "1", "--configfile", "config/smoke.yaml", "--", *targets)
    built = snakemake(work, *args, env=env)
    assert built.returncode == 0, built.stderr[-3000:]
    assert (work / targets[0]).read_text().startswith("built by release 12.4 with -O3 -fPIC")
    planned = snakemake(work, "-n", *args, env=env)
    assert planned.returncode == 0 and not jobs_of(planned.stdout + planned.stderr)
    fake.version = "release 13.0"
    planned = snakemake(work, "-n", *args, env=env)
    assert planned.returncode == 0, planned.stderr[-3000:]
    jobs = jobs_of(planned.stdout + planned.stderr)
    assert sorted(job["rule"] for job in jobs) == ["build_fatbin", "build_native"]
    assert "Params have changed since last execution" in planned.stdout + planned.stderr
    fake.version = "release 12.4"
    planned = snakemake(work, "-n", *args, env=env)
    assert planned.returncode == 0 and not jobs_of(planned.stdout + planned.stderr)


@pytest.mark.slow
def test_a_tree_mismatch_fails_the_run_naming_request_and_field(tmp_path):
    """A native library that builds different trees (its child push moved one level up) fails the check job
    with one line naming the first differing request and field, and no timing of it is written."""
    work = workdir_copy(tmp_path)
    source = work / "kernels" / "native" / "tree_build_cpu.cpp"
    text = source.read_text()
    mutated, count = re.subn(r"if \(depth < L\)", "if (depth + 1 < L)", text)
    if count != 1:
        pytest.skip("the mutation point (the child push) is not in the native source any more")
    source.write_text(mutated)
    config = smoke_config()
    config.update(builders=["reference", "native"], budgets=[16], batch_sizes=[1], distributions=["bf16"])
    (work / "mismatch.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(work, "--cores", "1", "--configfile", "mismatch.yaml", "--", "report")
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("ddtree-bench: rule check:")]
    assert len(lines) == 1, result.stderr[-3000:]
    assert "TreeMismatch" in lines[0] and "request " in lines[0] and "field " in lines[0]
    assert not list((work / "results" / "smoke" / "bench" / "native").glob("*.parquet"))
    assert not list((work / "results" / "smoke" / "check" / "native").glob("*.json"))
    assert not (work / "results" / "smoke" / "summary.parquet").exists()


STUB_STEP = """
from ddtree_bench.io import write_frame
from ddtree_bench.timing.records import stage_frame

job = snakemake  # noqa: F821
w, common = job.wildcards, {"phase": "timed", "status": "ok", "machine": job.params.job.machine}
if job.rule in ("step_model", "step_draft", "step_allreduce", "step_round"):  # a file per budget
    stages = {"step_model": "forward", "step_draft": "draft", "step_allreduce": "allreduce"}
    stage = stages.get(job.rule, "round")
    for budget, path in zip(job.params.job.budgets, job.output):
        row = dict(common, stage=stage, impl="torch", batch=int(w.batch), budget=int(budget), seconds=1e-3)
        write_frame(stage_frame([row]), path)
    raise SystemExit(0)
if job.rule == "step_peaks":
    rows = [
        dict(common, stage="peak", impl="bf16-gemm", seconds=1e-3, flops=8e14 * 1e-3, timing="cuda-events"),
        dict(common, stage="peak", impl="device-copy", seconds=1e-3, bytes=4e12 * 1e-3, timing="cuda-events"),
        dict(common, stage="peak", impl="floor", seconds=8e-6, timing="cuda-events"),
    ]
else:
    grid = dict(common, batch=int(w.batch), budget=int(w.budget), depth=int(w.depth))
    grid.update(distribution=w.distribution)
    if job.rule == "step_attention":
        grid.update(stage="verify-attention", prefix=int(w.prefix), heads=int(w.heads), flops=1e9, bytes=1e9)
        impls = list(job.params.job.impls)
    else:
        grid.update(stage="accept", expected_accept_mean=1.0, accept_length_mean=2.0)
        impls = ["gpu-kernel", "floor"]
    rows = [dict(grid, impl=i, seconds=1e-4, timing="cuda-events", cache="warm", correct=True) for i in impls]
write_frame(stage_frame(rows), job.output[0])
"""
STUB_FATBIN = """
from pathlib import Path

for path in snakemake.output:  # noqa: F821
    Path(path).write_bytes(b"stub")
"""


@pytest.mark.slow
def test_adding_a_budget_schedules_only_its_step_jobs(tmp_path):
    """Where a GPU is: after a complete run (the GPU jobs' scripts are stubs here, writing rows of the stage
    format), adding a budget schedules that budget's attention, accept, timing and tree-shape jobs, and the
    summaries and the report; no other job, the peaks included."""
    work = workdir_copy(tmp_path)
    env = pretend_gpu(tmp_path)
    scripts = work / "workflow" / "scripts"
    (scripts / "stage.py").write_text(STUB_STEP)  # every step stage's rule runs this one script
    (scripts / "build_fatbin.py").write_text(STUB_FATBIN)
    config = smoke_config()
    config.update(builders=["reference"], distributions=["uniform"])
    config["step"]["budgets"] = None  # every configured budget
    (work / "base.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(work, "--cores", "2", "--configfile", "base.yaml", "--", "report", env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ran = {job["rule"] for job in jobs_of(result.stdout + result.stderr)}
    assert STEP_RULES <= ran and "step_unavailable" not in ran
    step = pd.read_parquet(work / "results" / "smoke" / "step_summary.parquet")
    assert set(step["budget"]) == {0, *config["budgets"]}  # the peaks have no budget
    markdown = (work / config["report_dir"] / "summary.md").read_text()
    assert "reference (ours, Python): build (share)" in markdown  # the breakdown has rows

    new = 8
    assert new not in config["budgets"] and new < max(config["budgets"])  # the traces' K stays the same
    config["budgets"] = sorted(config["budgets"] + [new])
    (work / "more.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(work, "-n", "--cores", "2", "--configfile", "more.yaml", "--", "report", env=env)
    assert result.returncode == 0, result.stderr
    jobs = jobs_of(result.stdout + result.stderr)
    summaries = ("aggregate", "aggregate_step", "render_report", "report")
    # the rest of the round's jobs measure every budget of their (batch, prefix): they run again, whole
    rounds = {"step_model", "step_draft", "step_allreduce"}
    assert {job["rule"] for job in jobs} == {
        "bench",
        "tree_shape",
        "step_attention",
        "step_accept",
        *rounds,
        *summaries,
    }
    assert all(
        any(f"-N{new}-" in path or f"/N{new}-" in path for path in job["output"])
        for job in jobs
        if job["rule"] in rounds
    )
    per_budget = [job for job in jobs if job["rule"] not in summaries and job["rule"] not in rounds]
    assert all(
        f"-N{new}-" in job["output"][0] or job["output"][0].endswith(f"-N{new}.json") for job in per_budget
    )

    step = Settings.from_config(config).step_options()
    batches = len(step["batch_sizes"])
    assert sum(job["rule"] == "step_accept" for job in jobs) == batches
    attention = batches * len(step["prefix_lengths"]) * len(step["heads"])
    assert sum(job["rule"] == "step_attention" for job in jobs) == attention


# ----------------------------------------------------------------------------------------- nothing stale


def _variant(work: Path, name: str, **changes) -> str:
    """A copy of the smoke configuration with ``changes``, written into the work folder; its file name."""
    config = smoke_config()
    config.update(changes)
    (work / f"{name}.yaml").write_text(yaml.safe_dump(config))
    return f"{name}.yaml"


def _planned(work: Path, configfile: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return snakemake(work, "-n", "--cores", "2", "--configfile", configfile, "--", "report", env=env)


def _copy_of(work: Path, tmp_path: Path) -> Path:
    """A copy of a finished run (results, Snakemake's metadata and mtimes kept), for tests that change it."""
    copy = tmp_path / "copy"
    shutil.copytree(work, copy, symlinks=True)
    return copy


@pytest.mark.slow
def test_rows_record_their_traces_sha256_and_the_run_names_its_report(smoke_run):
    work, result, _ = smoke_run
    results = work / "results" / "smoke"
    digests = {
        path.stem: trace_sha256(path) for path in (results / "traces").glob("*.npz")
    }  # e.g. "drafter-L4"
    summary = pd.read_parquet(results / "summary.parquet")
    ok = summary[summary["status"] == "ok"]
    assert ok["trace_sha256"].notna().all()
    for _, row in ok.iterrows():
        assert row["trace_sha256"] == digests[f"{row['distribution']}-L{row['depth']}"]
    shapes = pd.read_parquet(results / "tree_shape.parquet")
    assert set(shapes["trace_sha256"]) == set(digests.values())
    check = json.loads(next((results / "check").glob("*/drafter-L4-N4.json")).read_text())
    assert check["trace_sha256"] == digests["drafter-L4"]
    config = smoke_config()
    assert f"ddtree-bench: report: {config['report_dir']}/index.html" in result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "changes",
    [
        {"distributions": ["drafter", "bf16"]},
        {"depths": [4, 3]},
        {"batch_sizes": [4]},  # the largest stays: the traces keep their requests
        {"builders": ["reference", "native"]},
    ],
    ids=["distributions", "depths", "batch_sizes", "builders"],
)
def test_changing_the_grid_reruns_the_aggregation_and_the_report(smoke_run, changes):
    work, _, _ = smoke_run
    result = _planned(work, _variant(work, "grid", **changes))
    assert result.returncode == 0, result.stderr
    rules = {job["rule"] for job in jobs_of(result.stdout + result.stderr)}
    assert {"aggregate", "render_report"} <= rules, rules
    traces = {job["output"][0] for job in jobs_of(result.stdout + result.stderr) if job["rule"] == "trace"}
    if "depths" not in changes:  # the traces of the configured distributions and depths stand
        assert traces <= {"results/smoke/traces/bf16-L4.npz"}, traces


@pytest.mark.slow
def test_a_new_budget_up_to_topk_regenerates_no_trace(smoke_run):
    work, _, _ = smoke_run
    config = smoke_config()
    new = config["topk"]
    assert new > max(config["budgets"])  # above every budget so far, within the fixed K
    result = _planned(work, _variant(work, "wider", budgets=[*config["budgets"], new]))
    assert result.returncode == 0, result.stderr
    jobs = jobs_of(result.stdout + result.stderr)
    rules = {job["rule"] for job in jobs}
    assert "trace" not in rules and "trace_recorded" not in rules, rules
    assert "bench" in rules and {"aggregate", "render_report"} <= rules
    timing = [job for job in jobs if job["rule"] in ("bench", "check", "tree_shape")]
    assert timing and all(f"-N{new}" in job["output"][0] for job in timing)


@pytest.mark.slow
def test_a_budget_above_topk_is_one_line_in_the_dry_run(smoke_run):
    work, _, _ = smoke_run
    config = smoke_config()
    above = 2 * config["topk"]
    result = _planned(work, _variant(work, "above", budgets=[*config["budgets"], above]))
    assert result.returncode == 2
    output = result.stdout + result.stderr
    message = (
        f"config: budgets: {above} is above topk ({config['topk']}), the traces' K: it needs a larger topk"
    )
    assert message in output
    assert not jobs_of(output)


@pytest.mark.slow
def test_a_wrong_recorded_trace_on_existing_results_stops_the_run(smoke_run, tmp_path):
    """Before: a missing recorded_trace on a results folder that had one exited 0 and reported old numbers."""
    work = _copy_of(smoke_run[0], tmp_path)
    distributions = [*smoke_config()["distributions"], "recorded"]
    missing = _variant(work, "missing", distributions=distributions, recorded_trace="no/such.npz")
    result = snakemake(work, "--cores", "1", "--configfile", missing, "--", "report")
    assert result.returncode == 2
    assert "config: recorded_trace: no/such.npz: file not found" in result.stdout + result.stderr
    (work / "text.npz").write_text("not a trace")
    invalid = _variant(work, "invalid", distributions=distributions, recorded_trace="text.npz")
    result = _planned(work, invalid)
    assert result.returncode == 2
    assert (
        "config: recorded_trace: text.npz: not an .npz trace (not a zip archive"
        in result.stdout + result.stderr
    )


@pytest.mark.slow
def test_the_report_refuses_a_summary_that_does_not_match_the_configuration(smoke_run, tmp_path):
    work = _copy_of(smoke_run[0], tmp_path)
    summary_path = work / "results" / "smoke" / "summary.parquet"
    summary = pd.read_parquet(summary_path)
    kept = summary[summary["budget"] != 4]  # a summary of an earlier configuration
    kept.to_parquet(summary_path, index=False)  # newer than the report: the report rule runs on it
    result = snakemake(work, "--cores", "1", "--configfile", "config/smoke.yaml", "--", "report")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "lacks builder reference's rows for drafter L=4 N=4 B=1" in output, output[-3000:]


@pytest.mark.slow
def test_snakemakes_own_report_holds_the_marked_outputs(smoke_run, tmp_path):
    work, _, _ = smoke_run
    archive = tmp_path / "snakemake-report.zip"
    result = snakemake(work, "--cores", "1", "--configfile", "config/smoke.yaml", "--report", str(archive))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    names = zipfile.ZipFile(archive).namelist()
    # the archive keeps each marked output under data/raw/<hash>/<its file name>
    stored = {Path(name).name for name in names if "/data/raw/" in name}
    marked = {
        "summary.parquet",
        "environment.json",
        "step_summary.parquet",
        "index.html",
        "summary.md",
        *(
            f"{name}.png"
            for name in ("time_vs_budget", "time_vs_batch", "speedup", "tree_shape", "step_share")
        ),
    }
    assert marked <= stored, (sorted(marked - stored), sorted(stored))
    assert any(name.endswith("report.html") for name in names)


def test_setup_installs_what_snakemakes_own_report_needs():
    """``make setup`` installs the package's dependencies; ``snakemake --report`` needs snakemake's
    ``reports`` extra (pygments) on top of snakemake's own."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    requirements = [Requirement(text) for text in pyproject["project"]["dependencies"]]
    requirements = {requirement.name: requirement for requirement in requirements}
    assert "reports" in requirements["snakemake"].extras
    extra = [Requirement(text) for text in importlib.metadata.requires("snakemake") or ()]
    extra = [r for r in extra if r.marker is not None and r.marker.evaluate({"extra": "reports"})]
    assert extra, "snakemake declares no reports extra"
    for requirement in extra:  # installed here, as setup installs them
        assert importlib.metadata.version(requirement.name), requirement.name


@pytest.mark.slow
def test_the_reports_own_settings_rerun_no_aggregation(smoke_run):
    work, _, _ = smoke_run
    config = smoke_config()
    throughput = {**(config.get("throughput") or {}), "draft_ms": 2.5}
    result = _planned(work, _variant(work, "elsewhere", report_dir="elsewhere", throughput=throughput))
    assert result.returncode == 0, result.stderr
    rules = {job["rule"] for job in jobs_of(result.stdout + result.stderr)}
    assert "render_report" in rules and "aggregate" not in rules, rules
    # a setting the results record reruns it, and its reason names that setting's group, not the config
    step = {**config["step"], "layers": 7}
    result = _planned(work, _variant(work, "layers", step=step))
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert "aggregate" in {job["rule"] for job in jobs_of(output)}
    reasons = [line for line in output.splitlines() if "Params have changed" in line]
    assert reasons and all("report_dir" not in line and "'depths'" not in line for line in reasons), reasons


def _tiny_config(**timing) -> dict:
    """The smallest grid that runs jobs for real: one reference configuration, no step stages."""
    config = smoke_config()
    config.update(
        machine="tiny",
        report_dir="results/tiny/report",
        budgets=[4],
        batch_sizes=[1],
        depths=[4],
        distributions=["uniform"],
        builders=["reference"],
    )
    config["timing"] = {**config["timing"], **timing}
    config["step"] = {**config["step"], "enabled": False}
    return config


@pytest.mark.slow
def test_each_configuration_is_timed_by_independent_jobs_and_the_summary_shows_their_spread(tmp_path):
    work = workdir_copy(tmp_path)
    (work / "three.yaml").write_text(yaml.safe_dump(_tiny_config(jobs=3)))
    summary_path = "results/tiny/summary.parquet"
    result = snakemake(work, "--cores", "1", "--configfile", "three.yaml", "--", summary_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    bench = work / "results" / "tiny" / "bench" / "reference"
    files = sorted(p.name for p in bench.glob("*.parquet"))
    assert files == ["uniform-L4-N4-B1-r2.parquet", "uniform-L4-N4-B1-r3.parquet", "uniform-L4-N4-B1.parquet"]
    # three jobs, three processes: each file's rows name their job, and each job has its own timed calls
    jobs = {name: set(pd.read_parquet(bench / name)["job"]) for name in files}
    assert jobs == {files[0]: {2}, files[1]: {3}, files[2]: {1}}
    rows = pd.concat([pd.read_parquet(bench / name) for name in files])
    timed = rows[(rows["phase"] == "timed") & (rows["timing"] == "wall") & (rows["status"] == "ok")]
    medians = timed.groupby("job")["seconds"].median()
    summary = pd.read_parquet(work / summary_path)
    row = summary[(summary["builder"] == "reference") & (summary["timing"] == "wall")].iloc[0]
    assert row["jobs"] == 3 and row["n"] == len(timed)  # every job's calls, pooled
    assert row["median_s"] == timed["seconds"].median()
    assert (row["job_median_min_s"], row["job_median_max_s"]) == (medians.min(), medians.max())
    # a fourth job: only it runs (and the summary), the three before stand
    (work / "four.yaml").write_text(yaml.safe_dump(_tiny_config(jobs=4)))
    result = snakemake(work, "-n", "--cores", "1", "--configfile", "four.yaml", "--", summary_path)
    assert result.returncode == 0, result.stderr
    planned = jobs_of(result.stdout + result.stderr)
    assert [job["output"][0] for job in planned if job["rule"] == "bench"] == [
        "results/tiny/bench/reference/uniform-L4-N4-B1-r4.parquet"
    ]
    assert {job["rule"] for job in planned} == {"bench", "aggregate"}
    # the aggregation reruns only for the settings it reads: not for the report's own (report_dir, throughput)
    config = _tiny_config(jobs=3)
    config.update(report_dir="elsewhere", throughput={**config.get("throughput", {}), "draft_ms": 2.5})
    (work / "report-only.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(work, "-n", "--cores", "1", "--configfile", "report-only.yaml", "--", summary_path)
    assert result.returncode == 0, result.stderr
    assert "Nothing to be done" in result.stdout + result.stderr
