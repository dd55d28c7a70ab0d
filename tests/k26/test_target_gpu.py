"""The target's and the drafter's share on the GPU (small shapes): graph replay equals the eager forward,
outputs are finite, the drafter's top-K is the builders' input (sorted log-probs). They skip without a GPU."""

from __future__ import annotations

import os

import numpy as np
import pytest
from model_shapes import SMALL_DRAFTER, SMALL_TARGET

from ddtree_bench.cuda.loader import gpu_unavailable_reason
from ddtree_bench.tree import packed_visibility

GPU_REASON = gpu_unavailable_reason()
#: Where SGLang's MoE kernels' files are (as the MoE tests take them), else the installed sglang's
SGLANG_FILES = os.environ.get("DDTREE_SGLANG_FILES") or None
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"needs a CUDA GPU: {GPU_REASON}")

SMALL = SMALL_TARGET


def chain_mask(batch: int, budget: int):
    """Packed visibility of chain trees (node i's parent is i - 1) on the GPU."""
    import torch  # noqa: PLC0415

    n = budget + 1
    visibility = np.broadcast_to(np.tril(np.ones((n, n), bool)), (batch, n, n)).copy()
    return torch.as_tensor(packed_visibility(visibility).view(np.int32), device="cuda")


@needs_gpu
@pytest.mark.parametrize("impl", ["bf16-grouped-mm", "marlin-w4a16", "triton-w4a16"])
def test_forward_graph_replay_equals_eager(impl):
    import torch  # noqa: PLC0415

    from ddtree_bench.k26 import moe as moe_ops  # noqa: PLC0415
    from ddtree_bench.k26.target import TargetShard, TargetWeights, capture  # noqa: PLC0415
    from ddtree_bench.ops.attention import VerifyAttention  # noqa: PLC0415

    reason = moe_ops.moe_unavailable_reason(impl, SGLANG_FILES)
    if reason is not None:
        pytest.skip(f"{impl} unavailable: {reason}")
    batch, budget, prefix = 2, 7, 200
    weights = TargetWeights(SMALL, moe_impl=impl, sglang_files=SGLANG_FILES, seed=1)
    state = TargetShard(
        weights,
        batch=batch,
        budget=budget,
        prefix=prefix,
        attention=VerifyAttention(),
        mask_bits=chain_mask(batch, budget),
    )
    eager = state.forward().clone()
    torch.cuda.synchronize()
    assert eager.shape == (batch * (budget + 1), SMALL.vocab_shard)
    assert torch.isfinite(eager.float()).all()
    # Marlin reduces its split-K partials with bf16 atomic adds on sm_90 (SGLang's fused_marlin_moe sets
    # use_atomic_add there): their order, and so the last bits of each sum, changes from call to call, and
    # the layers after carry it on. A replay must then be as close to eager as two eager calls are.
    eager_again = [state.forward().clone() for _ in range(4)]
    torch.cuda.synchronize()
    spread = max(float((e.float() - eager.float()).abs().max()) for e in eager_again)
    graph, out = capture(state.forward)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), eager.float(), rtol=1e-2, atol=1e-2 + 1.5 * spread)
    for part in (state.moe_part, state.dense_part, state.lm_head_part):
        assert torch.isfinite(part().float()).all()
    assert 1 <= state.experts_touched <= SMALL.experts


@needs_gpu
def test_drafter_top_k_is_sorted_log_probs_and_graph_equals_eager():
    import torch  # noqa: PLC0415

    from ddtree_bench.k26.draft import DraftShard  # noqa: PLC0415
    from ddtree_bench.k26.target import capture  # noqa: PLC0415

    drafter = DraftShard(SMALL_DRAFTER, batch=2, block=9, context=100, k=8, vocab_shard=2048)
    lp, ids = (t.clone() for t in drafter.run())
    assert lp.shape == (2, 8, 8) and ids.shape == (2, 8, 8)
    assert torch.isfinite(lp).all() and (lp <= 1e-6).all()
    assert (lp[..., :-1] >= lp[..., 1:]).all()  # rows sorted descending, as the builders take them
    assert (ids >= 0).all() and (ids < 2048).all()
    graph, (glp, gids) = capture(drafter.run)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(glp, lp, rtol=1e-4, atol=1e-4)
