"""Tree-verify attention for absorbed MLA (Kimi K2.6 / DeepSeek-V3 shapes):
``kernels/verify_attn/verify_attn.cu``.

One layer, a whole batch, per GPU under tensor parallel 8 (8 query heads; any head count works):

==============  ========================  ========  ====================================================
array           shape                     dtype     meaning
==============  ========================  ========  ====================================================
q               [B, N+1, H, 576]          bfloat16  512 latent + 64 rope dims per (tree token, head)
kv              [B, T, 576]               bfloat16  latent cache: prefix rows 0..S_b-1, then the tree's
                                                    N+1 tokens (node i at row S_b + i); V = dims 0..511;
                                                    rows from S_b + N + 1 on are padding, never read
prefix_lengths  [B]                       int       S_b >= 0 with S_b + N + 1 <= T (host array)
mask_bits       [B, N+1, ceil((N+1)/32)]  uint32    the tree builder's packed visibility
out             [B, N+1, H, 512]          bfloat16
==============  ========================  ========  ====================================================

Every query sees the whole prefix plus its tree ancestors and itself; softmax scale ``1/sqrt(192)``; fp32
accumulation with an online softmax. ``q``, ``kv`` and ``out`` are PyTorch CUDA tensors (the only bf16 type
at hand; the kernel reads them through DLPack without a copy); ``mask_bits`` a CuPy or PyTorch array.

``VerifyAttention.prepare`` checks every shape, dtype, layout and length (one-line ``ValueError`` before
anything touches the device), uploads the prefix lengths and allocates the split workspace; the returned
``PreparedAttention.launch`` only enqueues the kernel(s): no allocation, no host sync, CUDA-graph capturable.
``reference_attention`` is the float32 reference (PyTorch, per request).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ddtree_bench.cuda import loader as cuda
from ddtree_bench.cuda.loader import kernel_source
from ddtree_bench.cuda.tensor_map import encode_tiled_2d

KERNEL_SOURCE = kernel_source("verify_attn")
HEAD_DIM = 576  # q/k: kv_lora_rank 512 + qk_rope_head_dim 64
VALUE_DIM = 512  # v: the latent part
SOFTMAX_SCALE = 1.0 / math.sqrt(192.0)  # qk_nope_head_dim 128 + qk_rope_head_dim 64
ROWS_PER_BLOCK = 64
#: The Hopper path's ``ddtree_verify_attn_wgmma72`` tiles a request's query rows by 72 (its info kernel
#: reports 72): at 8 heads (8 (N + 1) rows, a multiple of 64 plus 8 for every budget N = 8 j) ceil(M / 72)
#: blocks instead of 64-row tiles' ceil(M / 64), whose last block computes a whole tile for 8 rows.
WIDE_ROWS_PER_BLOCK = 72
KEYS_PER_TILE = 32  # the mma.sync kernel's key tile; the wgmma kernel reports its own (64)
#: ``ddtree_verify_attn_small``: the mma.sync kernel with 32-row tiles of 16 keys (87 KB of shared memory a
#: block instead of 192 KB), taken where a GPU allows less than the latter (sm_120 parts: 99 KB), or forced
#: with ``path="mma-small"``. Its info kernel reports both sizes.
SMALL_ROWS_PER_BLOCK, SMALL_KEYS_PER_TILE = 32, 16
THREADS = 256
MIN_KEYS_PER_SPLIT = 128
#: A block's fixed cost (loading its Q tile, filling the key-tile pipeline, writing its output, its share of
#: the split combine) in units of one of its key tiles' time, per kernel path: planning estimates, used only
#: to choose the number of splits. Fitted on the H200: the mma.sync kernel 4 tiles of 32 keys; the wgmma
#: kernel 8 tiles of 64 keys (batch 1, N = 8: 4 to 129 splits of S = 8192 and 32768 matched within 10 %).
BLOCK_OVERHEAD_TILES = {"mma": 4, "wgmma": 8}
#: The small mma.sync tiles: the same fixed time as the 64 x 32 tiles' 4 in tiles of half the keys (not
#: fitted: the GPUs it is for were not measured)
SMALL_OVERHEAD_TILES = 8
#: The same for the 72-row tiles, in 64-row tiles of 64 keys (a 72-row block's tiles count 72 / 64 of one):
#: fitted on the H200 to batch 1 and 8, S = 4096 to 32768 at budget 8, where its estimate against the
#: 64-row tiles' picks the faster of the two (11.5 to 15 does).
WIDE_OVERHEAD_TILES = 14
MAX_ROWS = 2**31 - 1
#: Cluster sizes of the 72-row kernel's on-chip split merge (``ddtree_verify_attn_wgmma72_cluster2``): a
#: plan of 72-row tiles and 2 splits runs as clusters of 2, its output merged in shared memory (no partial
#: rows, no combine). Clusters of 4 and 8 (probed) did not fit 128 such blocks in one wave on the H200.
SPLIT_CLUSTER_SIZES = (2,)
#: The fewest splits a plan merges in the attention kernel (``AttentionPlan.merged_in_kernel``) rather than
#: with the combine launch. On the H200 (scratch probe of 2026-12-01, same inputs, CUDA events, combine ->
#: in the kernel): 65 splits (batch 1, budget 8) 36.8 -> 33.4 µs at S = 32768 and 25.2 -> 23.3 at S = 16384;
#: but 14 and 22 splits (batch 1, budget 64 and 8, S = 4096) 26.9 -> 28.2 and 18.7 -> 21.8, 16 splits (batch
#: 8, S = 32768) 120.4 -> 121.5; 4 and 8 splits 0.7-2.7 µs faster. The merge's work per block does not grow
#: with the splits, the combine's does. Probe of 2026-12-02 (drafter trees, 31 calls each): 43 splits (batch
#: 1, budget 16) 45.9 -> 49.6 µs at S = 32768 and 30.8 -> 34.9 at S = 16384, 65 splits 37.0 -> 34.1: the
#: threshold is 64, not 32.
MERGE_MIN_SPLITS = 64
#: Where a 64-row plan on the wgmma path runs the seesaw kernel rather than ``ddtree_verify_attn_wgmma``: a
#: request of at least this many row tiles (8 heads: budget 64 and up) and splits of at least this many key
#: tiles. Measured on the H200 (step grid, drafter trees, 8 heads): the seesaw kernel was faster at every
#: such shape (e.g. 1.35x at batch 64, budget 1024, S = 4096), the other kernel at every 64-row plan below
#: either (e.g. 36.6 against 50.3 µs at batch 8, budget 8, S = 4096: 9 tiles a split; 50.0 against 60.9 at
#: batch 1, budget 16, S = 32768: 3 row tiles). The seesaw kernel's fixed cost a block (mbarriers, both
#: first tiles, a tail of pairs) is larger.
SEESAW_MIN_ROW_TILES, SEESAW_MIN_TILES = 9, 10
#: The seesaw kernel's estimate against the 72-row tiles': a 64-row plan it runs counts this fraction of
#: the estimate ``plan_attention`` gives it (its key tiles go faster than the other kernels'). Measured on
#: the H200 (probe, same inputs, seesaw against 72-row tiles): 585 against 606 µs at batch 8, budget 64,
#: S = 32768; 4.77 against 4.98 ms at batch 64, budget 64; 31.3 against 36.6 ms at batch 64, budget 512;
#: 7.77 against 9.37 ms at batch 8, budget 1024 (S = 32768) but 122 against 112 µs at batch 8, budget 64,
#: S = 4096 and 270 against 189 µs at batch 8, budget 128 (a second wave): the fractions that pick the
#: faster at each of these lie between 0.853 and 0.908.
SEESAW_COST = 0.88
#: Clusters of a request's row tiles in which the seesaw kernel's blocks share every key tile by TMA
#: multicast (``ddtree_verify_attn_seesaw_multicastN``): requests of 2 to 5 row tiles of 64 (8 heads:
#: budgets 8 to 39), all of a request's row tiles in one cluster.
ROW_CLUSTER_SIZES = (2, 3, 4, 5)


class AttentionUnavailable(RuntimeError):
    """The GPU verify attention cannot run on this machine (the message says why)."""


def attention_flops(visible_keys, heads: int) -> float:
    """FLOPs of one call: ``2 * H * (576 + 512)`` per (query, visible key) pair, summed over queries."""
    return 2.0 * heads * (HEAD_DIM + VALUE_DIM) * float(np.sum(visible_keys, dtype=np.float64))


def visible_keys(prefix_lengths, mask_bits_host) -> np.ndarray:
    """Keys each tree query attends to, ``[B, N+1]``: its request's prefix plus the set bits of its row."""
    bits = np.asarray(mask_bits_host).astype(np.uint32, copy=False)
    per_row = np.unpackbits(bits.view(np.uint8), axis=-1).reshape(bits.shape[:2] + (-1,)).sum(axis=-1)
    return np.asarray(prefix_lengths, np.int64)[:, None] + per_row


def attention_bytes(prefix_lengths, tokens: int, heads: int, mask_words: int) -> float:
    """Bytes one call must move at least once: the keys it reads (prefix + tree, 576 bf16 each), the
    queries, the output and the mask."""
    keys = float(np.sum(np.asarray(prefix_lengths, np.int64) + tokens))
    batch = len(prefix_lengths)
    return (
        keys * HEAD_DIM * 2
        + batch * tokens * heads * (HEAD_DIM + VALUE_DIM) * 2
        + batch * tokens * mask_words * 4
    )


# ---------------------------------------------------------------------------------------------- validation


def _dtype_name(array) -> str:
    name = str(getattr(array, "dtype", "?"))
    return name.removeprefix("torch.")


def _shape(array, name: str) -> tuple[int, ...]:
    shape = getattr(array, "shape", None)
    if shape is None:
        raise ValueError(f"verify attention: {name} must be an array, got {type(array).__name__}")
    return tuple(int(s) for s in shape)


@dataclass(frozen=True)
class AttentionShape:
    batch: int
    tokens: int  # N + 1
    heads: int
    kv_rows: int  # T
    mask_words: int

    @property
    def budget(self) -> int:
        return self.tokens - 1

    @property
    def rows(self) -> int:  # query rows per request
        return self.tokens * self.heads


def check_attention_inputs(q, kv, prefix_lengths, mask_bits, out) -> tuple[AttentionShape, np.ndarray]:
    """Shapes, dtypes and lengths of one call (works on anything with ``shape`` and ``dtype``); returns the
    shape and the prefix lengths as int64. Every problem is a one-line ValueError naming it."""
    qs = _shape(q, "q")
    if len(qs) != 4 or qs[3] != HEAD_DIM:
        raise ValueError(f"verify attention: q must be [B, N+1, H, {HEAD_DIM}], got shape {qs}")
    batch, tokens, heads, _ = qs
    if batch < 1 or tokens < 1 or heads < 1:
        raise ValueError(f"verify attention: q has an empty dimension: shape {qs}")
    ks = _shape(kv, "kv")
    if len(ks) != 3 or ks[2] != HEAD_DIM:
        raise ValueError(f"verify attention: kv must be [B, T, {HEAD_DIM}], got shape {ks}")
    if ks[0] != batch:
        raise ValueError(f"verify attention: kv has batch {ks[0]} but q has B = {batch}")
    kv_rows = ks[1]
    os_ = _shape(out, "out")
    if os_ != (batch, tokens, heads, VALUE_DIM):
        raise ValueError(
            f"verify attention: out must be {(batch, tokens, heads, VALUE_DIM)} for q {qs}, got shape {os_}"
        )
    for name, array in (("q", q), ("kv", kv), ("out", out)):
        if _dtype_name(array) != "bfloat16":
            raise ValueError(f"verify attention: {name} must be bfloat16, got {_dtype_name(array)}")
    words = (tokens + 31) // 32
    ms = _shape(mask_bits, "mask_bits")
    if len(ms) != 3 or ms[0] != batch or ms[1] != tokens or ms[2] < words:
        raise ValueError(
            f"verify attention: mask_bits must be [B, N+1, >= {words}] = [{batch}, {tokens}, {words}] for q "
            f"{qs} (the tree buffers of budget N = {tokens - 1}), got shape {ms}"
        )
    if _dtype_name(mask_bits) not in ("uint32", "int32"):
        raise ValueError(
            f"verify attention: mask_bits must be uint32 packed bits, got {_dtype_name(mask_bits)}"
        )
    lengths = np.asarray(prefix_lengths)
    if lengths.shape != (batch,):
        raise ValueError(f"verify attention: prefix_lengths must have shape ({batch},), got {lengths.shape}")
    if not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(f"verify attention: prefix_lengths must be integers, got dtype {lengths.dtype}")
    lengths = lengths.astype(np.int64)
    if lengths.min() < 0:
        b = int(np.argmin(lengths))
        raise ValueError(f"verify attention: request {b} has a negative prefix length S = {int(lengths[b])}")
    if lengths.max() + tokens > kv_rows:
        b = int(np.argmax(lengths))
        raise ValueError(
            f"verify attention: request {b} needs S + N + 1 = {int(lengths[b]) + tokens} cache rows but kv "
            f"has T = {kv_rows}"
        )
    if tokens * heads > MAX_ROWS or kv_rows > 2**31 - 1:
        raise ValueError(f"verify attention: shape {qs} with T = {kv_rows} exceeds the kernel's int limits")
    return AttentionShape(batch, tokens, heads, kv_rows, ms[2]), lengths


# -------------------------------------------------------------------------------------------------- launch


@dataclass(frozen=True)
class AttentionPlan:
    """Grid of one call: ``row_tiles`` x ``splits`` x ``batch`` blocks of ``THREADS`` threads; each split
    covers ``tiles_per_split`` key tiles of the kernel's size (``keys_per_tile`` in ``plan_attention``)."""

    row_tiles: int
    splits: int
    tiles_per_split: int
    rows_per_block: int = ROWS_PER_BLOCK  # 64, 72 for the 72-row kernel, 32 for the small mma.sync tiles
    cost: float = 0.0  # the estimate the plan minimised: waves x a block's time, in 64-row key tiles
    #: 72-row kernel only: clusters of this many consecutive splits merge their outputs on chip (``splits``
    #: a multiple of it), so the split combine reads ``partials`` rows a query row (none where that is one)
    cluster: int = 1
    #: the splits' partial rows are merged by the attention kernel itself (Hopper kernels; every block of the
    #: grid resident at once), not by a combine launch
    merged_in_kernel: bool = False
    #: 64-row tiles on the wgmma path: run by the seesaw kernel (``ddtree_verify_attn_seesaw``)
    seesaw: bool = False
    #: seesaw only: a request's row tiles (all ``row_tiles`` of them) form one cluster whose blocks share each
    #: key tile by multicast, so that it leaves L2 once a request and split (``ROW_CLUSTER_SIZES``)
    row_cluster: int = 1

    def __post_init__(self):
        if self.seesaw and self.rows_per_block != ROWS_PER_BLOCK:
            raise ValueError(
                f"verify attention plan: the seesaw kernel has {ROWS_PER_BLOCK}-row tiles, "
                f"not {self.rows_per_block}"
            )
        if self.row_cluster != 1 and (
            not self.seesaw
            or self.row_cluster not in ROW_CLUSTER_SIZES
            or self.row_tiles != self.row_cluster
            or self.merged_in_kernel
        ):
            raise ValueError(
                f"verify attention plan: clusters of {self.row_cluster} row tiles need the seesaw kernel, "
                f"a size in {ROW_CLUSTER_SIZES} equal to the row tiles ({self.row_tiles}) and the combine "
                "launch"
            )
        if self.merged_in_kernel and (self.partials < 2 or self.cluster != 1):
            raise ValueError(
                "verify attention plan: the merge in the kernel needs splits > 1 and no clusters "
                f"(got {self.splits} splits, clusters of {self.cluster})"
            )
        if self.cluster != 1 and (
            self.cluster not in SPLIT_CLUSTER_SIZES
            or self.rows_per_block != WIDE_ROWS_PER_BLOCK
            or self.splits % self.cluster
        ):
            raise ValueError(
                f"verify attention plan: clusters of {self.cluster} splits need the "
                f"{WIDE_ROWS_PER_BLOCK}-row kernel, a size in {SPLIT_CLUSTER_SIZES} and splits a multiple "
                f"of it (got {self.rows_per_block} rows, {self.splits} splits)"
            )

    @property
    def partials(self) -> int:
        """Partial outputs a query row leaves in the workspace for the split combine (1: none, no combine)."""
        return self.splits // self.cluster


def plan_attention(
    shape: AttentionShape,
    max_kv_len: int,
    sm_count: int,
    keys_per_tile: int = KEYS_PER_TILE,
    overhead_tiles: float = BLOCK_OVERHEAD_TILES["mma"],
    rows_per_block: int = ROWS_PER_BLOCK,
) -> AttentionPlan:
    """Split a request's keys between blocks (split-KV) only while there are fewer blocks than SMs (one block
    of either path fits an SM: 192-227 KiB of shared memory), each split keeping at least
    ``MIN_KEYS_PER_SPLIT`` keys. The number of splits minimises the estimated time: waves of blocks
    (``ceil(blocks * splits / sm_count)``) times one block's time (its key tiles, each ``rows_per_block / 64``
    of a 64-row tile, plus ``overhead_tiles``), the fewest splits among equals. Filling the SMs with one
    split too many would double the time (a second wave of a few blocks)."""
    row_tiles = -(-shape.rows // rows_per_block)
    tiles = max(1, -(-max_kv_len // keys_per_tile))
    blocks = row_tiles * shape.batch
    tile_cost = rows_per_block / ROWS_PER_BLOCK

    def estimate(used: int, per: int) -> float:
        return -(-blocks * used // sm_count) * (per * tile_cost + overhead_tiles)

    best_cost, splits, tiles_per_split = estimate(1, tiles), 1, tiles
    if blocks < sm_count:
        min_tiles = max(1, MIN_KEYS_PER_SPLIT // keys_per_tile)
        for wanted in range(2, min(max(1, tiles // min_tiles), 4 * sm_count) + 1):
            per = -(-tiles // wanted)
            used = -(-tiles // per)  # no empty split
            cost = estimate(used, per)
            if cost < best_cost:
                best_cost, splits, tiles_per_split = cost, used, per
    return AttentionPlan(
        row_tiles=row_tiles,
        splits=splits,
        tiles_per_split=tiles_per_split,
        rows_per_block=rows_per_block,
        cost=best_cost,
    )


def _as_cupy(array, name: str):
    """A CuPy view of a CuPy array or a contiguous PyTorch CUDA tensor (bf16 seen as int16), no copy."""
    import cupy as cp  # noqa: PLC0415

    if isinstance(array, cp.ndarray):
        if not array.flags.c_contiguous:
            raise ValueError(f"verify attention: {name} must be C-contiguous")
        return array
    if hasattr(array, "is_contiguous") and hasattr(array, "device"):  # torch.Tensor
        if array.device.type != "cuda":
            raise ValueError(f"verify attention: {name} must be on the GPU, got device {array.device}")
        if not array.is_contiguous():
            raise ValueError(f"verify attention: {name} must be contiguous")
        import torch  # noqa: PLC0415

        if array.dtype == torch.bfloat16:
            array = array.view(torch.int16)
        return cp.from_dlpack(array)
    raise ValueError(f"verify attention: {name} must be a CuPy array or a PyTorch CUDA tensor")


ATTENTION_PATHS = ("auto", "wgmma", "mma", "mma-small")


#: splits a combine warp loads at once (``VA_COMBINE_UNROLL`` in kernels/verify_attn/verify_attn.cu)
COMBINE_UNROLL = 4


def combine_rows_per_block(partials: int, most: int) -> int:
    """Rows a block of the combine kernel merges (its 8 warps split between them): one warp a row while a
    warp's share of the splits is one group of loads (``COMBINE_UNROLL``), twice the warps a row each time
    the splits double past that, eight at most; never more rows than the build merges (``most``)."""
    warps = 1
    while warps < 8 and warps * COMBINE_UNROLL < partials:
        warps *= 2
    return max(1, min(most, 8 // warps))


class PreparedAttention:
    """One validated call: device views, the plan and the split workspace. ``launch`` enqueues only."""

    def __init__(self, kernels, shape: AttentionShape, plan: AttentionPlan, views: dict, lengths):
        import cupy as cp  # noqa: PLC0415

        self.kernels, self.shape, self.plan, self.views = kernels, shape, plan, views
        self.prefix_lengths = lengths
        self.d_prefix = cp.asarray(lengths.astype(np.int32))
        if plan.partials > 1:
            rows = plan.partials * shape.batch * shape.rows
            self.partial_out = cp.empty(rows * VALUE_DIM, cp.float32)
            self.partial_lse = cp.empty(rows, cp.float32)
        else:
            self.partial_out = self.partial_lse = None
        # the in-kernel merge's two counters per (request, row tile): zero here, reset by the kernel after use
        self.split_counters = (
            cp.zeros(2 * plan.row_tiles * shape.batch, cp.uint32) if plan.merged_in_kernel else None
        )
        self.workspace_bytes = sum(
            a.nbytes for a in (self.partial_out, self.partial_lse, self.split_counters) if a is not None
        )
        # the seesaw kernel loads key tiles with TMA: kv as [B * T, 576] rows, boxes of 64 keys x 64 dims
        self.kv_map = None
        if plan.seesaw:
            raw = encode_tiled_2d(
                int(views["kv"].data.ptr), shape.batch * shape.kv_rows, HEAD_DIM, kernels.keys_per_tile, 64
            )
            self.kv_map = cp.asarray(np.frombuffer(raw, np.uint8))

    def launch(self, stream=None) -> None:
        import cupy as cp  # noqa: PLC0415

        k, s, p, v = self.kernels, self.shape, self.plan, self.views
        stream = stream or cp.cuda.get_current_stream()
        null = np.uint64(0)
        args = (
            v["q"],
            v["kv"],
            self.d_prefix,
            v["mask_bits"],
            v["out"],
            self.partial_out if self.partial_out is not None else null,
            self.partial_lse if self.partial_lse is not None else null,
            self.split_counters if self.split_counters is not None else null,
            np.int32(s.batch),
            np.int32(s.tokens),
            np.int32(s.heads),
            np.int64(s.kv_rows),
            np.int32(s.mask_words),
            np.int32(p.splits),
            np.int32(p.tiles_per_split),
            np.float32(SOFTMAX_SCALE * math.log2(math.e)),
            self.kv_map if self.kv_map is not None else null,
        )
        if p.rows_per_block == WIDE_ROWS_PER_BLOCK:
            kernel = k.attn_wide if p.cluster == 1 else k.attn_wide_clusters[p.cluster]
            smem = k.wide_smem_bytes
        elif p.row_cluster > 1:
            kernel, smem = k.attn_seesaw_multicast[p.row_cluster], k.seesaw_smem_bytes
        elif p.seesaw:
            kernel, smem = k.attn_seesaw, k.seesaw_smem_bytes
        else:
            kernel, smem = k.attn, k.smem_bytes
        kernel((p.row_tiles, p.splits, s.batch), (THREADS,), args, stream=stream, shared_mem=smem)
        if p.partials > 1 and not p.merged_in_kernel:
            per_block = combine_rows_per_block(p.partials, k.combine_rows)
            k.combine(
                (-(-s.rows // per_block), s.batch),
                (k.combine_threads,),
                (
                    self.partial_out,
                    self.partial_lse,
                    v["out"],
                    np.int32(s.batch),
                    np.int32(s.rows),
                    np.int32(p.partials),
                    np.int32(per_block),
                ),
                stream=stream,
            )


@dataclass
class AttentionKernels:
    attn: object
    combine: object
    combine_threads: int
    smem_bytes: int
    sm_count: int
    keys_per_tile: int  # the split plan's unit
    overhead_tiles: int  # the split plan's estimate of a block's fixed cost, in key tiles
    runs: str  # which code runs, e.g. "sm_90a SASS, wgmma path"
    fatbin: Path
    path: str  # "wgmma" (Hopper warpgroup MMAs, sm_90a) or "mma" (mma.sync, every architecture)
    #: query rows of the ``attn`` kernel's blocks: 64, or 32 for the small mma.sync tiles
    rows_per_block: int = ROWS_PER_BLOCK
    attn_wide: object = None  # the wgmma path's kernel with 72-row tiles (None: not used)
    wide_smem_bytes: int = 0
    #: the 72-row kernel with clusters of splits merged on chip, by cluster size (``SPLIT_CLUSTER_SIZES``)
    attn_wide_clusters: dict = field(default_factory=dict)
    #: plans whose whole grid is resident at once merge their splits in the kernel (wgmma path only)
    merge_in_kernel: bool = True
    #: the seesaw kernel (64-row tiles, key tiles by TMA from ``PreparedAttention.kv_map``), where a plan
    #: takes it
    attn_seesaw: object = None
    seesaw_smem_bytes: int = 0
    #: the seesaw kernel in clusters of a request's row tiles, key tiles multicast, by cluster size
    #: (``ROW_CLUSTER_SIZES``)
    attn_seesaw_multicast: dict = field(default_factory=dict)
    #: the loaded module (its globals: the timeline build's ``vx_timeline``, tools/attention_timeline.py)
    module: object = None
    #: the most rows a block of the combine kernel merges (``combine_rows_per_block``; 1: one a block)
    combine_rows: int = 1

    def plan(self, shape: AttentionShape, max_kv_len: int) -> AttentionPlan:
        """The call's grid: 64-row tiles, or, where the 72-row kernel is loaded and its tiles need fewer
        blocks a request, 72-row tiles if that plan's estimate is the lower (fewer blocks and no tile
        computed for 8 rows, but fewer blocks to spread over the SMs: at batch 1, budget 8 the 64-row tiles
        win). A 72-row plan of 2 splits runs as clusters of 2 merged on chip (``SPLIT_CLUSTER_SIZES``); plans
        of at least ``MERGE_MIN_SPLITS`` splits on the wgmma path whose grid has at most one block per SM
        merge their splits in the kernel (``va_merge_splits``), with no combine launch. A 64-row plan of at
        least ``SEESAW_MIN_ROW_TILES`` row tiles and ``SEESAW_MIN_TILES`` key tiles a split runs the seesaw
        kernel where it is loaded; against the 72-row tiles its estimate counts ``SEESAW_COST`` of itself."""
        plan = plan_attention(
            shape, max_kv_len, self.sm_count, self.keys_per_tile, self.overhead_tiles, self.rows_per_block
        )
        seesaw = (
            self.attn_seesaw is not None
            and plan.row_tiles >= SEESAW_MIN_ROW_TILES
            and plan.tiles_per_split >= SEESAW_MIN_TILES
        )
        if self.attn_wide is not None and -(-shape.rows // WIDE_ROWS_PER_BLOCK) < plan.row_tiles:
            wide = plan_attention(
                shape, max_kv_len, self.sm_count, self.keys_per_tile, WIDE_OVERHEAD_TILES, WIDE_ROWS_PER_BLOCK
            )
            if wide.cost < plan.cost * (SEESAW_COST if seesaw else 1.0):
                if wide.splits in self.attn_wide_clusters:  # merged on chip: no partial rows, no combine
                    wide = replace(wide, cluster=wide.splits)
                plan = wide
        if seesaw and plan.rows_per_block == ROWS_PER_BLOCK:
            plan = replace(plan, seesaw=True)
        # at most one block a SM (192-227 KB of shared memory each): every block is resident at once, so the
        # splits can wait for each other
        resident = plan.row_tiles * plan.splits * shape.batch <= self.sm_count
        if self.path == "wgmma" and self.merge_in_kernel and plan.cluster == 1:
            if plan.partials >= MERGE_MIN_SPLITS and resident:
                plan = replace(plan, merged_in_kernel=True)
        return plan


def _kernel_info(module, name: str) -> tuple[int, int, int]:
    """What a Hopper kernel's info kernel ``name`` reports: its shared memory a block, whether it is compiled
    in for the device, and its tile size (rows or keys)."""
    import cupy as cp  # noqa: PLC0415

    info = cp.zeros(3, cp.int32)
    module.get_function(name)((1,), (1,), (info,))
    smem, compiled, tile = (int(x) for x in info.get())
    return smem, compiled, tile


def _set_shared_memory(chosen: dict, optin: int) -> None:
    """Check that the chosen kernels' (``AttentionKernels`` fields) shared memory a block fits the GPU's
    ``optin`` and set each kernel's dynamic shared memory to its own."""
    smem = chosen["smem_bytes"]
    wide_smem, seesaw_smem = chosen.get("wide_smem_bytes", 0), chosen.get("seesaw_smem_bytes", 0)
    needed = max(smem, wide_smem, seesaw_smem)
    if needed > optin:
        raise AttentionUnavailable(
            f"gpu verify attention needs {needed} bytes of shared memory per block; this GPU allows {optin}"
        )
    chosen["attn"].max_dynamic_shared_size_bytes = smem
    if chosen.get("attn_seesaw") is not None:
        chosen["attn_seesaw"].max_dynamic_shared_size_bytes = seesaw_smem
    for kernel in chosen.get("attn_seesaw_multicast", {}).values():
        kernel.max_dynamic_shared_size_bytes = seesaw_smem
    wide = [chosen["attn_wide"]] if chosen.get("attn_wide") is not None else []
    for kernel in wide + list(chosen.get("attn_wide_clusters", {}).values()):
        kernel.max_dynamic_shared_size_bytes = wide_smem


class VerifyAttention:
    """The CUDA verify attention (``kernels/verify_attn/verify_attn.cu``), loaded from ``fatbin`` or the
    cached build.

    ``path``: "auto" takes the Hopper kernel (``ddtree_verify_attn_wgmma``: warpgroup MMAs from shared memory)
    where the fatbin has sm_90a code for the device, else the ``mma.sync`` kernel; "wgmma" insists on the
    former (AttentionUnavailable where it is not compiled in), "mma" always takes the latter. The mma.sync
    kernel has 64-row tiles of 32 keys where the GPU allows a block its 192 KB of shared memory, else
    (sm_120 parts) ``ddtree_verify_attn_small``, 32-row tiles of 16 keys in 87 KB; "mma-small" takes the
    small tiles on any GPU (tests, measurements). On the wgmma path a call may take
    ``ddtree_verify_attn_wgmma72``, 72-row tiles (``AttentionKernels.plan``; with 2 splits its clustered
    form ``ddtree_verify_attn_wgmma72_cluster2``), unless ``wide_rows`` is False (measurements);
    ``merge_in_kernel`` False leaves every split merge to the combine launch (measurements). On the wgmma
    path a 64-row plan of enough row tiles and key tiles a split (``SEESAW_MIN_ROW_TILES``,
    ``SEESAW_MIN_TILES``) runs ``ddtree_verify_attn_seesaw`` (both warpgroups compute S of alternate key
    tiles and half of P V, key tiles loaded by TMA), unless ``seesaw`` is False (measurements)."""

    def __init__(
        self,
        fatbin: str | Path | None = None,
        archs=None,
        path: str = "auto",
        wide_rows: bool = True,
        merge_in_kernel: bool = True,
        seesaw: bool = True,
    ):
        if path not in ATTENTION_PATHS:
            raise ValueError(f"verify attention: path must be one of {ATTENTION_PATHS}, got {path!r}")
        self._fatbin = Path(fatbin) if fatbin else None
        self._archs = tuple(archs) if archs else None
        self._path = path
        self._wide_rows = wide_rows
        self._merge_in_kernel = merge_in_kernel
        self._seesaw = seesaw
        self._kernels: AttentionKernels | None = None

    def unavailable_reason(self) -> str | None:
        from ddtree_bench.cuda.loader import gpu_unavailable_reason  # noqa: PLC0415

        reason = gpu_unavailable_reason()
        if reason is None:
            try:
                import torch  # noqa: F401, PLC0415  (bf16 tensors)
            except ImportError as exc:
                reason = f"PyTorch is not installed (bf16 tensors): {exc}"
        return reason

    @property
    def kernels(self) -> AttentionKernels:
        if self._kernels is None:
            self._kernels = self._load()
        return self._kernels

    def _load(self) -> AttentionKernels:
        """Load the module, choose the path and its kernels (``_wgmma_kernels``, ``_mma_kernels``), check
        that their shared memory fits the GPU and set it; AttentionUnavailable says why where it cannot."""
        reason = self.unavailable_reason()
        if reason:
            raise AttentionUnavailable(f"gpu verify attention unavailable: {reason}")
        import cupy as cp  # noqa: PLC0415

        fatbin = self._fatbin or cuda.cached_fatbin(KERNEL_SOURCE, self._archs or cuda.DEFAULT_ARCHS)
        module = cp.RawModule(path=str(fatbin))
        wgmma_smem, wgmma_compiled, wgmma_keys_per_tile = _kernel_info(
            module, "ddtree_verify_attn_wgmma_info"
        )
        if self._path == "wgmma" and not wgmma_compiled:
            raise AttentionUnavailable(
                "gpu verify attention: the wgmma path needs sm_90a code for this GPU (compute capability "
                "9.0 and sm_90 in cuda_archs)"
            )
        path = "wgmma" if wgmma_compiled and self._path in ("auto", "wgmma") else "mma"
        dev = cp.cuda.Device()
        optin = cp.cuda.runtime.deviceGetAttribute(
            cp.cuda.runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin, dev.id
        )
        if path == "wgmma":
            chosen = self._wgmma_kernels(module, wgmma_smem, wgmma_keys_per_tile)
        else:
            chosen = self._mma_kernels(module, optin)
        _set_shared_memory(chosen, optin)
        probe = cp.zeros(3, cp.int32)
        module.get_function("ddtree_verify_attn_combine_threads")((1,), (1,), (probe,))
        props = cp.cuda.runtime.getDeviceProperties(dev.id)
        cc = int(props["major"]) * 10 + int(props["minor"])
        rows_per_block = chosen["rows_per_block"]
        return AttentionKernels(
            combine=module.get_function("ddtree_verify_attn_combine"),
            combine_threads=int(probe.get()[0]),
            combine_rows=max(1, int(probe.get()[1])),  # 0 from builds that merge one row a block
            sm_count=int(props["multiProcessorCount"]),
            runs=f"{cuda.fatbin_runs(Path(fatbin), cc)}, {path} path"
            + (f", {rows_per_block}-row tiles" if rows_per_block != ROWS_PER_BLOCK else ""),
            fatbin=Path(fatbin),
            path=path,
            merge_in_kernel=self._merge_in_kernel,
            module=module,
            **chosen,
        )

    def _wgmma_kernels(self, module, smem: int, keys_per_tile: int) -> dict:
        """The Hopper path's kernels (``AttentionKernels`` fields): the wgmma kernel, and where not switched
        off the seesaw kernel and the 72-row kernels (each checked against what its info kernel reports)."""
        chosen = {
            "attn": module.get_function("ddtree_verify_attn_wgmma"),
            "smem_bytes": smem,
            "keys_per_tile": keys_per_tile,
            "rows_per_block": ROWS_PER_BLOCK,
            "overhead_tiles": BLOCK_OVERHEAD_TILES["wgmma"],
        }
        if self._seesaw:
            seesaw_smem, seesaw_compiled, seesaw_keys = _kernel_info(module, "ddtree_verify_attn_seesaw_info")
            if not seesaw_compiled or seesaw_keys != keys_per_tile:
                raise AttentionUnavailable(
                    f"gpu verify attention: the seesaw kernel reports compiled={seesaw_compiled}, "
                    f"{seesaw_keys}-key tiles beside the wgmma kernel's {keys_per_tile}"
                )
            chosen["attn_seesaw"] = module.get_function("ddtree_verify_attn_seesaw")
            chosen["seesaw_smem_bytes"] = seesaw_smem
            chosen["attn_seesaw_multicast"] = {
                size: module.get_function(f"ddtree_verify_attn_seesaw_multicast{size}")
                for size in ROW_CLUSTER_SIZES
            }
        if self._wide_rows:
            wide_smem, wide_compiled, wide_rows = _kernel_info(module, "ddtree_verify_attn_wgmma72_info")
            if not wide_compiled or wide_rows != WIDE_ROWS_PER_BLOCK:
                raise AttentionUnavailable(
                    f"gpu verify attention: the 72-row kernel reports compiled={wide_compiled}, "
                    f"rows={wide_rows} beside the wgmma kernel"
                )
            chosen["attn_wide"] = module.get_function("ddtree_verify_attn_wgmma72")
            chosen["wide_smem_bytes"] = wide_smem
            chosen["attn_wide_clusters"] = {
                size: module.get_function(f"ddtree_verify_attn_wgmma72_cluster{size}")
                for size in SPLIT_CLUSTER_SIZES
            }
        return chosen

    def _mma_kernels(self, module, optin: int) -> dict:
        """The mma.sync path's kernel (``AttentionKernels`` fields): 64-row tiles of 32 keys where the GPU
        allows their shared memory (and ``path`` is not "mma-small"), else 32-row tiles of 16 keys."""
        import cupy as cp  # noqa: PLC0415

        info = cp.zeros(6, cp.int32)
        module.get_function("ddtree_verify_attn_smem_bytes")((1,), (1,), (info,))
        smem, rows, keys_per_tile, small_smem, small_rows, small_keys = (int(x) for x in info.get())
        if (rows, keys_per_tile, small_rows, small_keys) != (
            ROWS_PER_BLOCK,
            KEYS_PER_TILE,
            SMALL_ROWS_PER_BLOCK,
            SMALL_KEYS_PER_TILE,
        ):
            raise AttentionUnavailable(
                f"gpu verify attention: the mma.sync kernels report {rows} x {keys_per_tile} and "
                f"{small_rows} x {small_keys} tiles, not the {ROWS_PER_BLOCK} x {KEYS_PER_TILE} and "
                f"{SMALL_ROWS_PER_BLOCK} x {SMALL_KEYS_PER_TILE} this loader plans for"
            )
        if small_smem > optin:  # neither fits
            raise AttentionUnavailable(
                f"gpu verify attention needs {smem} bytes of shared memory per block ({rows}-row "
                f"tiles) or {small_smem} ({small_rows}-row tiles); this GPU allows {optin}"
            )
        if self._path == "mma-small" or smem > optin:
            return {
                "attn": module.get_function("ddtree_verify_attn_small"),
                "smem_bytes": small_smem,
                "keys_per_tile": small_keys,
                "rows_per_block": small_rows,
                "overhead_tiles": SMALL_OVERHEAD_TILES,
            }
        return {
            "attn": module.get_function("ddtree_verify_attn"),
            "smem_bytes": smem,
            "keys_per_tile": keys_per_tile,
            "rows_per_block": ROWS_PER_BLOCK,
            "overhead_tiles": BLOCK_OVERHEAD_TILES["mma"],
        }

    def prepare(self, q, kv, prefix_lengths, mask_bits, out) -> PreparedAttention:
        """Validate one call's arrays (module docstring) and get it ready to launch."""
        shape, lengths = check_attention_inputs(q, kv, prefix_lengths, mask_bits, out)
        kernels = self.kernels
        views = {
            name: _as_cupy(a, name)
            for name, a in (("q", q), ("kv", kv), ("mask_bits", mask_bits), ("out", out))
        }
        max_kv_len = int(lengths.max()) + shape.tokens
        plan = kernels.plan(shape, max_kv_len)
        return PreparedAttention(kernels, shape, plan, views, lengths)

    def __call__(self, q, kv, prefix_lengths, mask_bits, out, stream=None):
        """Validate, launch and return ``out`` (a convenience; time ``prepare(...).launch``)."""
        self.prepare(q, kv, prefix_lengths, mask_bits, out).launch(stream)
        return out


# ----------------------------------------------------------------------------------------------- reference


def reference_attention(q, kv, prefix_lengths, visibility, *, requests=None, scale=None):
    """float32 reference (PyTorch, on q's device), ``[len(requests), N+1, H, 512]`` float32: per request,
    softmax over the prefix plus the tree keys ``visibility[b, i]`` marks (numpy or torch) of ``scale * q.k``
    (default ``SOFTMAX_SCALE``), times V. Rows of ``kv`` past ``S_b + N`` are never read; a query with no
    visible key gives zeros, like the kernel."""
    import torch  # noqa: PLC0415

    scale = SOFTMAX_SCALE if scale is None else float(scale)
    batch, tokens, _, _ = q.shape
    requests = range(batch) if requests is None else requests
    outs = []
    for b in requests:
        s_b = int(prefix_lengths[b])
        keys = kv[b, : s_b + tokens].float()  # [S+N+1, 576]
        allowed = torch.ones((tokens, s_b + tokens), dtype=torch.bool, device=q.device)
        allowed[:, s_b:] = torch.as_tensor(visibility[b], device=q.device)
        scores = torch.einsum("ihd,kd->ihk", q[b].float(), keys) * scale
        scores = scores.masked_fill(~allowed[:, None, :], float("-inf"))
        probs = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
        outs.append(torch.einsum("ihk,kd->ihd", probs, keys[:, :VALUE_DIM]))
    return torch.stack(outs)
