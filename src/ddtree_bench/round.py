"""The arithmetic of one decode round of Kimi K2.6 under tensor parallel 8 (pure functions, no measurement):
the distinct routed experts a round's tokens touch, the per-rank weight bytes and FLOPs behind the linear
what-if of the target's forward, the drafter's, and the communication estimate. docs/throughput.md states
every number; ``kimi_arithmetic()`` derives the configuration's defaults from the shapes here.

The weights are W4A16 (the official checkpoint): routed experts INT4 (group 32, a BF16 scale per group),
attention, the shared expert, layer 0's dense MLP, the router and the LM head BF16.
"""

from __future__ import annotations

import math
import numbers

# Kimi K2.6 (DeepSeek-V3-style), per its public config
HIDDEN = 7168
LAYERS = 61
MOE_LAYERS = 60
HEADS = 64
Q_LORA = 1536
KV_LORA = 512
ROPE_DIM = 64
NOPE_DIM = 128
V_DIM = 128
VOCAB = 163840
EXPERTS = 384
EXPERTS_PER_TOKEN = 8
MOE_INTERMEDIATE = 2048
SHARED_INTERMEDIATE = 2048
DENSE_INTERMEDIATE = 18432
INT4_GROUP = 32
#: Tensor parallel degree of the deployment the step stages model (8 query heads per GPU).
TP = 8
#: Two all-reduces per layer (after attention, after the MLP/MoE).
ALLREDUCES = 2 * LAYERS
#: A K2.5 DFlash drafter (Qwen3-style layers): layers, query heads, KV heads, head dim, intermediate.
DRAFTER = {"layers": 6, "heads": 64, "kv_heads": 8, "head_dim": 128, "intermediate": 18432}

#: The H200's peaks these defaults assume where no measured peak rows exist (device copy, bf16 GEMM).
H200_COPY_TBPS = 4.3
H200_GEMM_TFLOPS = 790.0


def experts_touched(tokens, experts: int = EXPERTS, per_token: int = EXPERTS_PER_TOKEN) -> float:
    """E(T) = experts x (1 - (1 - per_token / experts)^T): the expected distinct experts T tokens touch in
    one MoE layer when each picks ``per_token`` of ``experts`` uniformly (a real, skewed router touches
    fewer). E(1) = 8, E(9) = 66.3, E(33) = 192.3, E(257) = 382.3."""
    if isinstance(tokens, bool) or not isinstance(tokens, numbers.Real) or not tokens >= 0:
        raise ValueError(f"tokens: must be a number >= 0, got {tokens!r}")
    return experts * (1.0 - (1.0 - per_token / experts) ** float(tokens))


def expert_slice_bytes(tp: int = TP) -> float:
    """One rank's slice of one routed expert (gate, up, down: 3 x hidden x intermediate / tp weights) at
    INT4 with a BF16 scale per group of 32: 3 x 7168 x 256 x (0.5 + 2/32) B = 3.10 MB under tp 8."""
    return 3 * HIDDEN * (MOE_INTERMEDIATE // tp) * (0.5 + 2 / INT4_GROUP)


def dense_params_per_rank(tp: int = TP) -> dict[str, float]:
    """The BF16 parameters one rank reads per forward (embedding lookups aside), by part. q_a and kv_a are
    replicated (as SGLang shards them), the router too; the rest is split over the ``tp`` ranks."""
    heads = HEADS // tp
    attention = (
        HIDDEN * Q_LORA  # q_a
        + Q_LORA * heads * (NOPE_DIM + ROPE_DIM)  # q_b
        + HIDDEN * (KV_LORA + ROPE_DIM)  # kv_a
        + 2 * heads * NOPE_DIM * KV_LORA  # absorbed kv_b (w_uk, w_uv)
        + heads * V_DIM * HIDDEN  # o_proj
    )
    return {
        "attention projections": LAYERS * attention,
        "shared experts": MOE_LAYERS * 3 * HIDDEN * SHARED_INTERMEDIATE / tp,
        "routers": MOE_LAYERS * HIDDEN * EXPERTS,
        "layer 0 dense MLP": 3 * HIDDEN * DENSE_INTERMEDIATE / tp,
        "LM head": VOCAB / tp * HIDDEN,
    }


def drafter_params_per_rank(tp: int = TP) -> float:
    """The DFlash drafter's BF16 parameters per rank: its layers split over ``tp`` ranks, plus the target's
    LM-head shard it uses over the block's positions."""
    d = DRAFTER
    per_layer = (
        HIDDEN * d["heads"] * d["head_dim"] * 2  # q, o
        + HIDDEN * d["kv_heads"] * d["head_dim"] * 2  # k, v
        + 3 * HIDDEN * d["intermediate"]  # MLP
    )
    return d["layers"] * per_layer / tp + VOCAB / tp * HIDDEN


def kimi_arithmetic(copy_tbps: float = H200_COPY_TBPS, gemm_tflops: float = H200_GEMM_TFLOPS) -> dict:
    """The linear what-if's terms from the shapes (docs/throughput.md): ``dense_weights_gb`` (BF16 weights
    read once per forward), ``expert_slice_mb``, ``per_token_us`` (2 FLOPs per BF16 parameter and per
    routed-expert weight a token meets, at ``gemm_tflops``), ``draft_weights_gb``, ``draft_per_token_us``,
    and ``fixed_ms`` = dense weights / ``copy_tbps``."""
    dense = sum(dense_params_per_rank().values())
    experts_per_token = MOE_LAYERS * EXPERTS_PER_TOKEN * 3 * HIDDEN * MOE_INTERMEDIATE / TP
    drafter = drafter_params_per_rank()
    return {
        "dense_weights_gb": 2 * dense / 1e9,
        "expert_slice_mb": expert_slice_bytes() / 1e6,
        "per_token_us": 2 * (dense + experts_per_token) / (gemm_tflops * 1e12) * 1e6,
        "per_token_dense_us": 2 * dense / (gemm_tflops * 1e12) * 1e6,
        "draft_weights_gb": 2 * drafter / 1e9,
        "draft_per_token_us": 2 * drafter / (gemm_tflops * 1e12) * 1e6,
        "fixed_ms": 2 * dense / (copy_tbps * 1e12) * 1e3,
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
    tokens: int, world: int, busbw_gbps: float, latency_us: float, count: int = ALLREDUCES
) -> float:
    """``count`` all-reduces of tokens x 7168 BF16 in ring terms (nccl-tests' bus bandwidth):
    count x (latency + 2 (w - 1) / w x bytes / busbw). 0 on one GPU."""
    if world <= 1:
        return 0.0
    size = tokens * HIDDEN * 2
    busbw = _positive(busbw_gbps, "bus bandwidth") * 1e9
    return count * (latency_us * 1e-6 + 2 * (world - 1) / world * size / busbw)


def topk_allgather_s(
    batch: int, positions: int, k: int, world: int, busbw_gbps: float, latency_us: float
) -> float:
    """The drafter's vocab-parallel top-K: three all-gathers per round (each rank's top-K values in
    float32, their token ids in int64, its logsumexp in float32, over batch x positions rows), each
    latency + (w - 1) / w x gathered bytes / busbw. 0 on one GPU."""
    if world <= 1:
        return 0.0
    busbw = _positive(busbw_gbps, "bus bandwidth") * 1e9
    rows = batch * positions
    per_rank = (rows * k * 4, rows * k * 8, rows * 4)
    return sum(latency_us * 1e-6 + (world - 1) / world * world * b / busbw for b in per_rank)
