"""The round runner: the split round's host build (SGLang's function per request, padded as its worker pads,
and our reference) gives the fields the verify reads equal to reference's trees; the on-GPU mask packing
equals the tree's packed bits; the whole round on the GPU (skipped here) is one graph equal to its eager
parts, and its accepted paths equal the CPU walk."""

from __future__ import annotations

import numpy as np
import pytest
from builders.test_sglang import write_stand_in
from conftest import make_topk
from model_shapes import SMALL_DRAFTER, SMALL_TARGET

from ddtree_bench.builders import get_builder
from ddtree_bench.cuda.loader import gpu_unavailable_reason
from ddtree_bench.k26.round import _COPIED, ROUND_BUILDERS, RoundOptions, host_trees, pack_bits
from ddtree_bench.stages import round as round_stage
from ddtree_bench.tree import packed_visibility

GPU_REASON = gpu_unavailable_reason()
TIMING = {
    "warmup": 0,
    "repeats": 2,
    "min_repeats": 1,
    "max_repeats": 3,
    "min_seconds": 0.0,
    "max_seconds": 1.0,
}


@pytest.mark.parametrize("budget", [1, 7, 31, 32, 33, 70])
def test_mask_packed_on_the_device_equals_the_trees_bits(budget):
    torch = pytest.importorskip("torch", reason="the packing is torch ops (PyTorch not installed)")
    lp, ids = make_topk("bf16", 3, 6, 16, seed=budget)
    trees = get_builder("reference").build(lp, ids, budget)
    want = packed_visibility(trees.visibility).view(np.int32)
    out = torch.zeros(want.shape, dtype=torch.int32)
    pack_bits(torch, torch.from_numpy(trees.visibility), out)
    assert np.array_equal(out.numpy(), want)


@pytest.mark.parametrize("name", ["sglang", "reference"])
def test_split_round_host_build_gives_the_verify_fields(tmp_path, name):
    torch = pytest.importorskip("torch", reason="the split round's host build runs on torch (not installed)")
    from ddtree_bench.builders.sglang import sglang_call  # noqa: PLC0415

    lp, ids = make_topk("bf16", 4, 8, 16, seed=3)
    budget = 20
    builder = (
        get_builder(name, source=write_stand_in(tmp_path / "ddtree.py", workspace=False))
        if (name == "sglang")
        else get_builder(name)
    )
    extra = sglang_call(builder) if name == "sglang" else None
    fields = host_trees(torch, name, builder, torch.from_numpy(lp), torch.from_numpy(ids), budget, extra)
    want = get_builder("reference").build(lp, ids, budget)
    assert set(fields) == set(_COPIED)
    for field in _COPIED:
        assert np.array_equal(fields[field].numpy(), np.asarray(getattr(want, field))), field


@pytest.mark.skipif(GPU_REASON is None, reason="a GPU is present: the stage measures")
def test_round_stage_without_a_gpu_writes_rows_saying_why():
    from ddtree_bench.k26.shapes import DrafterShape, ModelShape  # noqa: PLC0415

    args = {
        "batch": 1,
        "prefix": 4096,
        "budgets": (8, 64),
        "builders": ("gpu", "native-mt", "sglang"),
        "builder_options": {},
        "shape": ModelShape(),
        "drafter_shape": DrafterShape(),
        "forward_impl": "marlin-w4a16",
        "block_size": 16,
        "follow_budget": False,
        "topk": 1024,
        "routing": "uniform",
        "skew": 1.0,
        "sglang_files": None,
        "timing": TIMING,
        "machine": "m",
    }
    rows = round_stage.run(round_stage.Job(**args))
    for budget, frame in rows.items():
        assert set(frame["stage"]) == {"round"} and set(frame["status"]) == {"unavailable"}
        assert list(frame["impl"]) == ["gpu", "native-mt", "sglang"] and (frame["budget"] == budget).all()
    with pytest.raises(ValueError, match="unknown builder 'cuda'"):
        round_stage.run(
            round_stage.Job(**{**args, "prefix": 0, "budgets": (8,), "builders": ("cuda",), "topk": 8})
        )


@pytest.mark.skipif(GPU_REASON is not None, reason=f"needs a CUDA GPU: {GPU_REASON}")
@pytest.mark.parametrize("builder", ["gpu", "native-mt", "reference"])
def test_round_on_the_gpu_equals_its_eager_parts_and_the_cpu_walk(builder):
    import torch  # noqa: PLC0415

    from ddtree_bench.k26.round import RoundRunner  # noqa: PLC0415
    from ddtree_bench.k26.target import TargetWeights  # noqa: PLC0415
    from ddtree_bench.ops.accept import GpuAccept  # noqa: PLC0415
    from ddtree_bench.ops.attention import VerifyAttention  # noqa: PLC0415

    assert builder in ROUND_BUILDERS
    shape, drafter = SMALL_TARGET, SMALL_DRAFTER
    weights = TargetWeights(shape, moe_impl="bf16-grouped-mm", seed=2)
    runner = RoundRunner(
        weights,
        drafter,
        RoundOptions(batch=2, budget=24, prefix=100, block_size=8, follow_budget=False, topk=16),
        builder=builder,
        builder_options=None,
        attention=VerifyAttention(),
        accept=GpuAccept(),
    )
    runner.capture()
    runner.run_round()
    assert runner.check_accept()
    tokens_graph = runner.target_tokens.clone()
    accepted_graph = runner.accept_out.accepted_indices.copy()
    for part in runner.parts().values():  # the same round, part by part, eagerly replayed
        part()
    torch.cuda.synchronize()
    assert torch.equal(runner.target_tokens, tokens_graph)
    assert np.array_equal(runner.accept_out.accepted_indices.get(), accepted_graph.get())
    assert runner.check_accept()
    trees = runner.trees.to_host()
    lp, ids = (t.cpu().numpy() for t in (runner.drafter.top_log_probs, runner.drafter.top_token_ids))
    want = get_builder("reference").build(lp, ids, 24)
    assert np.array_equal(trees.parents, want.parents) and np.array_equal(
        trees.node_token_ids, want.node_token_ids
    )
