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

The float32 reference the peers are checked against is ``attention.reference_attention`` (one request at a
time), re-exported here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from ddtree_bench.attention import HEAD_DIM, SOFTMAX_SCALE, VALUE_DIM, reference_attention

PEERS = ("flexattention", "sdpa")
__all__ = [
    "PEERS",
    "PeerUnavailable",
    "dense_mask",
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
        import torch
    except Exception as exc:  # ImportError, or a broken install
        return f"PyTorch is not installed or does not import ({_describe(exc)}); pip install torch"
    try:
        available = torch.cuda.is_available()
    except Exception as exc:
        return f"PyTorch {torch.__version__} cannot query CUDA ({_describe(exc)})"
    if not available:
        return f"PyTorch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
    return None


def _describe(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` (with the next line where the first only introduces it, as
    Dynamo's "backend='inductor' raised:" does), truncated to ``limit`` characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):  # e.g. "backend='inductor' raised:" and the cause below
        lines[0] = f"{lines[0]} {lines[1]}"
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    import torch

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
        from torch.nn.attention import SDPBackend

        for name, member in SDPBackend.__members__.items():
            if int(member) == choice:
                return name.lower()
        return f"backend #{choice}"
    except Exception:
        return None


def _raise_recompile_limits(torch) -> None:
    """At least ``RECOMPILE_LIMIT`` (newer names first; older torch calls them ``*cache_size_limit``)."""
    import torch._dynamo

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
    import torch.nn.functional as F

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
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as exc:
        raise PeerUnavailable(
            f"torch {torch.__version__} has no torch.nn.attention.flex_attention ({_describe(exc)}); "
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


def make_peer(
    name: str,
    q,
    kv,
    prefix_lengths,
    visibility,
    *,
    scale: float | None = None,
    kernel_options: dict | None = None,
) -> Callable:
    """A zero-argument callable that runs peer ``name`` on these inputs and returns ``[B, N+1, H, 512]``
    bf16 (a view of the peer's ``[B, H, N+1, 512]`` output).

    Inputs (module docstring): ``q`` bf16 ``[B, N+1, H, 576]``, ``kv`` bf16 ``[B, T, 576]``,
    ``prefix_lengths`` int32 ``[B]``, ``visibility`` bool ``[B, N+1, N+1]``, all CUDA tensors. ``scale``
    defaults to ``1/sqrt(192)``. ``kernel_options`` is passed to ``flex_attention`` only when given
    (FlexAttention only; the default is PyTorch's own choice).

    All setup and one warm call (synchronised) happen here. The callable has attributes ``peer`` (the
    name), ``backend`` (which kernel runs, where known), ``shape`` (B, N, H, T_used) and ``kv_used`` (the
    sanitised cache it reads). Raises ``ValueError`` for an unknown name or malformed inputs, and
    ``PeerUnavailable`` (one-line reason) when PyTorch or its CUDA device is missing, FlexAttention is not
    in this torch, the peer raises for these head dims, or it runs out of memory.
    """
    if name not in PEERS:
        raise ValueError(f"unknown attention peer {name!r}; expected one of {list(PEERS)}")
    reason = torch_unavailable_reason()
    if reason is not None:
        raise PeerUnavailable(f"{name}: {reason}")
    import torch

    scale = SOFTMAX_SCALE if scale is None else float(scale)
    if kernel_options is not None and name != "flexattention":
        raise ValueError("kernel_options applies to the flexattention peer only")
    batch, budget, heads, _length, prefix = _check_inputs(torch, q, kv, prefix_lengths, visibility)
    nodes = budget + 1
    used = max(prefix) + nodes
    shape = f"B={batch} N={budget} H={heads} T_used={used} (qk {HEAD_DIM}, v {VALUE_DIM})"
    # No torch.no_grad() here: the inputs need no grad, and the timed calls must run under the same grad
    # mode as the warm call (Dynamo guards on it; a mismatch would recompile inside the timed calls).
    try:
        kv_used = _sanitized_kv(torch, kv, prefix_lengths, nodes, used)
        q_bhld = q.permute(0, 2, 1, 3).contiguous()
        if name == "sdpa":
            mask = dense_mask(prefix_lengths, visibility, used)
            call = _build_sdpa(torch, q_bhld, kv_used, mask, scale, heads)
        else:
            call = _build_flex(torch, q_bhld, kv_used, prefix_lengths, visibility, scale, kernel_options)
        out = call()
        torch.cuda.synchronize(q.device)
    except PeerUnavailable:
        raise
    except torch.cuda.OutOfMemoryError as exc:
        torch.cuda.empty_cache()
        raise PeerUnavailable(f"{name} ran out of GPU memory at {shape}") from exc
    except Exception as exc:
        torch.cuda.empty_cache()
        raise PeerUnavailable(f"{name} failed at {shape}: {_describe(exc)}") from exc
    expected = (batch, nodes, heads, VALUE_DIM)
    if tuple(out.shape) != expected:
        raise RuntimeError(f"{name} returned shape {list(out.shape)}, expected {list(expected)}")
    del out
    call.peer = name
    call.shape = (batch, budget, heads, used)
    call.kv_used = kv_used
    return call
