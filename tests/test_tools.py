"""tools/ on the CPU: the attention ablation's patches still apply to the kernel they patch, the plan sweep's
grids are ones the kernels run, and the step-run tools."""

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ddtree_bench.ops.attention import WIDE_OVERHEAD_TILES, AttentionShape, plan_attention

TOOL = Path(__file__).resolve().parent.parent / "tools" / "attention_ablation.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("attention_ablation", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_ablation_changes_only_its_part_of_the_kernel():
    tool = load_tool()
    source = (tool.KERNELS / tool.WIDE).read_text()
    assert tool.patch(source) == source
    no_loads = tool.patch(source, no_loads=True)
    assert tool.LOOP_LOADS not in no_loads and "vw_load_key_tile<128>" not in no_loads
    assert tool.QK_LATENT in no_loads and tool.PV_STEPS in no_loads
    half = tool.patch(source, half_loads=True)
    assert half.count("min(kv_len, key0 + 32), wtid") == 2
    light = tool.patch(source, light_mma=True)
    assert "step < 4; ++step)\n        wgmma_m64n72k16_ss<0>(s, wgmma_desc(nope_addr" in light
    assert "for (int kk = 0; kk < 1; ++kk)" in light and tool.LOOP_LOADS in light
    both = tool.patch(source, no_loads=True, light_mma=True)
    assert tool.LOOP_LOADS not in both and "kk < 1" in both


def test_a_changed_kernel_is_refused():
    tool = load_tool()
    source = (tool.KERNELS / tool.WIDE).read_text().replace("step < 32", "step < 30")
    with pytest.raises(ValueError, match="no longer applies"):
        tool.patch(source, light_mma=True)


def _tool(name: str):
    path = Path(__file__).resolve().parent.parent / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("rows", "tiles", "batch"), [(72, 514, 1), (136, 514, 1), (264, 66, 8), (136, 66, 64)]
)
def test_the_plan_sweep_tries_only_grids_the_kernels_run(rows, tiles, batch):
    sweep, sms = _tool("attention_plan_sweep"), 132
    grids = sweep.candidates(rows, tiles, batch, sms, wide=True)
    assert len(set(grids)) == len(grids)
    for plan in grids:
        blocks = plan.row_tiles * plan.splits * batch
        assert plan.row_tiles == -(-rows // plan.rows_per_block) and blocks <= 2 * sms  # two waves at most
        assert plan.splits * plan.tiles_per_split >= tiles > (plan.splits - 1) * plan.tiles_per_split
        assert not plan.merged_in_kernel or blocks <= sms  # the merge waits for every split: all resident
        assert plan.cluster == 1 or (plan.rows_per_block == 72 and plan.splits % 2 == 0)
    assert {p.rows_per_block for p in grids} == {64, 72}
    assert {p.rows_per_block for p in sweep.candidates(rows, tiles, batch, sms, wide=False)} == {64}
    shape = AttentionShape(batch=batch, tokens=rows // 8, heads=8, kv_rows=tiles * 64, mask_words=1)
    for rows_per_block, overhead in ((64, 8), (72, WIDE_OVERHEAD_TILES)):  # the plan's own grids among them
        plan = plan_attention(shape, tiles * 64, sms, 64, overhead, rows_per_block)
        grids = sweep.candidates(rows, tiles, batch, sms, wide=True, include=(plan.splits,))
        tried = {(p.rows_per_block, p.splits, p.tiles_per_split) for p in grids}
        assert (rows_per_block, plan.splits, plan.tiles_per_split) in tried
    for plan in grids:  # the numbers each record carries for fits: blocks, and the work spread evenly
        fields = sweep.grid_fields(plan, batch, tiles)
        assert fields["blocks"] == plan.row_tiles * plan.splits * batch
        assert fields["tile_units"] == plan.row_tiles * batch * tiles
        assert fields["tile_units"] <= fields["blocks"] * plan.tiles_per_split


@pytest.mark.parametrize(("tiles", "most"), [(513, 44), (65, 16), (513, 1), (9, 40)])
def test_the_multicast_probe_tries_split_counts_of_one_wave_down_to_one(tiles, most):
    tool = _tool_from_tools("attention_multicast")
    counts = tool.split_counts(tiles, most)
    assert counts[-1] == 1 and len(set(counts)) == len(counts)
    assert counts == sorted(counts, reverse=True) and counts[0] <= most
    for splits in counts:  # no split empty
        per = -(-tiles // splits)
        assert (splits - 1) * per < tiles <= splits * per


def _tool_from_tools(name: str):
    """A tool that imports another tool by name, as ``python tools/NAME.py`` lets it."""
    import sys  # noqa: PLC0415

    tools = str(Path(__file__).resolve().parent.parent / "tools")
    sys.path.insert(0, tools)
    try:
        return _tool(name)
    finally:
        sys.path.remove(tools)


def test_a_later_runs_step_rows_replace_the_same_configurations_and_keep_the_peaks(tmp_path):
    from ddtree_bench.summary.step import aggregate_steps, summarize_steps  # noqa: PLC0415
    from ddtree_bench.timing.records import stage_frame  # noqa: PLC0415

    def rows(stage, impl, budget, seconds, **extra):
        base = {
            "stage": stage,
            "impl": impl,
            "batch": 1,
            "budget": budget,
            "phase": "timed",
            "timing": "cuda-events",
            "cache": "warm",
            "status": "ok",
            "machine": "h",
        }
        return [base | {"repetition": i, "seconds": s} | extra for i, s in enumerate(seconds)]

    first = stage_frame(
        rows("peak", "device-copy", 0, [0.5, 0.5], bytes=2e12, batch=0)
        + rows("forward", "triton-w4a16", 8, [0.05, 0.05], bytes=1e11)
        + rows("dense", "torch", 8, [0.004])
    )
    first.to_parquet(tmp_path / "first.parquet")
    summary = tmp_path / "step_summary.parquet"
    aggregate_steps([tmp_path / "first.parquet"], summary)
    later = stage_frame(rows("forward", "triton-w4a16", 8, [0.04, 0.04], bytes=1e11))
    later.to_parquet(tmp_path / "later.parquet")
    tool = _tool("merge_step_summary")
    assert tool.main([str(summary), str(tmp_path / "later.parquet")]) == 0
    merged = pd.read_parquet(summary)
    forward = merged[merged["stage"] == "forward"]
    assert len(forward) == 1 and forward["median_s"].iloc[0] == pytest.approx(0.04)  # replaced
    assert forward["peak_copy_tbps"].iloc[0] == pytest.approx(4.0)  # the summary's own peak
    assert forward["pct_copy_peak"].iloc[0] == pytest.approx(100 * (1e11 / 0.04 / 1e12) / 4.0)
    assert set(merged["stage"]) == {"peak", "forward", "dense"}  # the others kept
    assert len(summarize_steps(later)) == 1
    assert tool.main([str(tmp_path / "none.parquet"), str(tmp_path / "later.parquet")]) == 2


def test_round_stages_refuses_a_bad_job_in_one_line(capsys):
    tool = _tool("round_stages")
    config = Path(__file__).resolve().parent.parent / "config" / "smoke.yaml"
    assert tool.main(["--config", str(config), "forward:batch=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown stage 'forward'" in err[0]
    assert tool.main(["--config", str(config), "model:batch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected stage:key=value" in err[0]


def test_tree_paths_fit_recovers_the_cost_model_and_the_wide_crossover():
    """The plan calibration's fit: rows made by a known PathCosts come back as its constants, and the wide
    path's batch limit is the largest batch where it was the fastest path."""
    from ddtree_bench.builders.gpu import PATH_COSTS, PathCosts  # noqa: PLC0415

    tree_paths = _tool("tree_paths")
    truth = PathCosts(
        pool_base=30.0, pool_per_node=0.02, wide_base=5.0, wide_per_node=0.01, wide_per_pair=2e-5
    )
    rows = [
        {"path": p, "batch": b, "budget": n, "us": truth.cost(p, b, n, 132)}
        for p in ("parallel", "wide")
        for b in (1, 2, 8, 500)
        for n in (8, 64, 256, 1024)
    ]
    fitted = tree_paths.fitted_costs(pd.DataFrame(rows), 132, PATH_COSTS)
    assert fitted.pool_base == pytest.approx(30.0, rel=1e-3)
    assert fitted.pool_per_node == pytest.approx(0.02, rel=1e-3)
    assert fitted.wide_per_pair == pytest.approx(2e-5, rel=1e-2)
    assert fitted.wide_max_batch == 500  # wide is the cheaper model at every batch here
    slow_wide = [dict(r, us=r["us"] * 10) if r["path"] == "wide" else r for r in rows]
    assert tree_paths.fitted_costs(pd.DataFrame(slow_wide), 132, PATH_COSTS).wide_max_batch == 0
    with pytest.raises(ValueError, match="three"):
        tree_paths.fit_path([[1, 8, 3.0]], 132, quadratic=False)


def test_the_timeline_tool_reads_each_blocks_phases_and_refuses_missing_marks():
    tool = _tool("attention_timeline")
    # two blocks (ns): prologue 2 / 4 µs, loop 10 / 20 µs, rows out 1 / 3 µs, merge 0 / 2 µs
    marks = np.array([[1000, 3000, 13000, 14000, 14000], [2000, 6000, 26000, 29000, 31000]])
    p = tool.phases(marks)
    assert p["blocks"] == 2 and p["span_us"] == 30.0 and p["start_spread_us"] == 1.0
    assert (p["prologue_us"], p["loop_us"], p["rows_out_us"], p["merge_us"]) == (3.0, 15.0, 2.0, 1.0)
    assert p["block_us"] == 21.0 and 15.0 < p["loop_p90_us"] <= 20.0
    with pytest.raises(ValueError, match="missing or out-of-order"):
        tool.phases(np.array([[1000, 0, 0, 0, 0]]))  # a build without the hooks leaves zeros
    with pytest.raises(ValueError, match="missing or out-of-order"):
        tool.phases(np.array([[5000, 4000, 6000, 7000, 8000]]))
    with pytest.raises(ValueError, match="expected"):
        tool.phases(np.zeros((2, 4)))
