"""``gpu``: the CUDA tree builder (kernels/tree_build/tree_build.cu), one thread block per request, the whole
batch in one launch, writing the padded TreeBatch (plus packed-bit visibility) into preallocated device
buffers.

``build()`` is the host-inclusive path (copy inputs in, build, copy the TreeBatch out); the benchmark uses
``prepare``/``launch`` on device arrays directly (no allocation, no host sync: CUDA-graph capturable).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ddtree_bench import catalog
from ddtree_bench.builders.base import Builder, BuilderUnavailable
from ddtree_bench.cuda import loader as cuda
from ddtree_bench.tree import TreeBatch

MAX_DEPTH = 32
MAX_BUDGET = 2048
FLAG_FORCE_HEAP = 1
FLAG_ROWS_IN_SHARED = 4
# the parallel kernel writes the bool mask itself up to this budget, from this batch on (bool_in_build_kernel)
BOOL_IN_BUILD_MAX_BUDGET = 512
BOOL_IN_BUILD_MIN_BATCH = 64
WARP_MAX_BUDGET = 128  # the warp-heap kernels take budgets up to this (4 heap slots per lane)
AUTO_WARP_HEAP_MAX_BUDGET = 64  # by default the warp heap up to here, the parallel pool path above
WIDE_BOOL_IN_BUILD_MAX_BUDGET = 256  # the wide path writes the bool mask itself up to here
STAT_NAMES = {
    0: "parallel",
    1: "heap (anomaly)",
    2: "heap (pool overflow)",
    3: "heap (forced)",
    4: "warp heap",
    5: "wide",
    6: "heap (wide: not certified)",
    7: "heap (wide: pool overflow)",
}
WIDE_MAX_DEPTH = 4096  # the wide path takes any depth up to here (depths are 16-bit; a tree is <= N deep)
WIDE_MAX_PREFETCH = 8  # row floats a thread of the wide path prefetches: topk <= 8 * threads
STATIC_SHARED_BYTES = 3072  # the kernel's static __shared__ arrays (2368 B for sm_90), rounded up


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x - 1).bit_length())


def shared_bytes(cap: int, budget: int, depth: int = 0, topk: int = 0, staged: bool = False) -> int:
    """Dynamic shared memory of one block (mirrors the carve-up in tree_build.cu)."""
    pool = 8 * cap * 2 + 4 * (cap + 1) + 4 * cap + 2 * cap * 5 + cap
    total = ((pool + 15) & ~15) + 7 * (budget + 1)
    if staged:
        total = ((total + 15) & ~15) + 4 * depth * topk
    return total


def warp_shared_bytes(budget: int, depth: int, topk: int) -> int:
    """Dynamic shared memory of the warp-heap kernels (mirrors warp_build_tree in tree_build_warp.cuh)."""
    n1 = budget + 1
    words = (n1 + 31) // 32
    flat_words = (n1 * n1 + 31) // 32 + 1  # the bool mask's flat bits, plus a word for the funnel shift
    return 12 * depth * topk + 12 * n1 + 4 * n1 * words + 4 * flat_words


def warp_slots(budget: int) -> int:
    """Heap slots per lane of the warp kernel for a budget (ddtree_build_tree_warp1/2/4)."""
    return 1 if budget <= 32 else 2 if budget <= 64 else 4


@dataclass(frozen=True)
class LaunchPlan:
    batch: int
    depth: int
    k: int
    budget: int
    cap: int
    threads: int
    shared_bytes: int
    rows_in_shared: bool
    path: str  # "warp-heap" (small budgets), "parallel" (the pool path) or "wide" (one big block a tree)

    @property
    def words_per_row(self) -> int:
        return (self.budget + 32) // 32

    @property
    def flags(self) -> int:
        return FLAG_ROWS_IN_SHARED if self.rows_in_shared else 0


def parallel_block_threads(budget: int) -> int:
    """Block size of the parallel path: 256 threads up to budget 128, 512 up to 512, then 1024.

    Measured on the H200 (batch 1 and 64, L = 16, K = N, peaked, uniform and bf16 traces, CUDA events): a
    block of at least 256 threads grows the pool (about 1.3 to 4 N entries) faster than one of N threads,
    and 1024 threads are slower than 512 below N = 512 (more warps meet at every barrier); batch 64, peaked,
    N = 256: 55.2 us with 256 threads, 49.0 with 512, 52.6 with 1024. Any block size gives the same tree."""
    return 256 if budget <= 128 else 512 if budget <= 512 else 1024


def _r16(x: int) -> int:
    return (x + 15) & ~15


def wide_shared_bytes(cap: int, budget: int, topk: int) -> int:
    """Dynamic shared memory of the wide path (mirrors the carve-up in tree_build_wide.cuh)."""
    n1 = budget + 1
    pool = _r16(8 * cap) + _r16(4 * cap) + _r16(4 * (cap + 1)) + _r16(4 * cap) + 2 * _r16(2 * cap)
    return pool + 2 * _r16(4 * topk) + 3 * _r16(4 * n1) + 2 * _r16(2 * n1)


def wide_block_threads(budget: int) -> int:
    """Block size of the wide path (not yet calibrated on the H200): enough threads that a level's
    frontier, its children and the final ranking take few turns a thread."""
    return 256 if budget <= 64 else 512 if budget <= 256 else 1024


def plan_wide(batch: int, k: int, budget: int, limit: int, depth: int) -> LaunchPlan:
    """The wide path's plan: a pool of up to 8 N entries (at least 512), halved until it fits; at least
    N + 2 (the fallback heap lives in the pool's memory)."""
    topk = min(budget, k)
    cap = _next_pow2(max(8 * budget, 512))
    while wide_shared_bytes(cap, budget, topk) > limit and cap // 2 >= budget + 2:
        cap //= 2
    size = wide_shared_bytes(cap, budget, topk)
    if size > limit:
        raise ValueError(
            f"gpu builder: budget {budget} needs {size} B of shared memory per block; the GPU allows {limit}"
        )
    threads = max(wide_block_threads(budget), -(-topk // WIDE_MAX_PREFETCH))
    return LaunchPlan(batch, depth, k, budget, cap, threads, size, False, "wide")


@dataclass(frozen=True)
class PathCosts:
    """A simple per-launch cost model (microseconds) for picking the kernel path. A tree's latency is
    ``base + per_node * N (+ per_pair * N^2)``; trees run side by side, ``per_sm`` of them on each SM, so
    a batch takes ``ceil(batch / (per_sm * SMs))`` such waves. Constants from the H200's published runs
    (warp heap, pool path; L = 16, peaked). ``wide_max_batch`` 0: at L <= 32 the plan never picks the wide
    path, which the H200's calibration (``tools/tree_paths.py``, results/published/h200/tree_paths.csv)
    found slower than the warp heap or the pool path at batch 1-32 and every budget (e.g. batch 1,
    N = 1024: 240 us against the pool path's 80); it runs where only it can, L > 32."""

    warp_base: float = 3.3
    warp_per_node: float = 0.33
    warp_per_sm: int = 16
    pool_base: float = 35.0
    pool_per_node: float = 0.025
    pool_per_sm: int = 1
    wide_base: float = 4.0
    wide_per_node: float = 0.02
    wide_per_pair: float = 1e-5
    wide_per_sm: int = 1
    wide_max_batch: int = 0

    def cost(self, path: str, batch: int, budget: int, sm_count: int) -> float:
        if path == "warp-heap":
            base, slope, quad, per_sm = self.warp_base, self.warp_per_node, 0.0, self.warp_per_sm
        elif path == "parallel":
            base, slope, quad, per_sm = self.pool_base, self.pool_per_node, 0.0, self.pool_per_sm
        elif path == "wide":
            base, slope, quad = self.wide_base, self.wide_per_node, self.wide_per_pair
            per_sm = self.wide_per_sm
        else:
            raise ValueError(f"gpu builder: unknown path {path!r}")
        waves = -(-batch // max(1, per_sm * sm_count))
        return waves * (base + slope * budget + quad * budget * budget)


PATH_COSTS = PathCosts()


def choose_path(batch: int, depth: int, budget: int, sm_count: int, costs: PathCosts = PATH_COSTS) -> str:
    """The path the cost model deems fastest for a launch: "warp-heap", "parallel" or "wide". Only the wide
    path takes depths above 32 (SGLang's worker hands the builder L = N rows)."""
    if depth > MAX_DEPTH:
        return "wide"
    options = ["parallel"]
    if budget <= AUTO_WARP_HEAP_MAX_BUDGET:
        options.append("warp-heap")
    if batch <= costs.wide_max_batch:
        options.append("wide")
    return min(options, key=lambda p: costs.cost(p, batch, budget, sm_count))


def plan_launch(
    batch: int,
    depth: int,
    k: int,
    budget: int,
    max_shared_bytes: int,
    path: str | None = None,
    sm_count: int | None = None,
    costs: PathCosts = PATH_COSTS,
) -> LaunchPlan:
    """Pool capacity, block size and shared-memory use for a shape; ValueError for a shape the kernel
    cannot take (never a wrong tree). ``path`` None: by ``choose_path`` where ``sm_count`` is given (else
    the warp heap up to budget 64 and the pool path above, the rule before the wide path existed)."""
    max_depth = WIDE_MAX_DEPTH if path in (None, "wide") else MAX_DEPTH
    if depth < 1 or depth > max_depth:
        raise ValueError(f"gpu builder: depth L={depth} outside 1..{max_depth}")
    if budget < 1 or budget > MAX_BUDGET:
        raise ValueError(f"gpu builder: budget {budget} outside 1..{MAX_BUDGET}")
    if k < 1:
        raise ValueError("gpu builder: K must be >= 1")
    if batch < 1 or batch > 2**31 - 1:
        raise ValueError(f"gpu builder: batch {batch} outside 1..2^31-1")
    limit = max_shared_bytes - STATIC_SHARED_BYTES
    if path is None and (sm_count is not None or depth > MAX_DEPTH):
        path = choose_path(batch, depth, budget, sm_count or 1, costs)
    if path == "wide":
        return plan_wide(batch, k, budget, limit, depth)
    topk = min(budget, k)
    warp_limit = WARP_MAX_BUDGET if path == "warp-heap" else AUTO_WARP_HEAP_MAX_BUDGET
    if budget <= warp_limit and path in (None, "warp-heap"):
        size = warp_shared_bytes(budget, depth, topk)
        if size <= max_shared_bytes:
            return LaunchPlan(batch, depth, k, budget, 0, 32, size, True, "warp-heap")
    cap = _next_pow2(max(4 * budget, 512))
    floor = _next_pow2(max(2 * budget, budget + 2, 256))
    while shared_bytes(cap, budget) > limit and cap > floor:
        cap //= 2
    if shared_bytes(cap, budget) > limit or cap > 16384:
        need = shared_bytes(cap, budget)
        raise ValueError(
            f"gpu builder: budget {budget} needs {need} B of shared memory per block; the GPU allows {limit}"
        )
    staged = shared_bytes(cap, budget, depth, topk, True) <= limit
    threads = parallel_block_threads(budget)
    size = shared_bytes(cap, budget, depth, topk, staged)
    return LaunchPlan(batch, depth, k, budget, cap, threads, size, staged, "parallel")


def device_layout(fields) -> tuple[dict[str, tuple[int, tuple, object]], int]:
    """Byte offsets of ``(name, shape, dtype)`` fields in one buffer, each 256-byte aligned."""
    offsets, at = {}, 0
    for name, shape, dtype in fields:
        offsets[name] = (at, shape, dtype)
        at += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // 256) * 256
    return offsets, at


def device_views(buffer, offsets) -> dict:
    out = {}
    for name, (at, shape, dtype) in offsets.items():
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        out[name] = buffer[at : at + nbytes].view(dtype).reshape(shape)
    return out


class DeviceTrees:
    """Preallocated device outputs for one (batch, budget), in one allocation: the TreeBatch fields first
    (one contiguous region, so a host consumer copies the whole batch out in one transfer), then the
    packed-bit mask and the per-tree path statistics."""

    def __init__(self, batch: int, budget: int, buffer=None):
        """``buffer``: a device byte array of at least ``required_bytes(batch, budget)`` bytes to lay the
        outputs out in (e.g. a CuPy view of a torch tensor); ``None``: a new zeroed CuPy allocation."""
        import cupy as cp  # noqa: PLC0415

        n1 = budget + 1
        words = (n1 + 31) // 32
        tree_fields = [
            ("node_count", (batch,), np.int32),
            ("node_token_ids", (batch, budget), np.int64),
            ("node_depths", (batch, budget), np.int64),
            ("parents", (batch, n1), np.int32),
            ("visibility", (batch, n1, n1), np.bool_),
            ("retrieve_next_token", (batch, n1), np.int64),
            ("retrieve_next_sibling", (batch, n1), np.int64),
        ]
        self.tree_offsets, self.tree_bytes = device_layout(tree_fields)
        offsets, total = device_layout(
            tree_fields + [("visibility_bits", (batch, n1, words), np.uint32), ("stats", (batch,), np.int32)]
        )
        self.offsets = offsets
        if buffer is None:
            self.buffer = cp.zeros(total, cp.uint8)
        else:
            if buffer.dtype != cp.uint8 or buffer.ndim != 1 or buffer.size < total:
                raise ValueError(f"DeviceTrees: buffer must be a 1-D uint8 device array of >= {total} bytes")
            self.buffer = buffer[:total]
        for name, view in device_views(self.buffer, offsets).items():
            setattr(self, name, view)

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)

    @property
    def batch(self) -> int:
        return int(self.node_count.shape[0])

    @property
    def budget(self) -> int:
        return int(self.node_token_ids.shape[1])

    @staticmethod
    def required_bytes(batch: int, budget: int) -> int:
        """Bytes of the one allocation holding a (batch, budget) output (same layout as ``__init__``)."""
        n1 = budget + 1
        words = (n1 + 31) // 32
        _, total = device_layout(
            [
                ("node_count", (batch,), np.int32),
                ("node_token_ids", (batch, budget), np.int64),
                ("node_depths", (batch, budget), np.int64),
                ("parents", (batch, n1), np.int32),
                ("visibility", (batch, n1, n1), np.bool_),
                ("retrieve_next_token", (batch, n1), np.int64),
                ("retrieve_next_sibling", (batch, n1), np.int64),
                ("visibility_bits", (batch, n1, words), np.uint32),
                ("stats", (batch,), np.int32),
            ]
        )
        return total

    def tree_region(self):
        """The TreeBatch fields as one contiguous device byte range."""
        return self.buffer[: self.tree_bytes]

    def host_views(self, host_buffer: np.ndarray) -> TreeBatch:
        """A TreeBatch viewing a host copy of ``tree_region()``."""
        return TreeBatch(**device_views(host_buffer, self.tree_offsets))

    def to_host(self) -> TreeBatch:
        host = self.tree_region().get()
        return TreeBatch(**{k: v.copy() for k, v in self.host_views(host).as_dict().items()})


class GpuBuilder(Builder):
    name = catalog.GPU_BUILDER
    label = "gpu (ours, CUDA kernel)"
    device = "cuda"

    def __init__(
        self,
        fatbin: str | Path | None = None,
        util_fatbin: str | Path | None = None,
        archs=None,
        bool_visibility: bool = True,
        force_heap: bool = False,
        path: str | None = None,
        bool_in_build: bool | None = None,
    ):
        self._fatbin = Path(fatbin) if fatbin else None
        self._util_fatbin = Path(util_fatbin) if util_fatbin else None
        self._archs = tuple(archs) if archs else None
        self.bool_visibility = bool_visibility
        self.force_heap = force_heap
        self.path = path  # None: by budget; "parallel" or "warp-heap" to force one (tests, measurements)
        # the parallel kernel writes the bool mask itself (True) or leaves it to the expansion kernel (False);
        # None: by batch (bool_in_build_kernel)
        self.bool_in_build = bool_in_build
        self._kernels = None
        self._shared_set = set()

    def unavailable_reason(self) -> str | None:
        from ddtree_bench.cuda.loader import gpu_unavailable_reason  # noqa: PLC0415

        return gpu_unavailable_reason()

    @property
    def kernels(self):
        if self._kernels is None:
            reason = self.unavailable_reason()
            if reason:
                raise BuilderUnavailable(f"gpu builder unavailable: {reason}")

            archs = self._archs or cuda.DEFAULT_ARCHS
            fatbin = self._fatbin or cuda.cached_fatbin(cuda.TREE_BUILD_SOURCE, archs)
            util = self._util_fatbin or cuda.cached_fatbin(cuda.BENCH_UTIL_SOURCE, archs)
            self._kernels = cuda.load_kernels(fatbin, util)
        return self._kernels

    def plan(self, batch: int, depth: int, k: int, budget: int) -> LaunchPlan:
        # the forced sequential heap (tests) lives in the parallel kernel
        path = "parallel" if self.force_heap and self.path is None and depth <= MAX_DEPTH else self.path
        k_ = self.kernels
        return plan_launch(batch, depth, k, budget, k_.max_shared_bytes, path, sm_count=k_.sm_count)

    def flags(self) -> int:
        return FLAG_FORCE_HEAP if self.force_heap else 0

    def bool_in_build_kernel(self, plan: LaunchPlan) -> bool:
        """Whether the parallel kernel writes the bool mask itself (each block its own tree's rows) rather
        than the expansion kernel over the whole GPU after it. Measured on the H200 (L = 16, CUDA events;
        the rows read from the packed bits the block left in shared memory): at batch 64 2-4 us faster at
        budgets 128-512 (N = 512: 62.3 against 64.8 us peaked, 25.5 against 27.9 uniform), slower at batch
        8 (N = 512: 53.9 against 50.5); at budget 1024 a block writing its 1 MB of rows alone takes ~28 us
        more than the packed build, the expansion kernel 3-30 us (batch 1-64), so it keeps the expansion."""
        if self.bool_in_build is not None:
            return self.bool_in_build
        return plan.budget <= BOOL_IN_BUILD_MAX_BUDGET and plan.batch >= BOOL_IN_BUILD_MIN_BATCH

    def launch(
        self,
        plan: LaunchPlan,
        d_log_probs,
        d_token_ids,
        out: DeviceTrees,
        stream=None,
        flags=None,
        profile=None,
        bool_visibility: bool | None = None,
    ):
        """Enqueue one build of the whole batch on ``stream`` (no allocation, no host sync): the tree kernel,
        which writes the bool mask too where wanted (the warp-heap kernels always; the parallel kernel per
        ``bool_in_build_kernel``), else followed by the kernel expanding the packed bits to it."""
        import cupy as cp  # noqa: PLC0415

        stream = stream or cp.cuda.get_current_stream()
        k = self.kernels
        warp = plan.path == "warp-heap"
        want_bool = self.bool_visibility if bool_visibility is None else bool_visibility
        wide = plan.path == "wide"
        kernel = k.build_warp[warp_slots(plan.budget)] if warp else k.build_wide if wide else k.build
        key = (id(kernel), plan.shared_bytes)
        if key not in self._shared_set:
            kernel.max_dynamic_shared_size_bytes = max(
                plan.shared_bytes, kernel.max_dynamic_shared_size_bytes
            )
            self._shared_set.add(key)
        args = (
            d_log_probs,
            d_token_ids,
            np.int32(plan.batch),
            np.int32(plan.depth),
            np.int32(plan.k),
            np.int32(plan.budget),
            np.int32(plan.cap),
            np.int32((self.flags() if flags is None else flags) | plan.flags),
            out.node_count,
            out.node_token_ids,
            out.node_depths,
            out.parents,
            out.visibility_bits,
            out.retrieve_next_token,
            out.retrieve_next_sibling,
            out.stats,
            profile if profile is not None else np.uint64(0),
        )
        in_kernel = want_bool and (warp or self.bool_in_build_kernel(plan))
        if wide:  # the wide path writes its bool rows itself up to this budget (one SM's stores)
            in_kernel = want_bool and plan.budget <= WIDE_BOOL_IN_BUILD_MAX_BUDGET
        args += (out.visibility if in_kernel else np.uint64(0),)
        kernel((plan.batch,), (plan.threads,), args, shared_mem=plan.shared_bytes, stream=stream)
        if want_bool and not in_kernel:
            chunks = (out.visibility.size + 15) // 16
            blocks = max(1, min((chunks + 255) // 256, 8 * k.sm_count))
            k.expand_visibility(
                (blocks,),
                (256,),
                (out.visibility_bits, np.int32(plan.batch), np.int32(plan.budget), out.visibility),
                stream=stream,
            )

    def build_device(
        self, top_log_probs, top_token_ids, budget: int, bool_visibility: bool | None = None
    ) -> tuple[DeviceTrees, LaunchPlan]:
        import cupy as cp  # noqa: PLC0415

        batch, depth, k = top_log_probs.shape
        plan = self.plan(batch, depth, k, budget)
        d_lp = cp.ascontiguousarray(cp.asarray(top_log_probs, dtype=cp.float32))
        d_ids = cp.ascontiguousarray(cp.asarray(top_token_ids, dtype=cp.int64))
        out = DeviceTrees(batch, budget)
        self.launch(plan, d_lp, d_ids, out, bool_visibility=bool_visibility)
        return out, plan

    def build(self, top_log_probs, top_token_ids, budget) -> TreeBatch:
        """Host-inclusive build of the full TreeBatch (the bool mask is always written here)."""
        budget = self.check(top_log_probs, top_token_ids, budget)
        out, _ = self.build_device(top_log_probs, top_token_ids, budget, bool_visibility=True)
        trees = out.to_host()
        self.last_stats = out.stats.get()
        self.last_visibility_bits = out.visibility_bits.get()
        return trees

    def info(self) -> dict:
        info = super().info()
        if self.unavailable_reason() is None:
            k = self.kernels
            info.update(gpu=k.device_name, code_running=k.runs, fatbin=str(k.fatbin))
        return info
