"""One GPU's share of the target (``shapes.ModelShape``) on the GPU, random weights, real kernels.

``TargetShard`` holds rank 0's weights of every layer (distinct per layer, so the L2 never serves a layer's
weights to the next), the latent KV cache of ``batch`` requests with ``prefix`` rows each plus the tree's
``budget + 1`` rows, and the buffers of one verify forward of ``T = batch x (budget + 1)`` tree tokens:

- per layer: RMSNorm, ``q_a`` -> norm -> ``q_b``, ``kv_a`` -> norm, RoPE on the rope dims, the query's
  absorption into the latent space (``W_UK``), the tree tokens' latent rows written into the cache, the
  verify attention (``ops.attention``, the tree's packed-bit mask), ``W_UV``, ``o_proj``, the residual;
  then RMSNorm and the MLP: the dense MLP in the first ``dense_layers``, else the router (its matmul and
  top-k run, their cost paid) and the routed experts through the MoE impl (``k26.moe``) on the routing
  drawn for the layer (``shapes.simulate_routing``'s distribution: random weights would route arbitrarily)
  plus the shared expert;
- the final norm and the LM-head shard (logits of the rank's vocab slice).

The tensor-parallel all-reduces are not here (a single GPU): the ``allreduce`` stage measures them.

``forward()``, ``moe_part()``, ``dense_part()`` and ``lm_head_part()`` only enqueue work on the current
stream (no host sync, no allocation after ``warm()``), so each can be captured as one CUDA graph
(``capture``). Torch is imported lazily: CPU machines import this module for its docstrings only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ddtree_bench.k26 import moe as moe_ops
from ddtree_bench.k26.shapes import ModelShape

GIB = 2**30


def rms_norm(torch, x, weight, eps=1e-6):
    """RMSNorm (PyTorch's own, one kernel where it has a fused one; SGLang runs a fused norm)."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def rope(torch, x, freqs):
    """Rotary embedding on the last dim, adjacent pairs rotated by ``freqs`` (complex, broadcastable): a
    complex multiply, the few kernels a fused RoPE saves."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs).flatten(-2).to(x.dtype)


def activation_bytes(shape: ModelShape, tokens: int) -> float:
    """An upper estimate of one forward's activations and workspaces (the routed experts' per-slot outputs,
    the LM head's logits, a dozen hidden-sized buffers)."""
    per_token = (
        16 * shape.hidden * 2
        + 2 * shape.vocab_shard * 4
        + shape.top_k * (2 * shape.expert_slice + 2 * shape.hidden) * 2
        + shape.local_heads * (shape.latent_dim + shape.kv_lora_rank) * 4
    )
    return float(tokens) * per_token + 256 * 2**20


def layer_expert_bytes(shape: ModelShape, moe_impl: str) -> float:
    """One MoE layer's routed experts in ``moe_impl``'s format."""
    return moe_ops.weight_bytes(moe_impl, shape.experts, shape.hidden, shape.expert_slice, shape.group_size)


def weights_bytes(shape: ModelShape, moe_impl: str) -> float:
    """What ``TargetWeights`` allocates (every layer's own experts)."""
    return shape.bf16_bytes() + shape.moe_layers * layer_expert_bytes(shape, moe_impl)


def state_bytes(shape: ModelShape, batch: int, budget: int, prefix: int, aux_layers: int = 0) -> float:
    """What ``TargetShard`` allocates over the weights: the KV cache, the activations and the hidden states
    kept for the drafter's commit (``aux_layers`` of them)."""
    tokens = batch * (budget + 1)
    return (
        shape.kv_cache_bytes(batch, prefix + budget + 1 + 64)
        + activation_bytes(shape, tokens)
        + 2.0 * tokens * max(1, aux_layers) * shape.hidden
    )


class TargetWeights:
    """Rank 0's weights of every layer on the current CUDA device, random and distinct per layer: BF16
    projections, norms, dense MLP, routers, shared experts, LM-head shard, and the routed experts in
    ``moe_impl``'s format. ``moe_only``: only what the MoE layers need. ``expert_sets``: the distinct routed
    expert weight sets (default: one per MoE layer); fewer are cycled over the layers (a format too large
    for every layer's own, e.g. BF16: each set is still far larger than the L2)."""

    def __init__(
        self,
        shape: ModelShape,
        *,
        moe_impl: str,
        sglang_files=None,
        moe_only: bool = False,
        expert_sets: int | None = None,
        seed: int = 0,
    ):
        import torch  # noqa: PLC0415

        self.shape, self.moe_impl, self.sglang_files, self.moe_only = shape, moe_impl, sglang_files, moe_only
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        s = shape
        bf16 = torch.bfloat16

        def weight(*dims):
            w = torch.empty(dims, device=self.device, dtype=bf16)
            return w.normal_(0.0, 1.0 / math.sqrt(dims[0]), generator=self.gen)

        def ones(n):
            return torch.ones(n, device=self.device, dtype=bf16)

        heads = s.local_heads
        self.layers = []
        for layer in range(s.layers):
            w = {"post_norm": ones(s.hidden)}
            if not moe_only:
                w.update(
                    in_norm=ones(s.hidden),
                    q_a=weight(s.hidden, s.q_lora_rank),
                    q_norm=ones(s.q_lora_rank),
                    q_b=weight(s.q_lora_rank, heads * (s.qk_nope_dim + s.qk_rope_dim)),
                    kv_a=weight(s.hidden, s.latent_dim),
                    kv_norm=ones(s.kv_lora_rank),
                    w_uk=weight(heads, s.qk_nope_dim, s.kv_lora_rank),
                    w_uv=weight(heads, s.kv_lora_rank, s.v_head_dim),
                    o_proj=weight(heads * s.v_head_dim, s.hidden),
                )
            if layer < s.dense_layers:
                if not moe_only:
                    w.update(
                        gate_up=weight(s.hidden, 2 * s.dense_slice), down=weight(s.dense_slice, s.hidden)
                    )
            else:
                w.update(
                    router=weight(s.hidden, s.experts),
                    shared_gate_up=weight(s.hidden, 2 * s.shared_slice),
                    shared_down=weight(s.shared_slice, s.hidden),
                )
            self.layers.append(w)
        self.final_norm = ones(s.hidden)
        self.lm_head = None if moe_only else weight(s.hidden, s.vocab_shard)
        sets = s.moe_layers if expert_sets is None else max(1, min(expert_sets, s.moe_layers))
        self.experts = [
            moe_ops.make_expert_weights(
                moe_impl,
                experts=s.experts,
                hidden=s.hidden,
                intermediate=s.expert_slice,
                group_size=s.group_size,
                seed=seed * 1000 + index,
                device=self.device,
            )
            for index in range(sets)
        ]

    def experts_of(self, layer: int):
        """The routed experts' weights of MoE layer ``layer`` (counted from the first MoE layer)."""
        return self.experts[layer % len(self.experts)]


@dataclass(frozen=True)
class ShardOptions:
    """A ``TargetShard``'s options: the routed experts' distribution (``routing``, ``skew``:
    ``shapes.ROUTINGS``), ``kv_align`` (each request's cache rows rounded up to a multiple: FlashMLA reads
    pages of 64) and ``aux_layers`` (how many evenly spaced layers' hidden states it keeps for the drafter's
    commit)."""

    routing: str = "uniform"
    skew: float = 1.0
    kv_align: int = 1
    aux_layers: int = 0


class TargetShard:
    """One verify forward's state over ``TargetWeights`` for (batch, budget, prefix) (module docstring):
    the KV cache, the drawn routing, the buffers and the prepared verify attention per layer.
    ``mask_bits``: the trees' packed visibility [B, N+1, words] on the GPU; ``attention``: an
    ``ops.attention.VerifyAttention`` (None with ``moe_only`` weights: only ``moe_part`` runs; or where
    every attention is added with ``add_attention``); ``options``: ``ShardOptions``."""

    def __init__(
        self,
        weights: TargetWeights,
        *,
        batch: int,
        budget: int,
        prefix: int,
        attention=None,
        mask_bits=None,
        options: ShardOptions | None = None,
    ):
        import torch  # noqa: PLC0415

        options = options or ShardOptions()
        routing, skew = options.routing, options.skew
        kv_align, aux_layers = options.kv_align, options.aux_layers
        self.torch, self.weights = torch, weights
        self.shape = s = weights.shape
        self.layers, self.final_norm, self.lm_head = weights.layers, weights.final_norm, weights.lm_head
        self.moe_impl = weights.moe_impl
        self.batch, self.budget, self.prefix = batch, budget, prefix
        self.tokens = t = batch * (budget + 1)
        self.device, gen = weights.device, weights.gen
        bf16 = torch.bfloat16
        heads = s.local_heads
        self.routing = draw_routing(torch, s, t, s.moe_layers, routing, skew, gen, self.device)
        self.experts_touched = float(
            sum(torch.unique(ids).numel() for ids, _ in self.routing) / max(1, len(self.routing))
        )
        self.x = torch.empty((t, s.hidden), device=self.device, dtype=bf16).normal_(0, 1, generator=gen)
        if weights.moe_only:
            return
        # the latent cache: prefix rows, then the tree's N + 1 rows (written by the forward), rounded up to
        # ``kv_align`` rows a request (FlashMLA reads it as pages of 64)
        kv_rows = -(-(prefix + budget + 1) // kv_align) * kv_align
        self.kv = [
            torch.empty((batch, kv_rows, s.latent_dim), device=self.device, dtype=bf16).normal_(
                0.0, 1.0, generator=gen
            )
            for _ in range(s.layers)
        ]
        self.q = torch.empty((batch, budget + 1, heads, s.latent_dim), device=self.device, dtype=bf16)
        self.attn_out = torch.zeros(
            (batch, budget + 1, heads, s.kv_lora_rank), device=self.device, dtype=bf16
        )
        positions = torch.arange(prefix, prefix + budget + 1, device=self.device, dtype=torch.float32)
        positions = positions.repeat(batch)
        inv_freq = 1.0 / (
            10000.0
            ** (torch.arange(0, s.qk_rope_dim, 2, device=self.device, dtype=torch.float32) / s.qk_rope_dim)
        )
        angles = positions[:, None] * inv_freq[None, :]
        self.freqs = torch.polar(torch.ones_like(angles), angles)  # [T, rope / 2] complex
        self.logits = torch.empty((t, s.vocab_shard), device=self.device, dtype=bf16)
        lengths = np.full(batch, prefix, np.int64)
        self.lengths = lengths
        # the hidden states of ``aux_layers`` evenly spaced layers, what the drafter's commit projects
        self.aux_layers = (
            tuple(int(i) for i in np.linspace(1, s.layers - 2, aux_layers).round().astype(int))
            if aux_layers
            else ()
        )
        self.hidden_aux = torch.empty(
            (t, max(1, len(self.aux_layers)) * s.hidden), device=self.device, dtype=bf16
        )
        self.attentions = {}
        if attention is not None:
            self.prepared = [
                attention.prepare(self.q, kv, lengths, mask_bits, self.attn_out) for kv in self.kv
            ]
            self.attentions[None] = self.prepared
            self.active = self.prepared

    def add_attention(self, name: str, attention, mask, **options) -> None:
        """Prepare another verify attention (``ops.sglang_verify``'s adapters) on every layer's cache with
        its own ``mask``; ``forward(attention=name)`` runs it."""
        self.attentions[name] = [
            attention.prepare(self.q, kv, self.lengths, mask, self.attn_out, **options) for kv in self.kv
        ]

    # --------------------------------------------------------------------------------------------- parts
    def _stream(self):
        import cupy as cp  # noqa: PLC0415

        return cp.cuda.ExternalStream(self.torch.cuda.current_stream().cuda_stream)

    def _projections(self, layer: int, x, attention: bool):
        """Norms, MLA projections, RoPE, absorption, cache write, (attention,) W_UV and o_proj: x + o."""
        torch, s, w = self.torch, self.shape, self.layers[layer]
        heads, t = s.local_heads, self.tokens
        h = rms_norm(torch, x, w["in_norm"])
        q = (rms_norm(torch, h @ w["q_a"], w["q_norm"]) @ w["q_b"]).view(t, heads, -1)
        kv = h @ w["kv_a"]
        latent = rms_norm(torch, kv[:, : s.kv_lora_rank], w["kv_norm"])
        k_rope = rope(torch, kv[:, s.kv_lora_rank :], self.freqs)
        q_rope = rope(torch, q[..., s.qk_nope_dim :], self.freqs[:, None, :])
        q_latent = torch.bmm(q[..., : s.qk_nope_dim].transpose(0, 1), w["w_uk"]).transpose(0, 1)
        q_view = self.q.view(t, heads, s.latent_dim)
        q_view[..., : s.kv_lora_rank].copy_(q_latent)
        q_view[..., s.kv_lora_rank :].copy_(q_rope)
        rows = self.kv[layer][:, self.prefix : self.prefix + self.budget + 1, :]
        rows[..., : s.kv_lora_rank].copy_(latent.view(self.batch, self.budget + 1, -1))
        rows[..., s.kv_lora_rank :].copy_(k_rope.view(self.batch, self.budget + 1, -1))
        if attention:
            self.active[layer].launch(self._stream())
        out = self.attn_out.view(t, heads, s.kv_lora_rank).transpose(0, 1)
        o = torch.bmm(out, w["w_uv"]).transpose(0, 1).reshape(t, heads * s.v_head_dim)
        return x + o @ w["o_proj"]

    def _mlp(self, gate_up, down, h):
        torch = self.torch
        gate, up = (h @ gate_up).chunk(2, dim=-1)
        return (torch.nn.functional.silu(gate) * up) @ down

    def _moe(self, layer: int, h):
        """Router (matmul and top-k, cost paid), routed experts on the drawn routing, shared expert."""
        torch, w = self.torch, self.layers[layer]
        index = layer - self.shape.dense_layers
        scores = torch.sigmoid((h @ w["router"]).float())
        torch.topk(scores, self.shape.top_k, dim=-1)
        ids, weights = self.routing[index]
        routed = moe_ops.routed_experts(
            self.moe_impl,
            self.weights.experts_of(index),
            h,
            ids,
            weights,
            sglang_files=self.weights.sglang_files,
        )
        return routed + self._mlp(w["shared_gate_up"], w["shared_down"], h)

    def forward(self, attention: str | None = None):
        """The whole verify forward of the tree tokens: every layer, the final norm, the LM-head shard;
        ``attention``: a verify attention added with ``add_attention`` (default: the one given at start)."""
        self.active = self.attentions[attention]
        x = self.x
        hidden = self.shape.hidden
        for layer in range(self.shape.layers):
            x = self._projections(layer, x, attention=True)
            h = rms_norm(self.torch, x, self.layers[layer]["post_norm"])
            if layer < self.shape.dense_layers:
                x = x + self._mlp(self.layers[layer]["gate_up"], self.layers[layer]["down"], h)
            else:
                x = x + self._moe(layer, h)
            if layer in self.aux_layers:
                slot = self.aux_layers.index(layer)
                self.hidden_aux[:, slot * hidden : (slot + 1) * hidden].copy_(x)
        self._lm_head(x)
        return self.logits

    def moe_part(self):
        """Every MoE layer's router, routed and shared experts, on the same normed input."""
        h = rms_norm(self.torch, self.x, self.final_norm)
        out = None
        for layer in range(self.shape.dense_layers, self.shape.layers):
            out = self._moe(layer, h)
        return out

    def dense_part(self):
        """Every layer's norms and MLA projections (no attention core) and the dense layers' MLPs."""
        x = self.x
        for layer in range(self.shape.layers):
            x = self._projections(layer, x, attention=False)
            if layer < self.shape.dense_layers:
                h = rms_norm(self.torch, x, self.layers[layer]["post_norm"])
                x = x + self._mlp(self.layers[layer]["gate_up"], self.layers[layer]["down"], h)
        return x

    def _lm_head(self, x):
        torch = self.torch
        torch.matmul(rms_norm(torch, x, self.final_norm), self.lm_head, out=self.logits)

    def lm_head_part(self):
        self._lm_head(self.x)
        return self.logits


def draw_routing(torch, shape: ModelShape, tokens: int, layers: int, routing, skew, gen, device):
    """Per MoE layer: (ids int32 [T, top_k], weights float32 [T, top_k]), drawn on the GPU without
    replacement with the routing's popularity (Gumbel top-k, as ``shapes.simulate_routing``)."""
    from ddtree_bench.k26.shapes import routing_weights  # noqa: PLC0415

    popularity = routing_weights(shape.experts, routing, skew)
    out = []
    for layer in range(layers):
        order = np.random.default_rng(layer).permutation(shape.experts)  # which experts are the popular ones
        log_w = torch.as_tensor(np.log(popularity[order]), device=device, dtype=torch.float32)
        u = torch.rand((tokens, shape.experts), generator=gen, device=device).clamp_(1e-20, 1.0)
        keys = log_w[None, :] - torch.log(-torch.log(u))
        ids = torch.topk(keys, shape.top_k, dim=-1).indices.to(torch.int32)
        weights = torch.rand((tokens, shape.top_k), generator=gen, device=device)
        out.append((ids.contiguous(), (weights / weights.sum(-1, keepdim=True)).contiguous()))
    return out


def capture(fn, warmup: int = 2):
    """``(graph, output)``: ``fn`` run ``warmup`` times eagerly on a side stream, then captured as one CUDA
    graph (``graph.replay()`` enqueues it on the current stream)."""
    import torch  # noqa: PLC0415

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out
