"""One GPU's share of the DFlash drafter (``shapes.DrafterShape``) and its top-K, random weights.

What SGLang's DDTree worker runs before the tree build, per round, on each rank:

1. the drafter's forward over the draft block of ``block`` tokens per request (the bonus token and mask
   tokens: the target's embedding shard looks them up): ``layers`` Qwen3-style layers, each RMSNorm, q/k/v
   projections (``heads / tp`` query heads, ``kv_heads / tp`` KV heads), RoPE, attention of the block's
   tokens over the request's ``context`` cached draft keys and the whole block (not causal: a block-diffusion
   drafter sees every block position), ``o_proj``, RMSNorm and a SiLU MLP (``intermediate / tp``);
2. the final norm and the target's LM-head shard over the block's non-bonus positions (``block - 1`` rows
   a request), in float32;
3. the log-softmax normaliser (logsumexp over the shard) and ``torch.topk`` with ``K = min(budget, topk)``,
   then the merge of the ranks' top-Ks as SGLang's ``_topk_from_vocab_parallel_head`` does it: the ranks'
   values, ids and normalisers all-gathered (not run on one GPU: the ``allreduce`` stage's all-gathers, an
   estimate elsewhere), a second ``topk`` over ``tp x K`` candidates, the ids gathered, the normalisers
   merged. Here the other ranks' slots hold -inf, so the merge runs at its real size and yields this rank's
   own top-K: the builders' inputs ``top_log_probs`` [B, block - 1, K] and ``top_token_ids``.

``head_greedy()`` is the linear DFlash chain's head instead (upstream's ``_DflashDraftSampler`` under tensor
parallel): each rank's maximum, the ranks' maxima merged, the argmax: ``draft_tokens`` [B, block - 1].
``commit(hidden, rows)`` is the drafter's side of a round's commit: the target's hidden states of the
committed tokens projected (``fc``, a norm) and every layer's K/V of them written into the draft KV cache
(one GEMM for all layers, the K norm and RoPE, a write per layer), as SGLang's fused KV materialisation does.

``run()``, ``forward()``, the heads and ``commit`` only enqueue work (CUDA-graph capturable).
"""

from __future__ import annotations

import math

from ddtree_bench.k26.shapes import DrafterShape

#: Kimi's DFlash mask token (the block's positions after the bonus token).
MASK_TOKEN = 163838


def draft_block(budget: int, block_size: int, topk: int, follow_budget: bool) -> tuple[int, int]:
    """``(block, K)`` of a round at budget ``budget``: the configured block and ``min(budget, topk)``, or
    (``follow_budget``) SGLang's worker's coupling, a block of ``budget + 1`` and ``K = budget``."""
    if follow_budget:
        return budget + 1, budget
    return block_size, min(budget, topk)


def draft_bytes(shape: DrafterShape, batch: int, block: int, context: int, vocab_shard: int) -> float:
    """What ``DraftShard`` allocates: weights (the commit's too), the LM-head shard, the draft KV cache and
    the logits."""
    kv = 2.0 * shape.layers * batch * (context + block) * 2 * shape.local_kv_heads * shape.head_dim
    logits = 4.0 * batch * block * vocab_shard
    return shape.bytes(vocab_shard) + 2.0 * shape.context_params() + kv + 3 * logits + 64 * 2**20


class DraftShard:
    """The drafter's share for ``batch`` requests, a block of ``block`` tokens, ``context`` cached draft
    positions a request and a top-``k`` over a vocab shard of ``vocab_shard`` rows (module docstring)."""

    def __init__(
        self,
        shape: DrafterShape,
        *,
        batch: int,
        block: int,
        context: int,
        k: int,
        vocab_shard: int,
        seed: int = 0,
    ):
        import torch  # noqa: PLC0415

        if block < 2:
            raise ValueError(
                f"draft: block must be >= 2 (the bonus token and a drafted position), got {block}"
            )
        if not 1 <= k <= vocab_shard:
            raise ValueError(f"draft: top-K must be in 1..{vocab_shard}, got {k}")
        self.torch = torch
        self.shape, self.batch, self.block, self.context, self.k = shape, batch, block, context, k
        self.device = torch.device("cuda", torch.cuda.current_device())
        gen = torch.Generator(device=self.device).manual_seed(seed)
        bf16 = torch.bfloat16
        s = shape
        hq, hk, d = s.local_heads, s.local_kv_heads, s.head_dim
        inter = s.intermediate // s.tp

        def weight(*dims):
            w = torch.empty(dims, device=self.device, dtype=bf16)
            return w.normal_(0.0, 1.0 / math.sqrt(dims[0]), generator=gen)

        def ones(n):
            return torch.ones(n, device=self.device, dtype=bf16)

        self.layers = [
            {
                "in_norm": ones(s.hidden),
                "post_norm": ones(s.hidden),
                "qkv": weight(s.hidden, (hq + 2 * hk) * d),
                "o_proj": weight(hq * d, s.hidden),
                "gate_up": weight(s.hidden, 2 * inter),
                "down": weight(inter, s.hidden),
            }
            for _ in range(s.layers)
        ]
        self.final_norm = ones(s.hidden)
        self.embedding = weight(vocab_shard, s.hidden)  # the target's embedding shard (rank 0's vocab slice)
        self.lm_head = weight(s.hidden, vocab_shard)
        kv_rows = context + block
        # the draft KV cache: [B, kv heads, context + block, d] per layer; the block's rows written by run()
        self.k_cache = [
            torch.empty((batch, hk, kv_rows, d), device=self.device, dtype=bf16).normal_(generator=gen)
            for _ in range(s.layers)
        ]
        self.v_cache = [
            torch.empty((batch, hk, kv_rows, d), device=self.device, dtype=bf16).normal_(generator=gen)
            for _ in range(s.layers)
        ]
        tokens = torch.full((batch, block), MASK_TOKEN % vocab_shard, device=self.device, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, vocab_shard, (batch,), device=self.device, generator=gen)
        self.tokens = tokens.reshape(-1)
        positions = torch.arange(context, context + block, device=self.device, dtype=torch.float32)
        inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=self.device, dtype=torch.float32) / d))
        angles = positions[:, None] * inv_freq[None, :]
        self.freqs = torch.polar(torch.ones_like(angles), angles)[None, None]  # [1, 1, block, d/2] complex
        rows = batch * (block - 1)
        self.top_log_probs = torch.empty((batch, block - 1, k), device=self.device, dtype=torch.float32)
        self.top_token_ids = torch.empty((batch, block - 1, k), device=self.device, dtype=torch.long)
        self.draft_tokens = torch.empty((batch, block - 1), device=self.device, dtype=torch.long)
        self._rows = rows
        # the ranks' gathered top-Ks (this rank's in slot 0, the others' -inf) and normalisers
        tp = s.tp
        self.gathered_values = torch.full((rows, tp * k), float("-inf"), device=self.device)
        self.gathered_ids = torch.zeros((rows, tp * k), device=self.device, dtype=torch.long)
        self.gathered_log_z = torch.full((tp, rows), float("-inf"), device=self.device)
        self.gathered_max = torch.full((rows, tp), float("-inf"), device=self.device)
        self.gathered_argmax = torch.zeros((rows, tp), device=self.device, dtype=torch.long)
        self.drafted = torch.empty((rows, s.hidden), device=self.device, dtype=bf16)
        self._commit_weights(weight, ones)

    def _commit_weights(self, weight, ones) -> None:
        """The commit's weights: ``fc`` (the target layers' hidden states to the drafter's), its norm, every
        layer's K/V projection in one matrix, the K norm."""
        s = self.shape
        self.fc = weight(s.target_layers * s.hidden, s.hidden)
        self.hidden_norm = ones(s.hidden)
        self.kv_all = weight(s.hidden, s.layers * 2 * s.local_kv_heads * s.head_dim)
        self.k_norm = ones(s.head_dim)

    def forward(self):
        """The drafter's layers over the block; the drafted positions' final hidden states in ``drafted``."""
        torch, s = self.torch, self.shape
        from ddtree_bench.k26.target import rms_norm, rope  # noqa: PLC0415

        b, blk = self.batch, self.block
        hq, hk, d = s.local_heads, s.local_kv_heads, s.head_dim
        x = self.embedding[self.tokens]
        for layer, w in enumerate(self.layers):
            h = rms_norm(torch, x, w["in_norm"])
            qkv = (h @ w["qkv"]).view(b, blk, hq + 2 * hk, d).transpose(1, 2)
            q = rope(torch, qkv[:, :hq], self.freqs)
            k = rope(torch, qkv[:, hq : hq + hk], self.freqs)
            self.k_cache[layer][:, :, self.context :, :].copy_(k)
            self.v_cache[layer][:, :, self.context :, :].copy_(qkv[:, hq + hk :])
            o = torch.nn.functional.scaled_dot_product_attention(
                q, self.k_cache[layer], self.v_cache[layer], enable_gqa=True
            )
            x = x + o.transpose(1, 2).reshape(b * blk, hq * d) @ w["o_proj"]
            h = rms_norm(torch, x, w["post_norm"])
            gate, up = (h @ w["gate_up"]).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ w["down"]
        drafted = rms_norm(torch, x, self.final_norm).view(b, blk, -1)[:, 1:, :]
        self.drafted.copy_(drafted.reshape(self._rows, -1))
        return self.drafted

    def head_topk(self):
        """The LM-head shard, the normaliser, this rank's top-K and the ranks' merge (module docstring);
        fills ``top_log_probs`` and ``top_token_ids``."""
        torch, b, blk, k = self.torch, self.batch, self.block, self.k
        logits = (self.drafted @ self.lm_head).float()
        log_z = torch.logsumexp(logits, dim=-1)
        values, ids = torch.topk(logits, k, dim=-1)
        self.gathered_values[:, :k].copy_(values)
        self.gathered_ids[:, :k].copy_(ids)
        self.gathered_log_z[0].copy_(log_z)
        top, position = torch.topk(self.gathered_values, k, dim=-1)
        merged_ids = torch.gather(self.gathered_ids, 1, position)
        merged_log_z = torch.logsumexp(self.gathered_log_z.transpose(0, 1), dim=-1)
        self.top_log_probs.copy_((top - merged_log_z[:, None]).view(b, blk - 1, k))
        self.top_token_ids.copy_(merged_ids.view(b, blk - 1, k))
        return self.top_log_probs, self.top_token_ids

    def head_greedy(self):
        """The chain's head (module docstring): fills ``draft_tokens``."""
        torch = self.torch
        logits = self.drafted @ self.lm_head
        best, index = torch.max(logits, dim=-1)
        self.gathered_max[:, 0].copy_(best.float())
        self.gathered_argmax[:, 0].copy_(index)
        rank = torch.argmax(self.gathered_max, dim=-1, keepdim=True)
        self.draft_tokens.copy_(torch.gather(self.gathered_argmax, 1, rank).view(self.batch, -1))
        return self.draft_tokens

    def run(self):
        """Drafter forward, LM head, normaliser, top-K and the ranks' merge (the tree's drafter)."""
        self.forward()
        return self.head_topk()

    def commit(self, hidden, rows: int):
        """The draft KV of a round's committed tokens: ``hidden`` [B * rows, target_layers x hidden] (the
        target's hidden states of the round's ``rows`` tokens a request, the committed ones first) projected
        for every row, as SGLang projects them, and the first ``min(rows, block)`` (the most a round commits)
        written into every layer's cache after the context (module docstring)."""
        torch, s = self.torch, self.shape
        from ddtree_bench.k26.target import rms_norm, rope  # noqa: PLC0415

        hk, d = s.local_kv_heads, s.head_dim
        ctx = rms_norm(torch, hidden @ self.fc, self.hidden_norm)
        kv = (ctx @ self.kv_all).view(self.batch, rows, s.layers, 2, hk, d)[:, : min(rows, self.block)]
        written = kv.shape[1]
        k = rope(torch, rms_norm(torch, kv[:, :, :, 0], self.k_norm), self.freqs[0, 0, :written, None, None])
        end = self.context + written
        for layer in range(s.layers):
            self.k_cache[layer][:, :, self.context : end, :].copy_(k[:, :, layer].transpose(1, 2))
            self.v_cache[layer][:, :, self.context : end, :].copy_(kv[:, :, layer, 1].transpose(1, 2))
