"""A whole DDTree decode round per stack (``catalog.STACKS``): the same drafter, trees, target forward and
routing for every stack, each stack's own three kernels (tree build, verify attention with its mask, accept).

``StackRound`` extends ``k26.round.RoundRunner`` (one GPU's share of Kimi K2.6, its DFlash drafter) with
SGLang's pieces (``ops.sglang_verify``) and runs a stack's round as its parts, one after another on torch's
current stream, then one synchronisation:

========== ===================================================================================================
part       what runs
========== ===================================================================================================
draft      the drafter and its top-K (one CUDA graph, every stack)
build      ours: the GPU kernel (one graph; it also writes the bool visibility where SGLang's mask needs it);
           SGLang's: its function per request after blocking copies of the top-K, the padded tree copied back
           from pageable memory (as its worker)
mask       our attention: nothing after our build (it writes the packed bits), the bits packed from the bool
           visibility after SGLang's build; SGLang's attention: its per-request bool mask (``VerifyMask``)
forward    the 61-layer verify forward with the stack's attention and the target's tokens (one CUDA graph
           per attention: the stacks differ in the attention kernel only)
accept     ours (in a graph), or SGLang's Triton accept kernel (SGLang's candidates copied first)
========== ===================================================================================================

The ``ours`` stack runs all of it as one CUDA graph. ``check(stack)`` compares the last round's accepted
paths with the CPU walk on its trees and target tokens. ``TooSlow`` is raised where one forward (or round)
would exceed ``max_seconds``: the stage records why instead of timing it.
"""

from __future__ import annotations

import time

import numpy as np

from ddtree_bench import catalog
from ddtree_bench.k26.round import RoundOptions, RoundRunner, host_trees, pack_bits
from ddtree_bench.ops.attention_peers import PeerUnavailable, load_sglang_extend_attention

PARTS = ("draft", "build", "mask", "forward", "accept")


class TooSlow(RuntimeError):
    """One call took longer than the stage's limit (the message says which and how long)."""


class StackRound(RoundRunner):
    """One round of ``options`` (``k26.round.RoundOptions``) for every stack of ``stacks``; ``sglang``: the
    paths of SGLang's code: ``{"builder": builder options (its DDTree file), "accept": that file or checkout,
    "attention_files": the folder of its Triton attention files}``; ``max_seconds``: the longest eager
    forward (or round) a stack may take before it is given up (``TooSlow``). Other arguments are
    ``RoundRunner``'s."""

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
        from ddtree_bench.builders import get_builder  # noqa: PLC0415
        from ddtree_bench.builders.sglang import sglang_call  # noqa: PLC0415

        super().__init__(
            weights,
            drafter_shape,
            options,
            builder=catalog.GPU_BUILDER,
            builder_options=None,
            attention=attention,
            accept=accept,
        )
        self.stacks = [catalog.STACKS[name] for name in stacks]
        self.max_seconds = float(max_seconds)
        self.sglang_paths = sglang
        self.notes: dict[str, str] = {}
        device = self.buffer.device
        if any(s.build == catalog.SGLANG for s in self.stacks):
            self.sglang_builder = get_builder(catalog.SGLANG, **sglang["builder"])
            reason = self.sglang_builder.unavailable_reason()
            if reason is not None:
                raise RuntimeError(reason)
            self.sglang = sglang_call(self.sglang_builder)
        self.h_lp = self.h_ids = None
        self.mask = None
        if any(s.sglang_mask for s in self.stacks):
            from ddtree_bench.ops.sglang_verify import VerifyMask  # noqa: PLC0415

            self.mask = VerifyMask(self.target.lengths, self.budget + 1, device)
        self.sglang_accept = None
        self.ids_view = self._field_view("node_token_ids")
        self.next_token = self._field_view("retrieve_next_token")
        self.next_sibling = self._field_view("retrieve_next_sibling")
        self.depths = self._field_view("node_depths")

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

    def _forward_fn(self, attention):
        torch = self.torch

        def run():
            logits = self.target.forward(attention)
            self.target_tokens.copy_(torch.argmax(logits, dim=-1).view(self.batch, self.budget + 1))

        return run

    def setup_attention(self, name: str) -> None:
        """Prepare ``name`` (an attention impl of the catalog) on every layer and capture its forward; a
        graph that cannot be captured leaves the forward eager (said in the stack's note). ``TooSlow``
        where one eager forward exceeds the limit."""
        from ddtree_bench.k26.target import capture  # noqa: PLC0415
        from ddtree_bench.ops import sglang_verify  # noqa: PLC0415

        key = f"forward:{name}"
        if name in self._too_slow:
            raise TooSlow(self._too_slow[name])
        if key in self.graphs:
            return
        attention = None if name == catalog.OURS else name
        if attention is not None:  # SGLang's attention reads its mask, made from this round's trees
            self.graphs["draft"].replay()
            self.graphs["build-bool"].replay()
            self.torch.cuda.synchronize()
            if name == catalog.SGLANG_TRITON_ATTENTION:
                try:
                    fwd, label = load_sglang_extend_attention(self.sglang_paths["attention_files"])
                except PeerUnavailable as exc:
                    raise sglang_verify.SglangUnavailable(str(exc)) from exc
                adapter = sglang_verify.TritonAttention(fwd, label)
                self.target.add_attention(name, adapter, self.mask)
            else:
                width = int(self.depths.max().item()) + 1  # the deepest path + 1 (the same trees every round)
                adapter = sglang_verify.Fa3Attention()
                self.target.add_attention(name, adapter, self.mask, width=width)
                self.notes[name] = adapter.describe + f"; W = {width}"
                self.fa3 = adapter
            self.mask.build(self.visibility)
        fn = self._forward_fn(attention)
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

    def capture(self):
        """The graphs every stack shares: draft, our builds (packed bits only; with the bool visibility),
        the bits packed from the visibility, our accept, and ``ours`` as one graph."""
        from ddtree_bench.k26.target import capture  # noqa: PLC0415

        self._eager, self._too_slow = {}, {}
        self.graphs["draft"], _ = capture(self.draft)
        self.graphs["build"], _ = capture(self.build_on_device)
        self.graphs["build-bool"], _ = capture(self._build_bool)
        self.graphs["pack"], _ = capture(lambda: pack_bits(self.torch, self.visibility, self.mask_bits))
        self.graphs["accept"], _ = capture(self._accept_ours)
        if any(s.accept == catalog.SGLANG_ACCEPT for s in self.stacks):
            from ddtree_bench.ops.sglang_verify import TritonAccept  # noqa: PLC0415

            self.sglang_accept = TritonAccept(
                self.sglang_paths["accept"], self.batch, self.budget, self.buffer.device
            )

    def _build_bool(self):
        self.device_builder(self.d_lp, self.d_ids, self.budget, out=self.trees, stream=self._stream())

    def _accept_ours(self):
        self.accept.launch(self.d_target, self.trees, self.accept_out, stream=self._stream())

    def _accept_sglang(self):
        self.sglang_accept.launch(self.ids_view, self.target_tokens, self.next_token, self.next_sibling)

    def build_sglang(self):
        """SGLang's build as its worker runs it: blocking copies of the top-K, its function per request,
        the padded tree copied back from pageable memory; returns when the tree is on the device."""
        torch = self.torch
        lp, ids = self.drafter.top_log_probs, self.drafter.top_token_ids
        h_lp, h_ids = lp.to("cpu"), ids.to("cpu")
        fields = host_trees(torch, catalog.SGLANG, self.sglang_builder, h_lp, h_ids, self.budget, self.sglang)
        for name, tensor in fields.items():
            self._field_view(name).copy_(tensor.to("cuda"))
        torch.cuda.current_stream().synchronize()

    def prepare_stack(self, stack) -> None:
        """Everything ``stack`` runs, prepared and captured (``TooSlow`` where its forward is too slow)."""
        if stack.name == catalog.OURS and "round" not in self.graphs:
            from ddtree_bench.k26.target import capture  # noqa: PLC0415

            self.setup_attention(catalog.OURS)
            try:
                self.graphs["round"], _ = capture(self.fused, warmup=1)
            except Exception as exc:  # noqa: BLE001 (said in the note: the parts' graphs back to back)
                self.torch.cuda.synchronize()
                self.notes[catalog.OURS] = f"parts' graphs back to back ({' '.join(str(exc).split())[:120]})"
            return
        self.setup_attention(stack.attention)

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
        ours_build = stack.build == catalog.GPU_BUILDER
        if ours_build:
            build = self.graphs["build-bool" if stack.sglang_mask else "build"].replay
        else:
            build = self.build_sglang
        if stack.sglang_mask:
            mask = lambda: self.mask.build(self.visibility)  # noqa: E731
        elif ours_build:
            mask = None
        else:
            mask = self.graphs["pack"].replay
        key = f"forward:{stack.attention}"
        accept = self.graphs["accept"].replay if stack.accept == catalog.OURS else self._accept_sglang
        parts = {"draft": self.graphs["draft"].replay, "build": build, "mask": mask}
        parts.update(forward=lambda: self._replay(key), accept=accept)
        return {name: part for name, part in parts.items() if part is not None}

    def run_stack(self, stack) -> None:
        """One whole round of ``stack``; returns when its accept is done."""
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
            shape = f"draft graph, {stack.build} build, mask, {forward}, {stack.accept} accept"
        extra = self.notes.get(stack.attention)
        if stack.attention == catalog.SGLANG_FA3_ATTENTION and getattr(self, "fa3", None) is not None:
            merge_note = getattr(self.fa3, "_shared", {}).get("merge_note")
            extra = f"{extra}; {merge_note}" if merge_note else extra
        return shape + (f"; {extra}" if extra else "")

    def check(self, stack) -> bool:
        """The last round's accepted paths, lengths and bonus tokens equal the CPU walk on its trees and
        target tokens."""
        from ddtree_bench.ops.accept import accept_cpu  # noqa: PLC0415

        self.torch.cuda.synchronize()
        want = accept_cpu(self.trees.to_host(), self.target_tokens.cpu().numpy())
        got = self.accept_out.to_host() if stack.accept == catalog.OURS else self.sglang_accept.result()
        return all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, want, strict=True))
