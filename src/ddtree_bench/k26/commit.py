"""A round's commit, after the accept: what SGLang's DDTree worker runs (the fork's later state,
``dflash_ddtree_worker.py`` after ``verify``), and the linear chain's part of it (upstream's
``dflash_worker_v2.py``). The same operations serve every stack: SGLang's stacks run them eagerly, as its
worker does; ours runs them inside its round's CUDA graph.

``Commit.run(accept_index, commit_lens, next_tokens)`` takes the accept in the fork's format:
``accept_index`` [B, q] int64 (the accepted path's flat node indices ``b * q + node``, the root first, -1
after the path), ``commit_lens`` [B] int32 (the path's nodes, root included) and ``next_tokens`` [B, q]
int64 (the path's tokens, the bonus token at ``commit_len - 1``). It runs:

1. the target KV compaction (``move_accept_tokens_to_target_kvcache``): each request's committed tree rows
   moved to the positions after its prefix, per layer one gather and one scatter of ``B x q`` latent rows
   (``kv[tgt] = kv[src]``; rows past the path move onto themselves);
2. the committed tokens' hidden states gathered (``torch.gather`` over the target's kept hidden states);
3. the new sequence lengths (prefix + commit length);
4. the drafter's KV of the committed tokens (``k26.draft.DraftShard.commit``: the context projection over
   all ``B x q`` rows, one GEMM for every layer's K/V, a write per layer);
5. the next round's bonus token (``next_tokens`` at ``commit_len - 1``).

A chain (``chain=True``) has no step 1 and no gather: its block's tokens already sit at their positions.
``from_ours`` turns our accept kernel's outputs (``ops.accept.DeviceAccept``) into that format first.
"""

from __future__ import annotations

import numpy as np


class Commit:
    """The commit of ``target`` (``k26.target.TargetShard``, its hidden states kept) into ``drafter``
    (``k26.draft.DraftShard``) for ``batch`` requests of ``q`` verified tokens (module docstring)."""

    def __init__(self, target, drafter, batch: int, q: int, *, chain: bool = False):
        import torch  # noqa: PLC0415

        self.torch, self.target, self.drafter = torch, target, drafter
        self.batch, self.q, self.chain = int(batch), int(q), bool(chain)
        device = target.device
        used = int(target.kv[0].shape[1])
        prefix = torch.as_tensor(np.asarray(target.lengths).reshape(-1), dtype=torch.int64, device=device)
        self.prefix = prefix
        self.row_offsets = (torch.arange(batch, device=device, dtype=torch.int64) * q)[:, None]
        # each request's first committed slot (flat latent rows) and the slots after it
        self.base = (torch.arange(batch, device=device, dtype=torch.int64) * used + prefix)[:, None]
        self.offsets = torch.arange(q, device=device, dtype=torch.int64)[None, :]
        self.flat = [kv.view(-1, kv.shape[-1]) for kv in target.kv]
        self.new_seq_lens = torch.empty(batch, dtype=torch.int64, device=device)
        self.bonus = torch.empty(batch, dtype=torch.int64, device=device)
        # from_ours' outputs
        self.accept_index = torch.full((batch, q), -1, dtype=torch.int64, device=device)
        self.commit_lens = torch.ones(batch, dtype=torch.int32, device=device)
        self.next_tokens = torch.zeros((batch, q), dtype=torch.int64, device=device)

    def run(self, accept_index, commit_lens, next_tokens) -> None:
        torch, q = self.torch, self.q
        hidden = self.target.hidden_aux
        if self.chain:
            committed = hidden.view(self.batch * q, -1)
        else:
            valid = accept_index >= 0
            local = (accept_index - self.row_offsets).clamp(min=0)
            src = self.base + local
            tgt = torch.where(valid, self.base + self.offsets, src).reshape(-1)
            src = src.reshape(-1)
            for flat in self.flat:
                flat[tgt] = flat[src]
            index = local.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
            committed = torch.gather(hidden.view(self.batch, q, -1), 1, index).reshape(self.batch * q, -1)
        self.new_seq_lens.copy_(self.prefix + commit_lens.to(torch.int64))
        self.drafter.commit(committed, q)
        last = (commit_lens.to(torch.int64) - 1).clamp(min=0).unsqueeze(1)
        self.bonus.copy_(next_tokens.view(self.batch, q).gather(1, last).reshape(-1))

    def from_ours(self, accepted, lengths, bonus) -> None:
        """Our accept's outputs (torch views of ``DeviceAccept``: local node indices [B, N+1] int32 padded
        -1, path lengths [B] int32, bonus tokens [B] int64) in the fork's format, then ``run``."""
        torch = self.torch
        accepted = accepted.to(torch.int64)
        self.accept_index.copy_(torch.where(accepted >= 0, accepted + self.row_offsets, accepted))
        self.commit_lens.copy_(lengths)
        last = (lengths.to(torch.int64) - 1).clamp(min=0).unsqueeze(1)
        self.next_tokens.scatter_(1, last, bonus.unsqueeze(1))
        self.run(self.accept_index, self.commit_lens, self.next_tokens)
