"""Small inputs for the GPU tests and tools: top-k arrays (numpy only) and verify-attention tensors (PyTorch,
imported where used)."""

from __future__ import annotations

import numpy as np

# every input kind topk_inputs makes, for tests that run all of them
KINDS = ("uniform", "peaked", "bf16", "equal", "tied", "tiny", "certain", "rounding")

# (batch, depth L, K, budget N) at the shape edges the emulated kernels are checked on
EMULATOR_SHAPE_EDGES = [
    (3, 1, 5, 8),  # L = 1: siblings only
    (2, 2, 3, 64),  # heap drain: 2 + 4 + ... < N
    (2, 32, 2, 128),  # the deepest trees (8-bit levels in all four of the warp heap's rank words)
    (2, 32, 200, 33),  # K > N, deep
    (5, 8, 1, 8),  # K = 1: a chain
    (1, 1, 1, 1),
    (3, 20, 3, 65),
]


def _bf16(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def topk_inputs(kind: str, batch: int, depth: int, k: int, vocab: int = 4096, seed: int = 0):
    """``(top_log_probs float32 [B, L, K], top_token_ids int64 [B, L, K])``.

    kinds: uniform (softmax of Gaussian logits), peaked (confident early positions), bf16 (logits and
    log-probs rounded through bfloat16: many exact ties), equal (all-equal rows), tied (few distinct
    values), tiny (log-probs near zero and very negative together: a wide span of magnitudes), certain (a
    top log-prob of exactly 0.0 at every position -- a token of probability 1 in float32 -- so a whole chain
    of nodes ties with its ancestors at score 0; -0.0 in every other request, which must tie with 0.0),
    rounding (made so the heap's sibling step ``logw - lp[r] + lp[r+1]`` rounds differently from the direct
    sum ``logw_parent + lp[r+1]``: the first row starts with a few -1.0, the second with -2^-53 and
    -1.5 2^-53, so a builder that scores siblings by the direct sum orders some paths differently from the
    heap)."""
    rng = np.random.default_rng(seed)
    vocab = max(vocab, k)
    if kind == "equal":
        lp = np.full((batch, depth, k), -np.log(vocab), np.float32)
        ids = np.tile(np.arange(k, dtype=np.int64), (batch, depth, 1))
        return lp, ids
    if kind == "rounding":
        lp = np.empty((batch, depth, k), np.float32)
        for b in range(batch):
            ones, tiny = min(k, 2 + b % 3), min(k, 2)
            lp[b, 0] = [-1.0] * ones + [-5.0 - r for r in range(k - ones)]
            lp[b, 1:] = [-2.0 - 0.5 * r for r in range(k)]
            if depth > 1:  # few near-ties, so the parallel path keeps them all in its pool
                lp[b, 1, :tiny] = [-(2.0**-53) * (1.0 + 0.5 * r) for r in range(tiny)]
        ids = np.tile(np.arange(k, dtype=np.int64), (batch, depth, 1))
        return lp, ids
    if kind == "tied":
        lp = -np.sort(rng.choice([0.5, 1.0, 1.5, 2.0, 4.0], size=(batch, depth, k)), axis=-1).astype(
            np.float32
        )
        ids = np.stack([rng.permutation(vocab)[:k] for _ in range(batch * depth)]).reshape(batch, depth, k)
        return lp, ids.astype(np.int64)
    logits = rng.standard_normal((batch, depth, vocab)).astype(np.float64)
    if kind == "peaked":
        boost = 12.0 * np.exp(-np.arange(depth) / 4.0)
        top = rng.integers(0, vocab, size=(batch, depth))
        np.put_along_axis(logits, top[..., None], boost[None, :, None] + 3.0, axis=-1)
    elif kind in ("tiny", "certain"):
        top = rng.integers(0, vocab, size=(batch, depth))
        np.put_along_axis(logits, top[..., None], 40.0 if kind == "tiny" else 200.0, axis=-1)
    if kind == "bf16":
        logits = _bf16(logits.astype(np.float32)).astype(np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) + logits.max(
        -1, keepdims=True
    )
    logp = (logits - logz).astype(np.float32)
    if kind == "bf16":
        logp = _bf16(logp)
    logp = np.minimum(logp, 0.0)
    order = np.argsort(-logp, axis=-1, kind="stable")[..., :k]
    lp = np.take_along_axis(logp, order, axis=-1).astype(np.float32)
    if kind == "certain":
        lp[1::2] = np.where(lp[1::2] == 0.0, np.float32(-0.0), lp[1::2])
    return np.ascontiguousarray(lp), np.ascontiguousarray(order.astype(np.int64))


def random_case(trees, heads, prefix, seed=0, pad=7):
    """Verify-attention inputs for ``trees``: q, kv (``pad`` rows past the longest request, NaN past every
    request's S + N + 1) and out (NaN) on the GPU, as bf16 torch tensors."""
    import torch  # noqa: PLC0415

    from ddtree_bench.ops.attention import HEAD_DIM, VALUE_DIM  # noqa: PLC0415

    gen = torch.Generator(device="cuda").manual_seed(seed)
    batch, q1 = trees.batch_size, trees.budget + 1
    prefix = np.asarray(prefix, np.int64)
    rows = int(prefix.max()) + q1 + pad
    q = torch.randn((batch, q1, heads, HEAD_DIM), generator=gen, device="cuda").to(torch.bfloat16)
    kv = torch.randn((batch, rows, HEAD_DIM), generator=gen, device="cuda").to(torch.bfloat16)
    for b in range(batch):
        kv[b, int(prefix[b]) + q1 :] = float("nan")
    out = torch.full((batch, q1, heads, VALUE_DIM), float("nan"), device="cuda", dtype=torch.bfloat16)
    return q, kv, out


def probe_call(batch: int, budget: int, prefix: int, heads: int = 8):
    """One verify-attention call for the probes in tools/: peaked trees of depth 16 (the native builder),
    every request at ``prefix``; ``(q, kv, lengths, bits, out, nbytes)`` with q, kv and out bf16 torch
    tensors on the GPU, the packed mask bits as int32 and ``nbytes`` the call's bytes."""
    import torch  # noqa: PLC0415

    from ddtree_bench.builders import get_builder  # noqa: PLC0415
    from ddtree_bench.ops.attention import HEAD_DIM, VALUE_DIM, attention_bytes  # noqa: PLC0415
    from ddtree_bench.tree import packed_visibility  # noqa: PLC0415

    logits, ids = topk_inputs("peaked", batch, 16, budget, seed=1)
    bits_host = packed_visibility(get_builder("native").build(logits, ids, budget).visibility)
    bits = torch.as_tensor(bits_host.view(np.int32), device="cuda")
    tokens = budget + 1
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn((batch, tokens, heads, HEAD_DIM), generator=gen, device="cuda").to(torch.bfloat16)
    kv = torch.randn((batch, prefix + tokens, HEAD_DIM), generator=gen, device="cuda").to(torch.bfloat16)
    lengths = np.full(batch, prefix)
    out = torch.empty((batch, tokens, heads, VALUE_DIM), device="cuda", dtype=torch.bfloat16)
    return q, kv, lengths, bits, out, attention_bytes(lengths, tokens, heads, bits_host.shape[-1])
