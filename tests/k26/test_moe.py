"""Routed-experts impls: byte arithmetic, refusals with a reason, the routing / layout / reference math on
the CPU, SGLang's files loading under our stand-ins (in a subprocess), and on a GPU each impl against the
float32 reference, under CUDA graph capture, and Marlin's layout against SGLang's own repack kernel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_bench.cuda import loader as cuda
from ddtree_bench.integrations import sglang
from ddtree_bench.integrations.sglang import stubs
from ddtree_bench.k26 import moe
from ddtree_bench.k26.moe import BF16, MARLIN, MOE_IMPLS, TRITON, MoeUnavailable

GPU_REASON = cuda.gpu_unavailable_reason()
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"needs a CUDA GPU: {GPU_REASON}")
REPO = Path(__file__).resolve().parents[2]
#: SGLang's extracted files (docs/k26_model.md): $DDTREE_SGLANG_FILES, else .peers/sglang_files in the repo
SGLANG_FILES = Path(os.environ.get("DDTREE_SGLANG_FILES", REPO / ".peers" / "sglang_files"))
HAVE_FILES = (SGLANG_FILES / sglang.REQUIRED_FILES[MARLIN][0]).is_file()
needs_files = pytest.mark.skipif(not HAVE_FILES, reason=f"SGLang's files not at {SGLANG_FILES}")
SRC = str(REPO / "src")


def _torch():
    return pytest.importorskip("torch")


# ------------------------------------------------------------------------------------------ arithmetic


def test_weight_bytes_of_a_k26_expert_slice():
    # 3 x 7168 x 256 weights x (0.5 + 2/32) B = 3.10 MB per expert slice at TP8
    assert moe.weight_bytes(MARLIN, 1, 7168, 256) == 3 * 7168 * 256 * 9 // 16 == 3_096_576
    assert moe.weight_bytes(TRITON, 1, 7168, 256) == 3_096_576
    assert moe.weight_bytes(BF16, 384, 7168, 256) == 384 * 3 * 7168 * 256 * 2 == 4_227_858_432
    assert moe.weight_bytes(MARLIN, 384, 7168, 256) == 384 * 3_096_576
    assert moe.weight_bytes(MARLIN, 1, 7168, 256, group_size=128) == 3 * 7168 * 256 * (1 / 2 + 2 / 128)


@pytest.mark.parametrize(
    "args",
    [(0, 7168, 256, 32), (1, 7168, 250, 32), (1, 7000, 256, 64), (1, 7168, 256, 0), (True, 7168, 256, 32)],
)
def test_weight_bytes_rejects_bad_shapes(args):
    experts, hidden, inter, group = args
    with pytest.raises(ValueError):
        moe.weight_bytes(MARLIN, experts, hidden, inter, group)


def test_unknown_impl_is_a_value_error():
    with pytest.raises(ValueError, match="unknown MoE impl 'fp8'"):
        moe.moe_unavailable_reason("fp8", None)
    with pytest.raises(ValueError, match="unknown MoE impl"):
        moe.weight_bytes("fp8", 1, 64, 64)
    with pytest.raises(ValueError, match="unknown MoE impl"):
        moe.make_expert_weights("fp8", experts=1, hidden=64, intermediate=64, seed=0, device="cpu")
    assert MOE_IMPLS == ("marlin-w4a16", "triton-w4a16", "bf16-grouped-mm")


def test_uint4b8_id_as_scalar_type_hpp_packs_it():
    # exponent 0 | mantissa 4 << 8 | signed 0 << 16 | bias 8 << 17 | finite 0 << 49 | NAN_IEEE_754 (1) << 50
    assert stubs.UINT4B8_ID == (4 << 8) | (8 << 17) | (1 << 50)
    assert stubs.UINT8B128_ID == (8 << 8) | (128 << 17) | (1 << 50)


@needs_files
@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to compile SGLang's scalar_type.hpp")
def test_uint4b8_id_equals_sglang_header(tmp_path):
    program = tmp_path / "id.cpp"
    program.write_text(
        "#include <cstdint>\n#include <cstdio>\n#include <string>\n#include <tuple>\n#include <type_traits>\n"
        "#include <utility>\n#include <sgl_kernel/scalar_type.hpp>\n"
        'int main() { std::printf("%lld %lld\\n", (long long)sglang::host::kU4B8.id(), '
        "(long long)sglang::host::kU8B128.id()); }\n"
    )
    include = SGLANG_FILES / "sglang" / "kernels" / "jit" / "include"
    subprocess.run(
        ["g++", "-std=c++20", f"-I{include}", str(program), "-o", str(tmp_path / "id")], check=True
    )
    out = subprocess.run([str(tmp_path / "id")], check=True, capture_output=True, text=True).stdout.split()
    assert [int(v) for v in out] == [stubs.UINT4B8_ID, stubs.UINT8B128_ID]


# ------------------------------------------------------------------------------------------ refusals


def test_missing_sglang_files_name_the_path(tmp_path):
    nowhere = tmp_path / "nowhere"
    for impl in (MARLIN, TRITON):
        reason = moe.moe_unavailable_reason(impl, str(nowhere))
        assert reason is not None and str(nowhere) in reason and impl in reason and "\n" not in reason
        with pytest.raises(MoeUnavailable, match="not found"):
            sglang.load_sglang_moe(impl, nowhere)


def _fake_files(root: Path) -> Path:
    for rels in sglang.REQUIRED_FILES.values():
        for rel in rels:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text("")
    return root


@pytest.mark.skipif(GPU_REASON is None, reason="a GPU is present")
def test_without_a_gpu_every_impl_says_so(tmp_path):
    files = _fake_files(tmp_path / "files")
    for impl in MOE_IMPLS:
        reason = moe.moe_unavailable_reason(impl, str(files))
        assert reason is not None and "GPU" in reason and reason.startswith(impl), reason
        assert "\n" not in reason


def test_bf16_needs_no_sglang_files():
    with pytest.raises(ValueError, match="loads nothing"):
        sglang.load_sglang_moe(BF16, None)
    with pytest.raises(ValueError, match="unknown MoE impl 'fp8'"):
        sglang.load_sglang_moe("fp8", None)


# --------------------------------------------------------------------------- CPU math (torch on CPU)


def test_expert_order_sorts_routes_stably():
    torch = _torch()
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 6, (11, 3), generator=gen, dtype=torch.int32)
    order, ends = moe.expert_order(ids, 7)
    flat = ids.reshape(-1).tolist()
    expected = sorted(range(len(flat)), key=lambda r: (flat[r], r))
    assert order.tolist() == expected
    counts = [flat.count(e) for e in range(7)]
    assert ends.dtype == torch.int32 and ends.tolist() == [sum(counts[: e + 1]) for e in range(7)]


def _naive_moe(torch, x, w13, w2, ids, weights):
    """Per token, per slot, in float64."""
    inter = w13.shape[1] // 2
    y = torch.zeros((x.shape[0], w2.shape[1]), dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            h = w13[e].double() @ x[t].double()
            a = torch.nn.functional.silu(h[:inter]) * h[inter:]
            y[t] += float(weights[t, k]) * (w2[e].double() @ a)
    return y


def test_grouped_moe_and_reference_equal_a_naive_loop():
    torch = _torch()
    w = moe.make_expert_weights(BF16, experts=6, hidden=64, intermediate=32, seed=1, device="cpu")
    x, ids, weights = moe.random_routing(5, 64, 6, seed=2, device="cpu", top_k=3)
    naive = _naive_moe(torch, x, w.w13, w.w2, ids, weights)
    ref = moe.reference_moe(BF16, w, x, ids, weights)
    assert ref.dtype == torch.float32
    torch.testing.assert_close(ref.double(), naive, rtol=1e-4, atol=1e-5)
    y = moe.grouped_moe(x, w.w13, w.w2, ids, weights, grouped_mm=moe._grouped_mm_loop)
    assert y.dtype == torch.bfloat16 and tuple(y.shape) == (5, 64)
    err = (y.double() - naive).abs().max().item()
    assert err <= 0.02 * naive.abs().max().item(), err  # bf16 intermediates


def test_marlin_layout_round_trips():
    torch = _torch()
    gen = torch.Generator().manual_seed(4)
    q = torch.randint(0, 16, (3, 128, 192), generator=gen, dtype=torch.uint8)
    s = torch.rand((3, 4, 192), generator=gen).to(torch.bfloat16)
    packed, ps = moe.marlin_pack(q, s)
    assert packed.dtype == torch.int32 and tuple(packed.shape) == (3, 128 // 16, 192 * 2)
    assert not torch.equal(ps, s)  # scales are permuted
    q2, s2 = moe.marlin_unpack(packed, ps, 128, 192)
    assert torch.equal(q2, q.to(torch.int64)) and torch.equal(s2, s)
    perm = moe._marlin_weight_perm(torch)
    assert sorted(perm.tolist()) == list(range(1024))


def _plain_int4(torch, experts, hidden, inter, seed):
    gen = torch.Generator().manual_seed(seed)
    q13 = torch.randint(0, 16, (experts, 2 * inter, hidden), generator=gen, dtype=torch.uint8)
    q2 = torch.randint(0, 16, (experts, hidden, inter), generator=gen, dtype=torch.uint8)
    s13 = (torch.rand((experts, 2 * inter, hidden // 32), generator=gen) / 40).to(torch.bfloat16)
    s2 = (torch.rand((experts, hidden, inter // 32), generator=gen) / 20).to(torch.bfloat16)
    w13 = (q13.float() - 8) * s13.float().repeat_interleave(32, -1)
    w2 = (q2.float() - 8) * s2.float().repeat_interleave(32, -1)
    return q13, q2, s13, s2, w13, w2


def _as_marlin(torch, q13, q2, s13, s2):
    """ExpertWeights(MARLIN) from plain [E, N, K] codes and [E, N, K/32] scales (Marlin's K x N)."""
    e, n13, hidden = q13.shape
    p13, ps13 = moe.marlin_pack(q13.transpose(1, 2), s13.transpose(1, 2))
    p2, ps2 = moe.marlin_pack(q2.transpose(1, 2), s2.transpose(1, 2))
    return moe.ExpertWeights(MARLIN, e, hidden, n13 // 2, 32, p13, p2, ps13, ps2)


def _as_triton(torch, q13, q2, s13, s2):
    e, n13, hidden = q13.shape

    def pack(q):  # even K index in the low nibble
        return (q[..., 0::2] | (q[..., 1::2] << 4)).to(torch.uint8)

    return moe.ExpertWeights(TRITON, e, hidden, n13 // 2, 32, pack(q13), pack(q2), s13, s2)


@pytest.mark.parametrize("impl", [MARLIN, TRITON])
def test_int4_dequantisation_recovers_the_plain_matrices(impl):
    torch = _torch()
    q13, q2, s13, s2, w13, w2 = _plain_int4(torch, 4, 128, 64, seed=5)
    weights = (_as_marlin if impl == MARLIN else _as_triton)(torch, q13, q2, s13, s2)
    d13, d2 = moe.dequantize(weights)
    assert torch.equal(d13, w13) and torch.equal(d2, w2)
    x, ids, tw = moe.random_routing(3, 128, 4, seed=6, device="cpu", top_k=2)
    ref = moe.reference_moe(impl, weights, x, ids, tw)
    torch.testing.assert_close(ref.double(), _naive_moe(torch, x, w13, w2, ids, tw), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl", MOE_IMPLS)
def test_made_weights_have_the_documented_format_and_bytes(impl):
    torch = _torch()
    w = moe.make_expert_weights(impl, experts=3, hidden=128, intermediate=64, seed=7, device="cpu")
    assert w.nbytes() == moe.weight_bytes(impl, 3, 128, 64)
    shapes = {
        MARLIN: ((3, 8, 256), (3, 4, 256), (3, 4, 128), (3, 2, 128)),
        TRITON: ((3, 128, 64), (3, 128, 32), (3, 128, 4), (3, 128, 2)),
        BF16: ((3, 128, 128), (3, 128, 64), None, None),
    }[impl]
    got = tuple(None if t is None else tuple(t.shape) for t in (w.w13, w.w2, w.w13_scale, w.w2_scale))
    assert got == shapes
    d13, d2 = moe.dequantize(w)
    assert tuple(d13.shape) == (3, 128, 128) and tuple(d2.shape) == (3, 128, 64)
    assert torch.isfinite(d13).all() and 0.02 < d13.std().item() < 0.2  # ~1/sqrt(hidden)
    again = moe.make_expert_weights(impl, experts=3, hidden=128, intermediate=64, seed=7, device="cpu")
    assert torch.equal(again.w13, w.w13)


def test_calls_reject_mismatched_inputs():
    torch = _torch()
    w = moe.make_expert_weights(BF16, experts=4, hidden=64, intermediate=32, seed=0, device="cpu")
    x, ids, tw = moe.random_routing(2, 64, 4, seed=0, device="cpu", top_k=2)
    with pytest.raises(ValueError, match="format"):
        moe.routed_experts(MARLIN, w, x, ids, tw)
    with pytest.raises(ValueError, match="bf16"):
        moe.reference_moe(BF16, w, x.float(), ids, tw)
    with pytest.raises(ValueError, match="must match"):
        moe.reference_moe(BF16, w, x, ids, tw[:, :1])
    del torch


# ------------------------------------------------------------- SGLang's files under our stand-ins (CPU)

_LOAD_SCRIPT = """
import json, sys
from ddtree_bench.integrations import sglang
from ddtree_bench.integrations.sglang import files, stubs
from ddtree_bench.k26 import moe
stubs.PLATFORM_OVERRIDE["cuda"] = True  # take the CUDA import branches on a machine without a GPU
out = {}
for impl in (moe.MARLIN, moe.TRITON):
    try:
        out[impl] = sglang.load_sglang_moe(impl, sys.argv[1]).__name__
    except sglang.SglangUnavailable as exc:
        out[impl] = "unavailable: " + str(exc)
out["modules"] = sorted(n for n in sys.modules if files.ours(n))
print(json.dumps(out))
"""


@needs_files
def test_sglang_modules_load_under_stand_ins():
    for module in ("torch", "triton", "tvm_ffi", "msgspec"):
        pytest.importorskip(module)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run(
        [sys.executable, "-c", _LOAD_SCRIPT, str(SGLANG_FILES)], capture_output=True, text=True, env=env
    )
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out[MARLIN] == "fused_marlin_moe" and out[TRITON] == "fused_experts_impl", out
    # what ran is SGLang's own code, the stand-ins only where documented
    assert "sglang.kernels.ops.moe.moe_wna16_marlin" in out["modules"]
    assert "sglang.kernels.ops.moe.fused_moe_triton_kernels" in out["modules"]
    assert "sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size" in out["modules"]


# ------------------------------------------------------------------------------------------------- GPU

SMALL = dict(experts=8, hidden=1024, intermediate=256)


def _impl_reason(impl):
    if GPU_REASON is not None:
        return f"needs a CUDA GPU: {GPU_REASON}"
    return moe.moe_unavailable_reason(impl, str(SGLANG_FILES) if impl != BF16 else None)


def _skip_unless(impl):
    reason = _impl_reason(impl)
    if reason is not None:
        pytest.skip(reason)


def _check_close(y, ref):
    err = (y.float() - ref).abs().max().item()
    scale = ref.abs().max().item()
    rel = ((y.float() - ref).norm() / ref.norm()).item()
    assert err <= 0.03 * scale and rel <= 0.01, f"max error {err:.4g} (max |ref| {scale:.4g}), rel {rel:.4g}"


@needs_gpu
@pytest.mark.parametrize("tokens", [1, 9, 64])
@pytest.mark.parametrize("impl", MOE_IMPLS)
def test_impl_matches_float32_reference(impl, tokens):
    _skip_unless(impl)
    weights = moe.make_expert_weights(impl, **SMALL, seed=11, device="cuda")
    x, ids, tw = moe.random_routing(tokens, SMALL["hidden"], SMALL["experts"], seed=tokens, device="cuda")
    y = moe.routed_experts(impl, weights, x, ids, tw, sglang_files=SGLANG_FILES)
    assert y.dtype.is_floating_point and tuple(y.shape) == (tokens, SMALL["hidden"])
    _check_close(y, moe.reference_moe(impl, weights, x, ids, tw))


@needs_gpu
@pytest.mark.parametrize("impl", MOE_IMPLS)
def test_impl_replays_under_cuda_graph(impl):
    _skip_unless(impl)
    import torch  # noqa: PLC0415

    weights = moe.make_expert_weights(impl, **SMALL, seed=12, device="cuda")
    x, ids, tw = moe.random_routing(9, SMALL["hidden"], SMALL["experts"], seed=1, device="cuda")
    moe.routed_experts(impl, weights, x, ids, tw, sglang_files=SGLANG_FILES)  # warm: builds, configs
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        moe.routed_experts(impl, weights, x, ids, tw, sglang_files=SGLANG_FILES)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe.routed_experts(impl, weights, x, ids, tw, sglang_files=SGLANG_FILES)
    x2, ids2, tw2 = moe.random_routing(9, SMALL["hidden"], SMALL["experts"], seed=2, device="cuda")
    x.copy_(x2)
    ids.copy_(ids2)
    tw.copy_(tw2)
    graph.replay()
    torch.cuda.synchronize()
    _check_close(out, moe.reference_moe(impl, weights, x2, ids2, tw2))


@needs_gpu
def test_int64_topk_ids_are_converted():
    _skip_unless(BF16)
    weights = moe.make_expert_weights(BF16, **SMALL, seed=13, device="cuda")
    x, ids, tw = moe.random_routing(5, SMALL["hidden"], SMALL["experts"], seed=3, device="cuda")
    a = moe.routed_experts(BF16, weights, x, ids, tw)
    b = moe.routed_experts(BF16, weights, x, ids.long(), tw)
    assert (a == b).all()


@needs_gpu
@needs_files
def test_marlin_layout_equals_sglang_repack_kernel():
    _skip_unless(MARLIN)
    import importlib  # noqa: PLC0415

    import torch  # noqa: PLC0415

    repack = importlib.import_module(sglang.REPACK_MODULE).gptq_marlin_repack
    gen = torch.Generator(device="cuda").manual_seed(9)
    size_k, size_n = 256, 512
    q = torch.randint(0, 16, (size_k, size_n), generator=gen, device="cuda", dtype=torch.int64)
    gptq = torch.zeros((size_k // 8, size_n), dtype=torch.int64, device="cuda")
    for i in range(8):  # GPTQ packs 8 codes of consecutive K rows into one int32, low bits first
        gptq |= q[i::8] << (4 * i)
    gptq = torch.where(gptq >= 2**31, gptq - 2**32, gptq).to(torch.int32)
    ours, _ = moe.marlin_pack(q, torch.ones((size_k // 32, size_n), device="cuda"))
    theirs = repack(gptq, torch.empty(0, dtype=torch.int32, device="cuda"), size_k, size_n, 4)
    assert torch.equal(ours, theirs)
