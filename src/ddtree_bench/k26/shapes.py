"""One GPU's share of Kimi K2.6 and of its DFlash drafter: shapes, bytes and FLOPs, plain arithmetic.

The share is rank 0 of tensor parallel ``tp`` as SGLang shards the target (numbers: the public K2.6 config):

- 61 decoder layers; the first ``dense_layers`` have a dense MLP (intermediate 18432 / tp), the rest are MoE
  layers: a router ``hidden -> experts`` (replicated, top-``top_k``), ``experts`` routed experts, INT4 W4A16
  (group ``group_size``, symmetric, bf16 scales), each sliced to intermediate ``moe_intermediate / tp``, and a
  BF16 shared expert (``shared_intermediate / tp``);
- absorbed MLA: ``q_a`` hidden -> q_lora_rank and ``kv_a`` hidden -> kv_lora_rank + rope (both replicated),
  ``q_b`` q_lora_rank -> heads/tp x (nope + rope), the absorbed ``kv_b`` per head (nope x latent for the
  query, latent x v for the output), ``o_proj`` heads/tp x v -> hidden; the attention core is the verify
  attention (``ops.attention``);
- final norm and a vocab-parallel LM-head shard (vocab / tp rows, BF16).

``ModelShape.part_bytes(T)`` and ``part_flops(T)`` give per forward of ``T`` tokens what each part reads and
computes (weights read once per forward; the routed experts only those the tokens touch,
``expected_experts``). ``expected_experts(T)`` is the mean number of distinct experts ``T`` tokens touch per
layer under uniform top-k
routing, ``E (1 - (1 - k/E)^T)``; ``simulate_routing`` draws the same routing.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np

#: The parts of the target's forward a stage times on its own (the verify attention core is its own stage).
PARTS = ("moe", "dense", "lm-head")
#: Routing distributions of the routed experts: every expert equally likely, or a Zipf-like skew.
ROUTINGS = ("uniform", "skewed")


@dataclass(frozen=True)
class ModelShape:
    """One rank's share of a DeepSeek-V3-style MLA + MoE target (defaults: Kimi K2.6 under TP 8)."""

    hidden: int = 7168
    layers: int = 61
    dense_layers: int = 1
    experts: int = 384
    top_k: int = 8
    moe_intermediate: int = 2048
    shared_intermediate: int = 2048
    dense_intermediate: int = 18432
    heads: int = 64
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_dim: int = 128
    qk_rope_dim: int = 64
    v_head_dim: int = 128
    vocab: int = 163840
    tp: int = 8
    group_size: int = 32

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"model: {f.name} must be an integer >= 0, got {value!r}")
        for name in ("hidden", "layers", "experts", "top_k", "heads", "tp", "group_size", "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"model: {name} must be >= 1, got {getattr(self, name)}")
        if self.dense_layers > self.layers:
            raise ValueError(f"model: dense_layers ({self.dense_layers}) must be <= layers ({self.layers})")
        if self.top_k > self.experts:
            raise ValueError(f"model: top_k ({self.top_k}) must be <= experts ({self.experts})")
        for name in ("heads", "moe_intermediate", "shared_intermediate", "dense_intermediate", "vocab"):
            if getattr(self, name) % self.tp:
                raise ValueError(f"model: {name} ({getattr(self, name)}) must divide by tp ({self.tp})")
        if self.hidden % self.group_size:
            raise ValueError(f"model: hidden ({self.hidden}) must divide by group_size ({self.group_size})")

    @classmethod
    def from_config(cls, section: dict | None) -> ModelShape:
        section = dict(section or {})
        unknown = sorted(set(section) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"model: unknown key {unknown[0]!r}")
        return cls(**section)

    def as_dict(self) -> dict:
        return asdict(self)

    # ------------------------------------------------------------------------------------ per-rank sizes
    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    @property
    def local_heads(self) -> int:
        return self.heads // self.tp

    @property
    def expert_slice(self) -> int:  # a routed expert's intermediate on this rank
        return self.moe_intermediate // self.tp

    @property
    def shared_slice(self) -> int:
        return self.shared_intermediate // self.tp

    @property
    def dense_slice(self) -> int:
        return self.dense_intermediate // self.tp

    @property
    def vocab_shard(self) -> int:
        return self.vocab // self.tp

    @property
    def latent_dim(self) -> int:  # one latent KV row: kv_lora_rank + rope
        return self.kv_lora_rank + self.qk_rope_dim

    def expert_slice_bytes(self) -> float:
        """One routed expert's INT4 slice here: gate, up and down, 0.5 B a weight + bf16 group scales."""
        weights = 3 * self.hidden * self.expert_slice
        return weights * (0.5 + 2.0 / self.group_size)

    # ------------------------------------------------------------------------------------ per-layer params
    def attention_params(self) -> int:
        """BF16 weights of one layer's MLA projections here (norms included, attention core excluded)."""
        h, heads = self.hidden, self.local_heads
        q_a = h * self.q_lora_rank
        q_b = self.q_lora_rank * heads * (self.qk_nope_dim + self.qk_rope_dim)
        kv_a = h * self.latent_dim
        kv_b = heads * self.kv_lora_rank * (self.qk_nope_dim + self.v_head_dim)  # absorbed: W_UK and W_UV
        o_proj = heads * self.v_head_dim * h
        norms = 2 * h + self.q_lora_rank + self.kv_lora_rank
        return q_a + q_b + kv_a + kv_b + o_proj + norms

    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.dense_slice

    def shared_expert_params(self) -> int:
        return 3 * self.hidden * self.shared_slice

    def router_params(self) -> int:
        return self.hidden * self.experts

    def lm_head_params(self) -> int:
        return self.vocab_shard * self.hidden + self.hidden  # the shard and the final norm

    def bf16_bytes(self) -> float:
        """Every BF16 weight of the rank: projections, dense MLP, shared experts, routers, LM head."""
        params = (
            self.layers * self.attention_params()
            + self.dense_layers * self.dense_mlp_params()
            + self.moe_layers * (self.shared_expert_params() + self.router_params())
            + self.lm_head_params()
        )
        return 2.0 * params

    def expert_bytes(self) -> float:
        """Every routed expert slice of the rank (INT4 W4A16)."""
        return self.moe_layers * self.experts * self.expert_slice_bytes()

    def kv_cache_bytes(self, batch: int, kv_rows: int) -> float:
        """The latent cache of every layer for ``batch`` requests of ``kv_rows`` rows (bf16)."""
        return 2.0 * self.layers * batch * kv_rows * self.latent_dim

    # ------------------------------------------------------------------------------------ per forward
    def expected_experts(self, tokens: int) -> float:
        return expected_experts(tokens, self.experts, self.top_k)

    def part_bytes(
        self, tokens: int, experts_touched: float | None = None, expert_bytes: float | None = None
    ) -> dict[str, float]:
        """Bytes each part reads at least once per forward of ``tokens`` tokens (weights; activations are
        small beside them). ``experts_touched``: distinct experts per MoE layer (default: uniform
        routing); ``expert_bytes``: one expert slice in the MoE impl's format (default: INT4)."""
        touched = self.expected_experts(tokens) if experts_touched is None else experts_touched
        slice_bytes = self.expert_slice_bytes() if expert_bytes is None else expert_bytes
        moe = self.moe_layers * (
            touched * slice_bytes + 2.0 * (self.shared_expert_params() + self.router_params())
        )
        dense = 2.0 * (self.layers * self.attention_params() + self.dense_layers * self.dense_mlp_params())
        return {"moe": moe, "dense": dense, "lm-head": 2.0 * self.lm_head_params()}

    def part_flops(self, tokens: int) -> dict[str, float]:
        """Multiply-add FLOPs (2 per weight and token) of each part per forward of ``tokens`` tokens."""
        t = float(tokens)
        routed = self.top_k * 3 * self.hidden * self.expert_slice
        moe = 2.0 * t * self.moe_layers * (routed + self.shared_expert_params() + self.router_params())
        dense = (
            2.0 * t * (self.layers * self.attention_params() + self.dense_layers * self.dense_mlp_params())
        )
        return {"moe": moe, "dense": dense, "lm-head": 2.0 * t * self.lm_head_params()}


@dataclass(frozen=True)
class DrafterShape:
    """One rank's share of a DFlash drafter (Qwen3-style layers; defaults: the public Kimi K2.5 drafter)."""

    layers: int = 6
    hidden: int = 7168
    heads: int = 64
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 18432
    tp: int = 8
    #: the target layers whose hidden states the drafter's context projection (``fc``) takes, concatenated
    target_layers: int = 5

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"draft: {f.name} must be an integer >= 1, got {value!r}")
        for name in ("heads", "kv_heads", "intermediate"):
            if getattr(self, name) % self.tp:
                raise ValueError(f"draft: {name} ({getattr(self, name)}) must divide by tp ({self.tp})")

    @classmethod
    def from_config(cls, section: dict | None) -> DrafterShape:
        section = dict(section or {})
        unknown = sorted(set(section) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"draft: unknown key {unknown[0]!r}")
        return cls(**section)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def local_heads(self) -> int:
        return self.heads // self.tp

    @property
    def local_kv_heads(self) -> int:
        return self.kv_heads // self.tp

    def layer_params(self) -> int:
        h, d = self.hidden, self.head_dim
        attn = h * (self.local_heads + 2 * self.local_kv_heads) * d + self.local_heads * d * h
        return attn + 3 * h * (self.intermediate // self.tp) + 2 * h

    def bytes(self, vocab_shard: int, hidden: int | None = None) -> float:
        """BF16 weights the drafter's round reads: its layers and the target's LM-head shard."""
        return 2.0 * (self.layers * self.layer_params() + vocab_shard * (hidden or self.hidden))

    def context_params(self) -> int:
        """The commit's weights: ``fc`` (the target layers' hidden states to the drafter's) and every
        layer's K/V projection of it (one matrix for all layers)."""
        kv = self.layers * 2 * self.local_kv_heads * self.head_dim
        return self.target_layers * self.hidden * self.hidden + self.hidden * kv

    def flops(self, batch: int, block: int, context: int, vocab_shard: int) -> float:
        """The block's projections, MLPs and attention over ``context + block`` keys, and the LM head."""
        tokens = batch * block
        attention = 4.0 * batch * block * (context + block) * self.local_heads * self.head_dim
        return self.layers * (2.0 * tokens * self.layer_params() + attention) + 2.0 * tokens * vocab_shard * (
            self.hidden
        )


def expected_experts(tokens: int, experts: int = 384, top_k: int = 8) -> float:
    """Mean distinct experts ``tokens`` tokens touch in one layer, each choosing ``top_k`` of ``experts``
    uniformly without replacement: ``experts x (1 - (1 - top_k / experts) ** tokens)``."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def routing_weights(experts: int, routing: str = "uniform", skew: float = 1.0) -> np.ndarray:
    """Each expert's relative popularity: equal (``uniform``), or ``1 / rank**skew`` in a shuffled order
    (``skewed``: a Zipf-like router, ``skew`` 0 is uniform)."""
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {list(ROUTINGS)}, got {routing!r}")
    if routing == "uniform":
        return np.full(experts, 1.0 / experts)
    if not math.isfinite(skew) or skew < 0:
        raise ValueError(f"routing skew must be a finite number >= 0, got {skew!r}")
    weights = 1.0 / np.arange(1, experts + 1, dtype=np.float64) ** skew
    return weights / weights.sum()


def simulate_routing(
    tokens: int, experts: int, top_k: int, *, rng: np.random.Generator, routing="uniform", skew=1.0
) -> np.ndarray:
    """int32 [tokens, top_k]: each token's ``top_k`` distinct experts, drawn without replacement with the
    routing's popularity (Gumbel top-k: exact sampling without replacement)."""
    log_w = np.log(routing_weights(experts, routing, skew))
    keys = log_w[None, :] + rng.gumbel(size=(tokens, experts))
    return np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k].astype(np.int32)


def distinct_experts(topk_ids: np.ndarray) -> int:
    return int(np.unique(np.asarray(topk_ids)).size)
