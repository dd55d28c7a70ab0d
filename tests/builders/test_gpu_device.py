"""The gpu builder's device-array entry points and the in-situ timing, on a GPU: trees equal to
reference's from CuPy and torch inputs, packed bits only, CUDA-graph capture and replay (CuPy and torch), the
SGLang-shaped torch function after padding, and in-situ rows for every builder. Skipped, with the reason,
without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_inputs import topk_inputs

from ddtree_bench.builders import get_builder
from ddtree_bench.builders.gpu import DeviceTrees
from ddtree_bench.builders.gpu_device import DeviceTreeBuilder, build_ddtree_batch_torch
from ddtree_bench.cuda import loader as cuda
from ddtree_bench.stages.build_gpu import run_gpu_benchmark
from ddtree_bench.stages.insitu import IN_SITU, run_insitu_benchmark, torch_cuda_reason
from ddtree_bench.stages.timing_job import TimingJob
from ddtree_bench.traces import generate_trace, save_trace
from ddtree_bench.tree import TREE_FIELDS, TreeBatch, first_difference, packed_visibility

GPU_REASON = cuda.gpu_unavailable_reason()
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"needs a CUDA GPU: {GPU_REASON}")
TORCH_REASON = torch_cuda_reason()
needs_torch_gpu = pytest.mark.skipif(
    GPU_REASON is not None or TORCH_REASON is not None,
    reason=f"needs a CUDA GPU and torch with CUDA: {GPU_REASON or TORCH_REASON}",
)
# (kind, batch, depth, K, budget): the warp-heap path (N <= 64), the parallel path, ties, a heap that drains
CASES = [
    ("bf16", 4, 16, 8, 8),
    ("tied", 3, 16, 64, 64),
    ("peaked", 5, 16, 200, 200),
    ("uniform", 2, 3, 2, 40),
]


def _expected(lp, ids, budget) -> TreeBatch:
    return get_builder("reference").build(lp, ids, budget)


def _host(out) -> TreeBatch:
    return out.to_host()


@pytest.fixture(scope="module")
def device_builder():
    return DeviceTreeBuilder()


@needs_gpu
@pytest.mark.parametrize(("kind", "batch", "depth", "k", "budget"), CASES)
def test_device_entry_equals_reference_from_cupy_arrays(device_builder, kind, batch, depth, k, budget):
    import cupy as cp  # noqa: PLC0415

    lp, ids = topk_inputs(kind, batch, depth, k)
    expected = _expected(lp, ids, budget)
    d_lp, d_ids = cp.asarray(lp), cp.asarray(ids)
    out = device_builder(d_lp, d_ids, budget)
    assert isinstance(out, DeviceTrees) and isinstance(out.visibility, cp.ndarray)
    cp.cuda.get_current_stream().synchronize()
    assert first_difference(expected, _host(out)) is None
    # packed bits only, into garbage: every field but the bool mask is written, padding included
    packed = DeviceTrees(batch, budget)
    packed.buffer.fill(0xFF)
    device_builder(d_lp, d_ids, budget, packed_only=True, out=packed)
    got = _host(packed)
    for name in TREE_FIELDS:
        if name != "visibility":
            assert np.array_equal(getattr(got, name), getattr(expected, name)), name
    assert np.array_equal(packed.visibility_bits.get(), packed_visibility(expected.visibility))
    assert (got.visibility.view(np.uint8) == 0xFF).all()  # left as it was


@needs_gpu
def test_device_entry_refuses_host_arrays_and_bad_dtypes(device_builder):
    import cupy as cp  # noqa: PLC0415

    lp, ids = topk_inputs("peaked", 2, 4, 8)
    with pytest.raises(ValueError, match="not an array on the CUDA device"):
        device_builder(lp, ids, 8)
    with pytest.raises(ValueError, match="float32 log-probs and int64 token ids"):
        device_builder(cp.asarray(lp, cp.float64), cp.asarray(ids), 8)
    with pytest.raises(ValueError, match="C-contiguous"):
        device_builder(cp.asarray(lp)[:, :, ::2], cp.asarray(ids)[:, :, ::2], 8)


@needs_gpu
@pytest.mark.parametrize("packed_only", [False, True])
def test_cupy_graph_capture_and_replay_gives_the_same_trees(device_builder, packed_only):
    import cupy as cp  # noqa: PLC0415

    lp, ids = topk_inputs("bf16", 6, 16, 64, seed=1)
    lp2, ids2 = topk_inputs("peaked", 6, 16, 64, seed=2)
    budget = 64
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        d_lp, d_ids = cp.asarray(lp), cp.asarray(ids)
        out = device_builder(d_lp, d_ids, budget, packed_only=packed_only)  # warm-up: loads, allocates
        stream.synchronize()
        before = out.buffer.data.ptr
        stream.begin_capture()
        captured = device_builder(d_lp, d_ids, budget, packed_only=packed_only)
        graph = stream.end_capture()
        assert captured is out and out.buffer.data.ptr == before  # no allocation in the captured call
        for inputs in ((lp, ids), (lp2, ids2)):  # the replay reads the inputs' memory as it is then
            d_lp[...] = cp.asarray(inputs[0])
            d_ids[...] = cp.asarray(inputs[1])
            out.buffer.fill(0xFF)
            graph.launch(stream)
            stream.synchronize()
            expected = _expected(*inputs, budget)
            got = _host(out)
            if packed_only:
                assert np.array_equal(out.visibility_bits.get(), packed_visibility(expected.visibility))
                got.visibility = expected.visibility
            assert first_difference(expected, got) is None


@needs_torch_gpu
def test_device_entry_takes_torch_tensors_on_torchs_current_stream(device_builder):
    import torch  # noqa: PLC0415

    lp, ids = topk_inputs("tied", 4, 16, 32)
    budget = 32
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t_lp, t_ids = torch.from_numpy(lp).cuda(), torch.from_numpy(ids).cuda()
        torch.cuda._sleep(50_000_000)  # keeps the side stream busy: the build queues behind it
        out = device_builder(t_lp, t_ids, budget)
        assert not side.query()
    side.synchronize()
    assert first_difference(_expected(lp, ids, budget), _host(out)) is None


@needs_torch_gpu
@pytest.mark.parametrize(("kind", "batch", "depth", "k", "budget"), CASES)
def test_torch_function_equals_reference_after_padding(kind, batch, depth, k, budget):
    import torch  # noqa: PLC0415

    lp, ids = topk_inputs(kind, batch, depth, k)
    expected = _expected(lp, ids, budget)
    got = build_ddtree_batch_torch(torch.from_numpy(lp).cuda(), torch.from_numpy(ids).cuda(), budget)
    torch.cuda.synchronize()
    for name in TREE_FIELDS:
        tensor = getattr(got, name)
        assert tensor.is_cuda and tensor.shape == getattr(expected, name).shape, name
        assert np.array_equal(tensor.cpu().numpy(), getattr(expected, name)), name
    bits = got.visibility_bits.view(torch.int32).cpu().numpy().view(np.uint32)
    assert np.array_equal(bits, packed_visibility(expected.visibility))
    packed = build_ddtree_batch_torch(
        torch.from_numpy(lp).cuda(), torch.from_numpy(ids).cuda(), budget, packed_only=True
    )
    assert packed.visibility is None
    assert np.array_equal(packed.retrieve_next_token.cpu().numpy(), expected.retrieve_next_token)


@needs_torch_gpu
def test_torch_graph_capture_and_replay_gives_the_same_trees():
    import torch  # noqa: PLC0415

    lp, ids = topk_inputs("bf16", 4, 16, 128, seed=3)
    lp2, ids2 = topk_inputs("uniform", 4, 16, 128, seed=4)
    budget = 128
    t_lp, t_ids = torch.from_numpy(lp).cuda(), torch.from_numpy(ids).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch.cuda.graph asks
        build_ddtree_batch_torch(t_lp, t_ids, budget)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = build_ddtree_batch_torch(t_lp, t_ids, budget)
    for inputs in ((lp, ids), (lp2, ids2)):
        t_lp.copy_(torch.from_numpy(inputs[0]))
        t_ids.copy_(torch.from_numpy(inputs[1]))
        graph.replay()
        torch.cuda.synchronize()
        expected = _expected(*inputs, budget)
        for name in TREE_FIELDS:
            assert np.array_equal(getattr(got, name).cpu().numpy(), getattr(expected, name)), name


# ----------------------------------------------------------------------------------------------- in-situ


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    lp, ids = generate_trace("bf16", 4, 16, 64, vocab_size=4096, seed=5, device="cpu")
    path = tmp_path_factory.mktemp("insitu") / "bf16-L16.npz"
    save_trace(path, lp, ids, distribution="bf16")
    return path


TIMING = dict(warmup=1, repeats=3, min_seconds=0.0, max_seconds=None, min_repeats=1, max_repeats=5)


def timing_job(builder, trace, budget, **fields) -> TimingJob:
    """Batch 4 of ``trace`` at ``budget``, timed by ``TIMING``."""
    return TimingJob(builder, trace, budget, 4, TIMING, machine="test", distribution="bf16", **fields)


@needs_gpu
@pytest.mark.parametrize("builder", ["reference", "native", "native-mt"])
def test_in_situ_timing_rows_for_the_cpu_builders(small_trace, native_library, builder):
    if builder == "reference" and TORCH_REASON is not None:
        pytest.skip(f"reference's in-situ path needs torch with CUDA: {TORCH_REASON}")
    options = {"library": str(native_library)} if builder.startswith("native") else None
    df = run_insitu_benchmark(timing_job(builder, small_trace, 64, builder_options=options))
    assert set(df["timing"]) == {IN_SITU} and set(df["status"]) == {"ok"}
    assert df["correct"].all()  # the tensors left on the device equal reference's
    timed = df[df["phase"] == "timed"]
    assert len(timed) >= 3 and (timed["seconds"] > 0).all()
    assert set(df["clock"]) == {"time.perf_counter_ns"}


@needs_torch_gpu
def test_in_situ_timing_rows_for_sglang_where_it_loads(small_trace):
    reason = get_builder("sglang").unavailable_reason()
    if reason is not None:
        pytest.skip(f"SGLang's function is not loadable here: {reason}")
    df = run_insitu_benchmark(timing_job("sglang", small_trace, 32))
    assert set(df["timing"]) == {IN_SITU} and set(df["status"]) == {"ok"} and df["correct"].all()


@needs_gpu
def test_in_situ_timing_rows_for_the_gpu_builder(small_trace):
    df = run_gpu_benchmark(timing_job("gpu", small_trace, 64, in_situ=True))
    timed = df[df["phase"] == "timed"]
    kinds = {t: g for t, g in timed.groupby("timing")}
    for timing, clock in (
        ("in-situ", "cudaEventElapsedTime"),
        ("in-situ-packed", "cudaEventElapsedTime"),
        ("in-situ-launch-sync", "time.perf_counter_ns"),
        ("in-situ-launch-sync-packed", "time.perf_counter_ns"),
        ("host-inclusive", "time.perf_counter_ns"),
    ):
        assert timing in kinds, timing
        assert set(kinds[timing]["clock"]) == {clock} and (kinds[timing]["seconds"] > 0).all()
    assert df["correct"].all()
    without = run_gpu_benchmark(timing_job("gpu", small_trace, 64))
    assert not without["timing"].str.startswith("in-situ").any()
