"""SGLang's DDTree verify as its worker runs it (the fork's later worker state, docs/round_stages.md): its
tree tensors on the device, the per-request bool verify mask, the FA3 metadata, the tree-verify attention
(SGLang's Triton ``extend_attention_fwd`` with that mask, or FA3 two-pass as SGLang's DDTree fork runs it on
Hopper), SGLang's Triton tree accept, and upstream's Triton accept of the linear DFlash chain. Used by the
round's stacks (``k26.stack``, ``k26.chain``). What loads SGLang's code (its attention file, FA3, the merge,
the accept files) is ``integrations.sglang``; this module runs what it loads.

- ``ForkTrees``: the tree tensors the fork's worker copies to the device per request (tokens, positions,
  visibility, the int32 first-child / next-sibling links).

- ``VerifyMask``: ``DFlashDDTreeVerifyInput.prepare_for_verify``'s ``custom_mask``: per request a
  ``[q, S_b + q]`` bool block (q = N + 1), the prefix columns filled True and the tree's visibility copied
  into the last ``q``, blocks concatenated; built per request, a fill and a copy each, every round.
- ``TritonAttention``: SGLang's ``extend_attention_fwd`` as its Triton backend calls it for target verify
  (the tree's rows as the extend part, the prefix through ``kv_indices`` at page size 1, the mask above,
  ``skip_prefix_custom_mask``). The tree's key rows are copied into the extend buffer first: SGLang's
  forward produces them there before writing the cache; ours writes the cache directly.
- ``Fa3TreeMetadata``: the fork's FA3 backend's per-round metadata for target verify
  (``uses_tree_verify_mask``), eager, outside the graph: each query's visible tree slots read from the
  mask's tree part and sorted to the front (``page_table``), their count (``cache_seqlens``).
- ``Fa3Attention``: the fork's FA3 backend's absorbed-MLA cascade, per layer: a non-causal varlen pass over
  the prefix (``qv`` = the latent query), a pass per query over its visible tree slots, the two LSEs
  transposed (``softmax_lse.T.contiguous()``), SGLang's merge (``sgl_kernel.merge_state_v2``, else the
  wheel's ``merge_state_triton``). Where ``sgl_kernel`` loads FA3 is SGLang's own; else the ``fa3-fwd``
  package, whose build has no paged KV: there the tree pass reads each query's visible rows gathered into a
  contiguous ``[B (N+1), W, 576]`` buffer (W = the deepest path + 1; one launch the fork does not make)
  where the fork reads them through a page table. ``describe`` says which.
- ``TritonAccept``: the fork's ``_compute_ddtree_accept_triton_unchecked`` (``triton_ops/ddtree.py`` beside
  its DDTree utils file), on the fork's tree tensors and the target's tokens.
- ``ChainAccept`` / ``chain_accept_cpu``: upstream's ``_compute_dflash_accept_bonus_triton_unchecked`` (the
  wheel's ``ops/speculative/dflash.py``) and the same walk on the CPU.
- ``launches``: the GPU operations one call issues (the profiler's count).

Every adapter's ``prepare`` allocates; ``launch`` only enqueues work on torch's current stream (the mask's
``build`` too, one request at a time). Torch is imported lazily.
"""

from __future__ import annotations

import numpy as np

from ddtree_bench.integrations.sglang import (
    ACCEPT_FUNCTION,
    SglangUnavailable,
    find_accept_file,
    load_accept,
    load_fa3,
)
from ddtree_bench.ops.attention import HEAD_DIM, SOFTMAX_SCALE, VALUE_DIM

ROPE_DIM = HEAD_DIM - VALUE_DIM
__all__ = [
    "ChainAccept",
    "Fa3Attention",
    "Fa3Causal",
    "Fa3TreeMetadata",
    "ForkTrees",
    "SglangUnavailable",
    "TritonAccept",
    "TritonAttention",
    "VerifyMask",
    "chain_accept_cpu",
    "find_accept_file",
    "launches",
]


# ----------------------------------------------------------------------------------------------- mask


class VerifyMask:
    """SGLang's verify ``custom_mask`` for requests of ``prefix_lengths`` and ``q`` tree rows each (module
    docstring): ``buffer`` (flat bool), ``indptr`` (int64 [B + 1], each request's first element)."""

    def __init__(self, prefix_lengths, q: int, device):
        import torch  # noqa: PLC0415

        self.torch = torch
        self.prefix = [int(s) for s in np.asarray(prefix_lengths).reshape(-1)]
        self.q = int(q)
        sizes = [self.q * (s + self.q) for s in self.prefix]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.buffer = torch.empty(int(self.offsets[-1]), dtype=torch.bool, device=device)
        self.indptr = torch.as_tensor(self.offsets, dtype=torch.int64, device=device)

    def build(self, visibility) -> None:
        """Per request, as ``prepare_for_verify``: the prefix part filled True, the visibility
        ``[B, q, q]`` (bool, on the device) copied into the tree part."""
        q = self.q
        for b, s in enumerate(self.prefix):
            block = self.buffer[int(self.offsets[b]) : int(self.offsets[b + 1])].view(q, s + q)
            if s > 0:
                block[:, :s].fill_(True)
            block[:, s:].copy_(visibility[b])

    def tree_part(self):
        """``[B, q, q]`` views of each request's tree columns (what the attention kernels read)."""
        q = self.q
        return [
            self.buffer[int(self.offsets[b]) : int(self.offsets[b + 1])].view(q, s + q)[:, s:]
            for b, s in enumerate(self.prefix)
        ]


def _tree_rows(torch, prefix, q: int, used: int, device):
    """Flat row indices (into ``kv.view(-1, 576)``) of each request's tree rows, [B q] int64."""
    starts = torch.as_tensor([b * used + s for b, s in enumerate(prefix)], dtype=torch.int64, device=device)
    return (starts[:, None] + torch.arange(q, device=device)[None, :]).reshape(-1)


# ----------------------------------------------------------------------------------------------- Triton


class TritonAttention:
    """SGLang's Triton tree-verify attention (module docstring): ``fwd``, its ``extend_attention_fwd``, and
    ``label``, where it came from, as ``integrations.sglang.load_extend_attention`` loads them."""

    def __init__(self, fwd, label: str):
        self.fwd = fwd
        self.describe = f"{label}, extend_attention_fwd (custom_mask, skip_prefix_custom_mask)"

    def prepare(self, q, kv, prefix_lengths, mask: VerifyMask, out):
        """One layer's call on its cache ``kv``; the index tensors and the extend buffer are shared by every
        layer of the same shape (the layers run one after another)."""
        import torch  # noqa: PLC0415

        batch, nodes, heads, _ = q.shape
        used = int(kv.shape[1])
        prefix = tuple(int(s) for s in np.asarray(prefix_lengths).reshape(-1))
        key = (batch, nodes, used, prefix, kv.dtype)
        if getattr(self, "_key", None) != key:
            device = q.device
            lengths = torch.as_tensor(prefix, dtype=torch.int64, device=device)
            zero = torch.zeros(1, dtype=torch.int64, device=device)
            self._key = key
            self._shared = {
                "k_extend": torch.empty((batch * nodes, 1, HEAD_DIM), dtype=kv.dtype, device=device),
                "rows": _tree_rows(torch, prefix, nodes, used, device),
                "qo_indptr": torch.arange(batch + 1, dtype=torch.int32, device=device) * nodes,
                "kv_indptr": torch.cat([zero, torch.cumsum(lengths, 0)]).to(torch.int32),
                "kv_indices": torch.cat(
                    [
                        torch.arange(s, device=device, dtype=torch.int64) + b * used
                        for b, s in enumerate(prefix)
                    ]
                ),
            }
        return _PreparedTriton(self.fwd, self._shared, q, kv, mask, out)


class _PreparedTriton:
    def __init__(self, fwd, shared: dict, q, kv, mask: VerifyMask, out):
        batch, nodes, heads, _ = q.shape
        used = kv.shape[1]
        self.fwd, self.mask, self.shared, self.nodes = fwd, mask, shared, nodes
        self.q_extend = q.view(batch * nodes, heads, HEAD_DIM)
        self.o_extend = out.view(batch * nodes, heads, VALUE_DIM)
        self.kv_flat = kv.view(batch * used, HEAD_DIM)
        self.k_buffer = kv.view(batch * used, 1, HEAD_DIM)
        self.v_buffer = self.k_buffer[..., :VALUE_DIM]

    def launch(self, stream=None) -> None:
        del stream  # torch's current stream
        shared = self.shared
        k_extend = shared["k_extend"]
        k_extend.view(-1, HEAD_DIM).copy_(self.kv_flat.index_select(0, shared["rows"]))
        self.fwd(
            self.q_extend,
            k_extend,
            k_extend[..., :VALUE_DIM],
            self.o_extend,
            self.k_buffer,
            self.v_buffer,
            shared["qo_indptr"],
            shared["kv_indptr"],
            shared["kv_indices"],
            self.mask.buffer,
            True,
            self.mask.indptr,
            self.nodes,
            1.0,
            1.0,
            sm_scale=SOFTMAX_SCALE,
            skip_prefix_custom_mask=True,
        )


# ----------------------------------------------------------------------------------------------- FA3


class ForkTrees:
    """The tree tensors the fork's worker keeps on the device for ``batch`` requests of ``q`` = N + 1 rows
    (``dflash_ddtree_worker.py``, ``_ensure_ddtree_decode_buffers``): ``tokens`` [B, q] int64 (the bonus
    token, then the nodes' tokens: the verify's input ids and the accept's candidates), ``positions`` [B, q]
    int64 (prefix + depth), ``visibility`` [B, q, q] bool (given: the view the mask reads), ``next_token`` and
    ``next_sibling`` [B, q] int32. ``upload`` is the worker's per-request step 5."""

    def __init__(self, batch: int, q: int, visibility, prefix_lengths, device):
        import torch  # noqa: PLC0415

        self.torch, self.batch, self.q = torch, int(batch), int(q)
        self.tokens = torch.zeros((batch, q), dtype=torch.int64, device=device)
        self.positions = torch.zeros((batch, q), dtype=torch.int64, device=device)
        self.visibility = visibility
        self.next_token = torch.full((batch, q), -1, dtype=torch.int32, device=device)
        self.next_sibling = torch.full((batch, q), -1, dtype=torch.int32, device=device)
        self.prefix = torch.as_tensor(
            np.asarray(prefix_lengths).reshape(-1), dtype=torch.int64, device=device
        )
        self.bonus = torch.zeros((batch, 1), dtype=torch.int64, device=device)

    def start(self) -> None:
        """The batched part of step 5: the bonus token broadcast, the positions reset to the prefix."""
        self.tokens.copy_(self.bonus.expand(-1, self.q))
        self.positions.copy_(self.prefix.unsqueeze(1).expand(-1, self.q))

    def upload(self, b: int, tokens, depths, visibility, next_token, next_sibling) -> None:
        """Request ``b``'s tree (CPU tensors from SGLang's function, padded to q), copied as the worker
        copies it: five non-blocking copies from pageable memory and the small kernels around them."""
        torch, device = self.torch, self.tokens.device
        real = int(tokens.numel()) + 1
        self.tokens[b, 1:real].copy_(tokens.to(device=device, non_blocking=True))
        self.positions[b, 1:real].copy_(
            self.prefix[b] + depths.to(device=device, dtype=torch.int64, non_blocking=True)
        )
        self.visibility[b].copy_(visibility, non_blocking=True)
        self.next_token[b].copy_(next_token.to(device=device, dtype=torch.int32, non_blocking=True))
        self.next_sibling[b].copy_(next_sibling.to(device=device, dtype=torch.int32, non_blocking=True))


class Fa3TreeMetadata:
    """The fork's FA3 tree-verify metadata (``flashattention_backend.py``, ``_apply_cuda_graph_metadata`` for
    target verify with ``uses_tree_verify_mask``), recomputed by ``refresh()`` every round, eagerly, before
    the graph's replay: the prefix pass's cache lengths and page table, then each query's visible tree slots
    read from the mask's tree part, sorted to the front (``page_table``, token slots) and counted
    (``cache_seqlens``). Slots are flat rows of a request-major cache of ``used`` rows a request: what
    ``req_to_token`` holds for a cache of page size 1."""

    def __init__(self, mask: VerifyMask, used: int, device):
        import torch  # noqa: PLC0415

        self.torch, self.mask, self.q = torch, mask, mask.q
        batch, q = len(mask.prefix), mask.q
        self.batch = batch
        self.seq_lens = torch.as_tensor(mask.prefix, dtype=torch.int64, device=device)
        self.req_pool_indices = torch.arange(batch, dtype=torch.int64, device=device)
        self.req_to_token = (
            torch.arange(batch * used, dtype=torch.int32, device=device).view(batch, used).contiguous()
        )
        self.max_pages = max(mask.prefix) + q
        self.strided = torch.arange(used, dtype=torch.int64, device=device)
        self.col_indices = torch.arange(q, dtype=torch.int64, device=device).expand(batch * q, q)
        self.cache_seqlens = torch.zeros(batch, dtype=torch.int32, device=device)
        self.cu_seqlens_k = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        self.page_table = torch.zeros((batch, used), dtype=torch.int32, device=device)
        self.expand_page_table = torch.zeros((batch * q, q), dtype=torch.int32, device=device)
        self.expand_seqlens = torch.zeros(batch * q, dtype=torch.int32, device=device)
        self.expand_cu_seqlens_k = torch.zeros(batch * q + 1, dtype=torch.int32, device=device)

    def refresh(self) -> None:
        torch, q = self.torch, self.q
        seq_lens = self.seq_lens
        self.cache_seqlens.copy_(seq_lens)
        self.cu_seqlens_k[1:].copy_(torch.cumsum(self.cache_seqlens, 0, dtype=torch.int32))
        pages = self.req_to_token[self.req_pool_indices[:, None], self.strided[None, : self.max_pages]]
        self.page_table[:, : self.max_pages].copy_(pages)
        offsets = torch.arange(q, device=seq_lens.device)[None]
        cols = offsets.expand(self.batch, -1) + seq_lens[:, None]
        cum_len = torch.nn.functional.pad(torch.cumsum((seq_lens + q).repeat_interleave(q), 0), (1, 0))[:-1]
        extraction = (cols.repeat_interleave(q, dim=0) + cum_len[:, None]).view(1, -1)
        mask = self.mask.buffer[extraction].view(-1, q)
        keys = torch.where(mask, self.col_indices, self.col_indices + q)
        _, sort_order = torch.sort(keys, dim=1)
        slots = self.req_to_token[self.req_pool_indices, :].gather(1, cols).repeat_interleave(q, dim=0)
        self.expand_page_table.copy_(slots.gather(1, sort_order))
        self.expand_seqlens.copy_(mask.sum(dim=1))
        self.expand_cu_seqlens_k[1:].copy_(torch.cumsum(self.expand_seqlens, 0, dtype=torch.int32))


class Fa3Attention:
    """FA3 two-pass tree verify as SGLang's DDTree fork runs it (module docstring). ``sglang_files``: where
    the wheel's ``merge_state_triton`` is (used where ``sgl_kernel`` does not load); ``width``: the tree
    pass's key rows per query (the deepest path + 1; only the gather of the fa3-fwd path uses it)."""

    def __init__(self, sglang_files=None):
        from ddtree_bench.integrations.sglang import load_merge_state  # noqa: PLC0415

        self.fn, _combine, self.paged, library = load_fa3()
        self.merge, merge_label = load_merge_state(sglang_files)
        self.metadata = None
        self.describe = (
            f"{library}: non-causal prefix pass (qv = latent query) + per-query pass over the visible tree "
            f"slots, their LSEs transposed, merged by {merge_label}; metadata eager every round"
        )
        if not self.paged:
            self.describe += "; tree rows gathered per query into a contiguous buffer (no paged KV: 1 launch)"

    def refresh(self) -> None:
        """The round's metadata (``Fa3TreeMetadata``), eagerly, as the fork runs it before the replay; with
        it, once a round, the visible slots the gather reads, ``width`` a query, contiguous."""
        self.metadata.refresh()
        shared = self._shared
        shared["slots"].view(-1, shared["width"]).copy_(self.metadata.expand_page_table[:, : shared["width"]])

    def prepare(self, q, kv, prefix_lengths, mask: VerifyMask, out, width: int):
        """One layer's call on its cache ``kv``. The metadata and the scratch buffers are shared by every
        layer of the same shape."""
        import torch  # noqa: PLC0415

        if self.paged:
            raise SglangUnavailable("sgl_kernel's paged FA3 path is not wired here; fa3-fwd is")
        batch, nodes, heads, _ = q.shape
        used = int(kv.shape[1])
        key = (id(mask), batch, nodes, heads, used, int(width))
        if getattr(self, "_key", None) != key:
            device = q.device
            self.metadata = Fa3TreeMetadata(mask, used, device)
            tokens, width = batch * nodes, min(int(width), nodes)
            self._key = key
            self._shared = {
                "width": width,
                "slots": torch.empty(tokens * width, dtype=torch.int32, device=device),
                "cu_seqlens_q": torch.arange(0, tokens + 1, nodes, dtype=torch.int32, device=device),
                "cu_seqlens_q_expand": torch.arange(tokens + 1, dtype=torch.int32, device=device),
                "gathered": torch.empty(
                    (tokens, min(int(width), nodes), 1, HEAD_DIM), dtype=kv.dtype, device=device
                ),
            }
            self.refresh()
        return _PreparedFa3(self, self._shared, q, kv, out)


class _PreparedFa3:
    """One layer: the prefix pass, the gather of each query's visible tree rows (fa3-fwd has no paged KV),
    the tree pass, the two LSEs transposed to [T, H] (``softmax_lse.T.contiguous()``), the merge."""

    def __init__(self, attention: Fa3Attention, shared: dict, q, kv, out):
        import torch  # noqa: PLC0415

        self.torch = torch
        batch, nodes, heads, _ = q.shape
        used = kv.shape[1]
        self.attention, self.shared, self.meta = attention, shared, attention.metadata
        self.tokens, self.nodes, self.heads = batch * nodes, nodes, heads
        flat_q = q.view(batch * nodes, heads, HEAD_DIM)
        self.q_rope, self.q_nope = flat_q[..., VALUE_DIM:], flat_q[..., :VALUE_DIM]
        cache = kv.view(batch, used, 1, HEAD_DIM)
        self.k_cache, self.v_cache = cache[..., VALUE_DIM:], cache[..., :VALUE_DIM]
        self.kv_flat = kv.view(batch * used, HEAD_DIM)
        self.out = out.view(batch * nodes, heads, VALUE_DIM)

    def launch(self, stream=None) -> None:
        del stream  # torch's current stream
        fn, meta, shared = self.attention.fn, self.meta, self.shared
        torch, gathered = self.torch, shared["gathered"]
        o, lse, *_ = fn(
            q=self.q_rope,
            k_cache=self.k_cache,
            v_cache=self.v_cache,
            qv=self.q_nope,
            cache_seqlens=meta.cache_seqlens,
            cu_seqlens_q=shared["cu_seqlens_q"],
            max_seqlen_q=self.nodes,
            softmax_scale=SOFTMAX_SCALE,
            causal=False,
            num_splits=0,
            return_softmax_lse=True,
        )
        torch.index_select(self.kv_flat, 0, shared["slots"], out=gathered.view(-1, HEAD_DIM))  # one launch
        o_expand, lse_expand, *_ = fn(
            q=self.q_rope,
            k_cache=gathered[..., VALUE_DIM:],
            v_cache=gathered[..., :VALUE_DIM],
            qv=self.q_nope,
            cache_seqlens=meta.expand_seqlens,
            cu_seqlens_q=shared["cu_seqlens_q_expand"],
            max_seqlen_q=1,
            softmax_scale=SOFTMAX_SCALE,
            causal=False,
            num_splits=0,
            return_softmax_lse=True,
        )
        self.attention.merge(o, lse.T.contiguous(), o_expand, lse_expand.T.contiguous(), self.out)


class Fa3Causal:
    """FA3's causal pass alone (what SGLang's FA3 backend runs for a linear chain's verify: one call, no
    mask, no merge), as a verify forward's attention where FlashMLA does not load."""

    def __init__(self):
        self.fn, _combine, _paged, library = load_fa3()
        self.describe = f"{library}: one causal pass (qv = latent query)"

    def prepare(self, q, kv, prefix_lengths, mask, out):
        import torch  # noqa: PLC0415

        del mask
        batch, nodes, heads, _ = q.shape
        used = int(kv.shape[1])
        lengths = torch.as_tensor(
            [int(s) + nodes for s in np.asarray(prefix_lengths).reshape(-1)],
            dtype=torch.int32,
            device=q.device,
        )
        cache = kv.view(batch, used, 1, HEAD_DIM)
        fn = self.fn

        class _Prepared:
            def launch(self, stream=None):
                del stream
                o, *_ = fn(
                    q=q[..., VALUE_DIM:],
                    k_cache=cache[..., VALUE_DIM:],
                    v_cache=cache[..., :VALUE_DIM],
                    qv=q[..., :VALUE_DIM],
                    cache_seqlens=lengths,
                    softmax_scale=SOFTMAX_SCALE,
                    causal=True,
                    num_splits=0,
                )
                out.copy_(o)

        return _Prepared()


# ----------------------------------------------------------------------------------------------- accept


class TritonAccept:
    """SGLang's Triton tree accept (module docstring) on the fork's tree tensors (``ForkTrees``: candidates,
    int32 links) and the target's tokens, its outputs preallocated as the fork's verify input holds them."""

    def __init__(self, source, trees: ForkTrees):
        import torch  # noqa: PLC0415

        self.fn, path = load_accept(source)
        self.describe = f"{path.name} {ACCEPT_FUNCTION}"
        self.path, self.trees = path, trees
        batch, q, device = trees.batch, trees.q, trees.tokens.device
        self.next_token_ids = torch.empty((batch, q), dtype=torch.int64, device=device)
        self.commit_lens = torch.empty(batch, dtype=torch.int32, device=device)
        self.accept_index = torch.empty((batch, q), dtype=torch.int64, device=device)

    def launch(self, target_tokens) -> None:
        """The kernel, on the current stream (what ``DFlashDDTreeVerifyInput.verify`` launches)."""
        trees = self.trees
        self.fn(
            trees.tokens,
            target_tokens,
            trees.next_token,
            trees.next_sibling,
            self.next_token_ids,
            self.commit_lens,
            self.accept_index,
        )

    def result(self):
        """``(accepted_indices [B, N+1] int32 padded -1, accept_length [B] int32, bonus_token [B] int64)``,
        as ``ops.accept`` gives them."""
        batch, q = self.accept_index.shape
        lengths = self.commit_lens.cpu().numpy().astype(np.int32)
        index = self.accept_index.cpu().numpy()
        tokens = self.next_token_ids.cpu().numpy()
        accepted = np.full((batch, q), -1, np.int32)
        bonus = np.zeros(batch, np.int64)
        for b in range(batch):
            n = int(lengths[b])
            accepted[b, :n] = index[b, :n] - b * q
            bonus[b] = tokens[b, n - 1]
        return accepted, lengths, bonus


class ChainAccept:
    """Upstream SGLang's Triton DFlash accept (``_compute_dflash_accept_bonus_triton_unchecked``) for
    ``batch`` chains of ``block`` tokens (the bonus token and ``block - 1`` drafted ones): the longest prefix
    of drafted tokens the target agrees with, the bonus token after it and the new sequence lengths."""

    def __init__(self, sglang_files, batch: int, block: int, prefix_lengths, device):
        import torch  # noqa: PLC0415

        from ddtree_bench.integrations.sglang import load_chain_accept  # noqa: PLC0415

        self.fn, path = load_chain_accept(sglang_files)
        self.describe = f"{path.name} _compute_dflash_accept_bonus_triton_unchecked"
        self.candidates = torch.zeros((batch, block), dtype=torch.int64, device=device)
        self.accept_lens = torch.empty(batch, dtype=torch.int32, device=device)
        self.commit_lens = torch.empty(batch, dtype=torch.int32, device=device)
        self.bonus = torch.empty(batch, dtype=torch.int64, device=device)
        self.out_tokens = torch.empty((batch, block), dtype=torch.int64, device=device)
        self.prefix = torch.as_tensor(
            np.asarray(prefix_lengths).reshape(-1), dtype=torch.int64, device=device
        )
        self.new_seq_lens = torch.empty(batch, dtype=torch.int64, device=device)

    def launch(self, target_tokens) -> None:
        self.fn(
            self.candidates,
            target_tokens,
            self.accept_lens,
            self.commit_lens,
            self.bonus,
            self.out_tokens,
            self.prefix,
            self.new_seq_lens,
        )

    def result(self):
        """``(accepted drafted tokens [B] int32, bonus token [B] int64)``."""
        return self.accept_lens.cpu().numpy().astype(np.int32), self.bonus.cpu().numpy()


def chain_accept_cpu(candidates, target_tokens):
    """The chain's accept on the CPU: per request the number of leading drafted tokens
    (``candidates[:, 1:]``) equal to the target's token at the position before each, and the target's token
    after them (the bonus). ``(accepted [B] int32, bonus [B] int64)``."""
    candidates = np.asarray(candidates)
    target = np.asarray(target_tokens)
    if candidates.ndim != 2 or candidates.shape != target.shape or candidates.shape[1] < 1:
        raise ValueError(
            f"chain accept: candidates and target tokens must be [B, block] alike, got "
            f"{candidates.shape} and {target.shape}"
        )
    batch, block = candidates.shape
    accepted = np.zeros(batch, np.int32)
    bonus = np.zeros(batch, np.int64)
    for b in range(batch):
        n = 0
        while n < block - 1 and candidates[b, n + 1] == target[b, n]:
            n += 1
        accepted[b], bonus[b] = n, target[b, n]
    return accepted, bonus


# ----------------------------------------------------------------------------------------------- launches


def launches(torch, fn) -> int:
    """The GPU operations (kernels, copies, fills) one call of ``fn`` issues, counted by torch's profiler:
    the device-side events of one eager call after a warm one."""
    from torch.autograd import DeviceType  # noqa: PLC0415
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for event in prof.events() if event.device_type == DeviceType.CUDA)
