"""Tree accept: the greedy verify walk over a batch of draft trees, on the CPU and on the GPU.

Semantics are SGLang's ``follow_verified_tree(child_maps, posterior)``: ``child_maps[p]`` maps each child's
token to its index, built in node-index order (``child_maps[parent][token] = index``), so when two children
of one parent carry the same token the later one wins. From the root (index 0), with ``t = posterior[cur]``,
move to ``child_maps[cur][t]`` while it exists; the accepted indices are the root and every node moved to,
and the bonus token is ``t`` at the node where the walk stopped.

Outputs, for a batch of ``B`` trees of budget ``N``:

====================  ==========  ========  ===========================================
output                shape       dtype     meaning
====================  ==========  ========  ===========================================
accepted_indices      [B, N+1]    int32     the accepted path, root (0) first, then -1
accept_length         [B]         int32     accepted nodes including the root (1...N+1)
bonus_token           [B]         int64     the target's token where the walk stopped
====================  ==========  ========  ===========================================

``accept_cpu`` walks child maps built from the TreeBatch's parents and node tokens (SGLang's way).
``GpuAccept`` runs ``kernels/tree_accept/tree_accept.cu`` on the trees' ``node_count``, ``node_token_ids`` and
``parents`` (``TREE_LINK_FIELDS``): one thread block per request computes, for every node at once, the child
the walk would move to (the largest-index child whose token is the node's target token: a shared-memory
``atomicMax``), then one thread follows those links from the root. The target row and the links are staged
in shared memory for budgets up to ``STAGE_MAX_BUDGET``; larger budgets (or ``force_global``) run the same
algorithm on global memory. ``launch`` works on device arrays into preallocated ``DeviceAccept`` outputs (no
allocation, no host sync: CUDA-graph capturable), ``accept`` is a host-inclusive convenience. Every shape
problem is a one-line ``ValueError`` before launch. The kernel tolerates malformed trees (a parent outside
``0..i-1`` never matches, so the walk always ends and stays in bounds); ``accept_cpu`` rejects them.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ddtree_bench.cuda import loader as cuda
from ddtree_bench.cuda.loader import kernel_constant, kernel_source
from ddtree_bench.tree import TreeBatch

KERNEL_SOURCE = kernel_source("tree_accept")
KERNEL_NAME = "ddtree_tree_accept"
# The kernel's own launch figures, read from its source: node loads a thread holds in registers, the
# block-size limit (its __launch_bounds__), and the staged path's shared bytes per node.
NODES_PER_THREAD = kernel_constant(KERNEL_SOURCE, "DDTREE_ACCEPT_NODES_PER_THREAD")
MAX_THREADS = kernel_constant(KERNEL_SOURCE, "DDTREE_ACCEPT_MAX_THREADS")
STAGE_MAX_BUDGET = 4000  # 12 (N + 1) bytes of dynamic shared memory stay under the 48 KB needing no opt-in
STAGE_BYTES_PER_NODE = kernel_constant(KERNEL_SOURCE, "DDTREE_ACCEPT_SHARED_BYTES_PER_NODE")
MAX_BATCH = 2**31 - 1
MAX_BUDGET = 2**30  # the kernel's int indices: N + 1 plus a block's stride must fit
# the TreeBatch fields the kernel reads, with the dtypes it reads them as
TREE_LINK_FIELDS = ("node_count", "node_token_ids", "parents")
TREE_FIELD_DTYPES = {"node_count": np.int32, "node_token_ids": np.int64, "parents": np.int32}
AcceptResult = tuple[np.ndarray, np.ndarray, np.ndarray]  # accepted_indices, accept_length, bonus_token


class AcceptUnavailable(RuntimeError):
    """The GPU accept cannot run on this machine (the message says why)."""


# ---------------------------------------------------------------------------------------------------------
# validation (shape and dtype only: works on numpy and CuPy arrays alike, before anything touches a device)


def check_batch_budget(batch, budget) -> tuple[int, int]:
    """``(batch, budget)`` as ints; ValueError for a non-integer, negative or too large value."""
    for name, value, limit in (("batch", batch, MAX_BATCH), ("budget", budget, MAX_BUDGET)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"tree accept: {name} must be an integer, got {value!r}")
        if value < 0:
            raise ValueError(f"tree accept: {name} must be >= 0, got {value}")
        if value > limit:
            raise ValueError(f"tree accept: {name} {value} exceeds the kernel's limit {limit}")
    return int(batch), int(budget)


def _shape(array, name: str) -> tuple[int, ...]:
    shape = getattr(array, "shape", None)
    if shape is None:
        raise ValueError(f"tree accept: {name} must be an array, got {type(array).__name__}")
    return tuple(int(s) for s in shape)


def check_tree_links(trees) -> tuple[int, int]:
    """``(batch, budget)`` of a tree batch (a TreeBatch, a DeviceTrees or anything with the fields the
    kernel reads): ``node_token_ids [B, N]``, ``node_count [B]`` and ``parents [B, N+1]``."""
    for name in TREE_LINK_FIELDS:
        if not hasattr(trees, name):
            raise ValueError(f"tree accept: the trees lack field {name}")
    shape = _shape(trees.node_token_ids, "node_token_ids")
    if len(shape) != 2:
        raise ValueError(f"tree accept: node_token_ids must be 2-D [B, N], got shape {shape}")
    batch, budget = check_batch_budget(*shape)
    expected = {"node_count": (batch,), "parents": (batch, budget + 1)}
    for name, want in expected.items():
        got = _shape(getattr(trees, name), name)
        if got != want:
            raise ValueError(
                f"tree accept: trees field {name} has shape {got}, expected {want} "
                f"(B = {batch}, N + 1 = {budget + 1})"
            )
    return batch, budget


def check_target_shape(target_tokens, batch: int, budget: int) -> None:
    """``target_tokens`` must be ``[B, N+1]`` for the trees' ``B`` and ``N``."""
    shape = _shape(target_tokens, "target_tokens")
    if len(shape) != 2:
        raise ValueError(f"tree accept: target_tokens must be 2-D [B, N+1], got shape {shape}")
    if shape[0] != batch:
        raise ValueError(f"tree accept: target_tokens has batch {shape[0]} but the trees have B = {batch}")
    if shape[1] != budget + 1:
        raise ValueError(
            f"tree accept: target_tokens has {shape[1]} columns but the trees need N + 1 = {budget + 1}"
        )


def _check_integer(array, name: str) -> None:
    dtype = np.dtype(array.dtype)
    if not np.issubdtype(dtype, np.integer):
        raise ValueError(f"tree accept: {name} must hold integer token ids, got dtype {dtype}")


def check_host_inputs(trees: TreeBatch, target_tokens, *, need_parents: bool) -> tuple[int, int]:
    """Shapes and dtypes of a host TreeBatch and its target tokens; with ``need_parents`` also the values of
    the node counts and parents (``0 <= parents[b, i] < i`` for every real node ``i``) the CPU walk needs
    (the GPU kernel tolerates malformed values: it never follows a bad parent)."""
    batch, budget = check_tree_links(trees)
    check_target_shape(target_tokens, batch, budget)
    _check_integer(target_tokens, "target_tokens")
    for name in TREE_LINK_FIELDS:
        _check_integer(getattr(trees, name), name)
    if not need_parents:
        return batch, budget
    counts = np.asarray(trees.node_count)
    parents = np.asarray(trees.parents)
    if batch and (counts.min() < 0 or counts.max() > budget):
        b = int(np.argmax((counts < 0) | (counts > budget)))
        raise ValueError(f"tree accept: request {b} has node_count {int(counts[b])} outside 0..{budget}")
    index = np.arange(budget + 1)
    real = (index[None, :] >= 1) & (index[None, :] <= counts[:, None])
    bad = real & ((parents < 0) | (parents >= index[None, :]))
    if bad.any():
        b, i = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(
            f"tree accept: request {b} node {i} has parent {int(parents[b, i])} (must be in 0..{i - 1})"
        )
    return batch, budget


# ---------------------------------------------------------------------------------------------------------
# CPU: SGLang's child maps and follow_verified_tree


def child_maps(parents, node_token_ids, node_count: int) -> list[dict[int, int]]:
    """SGLang's per-node ``{token: child index}`` maps of one tree (nodes inserted in index order, so a
    repeated token among siblings maps to the later child)."""
    maps: list[dict[int, int]] = [{} for _ in range(node_count + 1)]
    for index in range(1, node_count + 1):
        maps[int(parents[index])][int(node_token_ids[index - 1])] = index
    return maps


def follow_verified_tree(maps: list[dict[int, int]], posterior_tokens) -> tuple[list[int], int]:
    """SGLang's walk: ``(accepted indices, bonus token)``."""
    accepted = [0]
    current = 0
    next_token = int(posterior_tokens[current])
    while next_token in maps[current]:
        current = maps[current][next_token]
        accepted.append(current)
        next_token = int(posterior_tokens[current])
    return accepted, next_token


def accept_cpu(trees: TreeBatch, target_tokens: np.ndarray) -> AcceptResult:
    """``(accepted_indices [B, N+1] int32 padded -1, accept_length [B] int32, bonus_token [B] int64)``:
    per request, SGLang's child maps from the parents and node tokens, followed by its greedy walk."""
    batch, budget = check_host_inputs(trees, target_tokens, need_parents=True)
    target = np.asarray(target_tokens).astype(np.int64, copy=False)
    accepted_indices = np.full((batch, budget + 1), -1, np.int32)
    accept_length = np.zeros(batch, np.int32)
    bonus_token = np.zeros(batch, np.int64)
    for b in range(batch):
        n = int(trees.node_count[b])
        maps = child_maps(trees.parents[b].tolist(), trees.node_token_ids[b].tolist(), n)
        path, bonus = follow_verified_tree(maps, target[b, : n + 1].tolist())
        accepted_indices[b, : len(path)] = path
        accept_length[b] = len(path)
        bonus_token[b] = bonus
    return accepted_indices, accept_length, bonus_token


# ---------------------------------------------------------------------------------------------------------
# GPU


def host_field(trees, name: str) -> np.ndarray:
    """A tree field as the C-contiguous host array of the dtype the kernel reads (``TREE_FIELD_DTYPES``);
    ValueError when a value does not fit that dtype."""
    array = np.asarray(getattr(trees, name))
    dtype = np.dtype(TREE_FIELD_DTYPES[name])
    if array.dtype != dtype and array.size:
        info = np.iinfo(dtype)
        low, high = array.min(), array.max()
        if low < info.min or high > info.max:
            raise ValueError(f"tree accept: trees field {name} has values outside {dtype} ({low}..{high})")
    return np.ascontiguousarray(array.astype(dtype, copy=False))


class DeviceAccept:
    """Preallocated device outputs of one (batch, budget): ``accepted_indices [B, N+1] int32``,
    ``accept_length [B] int32``, ``bonus_token [B] int64`` (the kernel writes every element)."""

    def __init__(self, batch: int, budget: int):
        batch, budget = check_batch_budget(batch, budget)  # before CuPy: a bad shape is a ValueError anywhere
        import cupy as cp  # noqa: PLC0415

        self.batch, self.budget = batch, budget
        self.accepted_indices = cp.empty((batch, budget + 1), cp.int32)
        self.accept_length = cp.empty(batch, cp.int32)
        self.bonus_token = cp.empty(batch, cp.int64)

    def to_host(self) -> AcceptResult:
        return self.accepted_indices.get(), self.accept_length.get(), self.bonus_token.get()


def check_device_arrays(d_target, d_trees, out) -> tuple[int, int]:
    """Shapes, dtypes (int64 target tokens, ``TREE_FIELD_DTYPES`` for the tree fields, int32/int32/int64
    outputs) and C-contiguity of a launch's arrays."""
    batch, budget = check_tree_links(d_trees)
    check_target_shape(d_target, batch, budget)
    n1 = budget + 1
    arrays = [("target_tokens", d_target, np.int64, None)]
    arrays += [(name, getattr(d_trees, name), TREE_FIELD_DTYPES[name], None) for name in TREE_LINK_FIELDS]
    arrays += [
        ("accepted_indices", getattr(out, "accepted_indices", None), np.int32, (batch, n1)),
        ("accept_length", getattr(out, "accept_length", None), np.int32, (batch,)),
        ("bonus_token", getattr(out, "bonus_token", None), np.int64, (batch,)),
    ]
    for name, array, dtype, shape in arrays:
        got = _shape(array, name)
        if shape is not None and got != shape:
            raise ValueError(
                f"tree accept: output {name} has shape {got}, expected {shape} for the trees' "
                f"B = {batch}, N = {budget}"
            )
        if np.dtype(array.dtype) != np.dtype(dtype):
            raise ValueError(f"tree accept: {name} must be {np.dtype(dtype)}, got {np.dtype(array.dtype)}")
        if not array.flags.c_contiguous:
            raise ValueError(f"tree accept: {name} must be C-contiguous")
    return batch, budget


def threads_per_block(budget: int) -> int:
    """Threads of one request's block: enough that every node is one of a thread's ``NODES_PER_THREAD``
    register slots (all of a request's loads then leave before the first barrier), in whole warps, 32 to
    ``MAX_THREADS`` (256 at N = 1024; one warp, so nearly free barriers, up to N = 128)."""
    slots = -(-budget // NODES_PER_THREAD)
    return min(MAX_THREADS, max(32, -(-slots // 32) * 32))


def stage_shared_bytes(budget: int) -> int:
    """Dynamic shared memory of the staged path: the target row (int64) and the links (int32), N + 1 each."""
    return STAGE_BYTES_PER_NODE * (budget + 1)


def launch_config(batch: int, budget: int, force_global: bool = False) -> tuple[tuple[int], tuple[int], int]:
    """``(grid, block, shared_mem)`` of a launch: one block per request; dynamic shared memory for the
    staged path when ``budget <= STAGE_MAX_BUDGET`` (else, or with ``force_global``, 0: the kernel then
    runs on global memory)."""
    staged = budget <= STAGE_MAX_BUDGET and not force_global
    return (batch,), (threads_per_block(budget),), stage_shared_bytes(budget) if staged else 0


class GpuAccept:
    """The CUDA tree accept (``kernels/tree_accept/tree_accept.cu``), loaded from ``fatbin`` or the cached
    build. ``force_global``: run the global-memory path at every budget (tests, measurements)."""

    def __init__(self, fatbin: str | Path | None = None, archs=None, force_global: bool = False):
        self._fatbin = Path(fatbin) if fatbin else None
        self._archs = tuple(archs) if archs else None
        self.force_global = bool(force_global)
        self._kernel = None
        self.fatbin: Path | None = None

    def unavailable_reason(self) -> str | None:
        from ddtree_bench.cuda.loader import gpu_unavailable_reason  # noqa: PLC0415

        return gpu_unavailable_reason()

    def _require(self) -> None:
        reason = self.unavailable_reason()
        if reason:
            raise AcceptUnavailable(f"gpu tree accept unavailable: {reason}")

    @property
    def kernel(self):
        if self._kernel is None:
            self._require()
            import cupy  # noqa: PLC0415

            fatbin = self._fatbin or cuda.cached_fatbin(KERNEL_SOURCE, self._archs or cuda.DEFAULT_ARCHS)
            self._kernel = cupy.RawModule(path=str(fatbin)).get_function(KERNEL_NAME)
            self.fatbin = Path(fatbin)
        return self._kernel

    def launch_config(self, batch: int, budget: int) -> tuple[tuple[int], tuple[int], int]:
        """``(grid, block, shared_mem)`` of this accept's launch (module-level ``launch_config``)."""
        return launch_config(batch, budget, self.force_global)

    def launch(self, d_target, d_trees, out: DeviceAccept, stream=None) -> None:
        """Enqueue the accept of the whole batch on ``stream`` (no allocation, no host sync).

        ``d_target``: device int64 ``[B, N+1]``; ``d_trees``: a ``DeviceTrees`` (or anything with device
        ``node_count`` int32 ``[B]``, ``node_token_ids`` int64 ``[B, N]`` and ``parents`` int32 ``[B, N+1]``);
        ``out``: a ``DeviceAccept`` of the same ``(B, N)``. Every shape, dtype and layout is checked first
        (ValueError)."""
        batch, budget = check_device_arrays(d_target, d_trees, out)
        self._require()
        import cupy as cp  # noqa: PLC0415

        arrays = [d_target, *(getattr(d_trees, name) for name in TREE_LINK_FIELDS)]
        arrays += [out.accepted_indices, out.accept_length, out.bonus_token]
        if not all(isinstance(a, cp.ndarray) for a in arrays):
            raise ValueError("tree accept: launch takes CuPy device arrays (use accept() for host arrays)")
        if batch == 0:
            return
        kernel = self.kernel
        stream = stream or cp.cuda.get_current_stream()
        grid, block, shared_mem = self.launch_config(batch, budget)
        args = (
            d_target,
            d_trees.node_token_ids,
            d_trees.parents,
            d_trees.node_count,
            np.int32(batch),
            np.int32(budget),
            out.accepted_indices,
            out.accept_length,
            out.bonus_token,
        )
        kernel(grid, block, args, stream=stream, shared_mem=shared_mem)

    def accept(self, trees: TreeBatch, target_tokens: np.ndarray) -> AcceptResult:
        """Host in, host out (copies in, one launch, copies out): the same triple as ``accept_cpu``."""
        batch, budget = check_host_inputs(trees, target_tokens, need_parents=False)
        host = {name: host_field(trees, name) for name in TREE_LINK_FIELDS}
        self._require()
        import cupy as cp  # noqa: PLC0415

        d_target = cp.asarray(np.ascontiguousarray(np.asarray(target_tokens).astype(np.int64, copy=False)))
        d_trees = SimpleNamespace(**{name: cp.asarray(array) for name, array in host.items()})
        out = DeviceAccept(batch, budget)
        self.launch(d_target, d_trees, out)
        return out.to_host()
