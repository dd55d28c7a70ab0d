"""Estimates of a round's terms from the shapes alone (no measurement), for the linear what-if of the
target's forward and the communication of tensor parallel: docs/throughput.md states every number, and
``kimi_arithmetic()`` derives the configuration's defaults from ``shapes.ModelShape`` and
``shapes.DrafterShape`` (Kimi K2.6 under tensor parallel 8; W4A16: INT4 routed experts, the rest BF16).
"""

from __future__ import annotations

import math
import numbers

from ddtree_bench.k26.shapes import DrafterShape, ModelShape, expected_experts

K26 = ModelShape()
DRAFTER = DrafterShape()
#: The H200's peaks the defaults assume where no measured peak rows exist (device copy, bf16 GEMM).
H200_COPY_TBPS = 4.3
H200_GEMM_TFLOPS = 790.0


def experts_touched(tokens, shape: ModelShape = K26) -> float:
    """E(T): the expected distinct experts T tokens touch in one MoE layer under uniform top-k routing
    (``shapes.expected_experts``; a real, skewed router touches fewer)."""
    if isinstance(tokens, bool) or not isinstance(tokens, numbers.Real) or not tokens >= 0:
        raise ValueError(f"tokens: must be a number >= 0, got {tokens!r}")
    return expected_experts(tokens, shape.experts, shape.top_k)


def kimi_arithmetic(
    copy_tbps: float = H200_COPY_TBPS,
    gemm_tflops: float = H200_GEMM_TFLOPS,
    shape: ModelShape = K26,
    drafter: DrafterShape = DRAFTER,
) -> dict:
    """The linear what-if's terms (docs/throughput.md): ``dense_weights_gb`` (BF16 weights read once per
    forward), ``expert_slice_mb``, ``per_token_us`` (2 FLOPs per BF16 weight and per routed-expert weight
    a token meets, at ``gemm_tflops``) and its dense part ``per_token_dense_us``, ``draft_weights_gb``,
    ``draft_per_token_us``, and ``fixed_ms`` = dense weights / ``copy_tbps``."""
    dense = shape.bf16_bytes() / 2
    experts_per_token = shape.moe_layers * shape.top_k * 3 * shape.hidden * shape.expert_slice
    draft = drafter.bytes(shape.vocab_shard, shape.hidden) / 2
    return {
        "dense_weights_gb": shape.bf16_bytes() / 1e9,
        "expert_slice_mb": shape.expert_slice_bytes() / 1e6,
        "per_token_us": 2 * (dense + experts_per_token) / (gemm_tflops * 1e12) * 1e6,
        "per_token_dense_us": 2 * dense / (gemm_tflops * 1e12) * 1e6,
        "draft_weights_gb": 2 * draft / 1e9,
        "draft_per_token_us": 2 * draft / (gemm_tflops * 1e12) * 1e6,
        "fixed_ms": shape.bf16_bytes() / (copy_tbps * 1e12) * 1e3,
    }


def _positive(value, name: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
    return float(value)


def allreduce_s(
    tokens: int, world: int, busbw_gbps: float, latency_us: float, shape: ModelShape = K26
) -> float:
    """A forward's ``2 x layers`` all-reduces of tokens x hidden BF16 in ring terms (nccl-tests' bus
    bandwidth): count x (latency + 2 (w - 1) / w x bytes / busbw). 0 on one GPU."""
    if world <= 1:
        return 0.0
    size = tokens * shape.hidden * 2
    busbw = _positive(busbw_gbps, "bus bandwidth") * 1e9
    return 2 * shape.layers * (latency_us * 1e-6 + 2 * (world - 1) / world * size / busbw)


def topk_allgather_s(
    batch: int, positions: int, k: int, world: int, busbw_gbps: float, latency_us: float
) -> float:
    """The drafter's vocab-parallel top-K: three all-gathers per round (each rank's top-K values in float32,
    their token ids in int64, its logsumexp in float32, over batch x positions rows), each latency +
    (w - 1) / w x gathered bytes / busbw. 0 on one GPU."""
    if world <= 1:
        return 0.0
    busbw = _positive(busbw_gbps, "bus bandwidth") * 1e9
    rows = batch * positions
    per_rank = (rows * k * 4, rows * k * 8, rows * 4)
    return sum(latency_us * 1e-6 + (world - 1) / world * world * b / busbw for b in per_rank)


__all__ = ["experts_touched", "expected_experts", "kimi_arithmetic", "allreduce_s", "topk_allgather_s"]
