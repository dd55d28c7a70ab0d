"""The in-situ cost mode, its CPU-side parts: SGLang-style padding, the torch path's build + pad (on a CPU
device), rows where no GPU is usable, the decode-round targets (met / not met, by how much), the report's
headline and the step breakdown's preference, and the config key. The GPU parts: tests/test_gpu_device.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from report_rows import rows_for, write_machine
from step_rows import shapes_frame, synthetic_step

from ddtree_bench.builders import get_builder
from ddtree_bench.builders.gpu import DeviceTrees, device_layout
from ddtree_bench.builders.gpu_device import check_device_inputs
from ddtree_bench.builders.reference import build_one
from ddtree_bench.config import check_config
from ddtree_bench.report import (
    FIGURE_NAMES,
    ReportFiles,
    evaluate_targets,
    in_situ_tables,
    load_machines,
    render_report,
    speedups,
    timings,
)
from ddtree_bench.stages.build import run_benchmark
from ddtree_bench.stages.insitu import (
    IN_SITU,
    VERIFY_FIELDS,
    pad_request_torch,
    run_insitu_benchmark,
    torch_cuda_reason,
    torch_measure,
    unavailable_like,
)
from ddtree_bench.stages.timing_job import TimingJob
from ddtree_bench.summary.build import summarize
from ddtree_bench.summary.step import step_breakdown, summarize_steps
from ddtree_bench.traces import generate_trace, save_trace
from ddtree_bench.tree import TreeBatch

torch = pytest.importorskip("torch", reason="torch is needed for the SGLang-style padding")


def _inputs(topk_inputs, batch=3, depth=6, k=5):
    return topk_inputs("tied", batch, depth, k, seed=3)


def _sglang_result(trees: TreeBatch, b: int):
    """Request ``b`` of a padded batch as SGLang's function returns it: unpadded, torch tensors."""
    r = trees.request(b)
    return (
        torch.from_numpy(r["node_token_ids"].copy()),
        torch.from_numpy(r["node_depths"].copy()),
        [int(x) for x in r["parents"]],
        [{} for _ in range(len(r["parents"]))],
        torch.from_numpy(r["visibility"].copy()),
        torch.from_numpy(r["retrieve_next_token"].copy()),
        torch.from_numpy(r["retrieve_next_sibling"].copy()),
    )


def _stand_in_pad(calls):
    def pad(visibility, next_token, next_sibling, target_q_len):  # SGLang's pad_ddtree_build_outputs' shape
        calls.append(target_q_len)
        m = visibility.shape[0]
        vis = torch.zeros((target_q_len, target_q_len), dtype=torch.bool)
        vis[:m, :m] = visibility
        nt = torch.full((target_q_len,), -1, dtype=torch.long)
        ns = torch.full((target_q_len,), -1, dtype=torch.long)
        nt[:m], ns[:m] = next_token, next_sibling
        return vis, nt, ns

    return pad


@pytest.mark.parametrize("with_pad_function", [False, True])
def test_sglang_outputs_padded_like_the_contract(topk_inputs, with_pad_function):
    lp, ids = _inputs(topk_inputs, depth=3, k=2)  # 2 + 4 + 8 paths < N = 40: the heap drains
    budget = 40
    trees = get_builder("reference").build(lp, ids, budget)
    assert (trees.node_count < budget).any()
    calls = []
    pad = _stand_in_pad(calls) if with_pad_function else None
    for b in range(lp.shape[0]):
        padded = pad_request_torch(torch, _sglang_result(trees, b), budget, pad)
        for field, tensor in zip(VERIFY_FIELDS, padded, strict=True):
            assert np.array_equal(tensor.numpy(), getattr(trees, field)[b]), field
    assert calls == ([budget + 1] * lp.shape[0] if with_pad_function else [])


class _StandInSGLang:
    """What insitu_bench reads of an SGLang builder: its function, pad function and workspace."""

    name = "sglang"

    def __init__(self, pad_function=None, workspace=None):
        self.function = self._build
        self.pad_function = pad_function
        self.workspace = workspace
        self.workspaces = []

    def unavailable_reason(self):
        return None

    def _build(self, top_log_probs, top_token_ids, budget, **kwargs):
        self.workspaces.append(kwargs.get("workspace"))
        lp, ids = top_log_probs.numpy()[None], top_token_ids.numpy()[None]
        one = TreeBatch.empty(1, budget)
        build_one(lp[0], ids[0], budget, one, 0)
        return _sglang_result(one, 0)


@pytest.mark.parametrize("name", ["sglang", "reference"])
def test_torch_path_builds_pads_and_hands_back_the_verify_tensors(topk_inputs, name):
    lp, ids = _inputs(topk_inputs)
    budget = 9
    workspace = object()
    calls = []
    if name == "sglang":
        obj = _StandInSGLang(_stand_in_pad(calls), workspace)
    else:
        obj = get_builder("reference")
    keep = []
    measure, fetch, device_bytes = torch_measure(obj, name, lp, ids, budget, keep, device="cpu")
    assert measure() > 0 and measure() > 0
    expected = get_builder("reference").build(lp, ids, budget)
    for field, value in zip(VERIFY_FIELDS, fetch(), strict=True):
        assert np.array_equal(value, getattr(expected, field)), field
    assert device_bytes == lp.nbytes + ids.nbytes
    if name == "sglang":  # the reused workspace goes to every call; SGLang's pad function pads
        assert obj.workspaces == [workspace] * (2 * lp.shape[0])
        assert calls == [budget + 1] * (2 * lp.shape[0])


def _trace(tmp_path):
    lp, ids = generate_trace("peaked", 2, 4, 8, vocab_size=64, seed=0, device="cpu")
    path = tmp_path / "t.npz"
    save_trace(path, lp, ids, distribution="peaked")
    return path


def _job(builder, trace, distribution) -> TimingJob:
    """Budget 8, batch 2, one timed call, machine "m"."""
    timing = dict(warmup=0, repeats=1, min_seconds=0.0, max_seconds=None, min_repeats=1, max_repeats=None)
    return TimingJob(builder, trace, 8, 2, timing, machine="m", distribution=distribution)


@pytest.mark.skipif(torch_cuda_reason() is None, reason="this machine has torch with CUDA")
def test_in_situ_without_a_gpu_is_one_row_saying_why(tmp_path):
    df = run_insitu_benchmark(_job("reference", _trace(tmp_path), distribution="peaked"))
    assert len(df) == 1
    row = df.iloc[0]
    assert row["timing"] == IN_SITU and row["status"] == "unavailable"
    assert row["status_reason"].startswith("in-situ timing needs torch with a CUDA device")
    assert (row["budget"], row["batch"], row["depth"]) == (8, 2, 4)


def test_in_situ_refuses_the_gpu_builder(tmp_path):
    class Gpu:  # a builder object named "gpu": its in-situ rows come from run_gpu_benchmark
        name, label = "gpu", "gpu"

        def unavailable_reason(self):
            return None

        def check(self, lp, ids, budget):
            return int(budget)

    with pytest.raises(ValueError, match="run_gpu_benchmark"):
        run_insitu_benchmark(_job(Gpu(), _trace(tmp_path), distribution="x"))


# ----------------------------------------------------------------------------------------------- targets


def _in_situ_summary(gpu_s, native_mt_s, sglang_s, batch1_cpu_s, batch1_gpu_s, budgets=(8, 64)):
    frames = []
    for budget in budgets:
        kw = dict(budget=budget, batch=64, machine="h200", distribution="peaked", timing=IN_SITU)
        frames.append(rows_for("gpu", [gpu_s[budget]], cache="warm", **kw))
        frames.append(rows_for("native-mt", [native_mt_s[budget]], **kw))
        frames.append(rows_for("sglang", [sglang_s[budget]], **kw))
        kw["batch"] = 1
        frames.append(rows_for("gpu", [batch1_gpu_s], cache="warm", **kw))
        frames.append(rows_for("native", [batch1_cpu_s], **kw))
        frames.append(rows_for("native-mt", [batch1_cpu_s * 2], **kw))
        kw["timing"] = "wall"
        frames.append(rows_for("sglang", [sglang_s[budget] / 2], **kw))
    return summarize(pd.concat(frames, ignore_index=True))


def _targets(tmp_path, summary):
    path = tmp_path / "summary.parquet"
    summary.to_parquet(path)
    return {r.target: r for r in evaluate_targets(load_machines(path)) if r.target.startswith("in-situ")}


def test_in_situ_targets_met(tmp_path):
    targets = _targets(
        tmp_path,
        _in_situ_summary(
            gpu_s={8: 5e-6, 64: 1e-5},
            native_mt_s={8: 3e-5, 64: 2e-4},  # 6x below 64 (5x needed), 20x at 64 (10x needed)
            sglang_s={8: 1e-3, 64: 2e-2},  # N = 8 is not judged (budgets >= 32); 2000x at 64
            batch1_cpu_s=2.4e-5,
            batch1_gpu_s=8e-6,  # 3.0x the fastest (native), and 8 µs at N = 64
        ),
    )
    assert len(targets) == 4 and {r.status for r in targets.values()} == {"met"}
    assert targets["in-situ, batch 1: gpu <= 8 µs at N = 64"].measured == "8.0 µs (N=64, B=1, L=16, peaked)"
    mt = targets["in-situ, batch 64: gpu >= 10x native-mt at every budget >= 64, and >= 5x below"]
    assert mt.measured.startswith("min 6.0x against 5.0x needed (N=8, B=64, L=16, peaked) over 2")
    one = targets["in-situ, batch 1: gpu >= 3x the fastest CPU builder at every budget"]
    assert one.measured.endswith("fastest CPU builder: native")


def test_in_situ_targets_not_met_say_by_how_much(tmp_path):
    targets = _targets(
        tmp_path,
        _in_situ_summary(
            gpu_s={8: 5e-6, 64: 4e-5},
            native_mt_s={8: 3e-5, 64: 2e-4},  # 5x at 64 where 10x is needed
            sglang_s={8: 1e-3, 64: 2e-2},  # 500x at 64
            batch1_cpu_s=3e-6,
            batch1_gpu_s=6e-6,  # 0.5x
        ),
    )
    mt = targets["in-situ, batch 64: gpu >= 10x native-mt at every budget >= 64, and >= 5x below"]
    assert mt.status == "not met"
    assert "short at 1: N=64 peaked: 5.0x of 10.0x, gpu 40.0 µs where 20.0 µs is needed" in mt.measured
    sg = targets["in-situ, batch 64: gpu >= 1000x sglang (SGLang's function) at every budget >= 32"]
    assert sg.status == "not met" and "N=64 peaked: 500x of 1,000x" in sg.measured
    assert "over 1 configurations" in sg.measured  # budget 8 is not judged by this target
    one = targets["in-situ, batch 1: gpu >= 3x the fastest CPU builder at every budget"]
    assert one.status == "not met" and "short at 2" in one.measured and "0.5x of 3.0x" in one.measured
    n64 = targets["in-situ, batch 1: gpu <= 8 µs at N = 64"]
    assert n64.status == "met" and n64.measured == "6.0 µs (N=64, B=1, L=16, peaked)"


def test_in_situ_targets_without_rows_say_no_data(tmp_path):
    summary = summarize(rows_for("native", [1e-5], budget=8, batch=64, machine="m"))
    targets = _targets(tmp_path, summary)
    assert {r.status for r in targets.values()} == {"no data"}
    assert all("no gpu in-situ timings" in r.measured for r in targets.values())


# ----------------------------------------------------------------------------------------------- report


def _machine_with_in_situ(tmp_path):
    folder = tmp_path / "results" / "h200"
    write_machine(folder, "h200", sglang=True, gpu=True)
    base = pd.read_parquet(folder / "summary.parquet")
    extra = _in_situ_summary(
        gpu_s={8: 5e-6, 64: 1e-5},
        native_mt_s={8: 3e-5, 64: 2e-4},
        sglang_s={8: 1e-3, 64: 2e-2},
        batch1_cpu_s=3e-5,
        batch1_gpu_s=1e-5,
    )
    extra = extra[extra["timing"] == IN_SITU].assign(distribution="uniform")
    pd.concat([base, extra], ignore_index=True).to_parquet(folder / "summary.parquet")
    return folder / "summary.parquet"


def test_speedup_headline_is_in_situ_where_the_baseline_has_it(tmp_path):
    data = timings(load_machines(_machine_with_in_situ(tmp_path)))
    everything = speedups(data)
    headline = speedups(data, headline=True)
    assert set(everything["mode"]) == {"wall", "in-situ"}
    assert set(headline["mode"]) == {"in-situ"} and headline["panel"].str.contains("in-situ").all()
    gpu = headline[(headline["builder"] == "gpu") & (headline["budget"] == 64) & (headline["batch"] == 64)]
    assert gpu["speedup"].to_numpy() == pytest.approx([2e-2 / 1e-5])  # sglang in-situ / gpu in-situ
    wall = everything[(everything["mode"] == "wall") & (everything["builder"] == "gpu")]
    assert set(wall["timing"]) == {"kernel-events"}  # wall-clock comparisons never mix in in-situ series


def test_in_situ_table_and_report_section(tmp_path):
    path = _machine_with_in_situ(tmp_path)
    machines = load_machines(path)
    tables = in_situ_tables(timings(machines), machines, 16, "uniform")
    table = tables["h200"]
    assert "gpu in-situ (graph replay, bool mask)" in table.columns
    assert "sglang in-situ (pageable copies)" in table.columns
    assert "reference (ours, Python)" not in table.columns  # only in-situ series
    out = tmp_path / "report"
    render_report(
        summary=path,
        files=ReportFiles(
            out / "index.html",
            out / "summary.md",
            figures=[out / "figures" / f"{name}.png" for name in FIGURE_NAMES],
        ),
        depth=16,
        distribution="uniform",
    )
    markdown = (out / "summary.md").read_text()
    assert "## What the decode round pays (in-situ)" in markdown
    assert "gpu in-situ (graph replay, bool mask)" in markdown
    assert "in-situ: what the decode round pays" in markdown  # the speedup figure's title
    assert "decode round (in-situ)" in markdown  # the targets' source


def test_in_situ_section_says_why_a_machine_has_none(tmp_path):
    path = write_machine(tmp_path / "m", "m")
    machines = load_machines(path)
    assert in_situ_tables(timings(machines), machines, 16, "uniform")["m"].startswith("no in-situ rows (")


def test_step_breakdown_prefers_in_situ_builds():
    frames = []
    for budget in (8, 64):
        for batch in (1, 64):
            kw = dict(budget=budget, batch=batch, distribution="peaked", depth=16, machine="m")
            frames.append(rows_for("native", [1e-5], **kw))
            frames.append(rows_for("native", [3e-5], timing=IN_SITU, **kw))
            frames.append(rows_for("reference", [1e-3], **kw))  # no in-situ: its wall time stays
            frames.append(rows_for("gpu", [2e-5], timing="kernel-events", cache="warm", **kw))
            frames.append(rows_for("gpu", [7e-6], timing=IN_SITU, cache="warm", **kw))
    build = summarize(pd.concat(frames, ignore_index=True))
    step = summarize_steps(synthetic_step())
    breakdown = step_breakdown(build, step, shapes_frame(), layers=61, depth=16, distribution="peaked")
    assert list(dict.fromkeys(breakdown["builder"])) == [
        "native in-situ",
        "gpu in-situ (graph replay)",
        "reference (ours, Python)",
    ]
    gpu = breakdown[breakdown["builder"] == "gpu in-situ (graph replay)"]
    assert gpu["build_s"].to_numpy() == pytest.approx([7e-6] * len(gpu))


# ----------------------------------------------------------------------------------------------- config


def _config(**timing):
    return {"budgets": [8], "batch_sizes": [1], "depths": [4], "distributions": ["uniform"], "timing": timing}


def test_in_situ_config_key():
    assert check_config(_config())["timing"]["in_situ"] is True
    assert check_config(_config(in_situ=False))["timing"]["in_situ"] is False
    with pytest.raises(ValueError, match=r"^config: timing\.in_situ: .*boolean"):
        check_config(_config(in_situ="yes"))


def test_unavailable_like_names_the_timing_jobs_configuration(tmp_path):
    rows = run_benchmark(_job("reference", _trace(tmp_path), distribution=None))
    extra = unavailable_like(rows, "in-situ timing needs a CUDA GPU: no CUDA device found")
    assert len(extra) == 1
    row = extra.iloc[0]
    assert (row["builder"], row["timing"], row["status"]) == ("reference", IN_SITU, "unavailable")
    assert (row["budget"], row["batch"], row["depth"], row["distribution"]) == (8, 2, 4, "peaked")
    assert row["machine"] == "m" and np.isnan(row["seconds"])
    summary = summarize(pd.concat([rows, extra], ignore_index=True))
    assert set(zip(summary["timing"], summary["status"], strict=True)) == {
        ("wall", "ok"),
        (IN_SITU, "unavailable"),
    }


def test_device_input_checks_name_the_problem(topk_inputs):
    lp, ids = _inputs(topk_inputs)
    assert check_device_inputs(lp, ids, 9) == 9
    with pytest.raises(ValueError, match="float32 log-probs and int64 token ids"):
        check_device_inputs(lp.astype(np.float64), ids, 9)
    with pytest.raises(ValueError, match="one shape"):
        check_device_inputs(lp, ids[:, :2], 9)
    with pytest.raises(ValueError, match="C-contiguous"):
        check_device_inputs(lp[:, :, ::2], ids[:, :, ::2], 9)
    with pytest.raises(ValueError, match="budget"):
        check_device_inputs(lp, ids, 0)
    # one allocation: the seven TreeBatch fields, the packed bits and the path statistics, 256-byte aligned
    n1, words = 10, 1
    fields = [
        ("a", (3,), np.int32),
        ("b", (3, 9), np.int64),
        ("c", (3, 9), np.int64),
        ("d", (3, n1), np.int32),
    ]
    fields += [("e", (3, n1, n1), np.bool_), ("f", (3, n1), np.int64), ("g", (3, n1), np.int64)]
    fields += [("h", (3, n1, words), np.uint32), ("i", (3,), np.int32)]
    assert DeviceTrees.required_bytes(3, 9) == device_layout(fields)[1]
