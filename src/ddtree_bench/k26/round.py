"""A whole DDTree decode round on one GPU's share of Kimi K2.6: drafter, top-K, tree build, verify forward,
accept (``RoundRunner``).

Two ways to run it, as the builder allows:

- ``gpu`` (``fused``): the drafter and its top-K, our tree build (packed-bit mask straight into the buffer the
  verify attention reads), the 61-layer verify forward, the target's tokens (argmax of the LM-head shard) and
  the accept kernel, captured as one CUDA graph; a round is one replay and a synchronisation.
- a CPU builder (``split``), as SGLang's DDTree worker splits the round: graph 1 (drafter and top-K), the
  top-K copied to the host, the build on the host, the tree copied back, graph 2 (the mask packed from the
  bool visibility on the GPU, the verify forward, the target's tokens, the accept). ``sglang`` and
  ``reference`` copy with torch from pageable memory, a tensor at a time, as SGLang's worker does (they also
  copy the parents and node counts our accept kernel reads); ``native`` and ``native-mt`` copy through pinned
  buffers, one range each way.

``run_round()`` is one round, host-inclusive; ``parts()`` gives the same round's parts as separately timed
callables (draft, build, verify), so a row can set the run round beside the sum of its parts.
``check_accept()`` walks the last round's trees on the CPU with the same target tokens (``ops.accept``) and
compares the accepted paths with the GPU's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ddtree_bench import catalog
from ddtree_bench.builders.sglang import sglang_call
from ddtree_bench.k26.draft import DraftShard, draft_block

#: Builders whose round is one CUDA graph; the others split it around the host build (the catalog's copies).
FUSED_BUILDERS = catalog.builders_where(copies=catalog.DEVICE)
TORCH_COPY_BUILDERS = catalog.builders_where(copies=catalog.PAGEABLE)
PINNED_COPY_BUILDERS = catalog.builders_where(copies=catalog.PINNED)
ROUND_BUILDERS = catalog.ROUND_BUILDERS


def pack_bits(torch, visibility, out):
    """The bool visibility [B, N+1, N+1] packed into ``out`` [B, N+1, words] int32 (bit j % 32 of word
    j // 32 marks key j), with torch ops (capturable)."""
    batch, n1, _ = visibility.shape
    words = out.shape[-1]
    padded = torch.nn.functional.pad(visibility.to(torch.int64), (0, words * 32 - n1))
    shifts = torch.arange(32, device=visibility.device, dtype=torch.int64)
    packed = (padded.view(batch, n1, words, 32) << shifts).sum(-1)
    out.copy_(torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32))


@dataclass(frozen=True)
class RoundOptions:
    """What one round is: ``batch`` requests at ``budget`` over a prefix of ``prefix`` rows, the draft block
    (``block_size``, ``follow_budget``; ``k26.draft.draft_block``) and its top-``topk``, the routing of the
    routed experts (``routing``, ``skew``) and the seed of the drafter's and the target's state."""

    batch: int
    budget: int
    prefix: int
    block_size: int
    follow_budget: bool
    topk: int
    routing: str = "uniform"
    skew: float = 1.0
    seed: int = 0

    @property
    def block(self) -> tuple[int, int]:
        """``(block, K)``: the draft block and the top-K (``k26.draft.draft_block``)."""
        return draft_block(self.budget, self.block_size, self.topk, self.follow_budget)


class RoundRunner:
    """One round of ``options`` (``RoundOptions``) with ``builder`` (module docstring) over ``weights``
    (``k26.target.TargetWeights``, the forward's MoE impl) and a drafter of ``drafter_shape``;
    ``attention`` and ``accept``: our verify-attention and accept kernels; ``target_options``: more of
    ``k26.target.ShardOptions``' fields."""

    def __init__(
        self,
        weights,
        drafter_shape,
        options: RoundOptions,
        *,
        builder: str,
        builder_options: dict | None,
        attention,
        accept,
        target_options: dict | None = None,
    ):
        import cupy as cp  # noqa: PLC0415
        import torch  # noqa: PLC0415

        from ddtree_bench.builders import get_builder  # noqa: PLC0415
        from ddtree_bench.builders.gpu_device import DeviceTreeBuilder  # noqa: PLC0415
        from ddtree_bench.k26.target import ShardOptions, TargetShard  # noqa: PLC0415
        from ddtree_bench.ops.accept import DeviceAccept  # noqa: PLC0415

        if builder not in ROUND_BUILDERS:
            raise ValueError(f"round: unknown builder {builder!r}; expected one of {list(ROUND_BUILDERS)}")
        self.torch, self.cp = torch, cp
        self.options = options
        self.builder, self.batch, self.budget = builder, options.batch, options.budget
        self.drafter = _drafter(weights.shape, drafter_shape, options)
        self._tree_buffer(weights.device)
        self.target = TargetShard(
            weights,
            batch=options.batch,
            budget=options.budget,
            prefix=options.prefix,
            attention=attention,
            mask_bits=self.mask_bits,
            options=ShardOptions(routing=options.routing, skew=options.skew, **(target_options or {})),
        )
        self.target_tokens = torch.zeros(
            (self.batch, self.budget + 1), dtype=torch.int64, device=weights.device
        )
        # CuPy views of the torch buffers the kernels read, made here: a conversion inside a capture would
        # synchronise with a stream outside it (the array interface's stream semantics) and break the graph
        self.d_lp = cp.from_dlpack(self.drafter.top_log_probs)
        self.d_ids = cp.from_dlpack(self.drafter.top_token_ids)
        self.d_target = cp.from_dlpack(self.target_tokens)
        self.accept_out = DeviceAccept(self.batch, self.budget)
        self.accept = accept
        if builder in FUSED_BUILDERS:
            self.device_builder = DeviceTreeBuilder(**(builder_options or {}))
        else:
            self.host_builder = get_builder(builder, **(builder_options or {}))
            self._host_buffers()
        self.graphs = {}
        self.note = (
            "one CUDA graph" if builder in FUSED_BUILDERS else "split: draft graph, host build, verify graph"
        )

    def _tree_buffer(self, device) -> None:
        """The trees' device region as one torch buffer, its CuPy ``DeviceTrees`` and the views the verify
        reads (``mask_bits``, ``visibility``)."""
        from ddtree_bench.builders.gpu import DeviceTrees  # noqa: PLC0415
        from ddtree_bench.builders.gpu_device import torch_as_cupy, torch_view  # noqa: PLC0415

        torch, batch, budget = self.torch, self.batch, self.budget
        self.buffer = torch.zeros(DeviceTrees.required_bytes(batch, budget), dtype=torch.uint8, device=device)
        self.trees = DeviceTrees(batch, budget, buffer=torch_as_cupy(self.buffer, "trees"))
        views = {
            name: torch_view(torch, self.buffer, self.trees.offsets, name) for name in self.trees.offsets
        }
        self.mask_bits = views["visibility_bits"].view(torch.int32)
        self.visibility = views["visibility"]

    # ------------------------------------------------------------------------------------------- pieces
    def _stream(self):
        return self.cp.cuda.ExternalStream(self.torch.cuda.current_stream().cuda_stream)

    def draft(self):
        return self.drafter.run()

    def build_on_device(self):
        self.device_builder(
            self.d_lp, self.d_ids, self.budget, packed_only=True, out=self.trees, stream=self._stream()
        )

    def verify(self, pack: bool):
        """(The mask packed from the bool visibility,) the verify forward, the target's tokens, the accept."""
        torch = self.torch
        if pack:
            pack_bits(torch, self.visibility, self.mask_bits)
        logits = self.target.forward()
        self.target_tokens.copy_(torch.argmax(logits, dim=-1).view(self.batch, self.budget + 1))
        self.accept.launch(self.d_target, self.trees, self.accept_out, stream=self._stream())

    def fused(self):
        self.draft()
        self.build_on_device()
        self.verify(pack=False)

    # ------------------------------------------------------------------------------------------- host build
    def _host_buffers(self):
        """Pinned host buffers of the top-K and of the tree region (native builders), allocated once."""
        torch = self.torch
        lp, ids = self.drafter.top_log_probs, self.drafter.top_token_ids
        pin = self.builder in PINNED_COPY_BUILDERS
        self.h_lp = torch.empty(lp.shape, dtype=lp.dtype, pin_memory=pin)
        self.h_ids = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=pin)
        if pin:
            from ddtree_bench.builders.gpu import device_views  # noqa: PLC0415
            from ddtree_bench.timing.gpu import pinned  # noqa: PLC0415
            from ddtree_bench.tree import TreeBatch  # noqa: PLC0415

            self.h_region = pinned(self.trees.tree_bytes)
            self.h_trees = TreeBatch(**device_views(self.h_region, self.trees.tree_offsets))
        elif self.builder == catalog.SGLANG:
            self.sglang = sglang_call(self.host_builder)

    def build_on_host(self):
        """The top-K to the host, the build there, the tree back to the device; returns when the tree is on
        the device (the split round's critical path between its two graphs)."""
        torch, budget = self.torch, self.budget
        lp, ids = self.drafter.top_log_probs, self.drafter.top_token_ids
        stream = torch.cuda.current_stream()
        if self.builder in PINNED_COPY_BUILDERS:
            self.h_lp.copy_(lp, non_blocking=True)
            self.h_ids.copy_(ids, non_blocking=True)
            stream.synchronize()  # the CPU builds from it
            self.host_builder.build(self.h_lp.numpy(), self.h_ids.numpy(), budget, out=self.h_trees)
            self.trees.tree_region().set(self.h_region, stream=self._stream())
            stream.synchronize()
            return
        h_lp, h_ids = lp.to("cpu"), ids.to("cpu")  # pageable, as SGLang's worker copies
        fields = self._torch_host_trees(h_lp, h_ids)
        for name, tensor in fields.items():
            self._field_view(name).copy_(tensor.to("cuda"))
        stream.synchronize()

    def _field_view(self, name):
        from ddtree_bench.builders.gpu_device import torch_view  # noqa: PLC0415

        return torch_view(self.torch, self.buffer, self.trees.offsets, name)

    def _torch_host_trees(self, h_lp, h_ids) -> dict:
        extra = self.sglang if self.builder == catalog.SGLANG else None
        return host_trees(self.torch, self.builder, self.host_builder, h_lp, h_ids, self.budget, extra)

    # ------------------------------------------------------------------------------------------- rounds
    def capture(self):
        """Warm up and capture this round's graphs (fused: one; split: draft and verify)."""
        from ddtree_bench.k26.target import capture  # noqa: PLC0415

        if self.builder in FUSED_BUILDERS:
            self.graphs["draft"], _ = capture(self.draft)
            self.graphs["build"], _ = capture(self.build_on_device)
            self.graphs["verify"], _ = capture(lambda: self.verify(pack=False))
            try:
                self.graphs["round"], _ = capture(self.fused)
            except Exception as exc:  # noqa: BLE001 (said in the note: the parts' graphs back to back instead)
                self.torch.cuda.synchronize()
                reason = " ".join(str(exc).split())[:200]
                self.note = (
                    f"draft, build and verify graphs back to back, no host sync (one graph failed: {reason})"
                )
        else:
            self.graphs["draft"], _ = capture(self.draft)
            self.draft()
            self.build_on_host()
            self.graphs["verify"], _ = capture(lambda: self.verify(pack=True))

    def run_round(self):
        """One whole round; returns when its accept is done (host-inclusive)."""
        if self.builder in FUSED_BUILDERS and "round" not in self.graphs:
            for name in ("draft", "build", "verify"):
                self.graphs[name].replay()
        elif self.builder in FUSED_BUILDERS:
            self.graphs["round"].replay()
        else:
            self.graphs["draft"].replay()
            self.build_on_host()
            self.graphs["verify"].replay()
        self.torch.cuda.current_stream().synchronize()

    def parts(self) -> dict:
        """The round's parts as separately callable pieces: ``{"draft", "build", "verify"}``; the host build
        of a CPU builder returns when its tree is on the device."""
        if self.builder in FUSED_BUILDERS:
            return {name: self.graphs[name].replay for name in ("draft", "build", "verify")}
        return {
            "draft": self.graphs["draft"].replay,
            "build": self.build_on_host,
            "verify": self.graphs["verify"].replay,
        }

    def check_accept(self) -> bool:
        """The last round's accepted paths, lengths and bonus tokens equal the CPU walk on its trees and
        target tokens."""
        from ddtree_bench.ops.accept import accept_cpu  # noqa: PLC0415

        self.torch.cuda.synchronize()
        trees = self.trees.to_host()
        target = self.target_tokens.cpu().numpy()
        want = accept_cpu(trees, target)
        got = self.accept_out.to_host()
        return all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, want, strict=True))


#: The tree fields a split round copies back to the device (the visibility, SGLang's links, the tokens and
#: depths SGLang's worker moves, and the parents and counts our accept kernel reads).
_COPIED = (
    "visibility",
    "retrieve_next_token",
    "retrieve_next_sibling",
    "node_token_ids",
    "node_depths",
    "parents",
    "node_count",
)


def host_trees(torch, name: str, builder, h_lp, h_ids, budget: int, sglang=None) -> dict:
    """The split round's host build for ``sglang`` or ``reference`` from CPU tensors ``h_lp``/``h_ids``
    [B, L, K]: ``{field: CPU tensor of the whole batch}`` for the fields it copies back (``_COPIED``), padded
    to N + 1 as SGLang pads. ``sglang``: ``(function, pad_function, extra)`` of SGLang's builder, called per
    request as its worker does."""
    n1 = budget + 1
    if name == catalog.REFERENCE:
        trees = builder.build(h_lp.numpy(), h_ids.numpy(), budget)
        return {field: torch.from_numpy(np.ascontiguousarray(getattr(trees, field))) for field in _COPIED}
    function, pad_function, extra = sglang
    per = {field: [] for field in _COPIED}
    for b in range(h_lp.shape[0]):  # the per-request loop SGLang's worker runs
        tokens, depths, parents, _maps, vis, nt, ns = function(h_lp[b], h_ids[b], budget, **extra)
        vis, nt, ns = pad_function(vis, nt, ns, n1) if pad_function else _pad(torch, vis, nt, ns, n1)
        n = int(torch.as_tensor(tokens).numel())
        padded_tokens = torch.full((budget,), -1, dtype=torch.int64)
        padded_tokens[:n] = torch.as_tensor(tokens).reshape(-1)
        padded_depths = torch.zeros((budget,), dtype=torch.int64)
        padded_depths[:n] = torch.as_tensor(depths).reshape(-1)
        padded_parents = torch.full((n1,), -1, dtype=torch.int32)
        padded_parents[: n + 1] = torch.as_tensor(list(parents), dtype=torch.int32)
        values = (
            vis,
            nt,
            ns,
            padded_tokens,
            padded_depths,
            padded_parents,
            torch.tensor(n, dtype=torch.int32),
        )
        for field, value in zip(_COPIED, values, strict=True):
            per[field].append(torch.as_tensor(value))
    return {field: torch.stack(values) for field, values in per.items()}


def _drafter(shape, drafter_shape, options: RoundOptions):
    """The round's drafter: its block and top-K (at most the vocab shard) over the target's vocab shard."""
    block, k = options.block
    return DraftShard(
        drafter_shape,
        batch=options.batch,
        block=block,
        context=options.prefix,
        k=min(k, shape.vocab_shard),
        vocab_shard=shape.vocab_shard,
        seed=options.seed,
    )


def _pad(torch, vis, nt, ns, n1):
    m = int(vis.shape[0])
    padded = torch.zeros((n1, n1), dtype=torch.bool)
    padded[:m, :m] = torch.as_tensor(vis)
    next_token = torch.full((n1,), -1, dtype=torch.int64)
    next_token[:m] = torch.as_tensor(nt)
    next_sibling = torch.full((n1,), -1, dtype=torch.int64)
    next_sibling[:m] = torch.as_tensor(ns)
    return padded, next_token, next_sibling
