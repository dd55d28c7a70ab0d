"""A whole DDTree decode round per stack (``catalog.STACKS``): the same drafter, trees, target forward and
routing for every stack, each stack's own three kernels (tree build, verify attention with its mask, accept),
and the commit every round pays.

``StackRound`` extends ``k26.round.RoundRunner`` (one GPU's share of Kimi K2.6, its DFlash drafter) with
SGLang's pieces (``ops.sglang_verify``) and runs a stack's round as its parts, one after another on torch's
current stream, then one synchronisation. SGLang's parts follow its DDTree fork's worker (the later state,
which takes any batch and captures the target verify; docs/round_stages.md lists each step's file):

========== ===================================================================================================
part       what runs
========== ===================================================================================================
draft      SGLang's: the drafter's graph, then its top-K eagerly (matmul, logsumexp, top-K, the ranks' merge);
           ours: both in one graph
build      SGLang's: per request its function on the device's top-K (two blocking copies to pageable host
           memory inside), its pad, five non-blocking copies from pageable memory and the small kernels
           around them (``ops.sglang_verify.ForkTrees``); ours: the GPU kernel (one graph; with the bool
           visibility where SGLang's mask needs it). A swap adapts the build's outputs to the accept that
           follows (SGLang's tensors from ours, or the parents and counts our accept reads from SGLang's)
mask       SGLang's attention: its per-request bool mask (``VerifyMask``); our attention after SGLang's
           build: the bits packed from the bool visibility; after ours: nothing (our build writes the bits)
metadata   SGLang's FA3: the backend's tree-verify metadata and the graph runner's input copies, eagerly
forward    the 61-layer verify forward with the stack's attention (one CUDA graph per attention)
accept     SGLang's: the target's tokens (argmax) and its Triton accept, eagerly; ours: both in a graph
commit     ``k26.commit.Commit``: the target KV compaction, the hidden states, the draft KV, the bonus token;
           eagerly in SGLang's stacks, in a graph in ours
========== ===================================================================================================

The ``ours`` stack runs all of it as one CUDA graph. ``check(stack)`` compares the last round's accepted
paths with the CPU walk on its trees and target tokens (and SGLang's built tokens with ours). ``TooSlow`` is
raised where one forward (or round) would exceed ``max_seconds``: the stage records why instead of timing
it. ``launches_per_layer(attention)`` counts one layer's verify-attention launches.
"""

from __future__ import annotations

import time

import numpy as np

from ddtree_bench import catalog
from ddtree_bench.k26.round import RoundOptions, RoundRunner, pack_bits
from ddtree_bench.ops.attention_peers import PeerUnavailable, load_sglang_extend_attention

PARTS = ("draft", "build", "mask", "metadata", "forward", "accept", "commit")


class TooSlow(RuntimeError):
    """One call took longer than the stage's limit (the message says which and how long)."""


def _torch_of(torch, array):
    return torch.from_dlpack(array)


class StackRound(RoundRunner):
    """One round of ``options`` (``k26.round.RoundOptions``) for every stack of ``stacks``; ``sglang``: the
    paths of SGLang's code: ``{"builder": builder options (its DDTree file), "accept": that file or checkout,
    "attention_files": the folder of its Triton attention files, "files": the wheel's files (its merge)}``;
    ``max_seconds``: the longest eager forward (or round) a stack may take before it is given up
    (``TooSlow``). Other arguments are ``RoundRunner``'s."""

    def __init__(
        self,
        weights,
        drafter_shape,
        options: RoundOptions,
        *,
        stacks,
        sglang: dict,
        max_seconds: float,
        attention,
        accept,
    ):
        from ddtree_bench.k26.commit import Commit  # noqa: PLC0415
        from ddtree_bench.ops.sglang_verify import ForkTrees, VerifyMask  # noqa: PLC0415

        super().__init__(
            weights,
            drafter_shape,
            options,
            builder=catalog.GPU_BUILDER,
            builder_options=None,
            attention=attention,
            accept=accept,
            target_options={"aux_layers": drafter_shape.target_layers},
        )
        torch = self.torch
        self.stacks = [catalog.STACKS[name] for name in stacks]
        self.max_seconds = float(max_seconds)
        self.sglang_paths = sglang
        self.notes: dict[str, str] = {}
        self.q = self.budget + 1
        device = self.buffer.device
        self.fork = ForkTrees(self.batch, self.q, self.visibility, self.target.lengths, device)
        self.mask = None
        if any(s.sglang_mask for s in self.stacks):
            self.mask = VerifyMask(self.target.lengths, self.q, device)
        self.commit = Commit(self.target, self.drafter, self.batch, self.q)
        self.accepted = _torch_of(torch, self.accept_out.accepted_indices)
        self.accept_length = _torch_of(torch, self.accept_out.accept_length)
        self.bonus = _torch_of(torch, self.accept_out.bonus_token)
        self.node_tokens = self._field_view("node_token_ids")
        self.next_token = self._field_view("retrieve_next_token")
        self.next_sibling = self._field_view("retrieve_next_sibling")
        self.depths = self._field_view("node_depths")
        self.parents = self._field_view("parents")
        self.node_count = self._field_view("node_count")
        self.input_ids = torch.zeros((self.batch, self.q), dtype=torch.int64, device=device)
        self.input_positions = torch.zeros_like(self.input_ids)
        self.sglang_accept = None
        self.fa3 = None
        if any(s.build == catalog.SGLANG for s in self.stacks):
            self._sglang_builder(sglang["builder"])

    def _sglang_builder(self, options: dict) -> None:
        from ddtree_bench.builders import get_builder  # noqa: PLC0415
        from ddtree_bench.builders.sglang import sglang_call  # noqa: PLC0415

        builder = get_builder(catalog.SGLANG, **options)
        reason = builder.unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        self.sglang_builder = builder
        self.sglang_function, self.sglang_pad, extra = sglang_call(builder)
        workspace = extra.get("workspace")
        # one workspace a request, as the fork's worker keeps them (the outputs live in it)
        self.workspaces = (
            [type(workspace)() for _ in range(self.batch)] if workspace is not None else [None] * self.batch
        )

    # ------------------------------------------------------------------------------------------- setup
    def _timed_eager(self, fn, what: str) -> float:
        torch = self.torch
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        if seconds > self.max_seconds:
            raise TooSlow(f"{what} took {seconds:.2f} s, over the stage's limit of {self.max_seconds:g} s")
        return seconds

    def _adapter(self, name: str):
        """SGLang's attention ``name`` prepared on every layer (its mask built from this round's trees)."""
        from ddtree_bench.ops import sglang_verify  # noqa: PLC0415

        self.graphs["draft"].replay()
        self.graphs["build-bool"].replay()
        self.torch.cuda.synchronize()
        self.mask.build(self.visibility)
        if name == catalog.SGLANG_TRITON_ATTENTION:
            try:
                fwd, label = load_sglang_extend_attention(self.sglang_paths["attention_files"])
            except PeerUnavailable as exc:
                raise sglang_verify.SglangUnavailable(str(exc)) from exc
            adapter = sglang_verify.TritonAttention(fwd, label)
            self.target.add_attention(name, adapter, self.mask)
            self.notes[name] = adapter.describe
            return
        width = int(self.depths.max().item()) + 1  # the deepest path + 1 (the same trees every round)
        adapter = sglang_verify.Fa3Attention(self.sglang_paths.get("files"))
        self.target.add_attention(name, adapter, self.mask, width=width)
        self.notes[name] = adapter.describe + f"; W = {width}"
        self.fa3 = adapter

    def setup_attention(self, name: str) -> None:
        """Prepare ``name`` (an attention impl of the catalog) on every layer and capture its forward; a
        graph that cannot be captured leaves the forward eager (said in the stack's note). ``TooSlow``
        where one eager forward exceeds the limit."""
        from ddtree_bench.k26.target import capture  # noqa: PLC0415

        key = f"forward:{name}"
        if name in self._too_slow:
            raise TooSlow(self._too_slow[name])
        if key in self.graphs:
            return
        attention = None if name == catalog.OURS else name
        if attention is not None:
            self._adapter(name)
        fn = lambda: self.target.forward(attention)  # noqa: E731
        try:
            try:
                self._timed_eager(fn, f"one eager forward with {name}")
            except TooSlow:  # the first call also compiles (Triton's JIT for a new shape): time a second
                self._timed_eager(fn, f"one eager forward with {name} (its second call)")
        except TooSlow as exc:
            self._too_slow[name] = str(exc)
            raise
        try:
            self.graphs[key], _ = capture(fn, warmup=1)
        except Exception as exc:  # noqa: BLE001 (said in the note; the forward then runs eagerly)
            self.torch.cuda.synchronize()
            self.graphs[key] = None
            self._eager[key] = fn
            self.notes.setdefault("eager", "")
            self.notes["eager"] += f" {name} (capture failed: {' '.join(str(exc).split())[:120]})"

    def launches_per_layer(self, name: str) -> int:
        """One layer's verify-attention launches (kernels, copies, fills) of impl ``name``, once set up."""
        from ddtree_bench.ops.sglang_verify import launches  # noqa: PLC0415

        prepared = self.target.attentions[None if name == catalog.OURS else name][0]
        return launches(self.torch, lambda: prepared.launch(self._stream()))

    def capture(self):
        """The graphs every stack shares: the drafter (with and without its head), our builds (packed bits
        only; with the bool visibility), the bits packed from the visibility, our accept, our commit."""
        from ddtree_bench.k26.target import capture  # noqa: PLC0415

        self._eager, self._too_slow = {}, {}
        self.graphs["draft"], _ = capture(self.draft)
        self.graphs["draft-forward"], _ = capture(self.drafter.forward)
        self.graphs["build"], _ = capture(self.build_on_device)
        self.graphs["build-bool"], _ = capture(self._build_bool)
        self.graphs["pack"], _ = capture(lambda: pack_bits(self.torch, self.visibility, self.mask_bits))
        self.graphs["accept"], _ = capture(self._accept_ours)
        self.graphs["commit"], _ = capture(self._commit_ours)
        if any(s.accept == catalog.SGLANG_ACCEPT for s in self.stacks):
            from ddtree_bench.ops.sglang_verify import TritonAccept  # noqa: PLC0415

            self.sglang_accept = TritonAccept(self.sglang_paths["accept"], self.fork)

    # ------------------------------------------------------------------------------------------- pieces
    def _build_bool(self):
        self.device_builder(self.d_lp, self.d_ids, self.budget, out=self.trees, stream=self._stream())

    def _argmax(self):
        torch = self.torch
        self.target_tokens.copy_(torch.argmax(self.target.logits, dim=-1).view(self.batch, self.q))

    def _accept_ours(self):
        self._argmax()
        self.accept.launch(self.d_target, self.trees, self.accept_out, stream=self._stream())

    def _commit_ours(self):
        self.commit.from_ours(self.accepted, self.accept_length, self.bonus)

    def _draft_sglang(self):
        self.graphs["draft-forward"].replay()
        self.drafter.head_topk()  # eagerly, as the worker's _topk_from_vocab_parallel_head

    def build_sglang(self, for_our_accept: bool = False):
        """SGLang's build as the fork's worker runs it (module docstring); returns when the trees are on the
        device. ``for_our_accept``: also the node tokens, parents and counts our accept kernel reads."""
        torch = self.torch
        lp, ids, fork = self.drafter.top_log_probs, self.drafter.top_token_ids, self.fork
        fork.start()
        for b in range(self.batch):  # the worker's per-request loop
            extra = {} if self.workspaces[b] is None else {"workspace": self.workspaces[b]}
            tokens, depths, parents, _maps, vis, nt, ns = self.sglang_function(
                lp[b], ids[b], self.budget, **extra
            )
            vis, nt, ns = self.sglang_pad(vis, nt, ns, self.q)
            fork.upload(b, tokens, depths, vis, nt, ns)
            if for_our_accept:
                n = int(tokens.numel())
                self.parents[b, : n + 1].copy_(torch.as_tensor(list(parents), dtype=torch.int32).to("cuda"))
                self.parents[b, n + 1 :].fill_(-1)
                self.node_count[b].fill_(n)
        if for_our_accept:
            self.node_tokens.copy_(fork.tokens[:, 1:])
        torch.cuda.current_stream().synchronize()

    def _fork_from_ours(self):
        """Our build's trees in the tensors SGLang's accept reads (the swap's adaptation)."""
        fork = self.fork
        fork.tokens[:, 1:].copy_(self.node_tokens)
        fork.next_token.copy_(self.next_token)
        fork.next_sibling.copy_(self.next_sibling)

    def _metadata_fa3(self):
        """The FA3 backend's metadata and the graph runner's input copies (``load_batch``), eagerly."""
        self.fa3.refresh()
        self.input_ids.copy_(self.fork.tokens)
        self.input_positions.copy_(self.fork.positions)

    def _accept_sglang(self):
        self._argmax()
        self.sglang_accept.launch(self.target_tokens)

    def _commit_sglang(self):
        accept = self.sglang_accept
        self.commit.run(accept.accept_index, accept.commit_lens, accept.next_token_ids)

    def prepare_stack(self, stack) -> None:
        """Everything ``stack`` runs, prepared and captured (``TooSlow`` where its forward is too slow)."""
        if stack.name == catalog.OURS and "round" not in self.graphs:
            from ddtree_bench.k26.target import capture  # noqa: PLC0415

            self.setup_attention(catalog.OURS)
            try:
                self.graphs["round"], _ = capture(self.round_ours, warmup=1)
            except Exception as exc:  # noqa: BLE001 (said in the note: the parts' graphs back to back)
                self.torch.cuda.synchronize()
                self.notes[catalog.OURS] = f"parts' graphs back to back ({' '.join(str(exc).split())[:120]})"
            return
        self.setup_attention(stack.attention)

    def round_ours(self):
        """Our whole round (captured as one graph): draft, build, forward, accept, commit."""
        self.draft()
        self.build_on_device()
        self.target.forward()
        self._accept_ours()
        self._commit_ours()

    # ------------------------------------------------------------------------------------------- rounds
    def _replay(self, key):
        graph = self.graphs.get(key)
        if graph is None:
            self._eager[key]()
        else:
            graph.replay()

    def parts_of(self, stack) -> dict:
        """The stack's parts (module docstring) as callables that only enqueue (the host build and SGLang's
        mask loop run on the host as they go)."""
        sg_build = stack.build == catalog.SGLANG
        sg_attention = stack.sglang_mask
        sg_accept = stack.accept == catalog.SGLANG_ACCEPT
        ours = stack.name == catalog.OURS
        parts = {"draft": self.graphs["draft"].replay if ours else self._draft_sglang}
        if sg_build:
            parts["build"] = lambda: self.build_sglang(for_our_accept=not sg_accept)
        else:
            graph = self.graphs["build-bool" if sg_attention else "build"]
            parts["build"] = (
                graph.replay if not sg_accept else lambda: (graph.replay(), self._fork_from_ours())
            )
        if sg_attention:
            parts["mask"] = lambda: self.mask.build(self.visibility)
        elif sg_build:
            parts["mask"] = self.graphs["pack"].replay
        if stack.attention == catalog.SGLANG_FA3_ATTENTION:
            parts["metadata"] = self._metadata_fa3
        key = f"forward:{stack.attention}"
        parts["forward"] = lambda: self._replay(key)
        parts["accept"] = self._accept_sglang if sg_accept else self.graphs["accept"].replay
        if ours:
            parts["commit"] = self.graphs["commit"].replay
        else:
            parts["commit"] = self._commit_sglang if sg_accept else self._commit_ours
        return parts

    def run_stack(self, stack) -> None:
        """One whole round of ``stack``; returns when its commit is done."""
        if stack.name == catalog.OURS and self.graphs.get("round") is not None:
            self.graphs["round"].replay()
        else:
            for part in self.parts_of(stack).values():
                part()
        self.torch.cuda.current_stream().synchronize()

    def describe(self, stack) -> str:
        forward = (
            "eager forward" if stack.attention in self.notes.get("eager", "") else "forward as a CUDA graph"
        )
        if stack.name == catalog.OURS:
            shape = self.notes.get(catalog.OURS, "one CUDA graph")
        else:
            shape = f"SGLang's draft and commit, {stack.build} build, mask, {forward}, {stack.accept} accept"
        extra = self.notes.get(stack.attention)
        return shape + (f"; {extra}" if extra else "")

    def check(self, stack) -> bool:
        """The last round's accepted paths, lengths and bonus tokens equal the CPU walk on its trees and
        target tokens; after SGLang's build, its tokens equal our build's (run again here, untimed)."""
        from ddtree_bench.ops.accept import accept_cpu  # noqa: PLC0415

        torch = self.torch
        torch.cuda.synchronize()
        fork_tokens = self.fork.tokens.clone()
        got = self.accept_out.to_host() if stack.accept == catalog.OURS else self.sglang_accept.result()
        target = self.target_tokens.cpu().numpy()
        self.graphs["build-bool"].replay()
        torch.cuda.synchronize()
        trees = self.trees.to_host()
        want = accept_cpu(trees, target)
        same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, want, strict=True))
        if stack.build == catalog.SGLANG:
            tokens = fork_tokens.cpu().numpy()[:, 1:]
            for b in range(self.batch):
                n = int(trees.node_count[b])
                same = same and np.array_equal(tokens[b, :n], trees.node_token_ids[b, :n])
        return bool(same)
