"""The linear DFlash chain's round, as upstream SGLang runs it (``dflash_worker_v2.py``, sglang 0.5.23), on
the same weights as the tree stacks (``ChainRound``): the drafter proposes a block of ``block`` tokens (the
bonus token and ``block - 1`` drafted ones, the top-1 at each position), the target verifies them with a
causal mask, and the accept keeps the longest prefix the target agrees with.

========== ===================================================================================================
part       what runs
========== ===================================================================================================
draft      the drafter's forward and its greedy head (upstream folds the head into the draft graph): one graph
metadata   the block's candidates (the bonus token, the drafted tokens), the verify's cache lengths; eager
forward    the 61-layer verify forward of ``B x block`` tokens, FlashMLA causal (exact for a chain; FA3's
           causal pass where FlashMLA does not load), one CUDA graph
accept     the target's tokens (argmax) and upstream's Triton DFlash accept, eagerly
commit     the drafter's KV of the block's tokens (no target KV move: a chain's tokens sit at their places)
========== ===================================================================================================

``run_round()`` runs the parts one after another, as upstream's worker launches them; ``run_graph()``
replays the same work captured as one CUDA graph (no host work between the kernels): what overlap
scheduling, which hides the host's launches behind the previous round, could at best reach (a model, said
so wherever it is shown). ``check()`` compares the accepted lengths and bonus tokens with a CPU walk.
"""

from __future__ import annotations

import numpy as np

from ddtree_bench import catalog

PARTS = ("draft", "metadata", "forward", "accept", "commit")


class ChainRound:
    """A chain round of ``block`` tokens for ``batch`` requests over ``prefix`` rows on ``weights``
    (``k26.target.TargetWeights``) with a drafter of ``drafter_shape``; ``sglang_files``: the wheel's files
    (the accept)."""

    def __init__(self, weights, drafter_shape, *, batch, block, prefix, sglang_files, seed=0):
        import torch  # noqa: PLC0415

        from ddtree_bench.k26.draft import DraftShard  # noqa: PLC0415
        from ddtree_bench.k26.target import ShardOptions, TargetShard  # noqa: PLC0415
        from ddtree_bench.ops.sglang_verify import ChainAccept  # noqa: PLC0415

        self.torch = torch
        self.batch, self.block, self.prefix = int(batch), int(block), int(prefix)
        shape = weights.shape
        self.drafter = DraftShard(
            drafter_shape,
            batch=batch,
            block=block,
            context=prefix,
            k=1,
            vocab_shard=shape.vocab_shard,
            seed=seed,
        )
        self.target = TargetShard(
            weights,
            batch=batch,
            budget=block - 1,
            prefix=prefix,
            options=ShardOptions(kv_align=64, aux_layers=drafter_shape.target_layers),
        )
        self.attention, self.note = self._attention()
        self.accept = ChainAccept(sglang_files, batch, block, self.target.lengths, weights.device)
        self.target_tokens = torch.zeros((batch, block), dtype=torch.int64, device=weights.device)
        self.seqlens = torch.zeros(batch, dtype=torch.int32, device=weights.device)
        self.prefix_t = torch.full((batch,), prefix, dtype=torch.int32, device=weights.device)
        self.graphs = {}

    def _attention(self):
        """FlashMLA causal where it loads, else FA3's causal pass (``ops.sglang_verify``); its note."""
        from ddtree_bench.ops.attention_peers import FlashMlaAttention, PeerUnavailable  # noqa: PLC0415

        try:
            adapter = FlashMlaAttention()
            name = catalog.FLASHMLA
        except PeerUnavailable as exc:
            from ddtree_bench.ops.sglang_verify import Fa3Causal  # noqa: PLC0415

            adapter = Fa3Causal()
            name = "fa3-causal"
            adapter.describe += f" (FlashMLA does not load: {exc})"
        self.target.add_attention(name, adapter, None)
        return name, adapter.describe

    # ------------------------------------------------------------------------------------------- parts
    def _draft(self):
        self.drafter.forward()
        self.drafter.head_greedy()

    def _metadata(self):
        candidates = self.accept.candidates
        candidates[:, :1].copy_(self.drafter.tokens.view(self.batch, self.block)[:, :1])
        candidates[:, 1:].copy_(self.drafter.draft_tokens)
        self.seqlens.copy_(self.prefix_t + self.block)

    def _forward(self):
        self.target.forward(self.attention)

    def _accept(self):
        torch = self.torch
        self.target_tokens.copy_(torch.argmax(self.target.logits, dim=-1).view(self.batch, self.block))
        self.accept.launch(self.target_tokens)

    def _commit(self):
        self.drafter.commit(self.target.hidden_aux.view(self.batch * self.block, -1), self.block)

    def _whole(self):
        for part in (self._draft, self._metadata, self._forward, self._accept, self._commit):
            part()

    def capture(self) -> None:
        """The draft and forward graphs, and the whole round as one graph (the overlap model); a round
        that cannot be captured whole leaves that model out (``graphs["round"]`` None)."""
        from ddtree_bench.k26.target import capture  # noqa: PLC0415

        self.graphs["draft"], _ = capture(self._draft)
        self.graphs["forward"], _ = capture(self._forward)
        try:
            self.graphs["round"], _ = capture(self._whole, warmup=1)
        except Exception:  # noqa: BLE001 (the model is then not given; the parts still are)
            self.torch.cuda.synchronize()
            self.graphs["round"] = None

    def parts(self) -> dict:
        return {
            "draft": self.graphs["draft"].replay,
            "metadata": self._metadata,
            "forward": self.graphs["forward"].replay,
            "accept": self._accept,
            "commit": self._commit,
        }

    def run_round(self) -> None:
        for part in self.parts().values():
            part()
        self.torch.cuda.current_stream().synchronize()

    def run_graph(self) -> None:
        self.graphs["round"].replay()
        self.torch.cuda.current_stream().synchronize()

    def launches_per_layer(self) -> int:
        from ddtree_bench.ops.sglang_verify import launches  # noqa: PLC0415

        prepared = self.target.attentions[self.attention][0]
        return launches(self.torch, prepared.launch)

    def check(self) -> bool:
        """The last round's accepted lengths and bonus tokens equal the CPU walk on its candidates and the
        target's tokens."""
        from ddtree_bench.ops.sglang_verify import chain_accept_cpu  # noqa: PLC0415

        self.torch.cuda.synchronize()
        got = self.accept.result()
        want = chain_accept_cpu(self.accept.candidates.cpu().numpy(), self.target_tokens.cpu().numpy())
        return all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
