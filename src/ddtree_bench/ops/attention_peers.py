"""PyTorch peers for tree-verify attention in absorbed MLA (Kimi K2.6 / DeepSeek-V3 shapes): ``make_peer``.

The problem, per request ``b`` of a batch of ``B``:

- queries ``q[b]``: bf16 ``[N+1, H, 576]`` (512 latent dims, then 64 rope dims), one per tree node (the
  root is node 0);
- the latent KV cache ``kv[b]``: bf16 ``[T, 576]`` with ``T >= S_b + N + 1``. Rows ``0 .. S_b-1`` are the
  prefix, row ``S_b + i`` is tree node ``i``; rows past ``S_b + N`` are padding (they may hold NaN) and must
  never influence the output. Keys are whole rows, values their first 512 dims: one latent head shared by
  all ``H`` query heads;
- query ``i`` (every head) sees the ``S_b`` prefix keys and tree key ``j`` iff ``visibility[b, i, j]``
  (bool ``[B, N+1, N+1]``: row ``i`` marks ``i``'s ancestors and ``i`` itself);
- softmax scale ``1/sqrt(192)`` (the model's ``qk_nope + qk_rope`` head dim); output bf16
  ``[B, N+1, H, 512]``.

Peers (``PEERS``), each measured as PyTorch ships it (no tuning; FlexAttention takes ``kernel_options``
only when the caller gives them, and its ``backend`` then names them):

- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` with an explicit boolean mask; PyTorch
  picks the backend (``backend`` attribute of the returned callable).
- ``flexattention``: ``torch.nn.attention.flex_attention.flex_attention`` compiled by ``torch.compile``,
  with a ``BlockMask`` from a ``mask_mod`` that reads the prefix lengths and the visibility tensor.
- ``flashmla`` (optional extra): the ``flash_mla`` package's ``flash_mla_with_kvcache`` (either build:
  ``tokenspeed-flashmla`` for torch 2.11, SGLang's ``sgl-flash-mla`` for torch >= 2.14), the latent cache
  paged as it expects (64-token pages, a block table, cache lengths ``S_b + N + 1``, ``s_q = N + 1``),
  ``causal=True``. It has no tree mask: query ``i`` sees the prefix and tree keys ``0..i`` (the same bytes
  and nearly the same FLOPs, not the same answer), so its mask is ``CAUSAL_MASK`` and it is checked against
  float32 attention with that causal mask (``check_visibility``).
- ``sglang-triton`` (optional extra): SGLang's Triton ``extend_attention_fwd`` with ``custom_mask`` (the
  exact tree mask), what SGLang's Triton backend runs for tree verify. Its file is loaded from an installed
  ``sglang`` or a directory given as ``sglang_source`` without importing the ``sglang`` package itself
  (``load_sglang_extend_attention``).

Every peer's callable records the mask it applies (``mask``: ``TREE_MASK`` or ``CAUSAL_MASK``).

``make_peer`` does all setup (masks, layouts, compilation) and one warm call that proves the peer runs on
these shapes; the callable it returns does only the attention call. A peer that cannot run here raises
``PeerUnavailable`` (one-line reason); nothing falls back silently to another algorithm.

Layout choices made once during setup (untimed), the same for both peers:

- ``q`` is permuted to ``[B, H, N+1, 576]`` and made contiguous (the layout both APIs document);
- both peers read a private copy of ``kv[:, :T_used]`` (``T_used = max_b S_b + N + 1``) whose rows past
  ``S_b + N`` are zeroed. That is how NaN padding is kept out: a masked-out key still enters
  ``QK^T`` and, with a zero softmax weight, ``P V`` (``0 * NaN = NaN``) in the math and memory-efficient
  SDPA backends and in partial blocks of FlexAttention, so masking alone does not protect the output.
  The copy holds exactly the rows the unpadded cache would; the prefix and tree rows are unchanged.

The float32 reference the peers are checked against is ``ops.attention.reference_attention`` (one request at a
time), re-exported here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np

from ddtree_bench import catalog
from ddtree_bench.integrations import sglang
from ddtree_bench.integrations.sglang import SglangUnavailable, describe
from ddtree_bench.ops.attention import HEAD_DIM, SOFTMAX_SCALE, VALUE_DIM, reference_attention

FLASHMLA = catalog.FLASHMLA
SGLANG_TRITON, SGLANG_FA3 = catalog.SGLANG_TRITON_ATTENTION, catalog.SGLANG_FA3_ATTENTION
PEERS = (catalog.FLEXATTENTION, catalog.SDPA, FLASHMLA, SGLANG_TRITON, SGLANG_FA3)
#: what a peer's rows record as its mask: the exact tree mask, or FlashMLA's causal mask (no tree mask)
TREE_MASK, CAUSAL_MASK = "tree", "causal (no tree mask)"
PEER_MASKS = {
    catalog.FLEXATTENTION: TREE_MASK,
    catalog.SDPA: TREE_MASK,
    FLASHMLA: CAUSAL_MASK,
    SGLANG_TRITON: TREE_MASK,
    SGLANG_FA3: TREE_MASK,
}
__all__ = [
    "CAUSAL_MASK",
    "FLASHMLA",
    "PEERS",
    "PEER_MASKS",
    "SGLANG_FA3",
    "SGLANG_TRITON",
    "TREE_MASK",
    "PeerUnavailable",
    "check_visibility",
    "dense_mask",
    "find_sglang_kernel",
    "load_flash_mla",
    "FlashMlaAttention",
    "load_sglang_extend_attention",
    "make_peer",
    "reference_attention",
    "torch_unavailable_reason",
]
#: torch.compile's per-function recompile limit is raised to at least this, so that a grid of shapes never
#: hits the limit (past it Dynamo silently runs flex_attention eagerly, a different algorithm).
RECOMPILE_LIMIT = 1024


class PeerUnavailable(RuntimeError):
    """The peer cannot run these shapes here; the message (one line) says why."""

    def __init__(self, reason: str):
        super().__init__(" ".join(str(reason).split()))


def torch_unavailable_reason() -> str | None:
    """``None`` when PyTorch imports and sees a CUDA device, else why not (one line)."""
    try:
        import torch  # noqa: PLC0415
    except Exception as exc:  # ImportError, or a broken install
        return f"PyTorch is not installed or does not import ({describe(exc)}); pip install torch"
    try:
        available = torch.cuda.is_available()
    except Exception as exc:
        return f"PyTorch {torch.__version__} cannot query CUDA ({describe(exc)})"
    if not available:
        return f"PyTorch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
    return None


def _check_inputs(torch, q, kv, prefix_lengths, visibility) -> tuple[int, int, int, int, list[int]]:
    """``(B, N, H, T, prefix list)``; one-line ValueError for anything not of the documented form."""
    for name, tensor in (
        ("q", q),
        ("kv", kv),
        ("prefix_lengths", prefix_lengths),
        ("visibility", visibility),
    ):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor, got device {tensor.device}")
    if q.dtype != torch.bfloat16 or kv.dtype != torch.bfloat16:
        raise ValueError(f"q and kv must be bfloat16, got {q.dtype} and {kv.dtype}")
    if q.dim() != 4 or q.shape[-1] != HEAD_DIM:
        raise ValueError(f"q must be [B, N+1, H, {HEAD_DIM}], got {list(q.shape)}")
    batch, nodes, heads, _ = q.shape
    if kv.dim() != 3 or kv.shape[0] != batch or kv.shape[-1] != HEAD_DIM:
        raise ValueError(f"kv must be [B={batch}, T, {HEAD_DIM}], got {list(kv.shape)}")
    if prefix_lengths.dtype != torch.int32 or tuple(prefix_lengths.shape) != (batch,):
        raise ValueError(
            f"prefix_lengths must be int32 [B={batch}], "
            f"got {prefix_lengths.dtype} {list(prefix_lengths.shape)}"
        )
    if visibility.dtype != torch.bool or tuple(visibility.shape) != (batch, nodes, nodes):
        raise ValueError(
            f"visibility must be bool [B, N+1, N+1] = {[batch, nodes, nodes]}, "
            f"got {visibility.dtype} {list(visibility.shape)}"
        )
    if batch < 1 or nodes < 1 or heads < 1:
        raise ValueError(f"q must have B, N+1 and H >= 1, got {list(q.shape)}")
    prefix = [int(s) for s in prefix_lengths.tolist()]
    length = kv.shape[1]
    for b, s in enumerate(prefix):
        if s < 0 or s + nodes > length:
            raise ValueError(
                f"request {b}: prefix length {s} with N+1 = {nodes} tree rows needs 0 <= S and "
                f"S + N + 1 <= T = {length}"
            )
    return batch, nodes - 1, heads, length, prefix


def _sanitized_kv(torch, kv, prefix_lengths, nodes: int, used: int):
    """A private copy of ``kv[:, :used]`` with every row past ``S_b + N`` zeroed (module docstring)."""
    rows = torch.arange(used, device=kv.device)
    valid = rows[None, :] < (prefix_lengths.to(torch.int64)[:, None] + nodes)
    return torch.where(valid[..., None], kv[:, :used], torch.zeros((), dtype=kv.dtype, device=kv.device))


def dense_mask(prefix_lengths, visibility, used: int):
    """The boolean mask ``[B, 1, N+1, used]`` (True = attend): request ``b``'s query ``i`` sees key ``k``
    iff ``k < S_b``, or ``k = S_b + j`` with ``visibility[b, i, j]``; padding keys are never seen."""
    import torch  # noqa: PLC0415

    batch, nodes, _ = visibility.shape
    device = visibility.device
    keys = torch.arange(used, device=device)
    start = prefix_lengths.to(torch.int64)[:, None]  # [B, 1]
    prefix = keys[None, :] < start  # [B, used]
    mask = prefix[:, None, :].expand(batch, nodes, used).clone()  # [B, N+1, used]
    columns = (start + torch.arange(nodes, device=device)[None, :])[:, None, :].expand(batch, nodes, nodes)
    mask.scatter_(2, columns, visibility)
    return mask[:, None]


def _sdpa_backend(torch, query, key, value, mask, scale) -> str | None:
    """The SDPA backend PyTorch chooses for these inputs (``torch._fused_sdp_choice``), or None."""
    try:
        choice = int(torch._fused_sdp_choice(query, key, value, mask, 0.0, False, scale=scale))
        from torch.nn.attention import SDPBackend  # noqa: PLC0415

        for name, member in SDPBackend.__members__.items():
            if int(member) == choice:
                return name.lower()
        return f"backend #{choice}"
    except Exception:
        return None


def _raise_recompile_limits(torch) -> None:
    """At least ``RECOMPILE_LIMIT`` (newer names first; older torch calls them ``*cache_size_limit``)."""
    import torch._dynamo  # noqa: PLC0415

    config = torch._dynamo.config
    for names in (
        ("recompile_limit", "cache_size_limit"),
        ("accumulated_recompile_limit", "accumulated_cache_size_limit"),
    ):
        for name in names:
            if hasattr(config, name):
                setattr(config, name, max(int(getattr(config, name)), RECOMPILE_LIMIT))
                break


def _build_sdpa(torch, q_bhld, kv_used, mask, scale, heads: int):
    import torch.nn.functional as F  # noqa: PLC0415

    batch, used, _ = kv_used.shape
    key = kv_used[:, None, :, :].expand(batch, heads, used, HEAD_DIM)
    value = kv_used[:, None, :, :VALUE_DIM].expand(batch, heads, used, VALUE_DIM)
    sdpa = F.scaled_dot_product_attention

    def call():
        return sdpa(q_bhld, key, value, attn_mask=mask, scale=scale).transpose(1, 2)

    call.backend = _sdpa_backend(torch, q_bhld, key, value, mask, scale) or "chosen by PyTorch"
    return call


def _build_flex(torch, q_bhld, kv_used, prefix_lengths, visibility, scale, kernel_options):
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: PLC0415
    except ImportError as exc:
        raise PeerUnavailable(
            f"torch {torch.__version__} has no torch.nn.attention.flex_attention ({describe(exc)}); "
            "FlexAttention needs torch >= 2.5"
        ) from exc
    batch, heads, nodes, _ = q_bhld.shape
    used = kv_used.shape[1]
    last = nodes - 1
    prefix = prefix_lengths.to(torch.int32).contiguous()
    vis = visibility.contiguous()

    def mask_mod(b, h, q_idx, kv_idx):
        # Indices are clamped so that no lane reads outside `vis`; written with torch.where (the form
        # Inductor's C++ code generation also compiles; `|` / `&` of the loaded bool did not, torch 2.14).
        s = prefix[b]
        j = kv_idx - s
        visible = vis[b, q_idx.clamp(0, last), j.clamp(0, last)]
        return torch.where(kv_idx < s, True, torch.where((j >= 0) & (j <= last), visible, False))

    _raise_recompile_limits(torch)
    # compiled, as PyTorch recommends: the dense [B, N+1, T_used] mask is then never materialised
    block_mask = torch.compile(create_block_mask)(mask_mod, batch, None, nodes, used, device=q_bhld.device)

    gqa = "enable_gqa" in inspect.signature(flex_attention).parameters
    if gqa:
        key = kv_used[:, None, :, :]
        value = kv_used[:, None, :, :VALUE_DIM]
    else:
        key = kv_used[:, None, :, :].expand(batch, heads, used, HEAD_DIM)
        value = kv_used[:, None, :, :VALUE_DIM].expand(batch, heads, used, VALUE_DIM)
    kwargs = {"block_mask": block_mask, "scale": scale}
    if gqa:
        kwargs["enable_gqa"] = True
    if kernel_options:
        kwargs["kernel_options"] = dict(kernel_options)
    compiled = torch.compile(flex_attention, dynamic=False)

    def call():
        return compiled(q_bhld, key, value, **kwargs).transpose(1, 2)

    call.backend = "flex_attention (torch.compile, Triton)" + (", enable_gqa" if gqa else ", K/V expanded")
    if kernel_options:
        call.backend += ", kernel_options " + ", ".join(f"{k}={v}" for k, v in sorted(kernel_options.items()))
    call.block_mask = block_mask
    return call


# ------------------------------------------------------------------------------ optional extras: FlashMLA

#: FlashMLA's paged latent cache: pages of this many tokens (what flash_mla_with_kvcache's dense path expects)
FLASHMLA_PAGE = 64
#: the distributions that install the ``flash_mla`` package, either of which is accepted
FLASHMLA_DISTRIBUTIONS = ("tokenspeed-flashmla", "sgl-flash-mla")


def _distribution_of(package: str) -> str | None:
    """``name version`` of the installed distribution that provides ``package``, or None."""
    try:
        from importlib import metadata  # noqa: PLC0415

        names = metadata.packages_distributions().get(package) or []
        for name in names:
            return f"{name} {metadata.version(name)}"
    except Exception:
        return None
    return None


def load_flash_mla():
    """``(flash_mla module, "distribution version")``; ``PeerUnavailable`` (one line) where the package does
    not import or lacks ``flash_mla_with_kvcache`` / ``get_mla_metadata``."""
    try:
        import flash_mla  # noqa: PLC0415
    except Exception as exc:  # ImportError, or a build for another torch / CUDA (undefined symbols)
        raise PeerUnavailable(
            f"{FLASHMLA}: the flash_mla package does not import ({describe(exc)}); install "
            "tokenspeed-flashmla (a build for torch 2.11) or sgl-flash-mla (torch >= 2.14)"
        ) from exc
    missing = [n for n in ("flash_mla_with_kvcache", "get_mla_metadata") if not hasattr(flash_mla, n)]
    if missing:
        raise PeerUnavailable(f"{FLASHMLA}: this flash_mla has no {', '.join(missing)}")
    label = _distribution_of("flash_mla") or f"flash_mla {getattr(flash_mla, '__version__', '?')}"
    return flash_mla, label


def _build_flashmla(torch, q, kv_used, prefix_lengths, scale, heads: int):
    """FlashMLA's dense decode on the same inputs, causal (no tree mask): the cache copied once into pages of
    ``FLASHMLA_PAGE`` tokens (request ``b``'s pages in order, the block table saying which), cache lengths
    ``S_b + N + 1``, ``s_q = N + 1`` queries a request (the last ``N + 1`` positions)."""
    module, label = load_flash_mla()
    batch, used, _ = kv_used.shape
    nodes = q.shape[1]
    pages = -(-used // FLASHMLA_PAGE)
    cache = torch.zeros((batch, pages * FLASHMLA_PAGE, HEAD_DIM), dtype=kv_used.dtype, device=kv_used.device)
    cache[:, :used] = kv_used
    k_cache = cache.view(batch * pages, FLASHMLA_PAGE, 1, HEAD_DIM)
    block_table = torch.arange(batch * pages, dtype=torch.int32, device=q.device).view(batch, pages)
    seqlens = (prefix_lengths.to(torch.int32) + nodes).contiguous()
    query = q.contiguous()
    # the scheduling metadata: current builds return an empty holder that the first call fills (the warm
    # call in make_peer, untimed) and later calls reuse; older builds computed it here from these arguments
    meta, splits = module.get_mla_metadata(seqlens, nodes * heads, 1)
    run = module.flash_mla_with_kvcache

    def call():
        out, _lse = run(
            query, k_cache, block_table, seqlens, VALUE_DIM, meta, splits, softmax_scale=scale, causal=True
        )
        return out

    call.backend = f"{label}, flash_mla_with_kvcache (bf16 pages of {FLASHMLA_PAGE}, causal=True)"
    call.k_cache = k_cache
    return call


class FlashMlaAttention:
    """FlashMLA as a verify forward's attention (``k26.target.TargetShard.add_attention``), causal: what a
    linear chain's verify needs (its block's tokens see the prefix and the tokens before them). The cache
    must hold a multiple of ``FLASHMLA_PAGE`` rows a request (``ShardOptions(kv_align=64)``): it is read in
    place as pages, request ``b``'s in order. The scheduling metadata is made once per shape."""

    def __init__(self):
        self.module, label = load_flash_mla()
        self.describe = f"{label}, flash_mla_with_kvcache (pages of {FLASHMLA_PAGE}, causal=True)"

    def prepare(self, q, kv, prefix_lengths, mask, out):
        import torch  # noqa: PLC0415

        del mask  # causal: no mask
        batch, rows, _ = kv.shape
        if rows % FLASHMLA_PAGE:
            raise ValueError(f"{FLASHMLA}: the cache needs a multiple of {FLASHMLA_PAGE} rows, got {rows}")
        nodes, heads = q.shape[1], q.shape[2]
        pages = rows // FLASHMLA_PAGE
        key = (batch, rows, nodes, heads)
        if getattr(self, "_key", None) != key:
            seqlens = torch.as_tensor(
                [int(s) + nodes for s in prefix_lengths], dtype=torch.int32, device=q.device
            )
            table = torch.arange(batch * pages, dtype=torch.int32, device=q.device).view(batch, pages)
            meta, splits = self.module.get_mla_metadata(seqlens, nodes * heads, 1)
            self._key, self._shared = key, (seqlens, table, meta, splits)
        k_cache = kv.view(batch * pages, FLASHMLA_PAGE, 1, HEAD_DIM)
        return _PreparedFlashMla(self.module.flash_mla_with_kvcache, self._shared, q, k_cache, out)


class _PreparedFlashMla:
    def __init__(self, run, shared, q, k_cache, out):
        self.run, self.shared, self.q, self.k_cache, self.out = run, shared, q, k_cache, out

    def launch(self, stream=None) -> None:
        del stream  # torch's current stream
        seqlens, table, meta, splits = self.shared
        o, _lse = self.run(
            self.q,
            self.k_cache,
            table,
            seqlens,
            VALUE_DIM,
            meta,
            splits,
            softmax_scale=SOFTMAX_SCALE,
            causal=True,
        )
        self.out.copy_(o)


# ----------------------------------------------------------------------- optional extras: SGLang's Triton


def _peer_loads(name: str, load, source=None):
    """``load(source)`` (SGLang's loading, ``integrations.sglang``), its ``SglangUnavailable`` as this peer's
    ``PeerUnavailable`` (the same line, the peer's name first); a bad ``source`` stays a ``ValueError``."""
    try:
        return load(source)
    except SglangUnavailable as exc:
        raise PeerUnavailable(f"{name}: {exc}") from exc


def find_sglang_kernel(source=None):
    """``(root, relative path)`` of SGLang's Triton extend-attention file (``sglang.find_attention_file``):
    ``ValueError`` for a ``source`` without it, ``PeerUnavailable`` where no installed ``sglang`` has it."""
    return _peer_loads(SGLANG_TRITON, sglang.find_attention_file, source)


def load_sglang_extend_attention(source=None):
    """``(extend_attention_fwd, description)`` from SGLang's file, loaded without importing the ``sglang``
    package (``sglang.load_extend_attention``); once per file and process. ``ValueError`` for a bad
    ``source``; ``PeerUnavailable`` (one line) where it cannot load (a file it needs missing, no Triton)."""
    return _peer_loads(SGLANG_TRITON, sglang.load_extend_attention, source)


def _build_sglang_fa3(torch, q, kv_used, prefix_lengths, visibility, scale, source=None):
    """SGLang's FA3 tree verify as its DDTree fork's FA3 backend runs it (``ops.sglang_verify.Fa3Attention``:
    a non-causal prefix pass, a pass of each query over its visible tree rows, SGLang's merge). The
    metadata (each query's visible tree slots) is made once here, as a round makes it once for all its
    layers; a call is one layer's (the gather of the tree rows, both passes, the two LSE transposes and the
    merge). ``source``: SGLang's files (the wheel's ``merge_state_triton``)."""
    from ddtree_bench.ops import sglang_verify  # noqa: PLC0415

    if scale != SOFTMAX_SCALE:
        raise ValueError(f"{SGLANG_FA3} runs at the softmax scale {SOFTMAX_SCALE}, not {scale}")
    try:
        fa3 = sglang_verify.Fa3Attention(source)
    except SglangUnavailable as exc:
        raise PeerUnavailable(f"{SGLANG_FA3}: {exc}") from exc
    batch, nodes, heads, _ = q.shape
    prefix = [int(s) for s in prefix_lengths.tolist()]
    mask = sglang_verify.VerifyMask(prefix, nodes, q.device)
    mask.build(visibility)
    width = int(visibility.sum(-1).max())  # the deepest path + 1
    out = torch.empty((batch, nodes, heads, VALUE_DIM), dtype=q.dtype, device=q.device)
    prepared = fa3.prepare(q, kv_used, prefix, mask, out, width)

    def call():
        prepared.launch()
        return out

    call.backend = fa3.describe
    return call


def _build_sglang_triton(torch, q, kv_used, prefix_lengths, visibility, scale, heads: int, source):
    """SGLang's ``extend_attention_fwd`` as its Triton backend calls it for tree verify: the tree's queries
    and keys as the extend part, the prefix read from the cache through ``kv_indices`` (page size 1), and
    the ``custom_mask`` of SGLang's layout (per request ``[N+1, S_b + N + 1]`` bytes, prefix columns set,
    the tree's visibility in the last ``N + 1`` columns), ``is_causal=True``, ``skip_prefix_custom_mask``."""
    fwd, label = load_sglang_extend_attention(source)
    batch, used, _ = kv_used.shape
    nodes = q.shape[1]
    device = q.device
    prefix = prefix_lengths.to(torch.int64)
    rows = prefix[:, None] + torch.arange(nodes, device=device)[None, :]  # [B, N+1] tree rows
    k_extend = torch.gather(kv_used, 1, rows[..., None].expand(batch, nodes, HEAD_DIM))
    k_extend = k_extend.reshape(batch * nodes, 1, HEAD_DIM).contiguous()
    v_extend = k_extend[..., :VALUE_DIM].contiguous()
    k_buffer = kv_used.reshape(batch * used, 1, HEAD_DIM)
    v_buffer = k_buffer[..., :VALUE_DIM]
    q_extend = q.reshape(batch * nodes, heads, HEAD_DIM).contiguous()
    out = torch.empty((batch * nodes, heads, VALUE_DIM), dtype=q.dtype, device=device)
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=device) * nodes
    kv_indptr = torch.cat([zero, torch.cumsum(prefix, 0)]).to(torch.int32)
    starts = torch.arange(batch, device=device) * used
    kv_indices = torch.cat(
        [torch.arange(int(s), device=device) + starts[b] for b, s in enumerate(prefix.tolist())]
    ).to(torch.int64)
    masks = []  # bool, as SGLang's tree builders give it
    for b, s in enumerate(prefix.tolist()):
        mask = torch.ones((nodes, int(s) + nodes), dtype=torch.bool, device=device)
        mask[:, int(s) :] = visibility[b]
        masks.append(mask.reshape(-1))
    custom_mask = torch.cat(masks)
    mask_indptr = torch.cat([zero, torch.cumsum(nodes * (prefix + nodes), 0)]).to(torch.int64)

    def call():
        fwd(
            q_extend,
            k_extend,
            v_extend,
            out,
            k_buffer,
            v_buffer,
            qo_indptr,
            kv_indptr,
            kv_indices,
            custom_mask,
            True,
            mask_indptr,
            nodes,
            1.0,
            1.0,
            sm_scale=scale,
            skip_prefix_custom_mask=True,
        )
        return out.view(batch, nodes, heads, VALUE_DIM)

    call.backend = (
        f"{label}, extend_attention_fwd (custom_mask, is_causal=True, skip_prefix_custom_mask=True)"
    )
    return call


def check_visibility(name: str, visibility):
    """The tree-key visibility the float32 check of peer ``name`` (or ``ours``) uses: the mask it applies.
    The tree's own (numpy or torch ``[B, N+1, N+1]``), or for FlashMLA's causal mask the lower triangle
    (query ``i`` sees tree keys ``0..i``)."""
    if PEER_MASKS.get(name, TREE_MASK) != CAUSAL_MASK:
        return visibility
    batch, nodes, _ = visibility.shape
    return np.broadcast_to(np.tril(np.ones((nodes, nodes), dtype=bool)), (batch, nodes, nodes)).copy()


def _build_call(torch, name: str, q, kv_used, prefix_lengths, visibility, scale: float, options: dict):
    """Peer ``name``'s callable on the sanitised cache (``make_peer``'s setup; ``options``: its
    ``kernel_options`` and ``sglang_source``). ``q`` is permuted to ``[B, H, N+1, 576]`` for the PyTorch
    peers (module docstring)."""
    heads, used = q.shape[2], kv_used.shape[1]
    if name == FLASHMLA:
        return _build_flashmla(torch, q, kv_used, prefix_lengths, scale, heads)
    if name == SGLANG_FA3:
        source = options.get("sglang_source")
        return _build_sglang_fa3(torch, q, kv_used, prefix_lengths, visibility, scale, source)
    if name == SGLANG_TRITON:
        source = options["sglang_source"]
        return _build_sglang_triton(torch, q, kv_used, prefix_lengths, visibility, scale, heads, source)
    q_bhld = q.permute(0, 2, 1, 3).contiguous()
    if name == catalog.SDPA:
        mask = dense_mask(prefix_lengths, visibility, used)
        return _build_sdpa(torch, q_bhld, kv_used, mask, scale, heads)
    return _build_flex(torch, q_bhld, kv_used, prefix_lengths, visibility, scale, options["kernel_options"])


def make_peer(
    name: str,
    q,
    kv,
    prefix_lengths,
    visibility,
    *,
    scale: float | None = None,
    kernel_options: dict | None = None,
    sglang_source=None,
) -> Callable:
    """A zero-argument callable that runs peer ``name`` on these inputs and returns ``[B, N+1, H, 512]``
    bf16 (a view of the peer's ``[B, H, N+1, 512]`` output).

    Inputs (module docstring): ``q`` bf16 ``[B, N+1, H, 576]``, ``kv`` bf16 ``[B, T, 576]``,
    ``prefix_lengths`` int32 ``[B]``, ``visibility`` bool ``[B, N+1, N+1]``, all CUDA tensors. ``scale``
    defaults to ``1/sqrt(192)``. ``kernel_options`` is passed to ``flex_attention`` only when given
    (FlexAttention only; the default is PyTorch's own choice). ``sglang_source``: where ``sglang-triton``
    finds SGLang's files (``find_sglang_kernel``; None: the installed ``sglang``).

    All setup and one warm call (synchronised) happen here. The callable has attributes ``peer`` (the
    name), ``backend`` (which kernel runs, where known), ``mask`` (the mask it applies: ``TREE_MASK`` or
    ``CAUSAL_MASK``), ``shape`` (B, N, H, T_used) and ``kv_used`` (the sanitised cache it reads). Raises
    ``ValueError`` for an unknown name, malformed inputs or a ``sglang_source`` without SGLang's file, and
    ``PeerUnavailable`` (one-line reason) when PyTorch or its CUDA device is missing, FlexAttention is not
    in this torch, an optional extra (``flash_mla``, SGLang's file) does not load, the peer raises for these
    head dims, or it runs out of memory.
    """
    if name not in PEERS:
        raise ValueError(f"unknown attention peer {name!r}; expected one of {list(PEERS)}")
    if name == SGLANG_TRITON and sglang_source is not None:
        find_sglang_kernel(sglang_source)  # a bad path given by the user: ValueError, here or not
    reason = torch_unavailable_reason()
    if reason is not None:
        raise PeerUnavailable(f"{name}: {reason}")
    import torch  # noqa: PLC0415

    scale = SOFTMAX_SCALE if scale is None else float(scale)
    if kernel_options is not None and name != catalog.FLEXATTENTION:
        raise ValueError("kernel_options applies to the flexattention peer only")
    batch, budget, heads, _length, prefix = _check_inputs(torch, q, kv, prefix_lengths, visibility)
    nodes = budget + 1
    used = max(prefix) + nodes
    shape = f"B={batch} N={budget} H={heads} T_used={used} (qk {HEAD_DIM}, v {VALUE_DIM})"
    # No torch.no_grad() here: the inputs need no grad, and the timed calls must run under the same grad
    # mode as the warm call (Dynamo guards on it; a mismatch would recompile inside the timed calls).
    try:
        kv_used = _sanitized_kv(torch, kv, prefix_lengths, nodes, used)
        options = {"kernel_options": kernel_options, "sglang_source": sglang_source}
        call = _build_call(torch, name, q, kv_used, prefix_lengths, visibility, scale, options)
        out = call()
        torch.cuda.synchronize(q.device)
    except PeerUnavailable:
        raise
    except torch.cuda.OutOfMemoryError as exc:
        torch.cuda.empty_cache()
        raise PeerUnavailable(f"{name} ran out of GPU memory at {shape}") from exc
    except Exception as exc:
        torch.cuda.empty_cache()
        raise PeerUnavailable(f"{name} failed at {shape}: {describe(exc)}") from exc
    expected = (batch, nodes, heads, VALUE_DIM)
    if tuple(out.shape) != expected:
        raise RuntimeError(f"{name} returned shape {list(out.shape)}, expected {list(expected)}")
    del out
    call.peer = name
    call.mask = PEER_MASKS[name]
    call.shape = (batch, budget, heads, used)
    call.kv_used = kv_used
    return call
