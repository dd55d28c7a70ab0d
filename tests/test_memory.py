"""Sizes no machine holds: each job's peak memory is estimated from its sizes when the settings load, and a
configuration this machine cannot hold is refused before any job, naming what it needs and what the machine
has (before: a batch of 10^8 requests or a vocabulary of 10^11 passed every check and ended the run in a
MemoryError)."""

from __future__ import annotations

import pytest
from workflow_copy import error_lines, snakemake, workdir_copy

from ddtree_bench import memory
from ddtree_bench.settings import Settings, layered_settings

GIB = 1 << 30


def smoke(**changes) -> Settings:
    return Settings.from_config({**layered_settings(["config/smoke.yaml"]).as_config(), **changes})


def test_the_estimates_are_the_jobs_arrays():
    need = memory.trace_need(64, 16, 1024, 163840, "drafter")
    assert need.bytes == 64 * 16 * 1024 * 12 and need.where == "host"
    logits = memory.trace_need(64, 16, 1024, 163840, "uniform")  # plus one request's full-vocabulary logits
    assert logits.bytes == need.bytes + 16 * 163840 * 4 and "vocab_size" in logits.fields
    assert memory.trees_bytes(64, 1024) == 64 * 1025**2
    attention = memory.attention_need(8, 64, 4096, 8)
    assert attention.bytes == 8 * (4096 + 65) * 576 * 2 + 8 * 65 * 8 * (576 + 512) * 2 + 8 * 65**2
    assert memory.size(3 * GIB) == "3.0 GiB" and memory.size(512) == "512 B"


def test_the_committed_configurations_fit_this_machine():
    for files in ([], ["config/smoke.yaml"], ["config/full.yaml"]):
        memory.check_memory(layered_settings(files))  # the default, the smoke run, the full grid


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"batch_sizes": [1, 10**8]},
            "config: batch_sizes, budgets, depths, topk: a tree build (check or timing job) needs at least "
            "170.0 GiB of host memory (its trace, 100000000 x 4 x 32 x 12 B, and batch 100000000's trees of "
            "budget 16",
        ),
        (
            {"vocab_size": 10**11, "distributions": ["uniform"]},
            "config: batch_sizes, depths, topk, vocab_size: the trace uniform-L4 needs at least 1.5 TiB of "
            "host memory (4 requests x 4 positions x 32 columns x 12 B, plus one request's logits: 4 "
            "positions x vocab_size 100000000000 x 4 B), more than this machine's physical memory, 16.0 GiB",
        ),
    ],
)
def test_sizes_no_machine_holds_are_refused_naming_the_need_and_the_machine(changes, message):
    with pytest.raises(ValueError) as error:
        memory.check_memory(smoke(**changes), host=16 * GIB)
    assert str(error.value).startswith(message), error.value
    assert "\n" not in str(error.value)


def test_gpu_memory_is_checked_only_where_a_gpu_runs_the_step_stages():
    wide = smoke(step={**smoke().as_config()["step"], "attention": {"prefix_lengths": [10**9], "heads": [8]}})
    memory.check_memory(wide, host=16 * GIB)  # no GPU here: its jobs give rows saying why
    with pytest.raises(
        ValueError, match=r"a verify-attention job needs at least .* of GPU memory .* 80\.0 GiB"
    ):
        memory.check_memory(wide, gpu=80 * GIB, host=16 * GIB)


def test_the_workflow_refuses_it_in_the_dry_run_before_any_job(tmp_path):
    work = workdir_copy(tmp_path)
    args = (
        "-n",
        "--cores",
        "1",
        "--configfile",
        "config/smoke.yaml",
        "--config",
        "batch_sizes=[1,100000000]",
    )
    result = snakemake(work, *args, "--", "report")
    assert result.returncode == 2
    (line,) = error_lines(result.stderr)
    assert line.startswith(
        "config: batch_sizes, budgets, depths, topk: a tree build (check or timing job) "
    ), line
    assert "more than this machine's physical memory" in line and not (work / "results").exists()
