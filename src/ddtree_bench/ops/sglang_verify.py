"""SGLang's DDTree verify as its worker runs it: the per-request bool verify mask, the tree-verify attention
(SGLang's Triton ``extend_attention_fwd`` with that mask, or FA3 two-pass as SGLang's DDTree fork runs it on
Hopper) and SGLang's Triton tree accept. Used by the round's stacks (``k26.stack``). What loads SGLang's code
(its attention file, FA3, the accept file) is ``integrations.sglang``; this module runs what it loads.

- ``VerifyMask``: ``DFlashDDTreeVerifyInput.prepare_for_verify``'s ``custom_mask``: per request a
  ``[q, S_b + q]`` bool block (q = N + 1), the prefix columns filled True and the tree's visibility copied
  into the last ``q``, blocks concatenated; built per request, a fill and a copy each, every round.
- ``TritonAttention``: SGLang's ``extend_attention_fwd`` as its Triton backend calls it for target verify
  (the tree's rows as the extend part, the prefix through ``kv_indices`` at page size 1, the mask above,
  ``skip_prefix_custom_mask``). The tree's key rows are copied into the extend buffer first: SGLang's
  forward produces them there before writing the cache; ours writes the cache directly.
- ``Fa3Attention``: the fork's FA3 backend for an MLA target in target verify (``uses_tree_verify_mask``):
  once per forward, each query's visible tree slots are read from the mask's tree part and sorted to the
  front (``cache_seqlens`` = their count); per layer a non-causal pass over the prefix (``qv`` = the latent
  query), a pass per query over its visible tree slots, and the two merged by their log-sum-exp. Where
  ``sgl_kernel`` loads it is SGLang's own ``flash_attn_with_kvcache``; else the ``fa3-fwd`` package, whose
  build has no paged KV: there the tree pass reads each query's visible rows gathered into a contiguous
  ``[B (N+1), W, 576]`` buffer (W = the deepest path + 1) where the fork reads them through a page table,
  and the merge is FA3's own ``flash_attn_combine`` where the fork calls ``sgl_kernel``'s
  ``merge_state_v2``. ``describe`` says which.
- ``TritonAccept``: the fork's ``_compute_ddtree_accept_triton_unchecked`` (``triton_ops/ddtree.py`` beside
  its DDTree utils file), on SGLang's candidates (root token, then the node tokens), the target's tokens and
  the ``retrieve_next_token`` / ``retrieve_next_sibling`` links.

Every adapter's ``prepare`` allocates; ``launch`` only enqueues work on torch's current stream (the mask's
``build`` too, one request at a time). Torch is imported lazily.
"""

from __future__ import annotations

import numpy as np

from ddtree_bench.integrations.sglang import (
    ACCEPT_FUNCTION,
    SglangUnavailable,
    describe,
    find_accept_file,
    load_accept,
    load_fa3,
)
from ddtree_bench.ops.attention import HEAD_DIM, SOFTMAX_SCALE, VALUE_DIM

ROPE_DIM = HEAD_DIM - VALUE_DIM
__all__ = [
    "Fa3Attention",
    "SglangUnavailable",
    "TritonAccept",
    "TritonAttention",
    "VerifyMask",
    "find_accept_file",
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


class Fa3Attention:
    """FA3 two-pass tree verify as SGLang's DDTree fork runs it (module docstring). ``width``: the tree
    pass's key rows per query (the deepest path + 1 of the round's trees; only the fa3-fwd path uses it)."""

    def __init__(self):
        self.fn, self.merge, self.paged, library = load_fa3()
        self.describe = (
            f"{library}: non-causal prefix pass (qv = latent query) + per-query pass over the visible tree "
            "slots + LSE merge"
        )
        if not self.paged:
            self.describe += "; tree rows gathered per query into a contiguous buffer (no paged KV)"

    def prepare(self, q, kv, prefix_lengths, mask: VerifyMask, out, width: int):
        """One layer's call on its cache ``kv``. The per-forward metadata is refreshed by the first layer
        prepared; the scratch buffers are shared by every layer of the same shape."""
        import torch  # noqa: PLC0415

        if self.paged:
            raise SglangUnavailable("sgl_kernel's paged FA3 path is not wired here; fa3-fwd is")
        batch, nodes, heads, _ = q.shape
        used = int(kv.shape[1])
        key = (id(mask), batch, nodes, heads, used, int(width))
        first = getattr(self, "_key", None) != key
        if first:
            device = q.device
            meta = _Fa3Metadata(mask, used, int(width), device)
            self._key = key
            self._shared = {
                "meta": meta,
                "prefix": torch.as_tensor(
                    np.asarray(prefix_lengths).reshape(-1), dtype=torch.int32, device=device
                ),
                "gathered": torch.empty(
                    (batch * nodes, meta.width, 1, HEAD_DIM), dtype=kv.dtype, device=device
                ),
                "out_partial": torch.empty(
                    (2, batch, nodes, heads, VALUE_DIM), dtype=torch.float32, device=device
                ),
                # the combine wants the LSE's query dim fastest: laid out [2, B, H, q], viewed [2, B, q, H]
                "lse": torch.empty((2, batch, heads, nodes), dtype=torch.float32, device=device),
            }
        return _PreparedFa3(self.fn, self.merge, self._shared, q, kv, out, refresh=first)


class _Fa3Metadata:
    """Once per forward: each query's visible tree slots (sorted to the front) and their count."""

    def __init__(self, mask: VerifyMask, used: int, width: int, device):
        import torch  # noqa: PLC0415

        self.torch, self.mask = torch, mask
        q, batch = mask.q, len(mask.prefix)
        offsets = torch.arange(q, device=device)
        # the flat index of every (request, row, tree column) element of the mask
        self.index = torch.cat(
            [
                int(mask.offsets[b]) + s + offsets[:, None] * (s + q) + offsets[None, :]
                for b, s in enumerate(mask.prefix)
            ]
        ).reshape(-1)
        self.offsets = offsets
        self.starts = torch.as_tensor(
            [b * used + s for b, s in enumerate(mask.prefix)], dtype=torch.int64, device=device
        ).repeat_interleave(q)
        self.width = min(width, q)
        self.q, self.batch = q, batch
        self.cache_seqlens = torch.empty(batch * q, dtype=torch.int32, device=device)
        self.slots = torch.empty((batch * q, self.width), dtype=torch.int64, device=device)

    def refresh(self) -> None:
        torch, q = self.torch, self.q
        tree = self.mask.buffer[self.index].view(-1, q)
        keys = torch.where(tree, self.offsets, self.offsets + q)
        order = torch.sort(keys, dim=1).indices[:, : self.width]
        self.slots.copy_(self.starts[:, None] + order)
        self.cache_seqlens.copy_(tree.sum(1))


class _PreparedFa3:
    def __init__(self, fn, merge, shared: dict, q, kv, out, refresh: bool):
        batch, nodes, heads, _ = q.shape
        used = kv.shape[1]
        self.fn, self.merge, self.shared, self.refresh = fn, merge, shared, refresh
        self.shape = batch, nodes, heads
        self.q_rope = q[..., VALUE_DIM:]
        self.q_nope = q[..., :VALUE_DIM]
        cache = kv.view(batch, used, 1, HEAD_DIM)
        self.k_cache, self.v_cache = cache[..., VALUE_DIM:], cache[..., :VALUE_DIM]
        self.kv_flat = kv.view(batch * used, HEAD_DIM)
        self.out = out

    def launch(self, stream=None) -> None:
        del stream
        shared = self.shared
        meta, gathered, partial, lse = (
            shared["meta"],
            shared["gathered"],
            shared["out_partial"],
            shared["lse"],
        )
        batch, nodes, heads = self.shape
        if self.refresh:
            meta.refresh()
        o1, l1, *_ = self.fn(
            q=self.q_rope,
            k_cache=self.k_cache,
            v_cache=self.v_cache,
            qv=self.q_nope,
            cache_seqlens=shared["prefix"],
            softmax_scale=SOFTMAX_SCALE,
            causal=False,
            num_splits=0,
            return_softmax_lse=True,
        )
        gathered.view(-1, HEAD_DIM).copy_(self.kv_flat.index_select(0, meta.slots.view(-1)))
        o2, l2, *_ = self.fn(
            q=self.q_rope.reshape(batch * nodes, 1, heads, ROPE_DIM),
            k_cache=gathered[..., VALUE_DIM:],
            v_cache=gathered[..., :VALUE_DIM],
            qv=self.q_nope.reshape(batch * nodes, 1, heads, VALUE_DIM),
            cache_seqlens=meta.cache_seqlens,
            softmax_scale=SOFTMAX_SCALE,
            causal=False,
            num_splits=0,
            return_softmax_lse=True,
        )
        partial[0].copy_(o1)
        partial[1].copy_(o2.view(batch, nodes, heads, VALUE_DIM))
        lse[0].copy_(l1)
        lse[1].copy_(l2.view(batch, nodes, heads).transpose(1, 2))
        if shared.get("merge") is None:
            try:  # FA3's combine, where this build takes a 512-wide head; else the same merge in torch
                self.merge(partial, lse.transpose(-1, -2), out=self.out)
                shared["merge"] = self.merge
                shared["merge_note"] = "merged with flash_attn_combine"
            except Exception as exc:  # noqa: BLE001 (said in the description)
                shared["merge"] = _torch_merge
                shared["merge_note"] = f"merged in torch ({describe(exc, 100)})"
                _torch_merge(partial, lse.transpose(-1, -2), out=self.out)
        else:
            shared["merge"](partial, lse.transpose(-1, -2), out=self.out)


def _torch_merge(partial, lse, out):
    """Two attention partials ``[2, B, q, H, D]`` and their log-sum-exp ``[2, B, q, H]``, merged into
    ``out``."""
    import torch  # noqa: PLC0415

    weight = torch.exp(lse - lse.max(0).values)
    out.copy_((partial * weight[..., None]).sum(0) / weight.sum(0)[..., None])


# ----------------------------------------------------------------------------------------------- accept


class TritonAccept:
    """SGLang's Triton tree accept (module docstring) for ``batch`` trees of ``budget``, its outputs
    preallocated as the fork's verify input holds them."""

    def __init__(self, source, batch: int, budget: int, device):
        import torch  # noqa: PLC0415

        self.fn, path = load_accept(source)
        self.describe = f"{path.name} {ACCEPT_FUNCTION}"
        self.path = path
        q = budget + 1
        self.candidates = torch.zeros((batch, q), dtype=torch.int64, device=device)
        self.next_token_ids = torch.empty((batch, q), dtype=torch.int64, device=device)
        self.commit_lens = torch.empty(batch, dtype=torch.int32, device=device)
        self.accept_index = torch.empty((batch, q), dtype=torch.int64, device=device)

    def launch(self, node_token_ids, target_tokens, next_token, next_sibling) -> None:
        """SGLang's candidates (root, then the node tokens) and the kernel, on the current stream."""
        self.candidates[:, 1:].copy_(node_token_ids)
        self.fn(
            self.candidates,
            target_tokens,
            next_token,
            next_sibling,
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
