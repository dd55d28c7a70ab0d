"""Routed experts (MoE) of Kimi K2.6 for one GPU's share of tensor parallel 8, as loadable impls.

The problem, one layer: ``experts`` routed experts (384 in K2.6), each sliced to ``intermediate`` columns
(2048 / 8 = 256 on rank 0 of TP8), hidden size 7168, top-8 routing. Tokens ``x`` bf16 ``[T, hidden]``,
``topk_ids`` ``[T, 8]`` (int32), ``topk_weights`` float32 ``[T, 8]``; output bf16 ``[T, hidden]``:

    y[t] = sum_k  topk_weights[t, k] * W2[e] @ (silu(G[e] @ x[t]) * (U[e] @ x[t])),   e = topk_ids[t, k]

with ``W13[e] = [G[e]; U[e]]`` (gate rows first, then up: ``[2*I, hidden]``) and ``W2[e]`` ``[hidden, I]``.
The checkpoint's routed experts are INT4 W4A16: symmetric, group 32 along the input dim, bf16 scales, the
stored 4-bit code ``q`` meaning ``(q - 8) * scale`` (``uint4b8``).

Impls (``MOE_IMPLS``):

- ``marlin-w4a16``: what SGLang runs for that checkpoint on Hopper: ``fused_marlin_moe``
  (``sglang/srt/layers/moe/fused_moe_triton/fused_marlin_moe.py``), i.e. SGLang's alignment kernels, two
  ``moe_wna16_marlin_gemm`` calls (its CUDA sources JIT-compiled through apache-tvm-ffi and nvcc by SGLang's
  own ``load_jit``), ``silu_and_mul`` between them (SGLang's JIT kernel) and the top-k sum.
- ``triton-w4a16``: SGLang's Triton fused MoE, ``fused_experts_impl(..., use_int4_w4a16=True,
  block_shape=[0, group])`` (``sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py``).
- ``bf16-grouped-mm``: unquantised bf16 experts through ``torch._grouped_mm`` (sm90): tokens sorted by
  expert, two grouped GEMMs, silu * up, a weighted sum over the top-k. One layer's BF16 slice is
  ``384 * 3 * 7168 * 256 * 2`` B = 4.2 GB.

SGLang's entry points are loaded by ``integrations.sglang.load_sglang_moe`` from a folder (``sglang_files``)
holding its files at their package paths (e.g. ``<folder>/sglang/kernels/ops/moe/moe_wna16_marlin.py``), or
from an installed ``sglang``, WITHOUT running ``import sglang``, a few modules being our own stand-ins
(``integrations.sglang.stubs``). The finder stays installed for the process: a process that loads these impls
must not also import a real ``sglang``. Where they cannot load, ``SglangUnavailable`` (``MoeUnavailable``).

Weights formats (``make_expert_weights``; random bits are valid random weights):

- marlin: ``w13`` int32 ``[E, hidden/16, 2*I*2]`` and ``w2`` int32 ``[E, I/16, hidden*2]`` in Marlin's tile
  layout (what ``gptq_marlin_moe_repack`` produces), scales bf16 ``[E, groups, N]`` permuted as
  ``marlin_permute_scales`` does. ``reference_moe`` undoes both permutations (``_marlin_unpermute``,
  written from ``get_weight_perm`` / ``marlin_permute_weights`` in SGLang's ``test/test_marlin_utils.py``
  and ``get_scale_perms`` in ``srt/layers/quantization/marlin_utils.py``); the GPU tests check that
  permutation against SGLang's own JIT ``gptq_marlin_repack``.
- triton: ``w13`` uint8 ``[E, 2*I, hidden/2]``, ``w2`` uint8 ``[E, hidden, I/2]`` (two codes a byte along
  the input dim, the even index in the low nibble), scales bf16 ``[E, N, K/group]``.
- bf16: ``w13`` ``[E, 2*I, hidden]``, ``w2`` ``[E, hidden, I]``.

torch is imported inside functions only, so this module imports on machines without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ddtree_bench.catalog import MOE_IMPLS
from ddtree_bench.integrations import sglang
from ddtree_bench.integrations.sglang import SglangUnavailable

MARLIN, TRITON, BF16 = MOE_IMPLS
TOP_K = 8
GROUP_SIZE = 32
#: the value 4-bit codes are stored with (symmetric ``uint4b8``: weight = (q - 8) * scale)
INT4_BIAS = 8
__all__ = [
    "BF16",
    "MARLIN",
    "MOE_IMPLS",
    "TRITON",
    "ExpertWeights",
    "MoeUnavailable",
    "expert_order",
    "grouped_moe",
    "make_expert_weights",
    "marlin_pack",
    "marlin_unpack",
    "moe_unavailable_reason",
    "reference_moe",
    "routed_experts",
    "weight_bytes",
]

#: SGLang's code not loading for an impl: the integration's one error (``integrations.sglang``), by the name
#: the MoE callers know
MoeUnavailable = SglangUnavailable


def _check_impl(impl: str) -> None:
    if impl not in MOE_IMPLS:
        raise ValueError(f"unknown MoE impl {impl!r}; expected one of {list(MOE_IMPLS)}")


# ----------------------------------------------------------------------------------------- arithmetic


def _check_shape(experts: int, hidden: int, intermediate: int, group_size: int) -> None:
    for name, value in (
        ("experts", experts),
        ("hidden", hidden),
        ("intermediate", intermediate),
        ("group_size", group_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for name, value in (("hidden", hidden), ("intermediate", intermediate)):
        if value % group_size:
            raise ValueError(f"{name} = {value} is not a multiple of group_size = {group_size}")


def weight_bytes(
    impl: str, experts: int, hidden: int, intermediate: int, group_size: int = GROUP_SIZE
) -> int:
    """Bytes of one layer's routed-expert weights in ``impl``'s format: INT4 impls 0.5 B a weight plus a
    bf16 scale (2 B) per group of ``group_size`` weights; bf16 2 B a weight. Three matrices an expert
    (gate, up, down), each ``hidden x intermediate``."""
    _check_impl(impl)
    _check_shape(experts, hidden, intermediate, group_size)
    weights = 3 * experts * hidden * intermediate
    if impl == BF16:
        return 2 * weights
    return weights // 2 + 2 * (weights // group_size)


# ----------------------------------------------------------------------------------------- availability


def _bf16_reason() -> str | None:
    import torch  # noqa: PLC0415

    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm (needs torch >= 2.8)"
    major, minor = torch.cuda.get_device_capability()
    if major < 9:
        return f"torch._grouped_mm needs sm90 or newer; this GPU is sm{major}{minor}"
    return None


def moe_unavailable_reason(impl: str, sglang_files=None, *, build: bool = True) -> str | None:
    """None where ``impl`` can run here, else one line saying why (no torch, no CUDA GPU, SGLang's files
    not at ``sglang_files``, apache-tvm-ffi or ninja missing, SGLang's module does not load, the JIT build
    fails). With ``build`` (default) the SGLang impls also build their JIT kernels (cached on disk by
    SGLang's loader, minutes the first time). ``ValueError`` for an unknown impl."""
    _check_impl(impl)
    from ddtree_bench.ops.attention_peers import torch_unavailable_reason  # noqa: PLC0415

    if impl != BF16:  # a bad folder is named even where there is no GPU
        try:
            sglang.sglang_moe_root(sglang_files)
        except SglangUnavailable as exc:
            return f"{impl}: {exc}"
    reason = torch_unavailable_reason()
    if reason is not None:
        return f"{impl}: needs a CUDA GPU: {reason}"
    if impl == BF16:
        reason = _bf16_reason()
        return None if reason is None else f"{impl}: {reason}"
    if impl == MARLIN or impl == TRITON:
        from ddtree_bench.cuda.loader import find_nvcc  # noqa: PLC0415

        reason = sglang.jit_reason(find_nvcc())
        if reason is not None:
            return f"{impl}: {reason}"
        if impl == TRITON:
            try:
                import triton  # noqa: F401, PLC0415
            except Exception as exc:
                return f"{impl}: triton does not import ({sglang.describe(exc)})"
    try:
        sglang.load_sglang_moe(impl, sglang_files)
        if build:
            _warm_small(impl, sglang_files)
    except SglangUnavailable as exc:
        return str(exc)
    except Exception as exc:
        return f"{impl}: the JIT build or first call failed ({sglang.describe(exc)})"
    return None


def _warm_small(impl: str, sglang_files) -> None:
    """One tiny call (1 and 9 tokens: both alignment paths) that builds every JIT kernel the impl uses."""
    import torch  # noqa: PLC0415

    weights = make_expert_weights(impl, experts=8, hidden=256, intermediate=128, seed=0, device="cuda")
    for tokens in (1, 9):
        x, ids, w = random_routing(tokens, 256, 8, seed=tokens, device="cuda")
        routed_experts(impl, weights, x, ids, w, sglang_files=sglang_files)
    torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------- weights


@dataclass
class ExpertWeights:
    """One layer's routed experts in ``impl``'s format (module docstring): ``w13`` (gate+up), ``w2`` (down)
    and, for INT4 impls, their bf16 group scales."""

    impl: str
    experts: int
    hidden: int
    intermediate: int
    group_size: int
    w13: object
    w2: object
    w13_scale: object = None
    w2_scale: object = None
    extra: dict = field(default_factory=dict)

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for t in (self.w13, self.w2, self.w13_scale, self.w2_scale)
            if t is not None
        )


def _generator(torch, seed: int, device):
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen


def _random_scales(torch, shape, fan_in: int, gen, device):
    """bf16 scales so that a weight (q - 8) * s has standard deviation about 1/sqrt(fan_in) (a uniform
    code in 0..15 minus 8 has standard deviation ~4.6)."""
    base = 1.0 / (4.6 * math.sqrt(fan_in))
    s = torch.rand(shape, generator=gen, device=device, dtype=torch.float32) + 0.5
    return (s * base).to(torch.bfloat16)


def make_expert_weights(
    impl: str,
    *,
    experts: int,
    hidden: int,
    intermediate: int,
    group_size: int = GROUP_SIZE,
    seed: int,
    device,
) -> ExpertWeights:
    """Random weights of one layer's routed experts in ``impl``'s own format (module docstring). Random
    bits are valid random INT4 weights; scales and bf16 weights are scaled so outputs stay O(1)."""
    _check_impl(impl)
    _check_shape(experts, hidden, intermediate, group_size)
    import torch  # noqa: PLC0415

    gen = _generator(torch, seed, device)
    e, h, i = experts, hidden, intermediate
    if impl == BF16:
        w13 = (torch.randn((e, 2 * i, h), generator=gen, device=device) / math.sqrt(h)).to(torch.bfloat16)
        w2 = (torch.randn((e, h, i), generator=gen, device=device) / math.sqrt(i)).to(torch.bfloat16)
        return ExpertWeights(impl, e, h, i, group_size, w13, w2)
    if impl == TRITON:
        w13 = torch.randint(0, 256, (e, 2 * i, h // 2), generator=gen, device=device, dtype=torch.uint8)
        w2 = torch.randint(0, 256, (e, h, i // 2), generator=gen, device=device, dtype=torch.uint8)
        s13 = _random_scales(torch, (e, 2 * i, h // group_size), h, gen, device)
        s2 = _random_scales(torch, (e, h, i // group_size), i, gen, device)
        return ExpertWeights(impl, e, h, i, group_size, w13, w2, s13, s2)
    for name, value in (("hidden", h), ("2*intermediate", 2 * i), ("intermediate", i)):
        if value % 64:
            raise ValueError(f"{MARLIN}: {name} = {value} must be a multiple of 64 (Marlin's tiles)")
    low, high = -(2**31), 2**31 - 1
    # Marlin: K = input dim, N = output dim; w13 has K = hidden, N = 2*I; w2 has K = I, N = hidden
    w13 = torch.randint(low, high, (e, h // 16, 2 * i * 2), generator=gen, device=device, dtype=torch.int32)
    w2 = torch.randint(low, high, (e, i // 16, h * 2), generator=gen, device=device, dtype=torch.int32)
    s13 = _random_scales(torch, (e, h // group_size, 2 * i), h, gen, device)
    s2 = _random_scales(torch, (e, i // group_size, h), i, gen, device)
    return ExpertWeights(impl, e, h, i, group_size, w13, w2, s13, s2)


def random_routing(tokens: int, hidden: int, experts: int, *, seed: int, device, top_k: int = TOP_K):
    """``(x bf16 [T, hidden], topk_ids int32 [T, top_k] distinct per token, topk_weights float32 [T, top_k]
    summing to 1)``, as a softmax top-k router gives them."""
    import torch  # noqa: PLC0415

    if top_k > experts:
        raise ValueError(f"top_k = {top_k} exceeds experts = {experts}")
    gen = _generator(torch, seed, device)
    x = torch.randn((tokens, hidden), generator=gen, device=device).to(torch.bfloat16)
    logits = torch.randn((tokens, experts), generator=gen, device=device)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return x, ids.to(torch.int32), weights.to(torch.float32)


# --------------------------------------------------------------------------- Marlin's layout (reference)


def _marlin_weight_perm(torch):
    """``get_weight_perm(4)`` of SGLang's test/test_marlin_utils.py: the order of the 1024 values of one
    16 x 64 tile row group in Marlin's layout, with the 4-bit interleave."""
    perm = []
    for i in range(32):
        perm1 = []
        col = i // 4
        for block in (0, 1):
            for row in (2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1):
                perm1.append(16 * row + col + 8 * block)
        for j in range(4):
            perm.extend(p + 256 * j for p in perm1)
    interleave = (0, 2, 4, 6, 1, 3, 5, 7)
    out = [perm[r + c] for r in range(0, len(perm), 8) for c in interleave]
    return torch.tensor(out, dtype=torch.int64)


def _marlin_scale_perm(torch):
    """``get_scale_perms()[0]`` of SGLang's srt/layers/quantization/marlin_utils.py (grouped scales)."""
    return torch.tensor([i + 8 * j for i in range(8) for j in range(8)], dtype=torch.int64)


def marlin_pack(q, scales):
    """Marlin's layout of plain INT4 codes ``q`` (uint8/int ``[..., K, N]``, values 0..15) and group scales
    ``[..., K/group, N]``: ``(qweight int32 [..., K/16, N*2], scales [..., K/group, N])``, as SGLang's
    ``marlin_weights`` / ``marlin_permute_scales`` compute them (for tests; SGLang repacks with its JIT
    ``gptq_marlin_repack``)."""
    import torch  # noqa: PLC0415

    *lead, k, n = q.shape
    perm = _marlin_weight_perm(torch).to(q.device)
    t = q.to(torch.int64).reshape(*lead, k // 16, 16, n // 16, 16).transpose(-3, -2)
    t = t.reshape(*lead, k // 16, n * 16)
    t = t.reshape(*lead, -1, perm.numel())[..., perm].reshape(*lead, k // 16, n * 16)
    packed = torch.zeros((*lead, k // 16, n * 2), dtype=torch.int64, device=q.device)
    for i in range(8):
        packed |= t[..., i::8] << (4 * i)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    sperm = _marlin_scale_perm(torch).to(q.device)
    s = scales.reshape(*lead, -1, sperm.numel())[..., sperm].reshape(scales.shape)
    return packed.contiguous(), s.contiguous()


def marlin_unpack(qweight, scales, size_k: int, size_n: int):
    """The inverse of ``marlin_pack``: ``(q int64 [..., K, N] in 0..15, scales [..., K/group, N])``."""
    import torch  # noqa: PLC0415

    *lead, _, _ = qweight.shape
    perm = _marlin_weight_perm(torch).to(qweight.device)
    words = qweight.to(torch.int64) & 0xFFFFFFFF
    t = torch.empty((*lead, size_k // 16, size_n * 16), dtype=torch.int64, device=qweight.device)
    for i in range(8):
        t[..., i::8] = (words >> (4 * i)) & 0xF
    flat = t.reshape(*lead, -1, perm.numel())
    unperm = torch.empty_like(flat)
    unperm[..., perm] = flat
    q = unperm.reshape(*lead, size_k // 16, size_n // 16, 16, 16).transpose(-3, -2)
    q = q.reshape(*lead, size_k, size_n)
    sperm = _marlin_scale_perm(torch).to(scales.device)
    sflat = scales.reshape(*lead, -1, sperm.numel())
    s = torch.empty_like(sflat)
    s[..., sperm] = sflat
    return q, s.reshape(scales.shape)


def dequantize(weights: ExpertWeights, experts=None):
    """float32 ``(W13 [n, 2I, hidden], W2 [n, hidden, I])`` of the listed experts (all when None)."""
    import torch  # noqa: PLC0415

    w = weights
    idx = torch.arange(w.experts, device=w.w13.device) if experts is None else experts.to(w.w13.device)
    g = w.group_size
    if w.impl == BF16:
        return w.w13[idx].float(), w.w2[idx].float()
    if w.impl == TRITON:

        def unpack(packed, scales):  # [n, N, K/2] uint8 -> [n, N, K]
            codes = torch.stack(((packed & 0xF), (packed >> 4)), dim=-1).reshape(*packed.shape[:-1], -1)
            return (codes.float() - INT4_BIAS) * scales.float().repeat_interleave(g, dim=-1)

        return unpack(w.w13[idx], w.w13_scale[idx]), unpack(w.w2[idx], w.w2_scale[idx])

    def unpack_marlin(packed, scales, k, n):  # -> [n_e, N, K]
        q, s = marlin_unpack(packed, scales, k, n)
        return ((q.float() - INT4_BIAS) * s.float().repeat_interleave(g, dim=-2)).transpose(-1, -2)

    h, i = w.hidden, w.intermediate
    return (
        unpack_marlin(w.w13[idx], w.w13_scale[idx], h, 2 * i),
        unpack_marlin(w.w2[idx], w.w2_scale[idx], i, h),
    )


# -------------------------------------------------------------------------------------------- routing


def expert_order(topk_ids, experts: int):
    """``(order, ends)``: ``order`` int64 ``[T*k]`` lists the flattened (token, slot) routes sorted by
    expert (stable: by route index within an expert); ``ends`` int32 ``[experts]`` is the cumulative route
    count (``torch._grouped_mm``'s ``offs``). No host synchronisation (CUDA-graph capturable)."""
    import torch  # noqa: PLC0415

    flat = topk_ids.reshape(-1).to(torch.int64)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(experts, dtype=torch.int32, device=flat.device)
    counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    return order, torch.cumsum(counts, 0, dtype=torch.int32)


def _grouped_mm_loop(a, b, offs):
    """What ``torch._grouped_mm(a [M, K], b [G, K, N], offs)`` computes, one group at a time (CPU tests;
    synchronises)."""
    import torch  # noqa: PLC0415

    out = torch.empty((a.shape[0], b.shape[-1]), dtype=a.dtype, device=a.device)
    start = 0
    for group, end in enumerate(offs.tolist()):
        out[start:end] = (a[start:end].float() @ b[group].float()).to(a.dtype)
        start = end
    return out


def grouped_moe(x, w13, w2, topk_ids, topk_weights, *, grouped_mm=None):
    """The bf16 grouped-GEMM MoE: routes sorted by expert (``expert_order``), ``h = x @ W13^T`` per group,
    ``a = silu(gate) * up`` (bf16), ``y_r = a @ W2^T`` per group, then ``y[t] = sum_k w[t,k] y_(t,k)``
    in float32, returned bf16. ``grouped_mm`` defaults to ``torch._grouped_mm``."""
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415

    mm = torch._grouped_mm if grouped_mm is None else grouped_mm
    tokens, top_k = topk_ids.shape
    experts, two_i, _ = w13.shape
    inter = two_i // 2
    order, ends = expert_order(topk_ids, experts)
    xs = x.index_select(0, order // top_k)  # [T*k, hidden], routes in expert order
    h = mm(xs, w13.transpose(1, 2), offs=ends)  # [T*k, 2I]
    a = F.silu(h[:, :inter]) * h[:, inter:]
    ys = mm(a, w2.transpose(1, 2), offs=ends)  # [T*k, hidden]
    routed = torch.empty_like(ys)
    routed.index_copy_(0, order, ys)
    y = (routed.view(tokens, top_k, -1).float() * topk_weights.float().unsqueeze(-1)).sum(dim=1)
    return y.to(torch.bfloat16)


# ----------------------------------------------------------------------------------------------- calls


def _check_call(torch, weights: ExpertWeights, x, topk_ids, topk_weights) -> None:
    if not isinstance(weights, ExpertWeights):
        raise ValueError(f"weights must come from make_expert_weights, got {type(weights).__name__}")
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != weights.hidden:
        raise ValueError(f"x must be bf16 [T, {weights.hidden}], got {x.dtype} {list(x.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids must be [T={x.shape[0]}, k], got {list(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(
            f"topk_weights {list(topk_weights.shape)} must match topk_ids {list(topk_ids.shape)}"
        )


def routed_experts(
    impl: str, weights: ExpertWeights, x, topk_ids, topk_weights, *, workspace=None, sglang_files=None
):
    """bf16 ``[T, hidden]``: the routed experts' output (module docstring) through ``impl``.

    ``topk_ids`` int32 (converted if not), ``topk_weights`` float32. ``workspace`` is accepted for API
    symmetry and unused: every impl allocates its scratch through PyTorch's caching allocator, as SGLang
    does (Marlin's lock workspace fresh each call, zeroed in-stream), which CUDA graph capture supports;
    no impl synchronises the host. Capture after one warm call (it builds the JIT kernels and Triton
    autotuning-free launches). ``sglang_files``: where SGLang's files are (first call only)."""
    del workspace
    _check_impl(impl)
    import torch  # noqa: PLC0415

    if weights.impl != impl:
        raise ValueError(f"weights are in {weights.impl}'s format, not {impl}'s")
    _check_call(torch, weights, x, topk_ids, topk_weights)
    ids = topk_ids if topk_ids.dtype == torch.int32 else topk_ids.to(torch.int32)
    w = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.to(torch.float32)
    if impl == BF16:
        return grouped_moe(x, weights.w13, weights.w2, ids, w)
    function = sglang.load_sglang_moe(impl, sglang_files)
    if impl == MARLIN:
        # as CompressedTensorsWNA16MarlinMoEMethod / the Marlin runner call it for a symmetric INT4
        # checkpoint without expert parallelism (router logits are only checked for their row count)
        return function(
            x,
            weights.w13,
            weights.w2,
            weights.w13_scale,
            weights.w2_scale,
            w,
            w,
            ids,
            global_num_experts=weights.experts,
            num_bits=4,
            is_k_full=True,
        )
    # fused_experts -> outplace_fused_experts -> fused_experts_impl, TP only (filter_expert is False when
    # every expert is local), no routed scaling factor in the MoE (K2.6 applies it outside)
    return function(
        x,
        weights.w13,
        weights.w2,
        w,
        ids,
        use_int4_w4a16=True,
        w1_scale=weights.w13_scale,
        w2_scale=weights.w2_scale,
        block_shape=[0, weights.group_size],
        filter_expert=False,
    )


def reference_moe(impl: str, weights: ExpertWeights, x, topk_ids, topk_weights):
    """float32 ``[T, hidden]``: the routed experts' output from ``impl``'s weights dequantised to float32
    (Marlin's permutations undone), one route at a time (``x`` taken as float32, no intermediate
    rounding)."""
    _check_impl(impl)
    import torch  # noqa: PLC0415

    if weights.impl != impl:
        raise ValueError(f"weights are in {weights.impl}'s format, not {impl}'s")
    _check_call(torch, weights, x, topk_ids, topk_weights)
    ids = topk_ids.to(torch.int64)
    used, local = torch.unique(ids, return_inverse=True)
    w13, w2 = dequantize(weights, used)
    w13, w2 = w13.to(x.device), w2.to(x.device)
    inter = weights.intermediate
    xf = x.float()
    y = torch.zeros((x.shape[0], weights.hidden), dtype=torch.float32, device=x.device)
    for k in range(ids.shape[1]):
        e = local[:, k]
        h = torch.einsum("th,tnh->tn", xf, w13[e])
        a = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        y += topk_weights[:, k].float().unsqueeze(-1) * torch.einsum("ti,thi->th", a, w2[e])
    return y


def describe_impl(impl: str, sglang_files=None) -> str:
    """What runs for ``impl`` (for result rows)."""
    _check_impl(impl)
    if impl == BF16:
        return "torch._grouped_mm (bf16), silu*up, weighted top-k sum in float32"
    root = sglang.sglang_moe_root(sglang_files)
    entry = "fused_marlin_moe" if impl == MARLIN else "fused_experts_impl(use_int4_w4a16, block_shape=[0, g])"
    return f"sglang {sglang.files_version(root) or 'unknown version'} {entry} (files from {root})"
