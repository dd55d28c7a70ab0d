"""Verify attention (kernels/verify_attn/verify_attn.cu): input checks everywhere, equality with a float32
reference on a GPU (trees built from DDTree inputs, padding filled with NaN so an out-of-bounds read
shows)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from gpu_inputs import random_case, topk_inputs

import ddtree_bench.ops.attention as attention_module
from ddtree_bench.builders import get_builder
from ddtree_bench.builders.gpu import DeviceTrees, GpuBuilder
from ddtree_bench.cuda import loader as cuda
from ddtree_bench.cuda.loader import BENCH_UTIL_SOURCE, cached_fatbin, gpu_unavailable_reason
from ddtree_bench.ops.attention import (
    COMBINE_UNROLL,
    HEAD_DIM,
    KERNEL_SOURCE,
    MIN_KEYS_PER_SPLIT,
    SMALL_OVERHEAD_TILES,
    VALUE_DIM,
    AttentionKernels,
    AttentionPlan,
    AttentionShape,
    AttentionUnavailable,
    PreparedAttention,
    VerifyAttention,
    attention_bytes,
    attention_flops,
    check_attention_inputs,
    combine_rows_per_block,
    plan_attention,
    reference_attention,
    visible_keys,
)
from ddtree_bench.stages import attention as attention_stage
from ddtree_bench.stages.attention import STREAM_THREADS, backend_name
from ddtree_bench.timing.records import STAGE_COLUMNS
from ddtree_bench.traces import generate_trace, save_trace
from ddtree_bench.tree import packed_visibility


def fake(shape, dtype):
    return SimpleNamespace(shape=tuple(shape), dtype=dtype)


def good(batch=2, budget=7, heads=8, kv_rows=100, mask_words=None, prefix=(10, 20)):
    q1 = budget + 1
    words = mask_words if mask_words is not None else (q1 + 31) // 32
    return dict(
        q=fake((batch, q1, heads, HEAD_DIM), "torch.bfloat16"),
        kv=fake((batch, kv_rows, HEAD_DIM), "torch.bfloat16"),
        prefix_lengths=np.array(prefix, np.int32),
        mask_bits=fake((batch, q1, words), "uint32"),
        out=fake((batch, q1, heads, VALUE_DIM), "torch.bfloat16"),
    )


def test_good_inputs_give_their_shape():
    shape, lengths = check_attention_inputs(**good())
    assert shape == AttentionShape(batch=2, tokens=8, heads=8, kv_rows=100, mask_words=1)
    assert shape.rows == 64 and shape.budget == 7
    assert lengths.tolist() == [10, 20]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(q=fake((2, 8, 8, 512), "torch.bfloat16")), "q must be"),
        (dict(q=fake((2, 8, 8, HEAD_DIM), "torch.float16")), "q must be bfloat16"),
        (dict(kv=fake((2, 100, HEAD_DIM), "torch.float32")), "kv must be bfloat16"),
        (dict(out=fake((2, 8, 8, VALUE_DIM), "torch.float32")), "out must be bfloat16"),
        (dict(kv=fake((3, 100, HEAD_DIM), "torch.bfloat16")), "kv has batch 3"),
        (dict(kv=fake((2, 100, 512), "torch.bfloat16")), "kv must be"),
        (dict(out=fake((2, 8, 8, 576), "torch.bfloat16")), "out must be"),
        (dict(mask_bits=fake((2, 9, 1), "uint32")), "mask_bits must be"),  # tree buffers of another budget
        (dict(mask_bits=fake((2, 8, 1), "float32")), "mask_bits must be uint32"),
        (dict(prefix_lengths=np.array([10, -1], np.int32)), "negative prefix length"),
        (dict(prefix_lengths=np.array([10, 93], np.int32)), "needs S \\+ N \\+ 1 = 101"),
        (dict(prefix_lengths=np.array([10], np.int32)), "prefix_lengths must have shape"),
        (dict(prefix_lengths=np.array([1.0, 2.0])), "prefix_lengths must be integers"),
        (dict(q="not an array"), "q must be an array"),
    ],
)
def test_bad_inputs_are_one_line_errors(change, message):
    args = {**good(), **change}
    with pytest.raises(ValueError, match=message) as info:
        check_attention_inputs(**args)
    assert "\n" not in str(info.value)


def test_budget_larger_than_the_mask_buffers_is_refused():
    args = good(budget=40, mask_words=1)  # 41 keys need 2 words per row
    with pytest.raises(ValueError, match="mask_bits must be"):
        check_attention_inputs(**args)


def test_plan_splits_only_when_blocks_are_few():
    sms = 132
    big = AttentionShape(batch=64, tokens=1025, heads=8, kv_rows=40000, mask_words=33)
    assert plan_attention(big, 33793, sms).splits == 1
    small = AttentionShape(batch=1, tokens=9, heads=8, kv_rows=5000, mask_words=1)
    plan = plan_attention(small, 4105, sms)
    assert plan.row_tiles == 2
    assert plan.splits > 1
    assert plan.splits * plan.tiles_per_split >= math.ceil(4105 / 32)
    assert (plan.splits - 1) * plan.tiles_per_split < math.ceil(4105 / 32)  # no empty split
    assert plan.tiles_per_split * 32 >= MIN_KEYS_PER_SPLIT
    tiny = AttentionShape(batch=1, tokens=2, heads=1, kv_rows=2, mask_words=1)
    assert plan_attention(tiny, 2, sms).splits == 1


@pytest.mark.parametrize(
    "batch, budget, kv_len, splits",
    [
        (1, 64, 32833, 14),  # 9 row tiles: 15 splits would leave 3 of 135 blocks for a second wave
        (8, 8, 32777, 8),  # 16 blocks: 8 splits fill 128 SMs in one wave (9 would need two)
        (64, 8, 32777, 1),  # 128 blocks already fill one wave: a split would only add a second
        (1, 1024, 33793, 1),  # 129 blocks: one wave without splits
    ],
)
def test_plan_splits_fill_whole_waves(batch, budget, kv_len, splits):
    sms = 132
    shape = AttentionShape(batch=batch, tokens=budget + 1, heads=8, kv_rows=kv_len, mask_words=1)
    plan = plan_attention(shape, kv_len, sms)
    assert plan.splits == splits
    assert plan.row_tiles * batch * plan.splits <= sms or plan.splits == 1
    assert plan.splits * plan.tiles_per_split >= math.ceil(kv_len / 32)


def test_plan_counts_in_the_kernels_tile_size():
    # the wgmma kernel's key tiles have 64 keys: the plan covers the keys with tiles of that size and still
    # fills one whole wave (16 blocks x 8 splits)
    sms, kv_len = 132, 32777
    shape = AttentionShape(batch=8, tokens=9, heads=8, kv_rows=kv_len, mask_words=1)
    plan = plan_attention(shape, kv_len, sms, keys_per_tile=64, overhead_tiles=8)
    assert plan.splits == 8
    assert plan.splits * plan.tiles_per_split * 64 >= kv_len
    assert (plan.splits - 1) * plan.tiles_per_split * 64 < kv_len  # no empty split
    assert plan.tiles_per_split == math.ceil(kv_len / 64 / 8)
    assert plan_attention(shape, kv_len, sms).tiles_per_split == math.ceil(kv_len / 32 / 8)


def test_plan_with_a_larger_block_overhead_prefers_fewer_longer_splits_only_across_waves():
    # batch 1, N = 8 (2 row tiles), S = 8192 + 9 keys = 129 tiles of 64: with the wgmma kernel's estimate
    # (8 tiles) 43 splits of 3 tiles (86 blocks, one wave) beat 26 of 5 (cost 11 vs 13 tiles); splits of 2
    # tiles would need 65 splits, more than the 64 that splits of MIN_KEYS_PER_SPLIT keys allow
    shape = AttentionShape(batch=1, tokens=9, heads=8, kv_rows=8201, mask_words=1)
    plan = plan_attention(shape, 8201, 132, keys_per_tile=64, overhead_tiles=8)
    assert (plan.splits, plan.tiles_per_split) == (43, 3)
    assert plan.tiles_per_split * 64 >= MIN_KEYS_PER_SPLIT
    # at S = 32768 a second wave of shorter splits would cost more: 65 splits of 8 tiles
    big = AttentionShape(batch=1, tokens=9, heads=8, kv_rows=32777, mask_words=1)
    assert plan_attention(big, 32777, 132, keys_per_tile=64, overhead_tiles=8).splits == 65


def test_plan_of_72_row_tiles():
    # budget 8 at 8 heads: 72 query rows, one block a request instead of two (64 + 8 rows)
    shape = AttentionShape(batch=64, tokens=9, heads=8, kv_rows=32777, mask_words=1)
    narrow = plan_attention(shape, 32777, 132, keys_per_tile=64, overhead_tiles=8)
    wide = plan_attention(shape, 32777, 132, keys_per_tile=64, overhead_tiles=14, rows_per_block=72)
    assert (narrow.row_tiles, narrow.rows_per_block) == (2, 64)
    assert (wide.row_tiles, wide.rows_per_block) == (1, 72)
    assert wide.cost == 257 * 72 / 64 + 14 and narrow.cost == 513 + 8  # one wave each
    assert wide.splits == 2  # 64 blocks: two splits fill a wave
    # budget 1024: 8200 rows, 114 blocks of 72 rows (the last with 64) against 129 of 64 (the last with 8)
    big = AttentionShape(batch=2, tokens=1025, heads=8, kv_rows=5121, mask_words=33)
    assert plan_attention(big, 5121, 132, 64, 14, 72).row_tiles == 114
    assert plan_attention(big, 5121, 132, 64, 8).row_tiles == 129


def test_72_row_tiles_are_planned_only_where_they_need_fewer_blocks_are_loaded_and_estimated_faster():
    fields = dict(
        attn=None, combine=None, combine_threads=256, smem_bytes=1, sm_count=132, keys_per_tile=64,
        overhead_tiles=8, runs="", fatbin=Path("x"), path="wgmma",
    )  # fmt: skip
    loaded = AttentionKernels(**fields, attn_wide=object(), wide_smem_bytes=1)

    def rows_per_block(batch, tokens, s, heads=8):
        shape = AttentionShape(batch=batch, tokens=tokens, heads=heads, kv_rows=s + tokens, mask_words=1)
        plan = loaded.plan(shape, s + tokens)
        assert plan.cost <= plan_attention(shape, s + tokens, 132, 64, 8).cost
        return plan.rows_per_block

    # budget 8 at 8 heads: 72-row tiles from batch 8 (S = 32768) or 64; at batch 1 the 64-row tiles (twice
    # the blocks for the SMs); as measured on the H200
    assert [rows_per_block(b, 9, 32768) for b in (1, 8, 64)] == [64, 72, 72]
    assert [rows_per_block(b, 9, 4096) for b in (1, 8, 64)] == [64, 64, 72]
    # budget 16 and 32 at batch 64: 2 and 4 blocks a request instead of 3 and 5
    assert [rows_per_block(64, n + 1, 32768) for n in (16, 32)] == [72, 72]
    # 64 rows (budget 7), or 64 heads (a multiple of 64 rows): never
    assert rows_per_block(64, 8, 32768) == 64 and rows_per_block(64, 65, 32768, heads=64) == 64
    unloaded = AttentionKernels(**fields)
    shape = AttentionShape(batch=64, tokens=9, heads=8, kv_rows=32777, mask_words=1)
    assert unloaded.plan(shape, 32777).rows_per_block == 64


def test_2_split_plans_of_72_row_tiles_run_as_clusters_merged_on_chip():
    fields = dict(
        attn=None, combine=None, combine_threads=256, smem_bytes=1, sm_count=132, keys_per_tile=64,
        overhead_tiles=8, runs="", fatbin=Path("x"), path="wgmma", attn_wide=object(), wide_smem_bytes=1,
    )  # fmt: skip
    clustered = AttentionKernels(**fields, attn_wide_clusters={2: object()})

    def plan(kernels, batch, budget, s):
        tokens = budget + 1
        shape = AttentionShape(batch=batch, tokens=tokens, heads=8, kv_rows=s + tokens, mask_words=3)
        return kernels.plan(shape, s + tokens)

    for batch, budget in ((64, 8), (8, 64)):  # 64 blocks of 72 rows: 2 splits, merged in clusters of 2
        p = plan(clustered, batch, budget, 32768)
        assert (p.rows_per_block, p.splits, p.cluster, p.partials) == (72, 2, 2, 1)
    p = plan(clustered, 8, 8, 32768)  # 16 splits: as before (clusters of 2 measured no faster there)
    assert (p.rows_per_block, p.splits, p.cluster, p.partials) == (72, 16, 1, 16)
    p = plan(clustered, 1, 8, 32768)  # the 64-row tiles: never clustered
    assert (p.rows_per_block, p.cluster) == (64, 1) and p.partials == p.splits
    p = plan(AttentionKernels(**fields), 64, 8, 32768)  # cluster kernel not loaded
    assert (p.splits, p.cluster, p.partials) == (2, 1, 2)


def test_the_seesaw_kernel_is_planned_for_enough_row_tiles_and_key_tiles_a_split():
    fields = dict(
        attn=object(),
        combine=None,
        combine_threads=256,
        smem_bytes=1,
        sm_count=132,
        keys_per_tile=64,
        overhead_tiles=8,
        runs="",
        fatbin=Path("x"),
        path="wgmma",
        attn_seesaw=object(),
        seesaw_smem_bytes=1,
    )
    kernels = AttentionKernels(**fields)

    def plan(batch, budget, prefix):
        shape = AttentionShape(
            batch=batch, tokens=budget + 1, heads=8, kv_rows=prefix + budget + 1, mask_words=33
        )
        return kernels.plan(shape, prefix + budget + 1)

    big = plan(8, 256, 32768)
    assert big.seesaw and big.row_tiles >= attention_module.SEESAW_MIN_ROW_TILES
    assert not plan(1, 16, 32768).seesaw  # 3 row tiles
    few = plan(1, 64, 4096)  # 9 row tiles, but 14 splits of 5 key tiles
    assert few.row_tiles == 9 and few.tiles_per_split < attention_module.SEESAW_MIN_TILES and not few.seesaw
    assert (
        not AttentionKernels(**{**fields, "attn_seesaw": None})
        .plan(AttentionShape(batch=8, tokens=257, heads=8, kv_rows=33025, mask_words=9), 33025)
        .seesaw
    )
    with pytest.raises(ValueError, match="seesaw kernel has 64-row tiles"):
        AttentionPlan(row_tiles=1, splits=1, tiles_per_split=1, rows_per_block=72, seesaw=True)


def test_the_seesaw_kernel_against_the_72_row_tiles_counts_its_faster_key_tiles():
    fields = dict(
        attn=object(), combine=None, combine_threads=256, smem_bytes=1, sm_count=132, keys_per_tile=64,
        overhead_tiles=8, runs="", fatbin=Path("x"), path="wgmma", attn_wide=object(), wide_smem_bytes=1,
    )  # fmt: skip
    both = AttentionKernels(**fields, attn_seesaw=object(), seesaw_smem_bytes=1)
    wide_only = AttentionKernels(**fields)

    def plan(kernels, batch, budget, prefix):
        tokens = budget + 1
        shape = AttentionShape(batch=batch, tokens=tokens, heads=8, kv_rows=prefix + tokens, mask_words=33)
        return kernels.plan(shape, prefix + tokens)

    # 65 row tiles of 64 against 57 of 72 (estimates within 1 %): the seesaw kernel, as measured
    for kernels, seesaw in ((both, True), (wide_only, False)):
        p = plan(kernels, 64, 512, 32768)
        assert (p.rows_per_block, p.seesaw) == ((64, True) if seesaw else (72, False))
    # 17 row tiles of 64 a request at batch 8 fill a second wave, 15 of 72 do not: the 72-row tiles
    p = plan(both, 8, 128, 32768)
    assert (p.rows_per_block, p.seesaw) == (72, False)
    assert 0.853 < attention_module.SEESAW_COST < 0.908


def test_the_small_mma_tiles_plan_32_row_blocks_of_16_key_tiles():
    small = AttentionKernels(
        attn=None, combine=None, combine_threads=256, smem_bytes=1, sm_count=188, keys_per_tile=16,
        overhead_tiles=SMALL_OVERHEAD_TILES, runs="", fatbin=Path("x"), path="mma", rows_per_block=32,
    )  # fmt: skip
    shape = AttentionShape(batch=1, tokens=9, heads=8, kv_rows=4096 + 9, mask_words=1)
    plan = small.plan(shape, 4096 + 9)
    assert (plan.rows_per_block, plan.row_tiles) == (32, 3)  # 72 rows
    # 257 tiles of 16 keys; splits keep at least 128 keys (8 tiles) and the grid stays within the SMs
    assert plan.tiles_per_split >= 8 and plan.row_tiles * plan.splits <= 188
    assert plan.splits * plan.tiles_per_split >= 257 > (plan.splits - 1) * plan.tiles_per_split
    assert plan.cost == plan_attention(shape, 4096 + 9, 188, 16, SMALL_OVERHEAD_TILES, 32).cost
    assert not plan.merged_in_kernel  # the mma.sync path leaves the merge to the combine


def test_split_plans_whose_grid_is_resident_at_once_merge_in_the_kernel(monkeypatch):
    fields = dict(
        attn=None, combine=None, combine_threads=256, smem_bytes=1, sm_count=132, keys_per_tile=64,
        overhead_tiles=8, runs="", fatbin=Path("x"), attn_wide=object(), wide_smem_bytes=1,
        attn_wide_clusters={2: object()},
    )  # fmt: skip

    def plan(kernels, batch, budget, s):
        tokens = budget + 1
        shape = AttentionShape(batch=batch, tokens=tokens, heads=8, kv_rows=s + tokens, mask_words=3)
        return kernels.plan(shape, s + tokens)

    hopper = AttentionKernels(**fields, path="wgmma")
    p = plan(hopper, 1, 8, 32768)  # 64-row tiles, 2 x 65 blocks: merged in the kernel
    assert (p.rows_per_block, p.row_tiles * p.splits, p.merged_in_kernel) == (64, 130, True)
    p = plan(hopper, 8, 8, 32768)  # 72-row tiles, 8 x 16 blocks: fewer than MERGE_MIN_SPLITS splits
    assert (p.rows_per_block, p.splits, p.merged_in_kernel) == (72, 16, False)
    p = plan(hopper, 1, 8, 4096)  # 22 splits
    assert (p.splits, p.merged_in_kernel) == (22, False)
    p = plan(hopper, 1, 16, 32768)  # 43 splits: the combine launch is faster there
    assert (p.splits, p.merged_in_kernel) == (43, False)
    p = plan(hopper, 64, 8, 32768)  # clusters of 2 merge on chip: nothing left to merge
    assert (p.cluster, p.partials, p.merged_in_kernel) == (2, 1, False)
    p = plan(hopper, 64, 1024, 4096)  # one split
    assert (p.splits, p.merged_in_kernel) == (1, False)
    # not the mma.sync path, not where the caller turned it off, not a grid of more blocks than SMs
    assert not plan(AttentionKernels(**fields, path="mma"), 1, 8, 32768).merged_in_kernel
    assert not plan(
        AttentionKernels(**fields, path="wgmma", merge_in_kernel=False), 1, 8, 32768
    ).merged_in_kernel
    # a plan of two waves (blocks wait for splits that have not started): the combine launch

    two_waves = AttentionPlan(row_tiles=2, splits=100, tiles_per_split=6)
    monkeypatch.setattr(attention_module, "plan_attention", lambda *args, **kwargs: two_waves)
    assert plan(hopper, 1, 8, 32768) == two_waves and not two_waves.merged_in_kernel
    with pytest.raises(ValueError, match="merge in the kernel"):
        AttentionPlan(1, splits=1, tiles_per_split=4, merged_in_kernel=True)
    with pytest.raises(ValueError, match="merge in the kernel"):
        AttentionPlan(1, splits=2, tiles_per_split=4, rows_per_block=72, cluster=2, merged_in_kernel=True)


@pytest.mark.parametrize(
    ("rows_per_block", "splits", "cluster"),
    [(72, 3, 2), (64, 2, 2), (72, 8, 8), (72, 4, 3)],
)
def test_a_plan_with_clusters_the_kernels_cannot_launch_is_refused(rows_per_block, splits, cluster):
    # a cluster's blocks must tile the split dimension, and only the 72-row kernel has a clustered form (2)
    with pytest.raises(ValueError, match="clusters of"):
        AttentionPlan(1, splits=splits, tiles_per_split=4, rows_per_block=rows_per_block, cluster=cluster)


def test_visible_keys_and_work():
    vis = np.zeros((1, 3, 3), bool)
    vis[0, 0, 0] = True
    vis[0, 1, [0, 1]] = True
    vis[0, 2, [0, 1, 2]] = True
    keys = visible_keys([5], packed_visibility(vis))
    assert keys.tolist() == [[6, 7, 8]]
    assert attention_flops(keys, 8) == 2 * 8 * (576 + 512) * 21
    assert attention_bytes([5], 3, 8, 1) == 8 * 576 * 2 + 3 * 8 * (576 + 512) * 2 + 3 * 4


@pytest.mark.skipif(cuda.find_nvcc() is None, reason="nvcc not found")
def test_fatbin_has_sm90a_code_for_the_wgmma_path(tmp_path):
    info = cuda.build_fatbin(KERNEL_SOURCE, tmp_path / "verify_attn.fatbin", ["sm_90", "sm_120"])
    assert info["archs"] == ["sm_120", "sm_90a"] and info["ptx"] == "compute_120"
    assert "arch=compute_90a,code=sm_90a" in info["command"]
    assert cuda.fatbin_runs(tmp_path / "verify_attn.fatbin", 90) == "sm_90a SASS"
    assert cuda.fatbin_runs(tmp_path / "verify_attn.fatbin", 120) == "sm_120 SASS"
    # the tree builder has no arch-specific path: plain sm_90
    assert cuda.gencode_flags(["sm_90"]) == [
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90",
    ]


def test_unknown_path_is_refused():
    with pytest.raises(ValueError, match="path must be one of"):
        VerifyAttention(path="tensor-cores")


# ------------------------------------------------------------------------------------------------- GPU

GPU_REASON = gpu_unavailable_reason()
try:
    import torch

    TORCH_REASON = None if torch.cuda.is_available() else "PyTorch sees no CUDA device"
except ImportError as exc:  # pragma: no cover - depends on the machine
    TORCH_REASON = f"PyTorch is not installed ({exc})"
needs_gpu = pytest.mark.skipif(
    GPU_REASON is not None or TORCH_REASON is not None,
    reason=f"needs a CUDA GPU and PyTorch: {GPU_REASON or TORCH_REASON}",
)


def tree_mask(batch, budget, kind="peaked", depth=16, seed=0):
    lp, ids = topk_inputs(kind, batch, depth, budget, seed=seed)
    trees = get_builder("native").build(lp, ids, budget)
    return trees


def relative_error(got, ref) -> float:
    """Largest |got - ref| relative to |ref| (at least 1): bf16 rounding against the magnitude."""
    return ((got.float() - ref).abs() / ref.abs().clamp(min=1.0)).max().item()


def assert_close(out, ref, tol=2e-2):
    got = out.float()
    assert not torch.isnan(got).any(), "NaN in the output"
    err = (got - ref).abs().max().item()
    assert err < tol, f"max abs error {err}"


@needs_gpu
@pytest.mark.parametrize(
    ("batch", "budget", "heads", "prefix"),
    [
        (1, 1, 8, [0]),  # no prefix at all: only the tree
        (2, 8, 8, [100, 37]),  # variable S, many splits
        (3, 31, 8, [64, 0, 5]),
        (2, 64, 64, [300, 1000]),  # 64 heads (one GPU, no TP)
        (4, 256, 8, [2000, 100, 33, 4096]),
        (1, 1024, 8, [512]),  # the largest budget, 33 mask words
        (64, 16, 8, [128] * 64),  # enough blocks: a single split
        (2, 128, 8, [4097, 31]),  # many key tiles per split, a partial last tile
    ],
)
@pytest.mark.parametrize("path", ["wgmma", "wgmma-split-jobs", "mma", "mma-small"])
def test_equals_float32_reference(batch, budget, heads, prefix, path):
    trees = tree_mask(batch, budget, seed=budget)
    bits = torch.as_tensor(packed_visibility(trees.visibility).view(np.int32), device="cuda")
    q, kv, out = random_case(trees, heads, prefix, seed=batch)
    attn = attention_on_path(path)
    prepared = attn.prepare(q, kv, np.array(prefix), bits, out)
    prepared.launch()
    torch.cuda.synchronize()
    ref = reference_attention(q, kv, prefix, trees.visibility)
    assert_close(out, ref)


def attention_on_path(path):
    """Our kernel on ``path`` ("mma-small": the mma.sync kernel with 32-row tiles); the wgmma path is skipped
    (with the reason) where it is not compiled in."""
    attn = (
        VerifyAttention(path="wgmma", seesaw=False)
        if path == "wgmma-split-jobs"
        else VerifyAttention(path=path)
    )
    try:
        kernels = attn.kernels
    except AttentionUnavailable as exc:
        pytest.skip(str(exc))
    assert kernels.path == {"mma-small": "mma", "wgmma-split-jobs": "wgmma"}.get(path, path)
    assert (kernels.attn_seesaw is not None) == (path == "wgmma")
    assert kernels.rows_per_block == (32 if path == "mma-small" else 64)
    assert kernels.keys_per_tile == {"wgmma": 64, "wgmma-split-jobs": 64, "mma": 32, "mma-small": 16}[path]
    return attn


@needs_gpu
@pytest.mark.parametrize("tiles_per_split", [1, 2, 3, 4, 5, 1000])
@pytest.mark.parametrize("climbing", [False, True])
def test_the_seesaw_kernel_at_every_count_of_tiles_a_split(tiles_per_split, climbing):
    # The seesaw kernel takes key tiles in pairs; 1 to 5 tiles a split run each of its loop's ends (a last
    # pair of one tile, of two, and two pairs after the loop). Prefix lengths 0, 61, 64, 200, 1000 put the
    # tree keys at the start of a tile, across two tiles and in the last, partial tile (its rows past the
    # request's keys hold NaN). Climbing scores move the running maximum on many tiles.
    attn = attention_on_path("wgmma")
    kernels = attn.kernels
    batch, budget, heads, prefix = 5, 40, 8, [0, 61, 64, 200, 1000]
    trees = tree_mask(batch, budget, seed=7)
    bits = torch.as_tensor(packed_visibility(trees.visibility).view(np.int32), device="cuda")
    q, kv, out = random_case(trees, heads, prefix, seed=11)
    if climbing:
        ramp = torch.linspace(0.25, 3.0, kv.shape[1], device="cuda").view(1, -1, 1)
        kv = (kv.float() * ramp).to(torch.bfloat16)
    plan = run_on_seesaw(attn, q, kv, prefix, bits, out, budget, heads, tiles_per_split)
    ref = reference_attention(q, kv, prefix, trees.visibility)
    assert not torch.isnan(out.float()).any(), "NaN in the output"
    err = relative_error(out, ref)
    assert err < 2e-2, f"max relative error {err}"
    # the other 64-row kernel on the same plan: within rounding
    out_previous = torch.full_like(out, float("nan"))
    again = attn.prepare(q, kv, np.array(prefix), bits, out_previous)
    PreparedAttention(
        kernels, again.shape, replace(plan, seesaw=False), again.views, again.prefix_lengths
    ).launch()
    torch.cuda.synchronize()
    assert ((out.float() - out_previous.float()).abs() / ref.abs().clamp(min=1.0)).max().item() < 2e-2


def run_on_seesaw(
    attn, q, kv, prefix, bits, out, budget, heads, tiles_per_split, multicast=False
) -> AttentionPlan:
    """One call of the seesaw kernel with ``tiles_per_split`` key tiles a split (at most all of them), into
    ``out``, synchronised; returns the plan it ran. ``multicast``: a request's row tiles in one cluster."""
    kernels = attn.kernels
    base = attn.prepare(q, kv, np.array(prefix), bits, out)
    tiles = math.ceil((max(prefix) + budget + 1) / kernels.keys_per_tile)
    per = min(tiles_per_split, tiles)
    row_tiles = math.ceil((budget + 1) * heads / 64)
    plan = AttentionPlan(
        row_tiles=row_tiles,
        splits=math.ceil(tiles / per),
        tiles_per_split=per,
        seesaw=True,
        row_cluster=row_tiles if multicast else 1,
    )
    PreparedAttention(kernels, base.shape, plan, base.views, base.prefix_lengths).launch()
    torch.cuda.synchronize()
    return plan


def hidden_tree_tiles(visibility, heads, prefix, tiles_per_split, keys=64, rows=64):
    """(row tile, split tile) pairs of each request where no row of the row tile sees a key of a tile that
    lies wholly in the tree: what the seesaw kernel skips. Counted on the host from the visibility."""
    count = 0
    for b, s in enumerate(prefix):
        vis, nodes = visibility[b], visibility.shape[1]
        tiles = math.ceil((s + nodes) / keys)
        for row0 in range(0, nodes * heads, rows):
            tokens = range(row0 // heads, (min(row0 + rows, nodes * heads) - 1) // heads + 1)
            seen = vis[[t for t in tokens if t < nodes]].any(axis=0)
            for t in range(tiles):
                key0, split_end = (
                    t * keys,
                    min(s + nodes, (t // tiles_per_split + 1) * tiles_per_split * keys),
                )
                if key0 >= s and not seen[key0 - s : min(key0 + keys, split_end) - s].any():
                    count += 1
    return count


@needs_gpu
@pytest.mark.parametrize("budget", [8, 16, 24, 32])
@pytest.mark.parametrize("tiles_per_split", [1, 2, 3, 5, 1000])
def test_the_seesaw_kernel_with_key_tiles_multicast_to_a_cluster_of_row_tiles(budget, tiles_per_split):
    # Budgets 8 to 32 at 8 heads: 2 to 5 row tiles, one cluster a request and split. The same prefix lengths
    # as above (NaN padding past every request's keys); one tile a split gives 17 splits of 5 requests, more
    # clusters than fit the GPU at once. Against float32, and against the unclustered kernel on the same grid:
    # the same tiles in the same order, so the same bits.
    attn = attention_on_path("wgmma")
    kernels = attn.kernels
    batch, heads, prefix = 5, 8, [0, 61, 64, 200, 1000]
    trees = tree_mask(batch, budget, seed=budget)
    bits = torch.as_tensor(packed_visibility(trees.visibility).view(np.int32), device="cuda")
    q, kv, out = random_case(trees, heads, prefix, seed=tiles_per_split)
    plan = run_on_seesaw(attn, q, kv, prefix, bits, out, budget, heads, tiles_per_split, multicast=True)
    assert plan.row_cluster == plan.row_tiles == math.ceil((budget + 1) * heads / 64)
    ref = reference_attention(q, kv, prefix, trees.visibility)
    assert not torch.isnan(out.float()).any(), "NaN in the output"
    assert relative_error(out, ref) < 2e-2
    alone = torch.full_like(out, float("nan"))
    again = attn.prepare(q, kv, np.array(prefix), bits, alone)
    PreparedAttention(
        kernels, again.shape, replace(plan, row_cluster=1), again.views, again.prefix_lengths
    ).launch()
    torch.cuda.synchronize()
    assert torch.equal(out, alone), float((out.float() - alone.float()).abs().max())


@needs_gpu
def test_clusters_of_row_tiles_fit_the_gpu():
    from ddtree_bench.cuda.occupancy import max_active_clusters  # noqa: PLC0415

    kernels = attention_on_path("wgmma").kernels
    assert set(kernels.attn_seesaw_multicast) == set(attention_module.ROW_CLUSTER_SIZES)
    for size, function in kernels.attn_seesaw_multicast.items():
        clusters = max_active_clusters(function, size, attention_module.THREADS, kernels.seesaw_smem_bytes)
        assert 1 <= clusters and clusters * size <= kernels.sm_count, (size, clusters)


def test_cluster_occupancy_refuses_an_impossible_launch():
    from ddtree_bench.cuda.occupancy import max_active_clusters  # noqa: PLC0415

    with pytest.raises(ValueError, match="cluster 0"):
        max_active_clusters(object(), 0, 256, 1024)


def test_a_plan_of_multicast_row_clusters_is_checked():
    ok = AttentionPlan(row_tiles=3, splits=4, tiles_per_split=9, seesaw=True, row_cluster=3)
    assert ok.partials == 4
    for bad in (
        dict(row_tiles=3, seesaw=False, row_cluster=3),  # the seesaw kernel only
        dict(row_tiles=4, seesaw=True, row_cluster=3),  # all of a request's row tiles
        dict(row_tiles=6, seesaw=True, row_cluster=6),  # a size the kernels have
        dict(row_tiles=3, seesaw=True, row_cluster=3, merged_in_kernel=True),  # clusters need not be resident
    ):
        with pytest.raises(ValueError, match="clusters of .* row tiles"):
            AttentionPlan(splits=4, tiles_per_split=9, **bad)


@needs_gpu
@pytest.mark.parametrize("tiles_per_split", [1, 3, 1000])
def test_the_seesaw_kernel_skips_the_tree_tiles_no_row_of_a_block_sees(tiles_per_split):
    # Budget 700 over 8 heads: a 64-row block holds 8 tokens, which see few of the tree's 11 tiles. Prefix
    # lengths 0, 61, 64 and 300 put the tree at a tile's start, across tiles and late in a split; with one
    # tile a split, whole splits hold only hidden tiles (their rows: no key, merged with weight 0).
    attn = attention_on_path("wgmma")
    batch, budget, heads, prefix = 4, 700, 8, [0, 61, 64, 300]
    trees = tree_mask(batch, budget, kind="uniform", seed=3)
    assert hidden_tree_tiles(trees.visibility, heads, prefix, tiles_per_split) > 0, "nothing to skip"
    bits = torch.as_tensor(packed_visibility(trees.visibility).view(np.int32), device="cuda")
    q, kv, out = random_case(trees, heads, prefix, seed=5)
    run_on_seesaw(attn, q, kv, prefix, bits, out, budget, heads, tiles_per_split)
    ref = reference_attention(q, kv, prefix, trees.visibility)
    assert not torch.isnan(out.float()).any(), "NaN in the output"
    assert relative_error(out, ref) < 2e-2


@needs_gpu
def test_the_mma_path_takes_the_small_tiles_where_the_gpu_allows_less_shared_memory(monkeypatch):
    import cupy as cp  # noqa: PLC0415

    real = cp.cuda.runtime.deviceGetAttribute
    allowed = {}

    def optin(attr, device):
        if attr == cp.cuda.runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin and "bytes" in allowed:
            return allowed["bytes"]
        return real(attr, device)

    monkeypatch.setattr(cp.cuda.runtime, "deviceGetAttribute", optin)
    full = VerifyAttention(path="mma").kernels  # this GPU's own limit
    if real(cp.cuda.runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin, cp.cuda.Device().id) >= 196352:
        assert (full.rows_per_block, full.keys_per_tile, full.smem_bytes) == (64, 32, 196352)
        assert full.runs.endswith("mma path")
    allowed["bytes"] = 101376  # an sm_120 part (RTX PRO 6000): 99 KB a block
    small = VerifyAttention(path="mma").kernels
    assert (small.rows_per_block, small.keys_per_tile, small.smem_bytes) == (32, 16, 88960)
    assert small.runs.endswith("mma path, 32-row tiles")
    allowed["bytes"] = 88960 - 16  # not even the small tiles: refused before any launch, with both sizes
    both = r"needs 196352 bytes .* \(64-row tiles\) or 88960 \(32-row tiles\); this GPU allows 88944"
    with pytest.raises(AttentionUnavailable, match=both):
        _ = VerifyAttention(path="mma").kernels


@needs_gpu
def test_the_small_tiles_equal_the_64_row_tiles():
    batch, budget, heads, prefix = 3, 64, 8, [5000, 33, 0]
    trees = tree_mask(batch, budget, seed=7)
    bits = torch.as_tensor(packed_visibility(trees.visibility).view(np.int32), device="cuda")
    q, kv, out = random_case(trees, heads, prefix, seed=11)
    out_small = torch.full_like(out, float("nan"))
    for path, o in (("mma", out), ("mma-small", out_small)):
        VerifyAttention(path=path).prepare(q, kv, np.array(prefix), bits, o).launch()
    torch.cuda.synchronize()
    assert not torch.isnan(out_small.float()).any(), "a row the small tiles did not write"
    # the same within rounding (the online softmax rescales per tile): a bf16 ulp or so of the magnitude
    err = ((out_small.float() - out.float()).abs() / out.float().abs().clamp(min=1.0)).max().item()
    assert err < 1e-2, f"max relative difference {err}"


@needs_gpu
def test_auto_takes_the_wgmma_path_on_hopper():
    major = torch.cuda.get_device_capability()[0]
    kernels = VerifyAttention().kernels
    assert kernels.path == ("wgmma" if major == 9 else "mma")
    assert f"{kernels.path} path" in kernels.runs


@needs_gpu
@pytest.mark.parametrize("path", ["wgmma", "mma", "mma-small"])
def test_mask_from_the_gpu_builder_and_both_split_paths_agree(path):
    import cupy as cp  # noqa: PLC0415

    batch, budget, heads = 2, 64, 8
    lp, ids = topk_inputs("bf16", batch, 16, budget)
    gpu = GpuBuilder()
    plan = gpu.plan(batch, 16, budget, budget)
    d_trees = DeviceTrees(batch, budget)
    gpu.launch(plan, cp.asarray(lp), cp.asarray(ids), d_trees, bool_visibility=False)
    trees = get_builder("native").build(lp, ids, budget)
    prefix = [700, 3000]
    q, kv, out = random_case(trees, heads, prefix)
    attn = attention_on_path(path)
    prepared = attn.prepare(q, kv, np.array(prefix), d_trees.visibility_bits, out)
    assert prepared.plan.splits > 1
    prepared.launch()
    torch.cuda.synchronize()
    ref = reference_attention(q, kv, prefix, trees.visibility)
    assert_close(out, ref)
    # the same call without splits (as if the GPU had one SM) gives the same result within rounding
    k = attn.kernels
    single = plan_attention(
        prepared.shape, max(prefix) + budget + 1, 1, k.keys_per_tile, k.overhead_tiles, k.rows_per_block
    )
    assert single.splits == 1
    out1 = torch.full_like(out, float("nan"))
    again = attn.prepare(q, kv, np.array(prefix), d_trees.visibility_bits, out1)
    again.plan = single
    again.partial_out = again.partial_lse = None
    again.launch()
    torch.cuda.synchronize()
    assert_close(out1, ref)


def wide_kernel_or_skip(attn):
    """The 72-row kernel belongs to the wgmma path: skipped (with the reason) where that is not compiled."""
    try:
        kernels = attn.kernels
    except AttentionUnavailable as exc:
        pytest.skip(str(exc))
    if kernels.attn_wide is None:
        pytest.skip(f"the 72-row kernel belongs to the wgmma path; this GPU runs the {kernels.path} path")
    return kernels


@needs_gpu
@pytest.mark.parametrize(
    ("batch", "tokens", "heads", "prefix"),
    [
        (2, 9, 8, [100, 4000]),  # budget 8 at 8 heads (72 rows), variable S, splits
        (3, 5, 14, [0, 63, 64]),  # 70 rows: a request without prefix, prefixes at a key-tile edge
        (1, 13, 5, [5000]),  # 65 rows, many splits
        (140, 9, 8, [200] * 140),  # more requests than SMs: a single split
        (2, 17, 8, [300, 2000]),  # budget 16: 136 rows, two 72-row blocks (the second with 64)
        (1, 33, 8, [1000]),  # budget 32: 264 rows, four blocks (the last with 48 rows)
        (3, 65, 8, [64, 700, 0]),  # budget 64: 520 rows, eight blocks (the last with 16 rows)
        (2, 20, 3, [900, 40]),  # 60 rows: one block, 12 of its rows padding
    ],
)
def test_the_72_row_kernel_equals_the_reference_and_the_64_row_tiles(batch, tokens, heads, prefix):
    attn = VerifyAttention(path="wgmma")
    wide_kernel_or_skip(attn)
    trees = tree_mask(batch, tokens - 1, seed=tokens)
    bits = torch.as_tensor(packed_visibility(trees.visibility).view(np.int32), device="cuda")
    q, kv, out = random_case(trees, heads, prefix, seed=heads)
    prepared = attn.prepare(q, kv, np.array(prefix), bits, out)
    if prepared.plan.rows_per_block != 72:  # the plan estimated the 64-row tiles faster: force the kernel
        tiles = math.ceil((max(prefix) + tokens) / attn.kernels.keys_per_tile)
        row_tiles = math.ceil(tokens * heads / 72)
        plan = AttentionPlan(row_tiles, splits=math.ceil(tiles / 2), tiles_per_split=2, rows_per_block=72)
        p = prepared
        prepared = PreparedAttention(attn.kernels, p.shape, plan, p.views, p.prefix_lengths)
    prepared.launch()
    torch.cuda.synchronize()
    assert_close(out, reference_attention(q, kv, prefix, trees.visibility))
    out64 = torch.full_like(out, float("nan"))
    narrow = VerifyAttention(path="wgmma", wide_rows=False).prepare(q, kv, np.array(prefix), bits, out64)
    assert narrow.plan.rows_per_block == 64
    narrow.launch()
    torch.cuda.synchronize()
    assert_close(out, out64.float())  # the same within rounding


@needs_gpu
@pytest.mark.parametrize("tiles_per_split", [1, 2, 1000])
def test_the_72_row_kernel_with_climbing_scores_and_splits_that_see_nothing(tiles_per_split):
    # keys scaled up along the sequence: the row maxima climb tile after tile, so the kernel's running maximum
    # is moved (its cross-warp exchange) on many tiles, not only the first. Prefix 120: with one key tile a
    # split, the last split holds only tree token 8, which rows of the other tokens do not see (their
    # partial row sums are 0, their log-sum-exp -inf).

    attn = VerifyAttention(path="wgmma")
    kernels = wide_kernel_or_skip(attn)
    batch, budget, heads, prefix = 2, 8, 8, [120, 3000]
    trees = tree_mask(batch, budget, seed=3)
    bits = torch.as_tensor(packed_visibility(trees.visibility).view(np.int32), device="cuda")
    q, kv, out = random_case(trees, heads, prefix, seed=5)
    ramp = torch.linspace(0.25, 3.0, kv.shape[1], device="cuda").view(1, -1, 1)
    kv = (kv.float() * ramp).to(torch.bfloat16)
    base = attn.prepare(q, kv, np.array(prefix), bits, out)
    tiles = math.ceil((max(prefix) + budget + 1) / kernels.keys_per_tile)
    per = min(tiles_per_split, tiles)
    plan = AttentionPlan(row_tiles=1, splits=math.ceil(tiles / per), tiles_per_split=per, rows_per_block=72)
    forced = PreparedAttention(kernels, base.shape, plan, base.views, base.prefix_lengths)
    forced.launch()
    torch.cuda.synchronize()
    ref = reference_attention(q, kv, prefix, trees.visibility)
    assert not torch.isnan(out.float()).any(), "NaN in the output"
    # the outputs reach ~10 here (the largest keys win): bf16 rounding relative to the magnitude
    err = relative_error(out, ref)
    assert err < 2e-2, f"max relative error {err}"


@needs_gpu
@pytest.mark.parametrize(
    ("batch", "tokens", "heads", "prefix", "splits"),
    [
        (2, 9, 8, [100, 4000], 2),  # budget 8: one cluster holds a request's splits: bf16 out, no combine
        (3, 65, 8, [64, 700, 0], 2),  # 8 row tiles; request 3's second split has no keys (log-sum-exp -inf)
        (1, 13, 5, [5000], 8),  # 65 rows, 8 splits: 4 partial rows a query row, then the combine
        (2, 20, 3, [900, 40], 4),  # 60 rows; request 2's last three splits have no keys
    ],
)
def test_split_clusters_merge_on_chip_equal_the_reference_and_the_unclustered_kernel(
    batch, tokens, heads, prefix, splits
):
    attn = VerifyAttention(path="wgmma")
    kernels = wide_kernel_or_skip(attn)
    trees = tree_mask(batch, tokens - 1, seed=tokens)
    bits = torch.as_tensor(packed_visibility(trees.visibility).view(np.int32), device="cuda")
    q, kv, out = random_case(trees, heads, prefix, seed=heads)
    base = attn.prepare(q, kv, np.array(prefix), bits, out)
    tiles = math.ceil((max(prefix) + tokens) / kernels.keys_per_tile)
    outs = {}
    for cluster in (1, 2):
        plan = AttentionPlan(
            row_tiles=math.ceil(tokens * heads / 72),
            splits=splits,
            tiles_per_split=math.ceil(tiles / splits),
            rows_per_block=72,
            cluster=cluster,
        )
        assert plan.partials == splits // cluster
        prepared = PreparedAttention(kernels, base.shape, plan, base.views, base.prefix_lengths)
        assert (prepared.partial_out is None) == (plan.partials == 1)
        out.fill_(float("nan"))
        prepared.launch()
        torch.cuda.synchronize()
        outs[cluster] = out.float().clone()
    assert not torch.isnan(outs[2]).any(), "a row the clusters did not write"
    assert_close(outs[2], reference_attention(q, kv, prefix, trees.visibility))
    assert_close(outs[2], outs[1])  # the same within rounding


def test_the_combine_takes_one_warp_a_row_for_few_splits_and_eight_for_many():
    rows = {splits: combine_rows_per_block(splits, 8) for splits in (2, 4, 5, 8, 9, 16, 17, 65, 129)}
    assert rows == {2: 8, 4: 8, 5: 4, 8: 4, 9: 2, 16: 2, 17: 1, 65: 1, 129: 1}
    assert combine_rows_per_block(3, 1) == 1 and combine_rows_per_block(3, 2) == 2  # a build's most
    assert cuda.kernel_constant(cuda.kernel_source("verify_attn"), "VA_COMBINE_UNROLL") == COMBINE_UNROLL


@needs_gpu
@pytest.mark.parametrize(
    ("batch", "tokens", "prefix", "splits"),
    [
        (2, 9, [100, 4000], 3),  # few splits: eight rows a block; request 0's later splits are empty
        (2, 17, [300, 2000], 7),  # four rows a block; 136 rows, not a multiple of 8 (a part block)
        (1, 33, [5000], 13),  # two rows a block
        (2, 9, [64, 9000], 40),  # eight warps a row, ten loads of four splits a warp; empty splits
    ],
)
def test_the_combine_merges_one_to_eight_rows_a_block_alike(batch, tokens, prefix, splits):
    attn = VerifyAttention(path="auto")
    try:
        kernels = attn.kernels
    except AttentionUnavailable as exc:
        pytest.skip(str(exc))
    assert kernels.combine_rows == 8
    trees = tree_mask(batch, tokens - 1, seed=splits)
    bits = torch.as_tensor(packed_visibility(trees.visibility).view(np.int32), device="cuda")
    q, kv, out = random_case(trees, 8, prefix, seed=splits)
    base = attn.prepare(q, kv, np.array(prefix), bits, out)
    tiles = math.ceil((max(prefix) + tokens) / kernels.keys_per_tile)
    per = math.ceil(tiles / splits)
    row_tiles = math.ceil(tokens * 8 / kernels.rows_per_block)
    plan = AttentionPlan(row_tiles, math.ceil(tiles / per), per, rows_per_block=kernels.rows_per_block)
    outs = {}
    for most in (1, 2, 4, 8):  # the build's most rows a block: the host takes fewer where it is lower
        prepared = PreparedAttention(
            replace(kernels, combine_rows=most), base.shape, plan, base.views, base.prefix_lengths
        )
        out.fill_(float("nan"))
        prepared.launch()
        torch.cuda.synchronize()
        outs[combine_rows_per_block(plan.partials, most)] = out.float().clone()
    assert_close(outs[1], reference_attention(q, kv, prefix, trees.visibility))
    assert max(outs) == combine_rows_per_block(plan.partials, 8)
    for got in outs.values():  # the same sums in another order: equal within a bf16 rounding
        assert_close(got, outs[1], tol=1e-2)


@needs_gpu
@pytest.mark.parametrize("rows_per_block", [64, 72])
@pytest.mark.parametrize(
    ("batch", "tokens", "heads", "prefix", "splits"),
    [
        (1, 9, 8, [32768], 65),  # budget 8 at batch 1: the published shape's 65 splits
        (2, 9, 8, [100, 4000], 16),  # variable S: request 1's later splits have no keys (log-sum-exp -inf)
        (3, 5, 14, [0, 63, 64], 2),  # 70 rows; a request without prefix
        (1, 13, 5, [5000], 40),  # 65 rows: the last row tile holds 1 (64-row tiles) or all 65 rows
        (2, 17, 8, [300, 2000], 7),  # 136 rows: two row tiles, splits not a divisor of the chunks
    ],
)
def test_splits_merged_in_the_kernel_equal_the_combine_and_the_reference(
    rows_per_block, batch, tokens, heads, prefix, splits
):
    attn = VerifyAttention(path="wgmma")
    kernels = wide_kernel_or_skip(attn)
    trees = tree_mask(batch, tokens - 1, seed=tokens)
    bits = torch.as_tensor(packed_visibility(trees.visibility).view(np.int32), device="cuda")
    q, kv, out = random_case(trees, heads, prefix, seed=heads + splits)
    base = attn.prepare(q, kv, np.array(prefix), bits, out)
    tiles = math.ceil((max(prefix) + tokens) / kernels.keys_per_tile)
    per = math.ceil(tiles / splits)
    row_tiles = math.ceil(tokens * heads / rows_per_block)
    assert row_tiles * math.ceil(tiles / per) * batch <= kernels.sm_count  # every block resident at once
    outs = {}
    for merged in (False, True):
        plan = AttentionPlan(
            row_tiles, math.ceil(tiles / per), per, rows_per_block=rows_per_block, merged_in_kernel=merged
        )
        prepared = PreparedAttention(kernels, base.shape, plan, base.views, base.prefix_lengths)
        assert (prepared.split_counters is not None) == merged
        for _ in range(3):  # the counters are back at zero after every call: the next call merges again
            out.fill_(float("nan"))
            prepared.launch()
            torch.cuda.synchronize()
            if merged:
                assert int(prepared.split_counters.sum()) == 0
            outs[merged, _] = out.float().clone()
    assert_close(outs[True, 0], reference_attention(q, kv, prefix, trees.visibility))
    assert torch.equal(outs[True, 0], outs[True, 2])  # the same order of sums every call
    assert_close(outs[True, 0], outs[False, 0], tol=4e-3)  # as the combine launch, within rounding


@needs_gpu
def test_splits_merged_in_the_kernel_replay_from_a_cuda_graph():
    import cupy as cp  # noqa: PLC0415

    attn = VerifyAttention()
    trees = tree_mask(1, 8, seed=2)
    bits = torch.as_tensor(packed_visibility(trees.visibility).view(np.int32), device="cuda")
    q, kv, out = random_case(trees, 8, [20000], seed=4)
    prepared = attn.prepare(q, kv, np.array([20000]), bits, out)
    if not prepared.plan.merged_in_kernel:
        pytest.skip(f"this GPU's plan for batch 1 does not merge in the kernel: {prepared.plan}")
    stream = cp.cuda.Stream(non_blocking=True)
    prepared.launch(stream)
    stream.synchronize()
    stream.begin_capture()
    prepared.launch(stream)
    graph = stream.end_capture()
    ref = reference_attention(q, kv, [20000], trees.visibility)
    for _ in range(3):
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.launch(stream)
        stream.synchronize()
        assert_close(out, ref)


@needs_gpu
def test_launch_refuses_host_and_non_contiguous_tensors():
    trees = tree_mask(1, 8)
    q, kv, out = random_case(trees, 8, [16])
    bits = torch.as_tensor(packed_visibility(trees.visibility).view(np.int32), device="cuda")
    attn = VerifyAttention()
    with pytest.raises(ValueError, match="must be on the GPU"):
        attn.prepare(q.cpu(), kv, np.array([16]), bits, out)
    with pytest.raises(ValueError, match="contiguous"):
        wide = torch.zeros((1, kv.shape[1], HEAD_DIM + 8), device="cuda", dtype=torch.bfloat16)
        attn.prepare(q, wide[..., :HEAD_DIM], np.array([16]), bits, out)


# ------------------------------------------------------------------------------------- benchmark (no GPU)


@pytest.fixture(scope="module")
def attention_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "peaked-L8.npz"
    lp, ids = generate_trace("peaked", 4, 8, 32, vocab_size=300, seed=1, device="cpu")
    save_trace(path, lp, ids, distribution="peaked", seed=1)
    return path


TIMING = dict(warmup=1, repeats=2, min_seconds=0.0, max_seconds=0.1, min_repeats=1, max_repeats=5)


def attention_rows(trace, budget, batch, **fields):
    """The stage's rows of one job (``stages.attention.Job`` with these fields)."""
    return attention_stage.run(attention_stage.Job(trace, budget, batch, **fields))


def small_benchmark(trace, impls):
    """Budget 16, batch 2, 8 heads, S = 300 on the trace's first requests: every impl in ``impls``."""
    return attention_rows(
        trace, 16, 2, heads=8, prefix=300, impls=impls, timing=TIMING, machine="m", distribution=None
    )


@needs_gpu
def test_benchmark_times_both_of_our_paths(attention_trace):
    df = small_benchmark(attention_trace, ["ours", "ours-mma"])
    assert set(df["impl"]) == {"ours", "ours-mma"}
    assert set(df["status"]) == {"ok"} and df["correct"].all()
    assert (df["seconds"] > 0).all()
    assert set(df.loc[df["impl"] == "ours-mma", "status_reason"]) == {"backend: mma path"}
    kernels = VerifyAttention().kernels
    expected = f"backend: {kernels.path} path"  # budget 16: a 64-row plan too small for the seesaw kernel
    assert set(df.loc[df["impl"] == "ours", "status_reason"]) == {expected}  # 2 splits: the combine launch


@needs_gpu
def test_benchmark_read_stream_is_the_shapes_bandwidth_bound(attention_trace):
    df = small_benchmark(attention_trace, ["ours", "read-stream"])
    ours, stream = df[df["impl"] == "ours"], df[df["impl"] == "read-stream"]
    assert set(stream["status"]) == {"ok"} and (stream["seconds"] > 0).all()
    assert set(stream["cache"]) == {"warm", "cold"}
    # the same bytes as the attention call, no FLOPs, nothing to check
    assert set(stream["bytes"]) == set(ours["bytes"]) and stream["flops"].isna().all()
    assert stream["correct"].isna().all() and stream["error"].isna().all()
    (reason,) = set(stream["status_reason"])
    assert reason.startswith("backend: one read of the call's bytes, ")


@needs_gpu
def test_stream_read_kernel_reads_every_word():
    """A buffer of zeros but one word: the thread that reads that word folds it, and stores its fold when it
    equals `never`; a word the kernel skips (tail, unrolled body, any position) would leave the sink at 0."""
    import cupy as cp  # noqa: PLC0415

    read = cp.RawModule(path=str(cached_fatbin(BENCH_UTIL_SOURCE))).get_function("ddtree_stream_read")
    grid = 3  # a small grid, so that the unrolled body and the tail both run
    stride = grid * STREAM_THREADS
    for count in (1, stride - 1, 4 * stride, 9 * stride + 5):
        words = cp.zeros(4 * count, cp.uint32)
        for position in sorted({0, count // 2, count - 1, min(count - 1, 4 * stride - 1)}):
            words.fill(0)
            words[4 * position + 2] = 0xC0FFEE
            sink = cp.zeros(1, cp.uint32)
            read((grid,), (STREAM_THREADS,), (words, np.int64(count), np.uint32(0xC0FFEE), sink))
            assert int(sink[0]) == 0xC0FFEE, (count, position)


def test_benchmark_backend_names_the_72_row_tiles():
    def prepared(path, rows_per_block, cluster=1, merged=0, seesaw=False, row_cluster=1):
        plan = SimpleNamespace(
            rows_per_block=rows_per_block,
            cluster=cluster,
            merged_in_kernel=merged > 0,
            splits=merged,
            seesaw=seesaw,
            row_cluster=row_cluster,
        )
        return SimpleNamespace(kernels=SimpleNamespace(path=path), plan=plan)

    assert backend_name(prepared("wgmma", 72)) == "wgmma path, 72-row tiles"
    assert backend_name(prepared("wgmma", 72, 2)) == "wgmma path, 72-row tiles, clusters of 2 splits"
    assert backend_name(prepared("wgmma", 64, merged=65)) == "wgmma path, 65 splits merged in the kernel"
    assert backend_name(prepared("wgmma", 64)) == "wgmma path"
    assert backend_name(prepared("wgmma", 64, seesaw=True)) == "wgmma path, seesaw"
    assert (
        backend_name(prepared("wgmma", 64, seesaw=True, row_cluster=3))
        == "wgmma path, seesaw, key tiles multicast to clusters of 3 row tiles"
    )
    assert (
        backend_name(prepared("wgmma", 64, merged=65, seesaw=True))
        == "wgmma path, seesaw, 65 splits merged in the kernel"
    )
    assert backend_name(prepared("mma", 64)) == "mma path"
    assert backend_name(prepared("mma", 32)) == "mma path, 32-row tiles of 16 keys"


def test_benchmark_without_a_gpu_gives_one_unavailable_row_per_impl(attention_trace, monkeypatch):
    monkeypatch.setattr(VerifyAttention, "unavailable_reason", lambda self: "no GPU in this test")
    df = attention_rows(
        attention_trace, 16, 2, heads=8, prefix=100, timing=TIMING, machine="m", distribution=None
    )
    assert list(df.columns) == list(STAGE_COLUMNS)
    assert df["impl"].tolist() == [
        "ours",
        "ours-mma",
        "flexattention",
        "sdpa",
        "flashmla",
        "sglang-triton",
        "sglang-fa3",
        "read-stream",
    ]
    # the mask each impl applies (FlashMLA has no tree mask; the read stream is no attention)
    assert df["mask"].tolist()[:-1] == ["tree"] * 4 + ["causal (no tree mask)", "tree", "tree"]
    assert df["mask"].isna().tolist()[-1]
    assert set(df["status"]) == {"unavailable"}
    assert set(df["status_reason"]) == {"no GPU in this test"}
    assert df["seconds"].isna().all()
    row = df.iloc[0]
    assert (row.stage, row.batch, row.budget, row.heads, row.prefix, row.depth) == (
        "verify-attention",
        2,
        16,
        8,
        100,
        8,
    )
    assert row.distribution == "peaked" and row.machine == "m"
    # the work of one call follows from the trees: every query sees the prefix plus its path to the root

    with np.load(attention_trace) as data:
        lp, ids = data["top_log_probs"][:2, :, :16], data["top_token_ids"][:2, :, :16]
    trees = get_builder("reference").build(np.ascontiguousarray(lp), np.ascontiguousarray(ids), 16)
    keys = 100 * 2 * 17 + int(trees.visibility.sum())
    assert row.flops == 2 * 8 * (576 + 512) * keys


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(heads=0), "heads must be"),
        (dict(prefix=-1), "prefix must be"),
        (dict(impls=["ours", "flash"]), "impls must be"),
        (dict(impls=[]), "impls must be"),
    ],
)
def test_benchmark_rejects_bad_arguments(attention_trace, change, message):
    args = dict(heads=8, prefix=10, timing=TIMING, machine="m", distribution=None) | change
    with pytest.raises(ValueError, match=message):
        attention_rows(attention_trace, 16, 2, **args)
