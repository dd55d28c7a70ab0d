"""PyTorch peers for tree-verify attention: they refuse clearly where they cannot run (no torch, no GPU,
unknown name), and on a GPU each matches a float32 reference within bf16 tolerance, padding NaN included."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from ddtree_bench.integrations.sglang import describe
from ddtree_bench.ops import attention_peers
from ddtree_bench.ops.attention_peers import PEERS, PeerUnavailable, make_peer

TORCH_REASON = attention_peers.torch_unavailable_reason()
needs_torch_gpu = pytest.mark.skipif(
    TORCH_REASON is not None, reason=f"needs PyTorch with a CUDA GPU: {TORCH_REASON}"
)


def test_peer_names():
    assert PEERS == ("flexattention", "sdpa", "flashmla", "sglang-triton", "sglang-fa3")  # see test_peers.py
    assert issubclass(PeerUnavailable, RuntimeError)


def test_module_imports_and_refuses_without_torch():
    """With torch made unimportable, both modules import, and make_peer says why it cannot run."""
    code = """
import json, sys
sys.modules["torch"] = None  # "import torch" now raises ImportError
from ddtree_bench.ops import attention_peers
from ddtree_bench.stages import peaks
out = {"reason": attention_peers.torch_unavailable_reason()}
out["torch_loaded"] = sys.modules.get("torch") is not None
try:
    attention_peers.make_peer("sdpa", None, None, None, None)
except attention_peers.PeerUnavailable as exc:
    out["sdpa"] = str(exc)
try:
    attention_peers.make_peer("flash", None, None, None, None)
except ValueError as exc:
    out["unknown"] = str(exc)
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["torch_loaded"]
    assert "PyTorch is not installed" in out["reason"]
    assert out["sdpa"].startswith("sdpa: PyTorch is not installed") and "\n" not in out["sdpa"]
    assert "unknown attention peer 'flash'" in out["unknown"]


def test_unknown_peer_is_a_value_error():
    with pytest.raises(ValueError, match=r"unknown attention peer 'flash'.*flexattention"):
        make_peer("flash", None, None, None, None)


@pytest.mark.parametrize("name", PEERS)
def test_peer_unavailable_carries_the_reason(monkeypatch, name):
    monkeypatch.setattr(attention_peers, "torch_unavailable_reason", lambda: "no CUDA here\n(test)")
    with pytest.raises(PeerUnavailable) as info:
        make_peer(name, None, None, None, None)
    assert str(info.value) == f"{name}: no CUDA here (test)"


def test_reason_is_one_line():
    assert str(PeerUnavailable("a\n  b\tc")) == "a b c"
    nested = RuntimeError("backend='inductor' raised:\nOutOfResources: smem\nmore")
    assert describe(nested) == "RuntimeError: backend='inductor' raised: OutOfResources: smem"
    assert describe(KeyError()) == "KeyError"


# --- on a GPU -------------------------------------------------------------------------------------------


def ancestor_visibility(rng: np.random.Generator, nodes: int) -> np.ndarray:
    """A valid [nodes, nodes] ancestor mask from a random parents array (parent[i] < i)."""
    vis = np.zeros((nodes, nodes), dtype=bool)
    vis[0, 0] = True
    for i in range(1, nodes):
        parent = int(rng.integers(0, i))
        vis[i] = vis[parent]
        vis[i, i] = True
    return vis


def make_case(batch=2, budget=7, heads=8, prefix=(40, 100), extra=5, seed=0, nan_padding=True):
    """Unit-scale random bf16 inputs on the GPU; kv rows past S_b + N are NaN (they must not matter)."""
    import torch  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    nodes = budget + 1
    length = max(prefix) + nodes + extra
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, nodes, heads, 576, device="cuda", generator=gen).to(torch.bfloat16)
    kv = torch.randn(batch, length, 576, device="cuda", generator=gen).to(torch.bfloat16)
    if nan_padding:
        for b, s in enumerate(prefix):
            kv[b, s + nodes :] = float("nan")
    vis = np.stack([ancestor_visibility(rng, nodes) for _ in range(batch)])
    prefix_lengths = torch.tensor(prefix, dtype=torch.int32, device="cuda")
    visibility = torch.from_numpy(vis).to("cuda")
    return q, kv, prefix_lengths, visibility


def naive_reference(q, kv, prefix_lengths, visibility, scale=None):
    """Float32, one request and one query at a time: the definition, written out."""
    import torch  # noqa: PLC0415

    scale = 1 / math.sqrt(192) if scale is None else scale
    batch, nodes, heads, _ = q.shape
    out = torch.empty(batch, nodes, heads, 512, dtype=torch.float32, device=q.device)
    for b in range(batch):
        s = int(prefix_lengths[b])
        for i in range(nodes):
            keys = [*range(s), *(s + j for j in range(nodes) if bool(visibility[b, i, j]))]
            k = kv[b, keys].float()  # [K, 576]
            p = torch.softmax((q[b, i].float() @ k.T) * scale, dim=-1)  # [H, K]
            out[b, i] = p @ k[:, :512]
    return out


@needs_torch_gpu
def test_reference_matches_the_definition():
    q, kv, prefix_lengths, visibility = make_case()
    ref = attention_peers.reference_attention(q, kv, prefix_lengths, visibility)
    naive = naive_reference(q, kv, prefix_lengths, visibility)
    assert ref.shape == (2, 8, 8, 512) and bool(ref.isfinite().all())
    assert float((ref - naive).abs().max()) < 1e-4


@needs_torch_gpu
def test_dense_mask():
    import torch  # noqa: PLC0415

    _, _, prefix_lengths, visibility = make_case()
    used = 100 + 8
    mask = attention_peers.dense_mask(prefix_lengths, visibility, used).cpu()
    assert mask.shape == (2, 1, 8, used) and mask.dtype == torch.bool
    vis = visibility.cpu()
    for b, s in enumerate((40, 100)):
        assert bool(mask[b, 0, :, :s].all())
        assert torch.equal(mask[b, 0, :, s : s + 8], vis[b])
        assert not bool(mask[b, 0, :, s + 8 :].any())


@needs_torch_gpu
@pytest.mark.parametrize("name", PEERS)
def test_peer_matches_float32_reference(name):
    import torch  # noqa: PLC0415

    q, kv, prefix_lengths, visibility = make_case()
    try:
        peer = make_peer(name, q, kv, prefix_lengths, visibility)
    except PeerUnavailable as exc:
        if name == "sdpa":
            raise  # SDPA always has a backend that runs (math, at worst)
        pytest.skip(f"{name} cannot run these head dims here: {exc}")
    out = peer()
    torch.cuda.synchronize()
    assert out.shape == (2, 8, 8, 512) and out.dtype == torch.bfloat16
    assert peer.peer == name and peer.shape == (2, 7, 8, 108) and peer.backend
    # against float32 with the mask the peer applies (FlashMLA's causal mask: query i sees tree keys 0..i)
    assert peer.mask == attention_peers.PEER_MASKS[name]
    applied = visibility if peer.mask == attention_peers.TREE_MASK else torch.ones_like(visibility).tril()
    ref = naive_reference(q, kv, prefix_lengths, applied)
    error = float((out.float() - ref).abs().max())
    assert math.isfinite(error) and error < 2e-2, f"{name} ({peer.backend}): max abs error {error}"
    again = peer()
    assert torch.equal(again, out)  # the callable is re-runnable and deterministic


@needs_torch_gpu
def test_peer_scale_is_passed_through():
    q, kv, prefix_lengths, visibility = make_case(nan_padding=False)
    peer = make_peer("sdpa", q, kv, prefix_lengths, visibility, scale=0.01)
    ref = naive_reference(q, kv, prefix_lengths, visibility, scale=0.01)
    assert float((peer().float() - ref).abs().max()) < 2e-2


@needs_torch_gpu
def test_malformed_inputs_are_value_errors():
    import torch  # noqa: PLC0415

    q, kv, prefix_lengths, visibility = make_case()
    with pytest.raises(ValueError, match="q must be"):
        make_peer("sdpa", q[..., :512], kv, prefix_lengths, visibility)
    with pytest.raises(ValueError, match="prefix_lengths must be int32"):
        make_peer("sdpa", q, kv, prefix_lengths.long(), visibility)
    with pytest.raises(ValueError, match="visibility must be bool"):
        make_peer("sdpa", q, kv, prefix_lengths, visibility[:, :4, :4])
    with pytest.raises(ValueError, match="S \\+ N \\+ 1 <= T"):
        make_peer("sdpa", q, kv, torch.tensor([40, 200], dtype=torch.int32, device="cuda"), visibility)
    with pytest.raises(ValueError, match="CUDA tensor"):
        make_peer("sdpa", q.cpu(), kv, prefix_lengths, visibility)
