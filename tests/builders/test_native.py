"""The ``native`` C++ builder: identical to ``reference`` element for element (ties included), on every
input kind, budgets 1..1024, K < N and K > N, heap drain, L = 1, one thread and all cores; plus its build
helper, its binding and its failure modes."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddtree_bench import native_build
from ddtree_bench.builders import BuilderUnavailable, get_builder
from ddtree_bench.builders.native import NativeBuilder, uninitialised_batch
from ddtree_bench.tree import TREE_FIELDS, TreeBatch, first_difference

KINDS = ("uniform", "peaked", "bf16", "equal", "tied")


@pytest.fixture(scope="module")
def native(native_library):
    return get_builder("native", library=native_library)


@pytest.fixture(scope="module")
def native_mt(native_library):
    return get_builder("native-mt", library=native_library)


def assert_same(expected: TreeBatch, actual: TreeBatch) -> None:
    diff = first_difference(expected, actual)
    assert diff is None, diff


def assert_matches_reference(builder, lp, ids, budget) -> TreeBatch:
    expected = get_builder("reference").build(lp, ids, budget)
    actual = builder.build(lp, ids, budget)
    assert_same(expected, actual)
    return actual


# -- native == reference ----------------------------------------------------------------------------------

BUDGET_BATCH = [(1, 6), (2, 6), (3, 6), (7, 6), (8, 6), (16, 4), (31, 4), (64, 3), (256, 2), (1024, 1)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("budget,batch", BUDGET_BATCH, ids=[f"N{n}" for n, _ in BUDGET_BATCH])
def test_equals_reference_k_equals_n(native, topk_inputs, kind, budget, batch):
    lp, ids = topk_inputs(kind, batch, 16 if budget <= 256 else 8, budget, seed=budget)
    assert_matches_reference(native, lp, ids, budget)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("budget,k", [(8, 3), (31, 5), (64, 17), (256, 40), (8, 20), (31, 64), (64, 100)])
def test_equals_reference_k_below_and_above_n(native, topk_inputs, kind, budget, k):
    lp, ids = topk_inputs(kind, 3, 8, k, seed=budget + k)
    assert_matches_reference(native, lp, ids, budget)


@pytest.mark.parametrize("kind", KINDS)
def test_heap_drain(native, topk_inputs, kind):
    lp, ids = topk_inputs(kind, 3, 3, 3, seed=7)
    trees = assert_matches_reference(native, lp, ids, 64)
    assert trees.node_count.tolist() == [3 + 9 + 27] * 3


@pytest.mark.parametrize("budget", [1, 5, 40])
def test_depth_one(native, topk_inputs, budget):
    lp, ids = topk_inputs("bf16", 4, 1, 12, seed=budget)
    trees = assert_matches_reference(native, lp, ids, budget)
    assert trees.node_count.tolist() == [min(budget, 12)] * 4


def test_k_one_chain(native, topk_inputs):
    lp, ids = topk_inputs("uniform", 2, 6, 1)
    trees = assert_matches_reference(native, lp, ids, 10)
    assert trees.parents[0, :8].tolist() == [-1, 0, 1, 2, 3, 4, 5, -1]


def test_incremental_rounding_case(native):
    # the case of test_reference.py where a heap pop order differs from a path-sum order
    x, p, q = np.float32(-1.2848934e-09), np.float32(-2.6211164), np.float32(-28.526234)
    lp = np.array([[[x, -60.0], [p, q], [p, q]]], np.float32)
    ids = np.arange(6, dtype=np.int64).reshape(1, 3, 2) + 10
    assert_matches_reference(native, lp, ids, 14)


@pytest.mark.parametrize("kind", ["bf16", "equal", "tied"])
def test_multithreaded_equals_single_threaded(native, native_mt, native_library, topk_inputs, kind):
    # large enough for the pool (batch x budget >= the parallel threshold), and then some
    lp, ids = topk_inputs(kind, 96, 16, 64, seed=11)
    single = native.build(lp, ids, 64)
    assert_same(single, native_mt.build(lp, ids, 64))
    assert_same(single, NativeBuilder(library=native_library, threads=3).build(lp, ids, 64))
    assert_same(get_builder("reference").build(lp[:8], ids[:8], 64), native_mt.build(lp[:8], ids[:8], 64))
    assert native_mt.info()["threads"] == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("threads", [1, 0])
@pytest.mark.parametrize("budget,batch,depth,k", [(1023, 3, 6, 40), (1025, 2, 16, 1025), (1100, 2, 2, 3)])
def test_large_outputs(native_library, topk_inputs, threads, budget, batch, depth, k):
    # batch x (N+1)^2 above the library's streaming threshold: odd row widths, and a drained heap (last case)
    builder = NativeBuilder(library=native_library, threads=threads)
    lp, ids = topk_inputs("bf16", batch, depth, k, seed=budget)
    assert_matches_reference(builder, lp, ids, budget)


def test_rows_wider_than_the_staging_buffer(native, topk_inputs):
    lp, ids = topk_inputs("tied", 1, 3, 70, seed=5)
    assert_matches_reference(native, lp, ids, 4200)


def test_out_buffers_need_no_initialisation(native, topk_inputs):
    lp, ids = topk_inputs("uniform", 5, 4, 6, seed=3)
    out = uninitialised_batch(5, 100)  # garbage everywhere, padding included
    rng = np.random.default_rng(0)
    for name in TREE_FIELDS:
        array = getattr(out, name)
        array.view(np.uint8)[...] = rng.integers(0, 256, array.nbytes, dtype=np.uint8).reshape(
            array.view(np.uint8).shape
        )
    result = native.build(lp, ids, 100, out=out)
    assert result is out
    assert_same(get_builder("reference").build(lp, ids, 100), out)
    lp2, ids2 = topk_inputs("tied", 5, 2, 3, seed=4)  # reuse the same buffers for a drained heap
    assert_same(get_builder("reference").build(lp2, ids2, 100), native.build(lp2, ids2, 100, out=out))


def test_calls_alternating_inputs_and_outputs(native, topk_inputs):
    # the binding reuses the previous call's addresses only for the very same arrays
    reference = get_builder("reference")
    (lp1, ids1), (lp2, ids2) = topk_inputs("uniform", 3, 4, 8, seed=1), topk_inputs("bf16", 3, 4, 8, seed=2)
    out1, out2 = uninitialised_batch(3, 8), uninitialised_batch(3, 8)
    want1, want2 = reference.build(lp1, ids1, 8), reference.build(lp2, ids2, 8)
    for _ in range(2):
        assert_same(want1, native.build(lp1, ids1, 8, out=out1))
        assert_same(want2, native.build(lp2, ids2, 8, out=out2))
        assert_same(want2, native.build(lp2, ids2, 8, out=out1))
        assert_same(want1, native.build(lp1, ids1, 8))
    out1.visibility = uninitialised_batch(3, 8).visibility  # same TreeBatch, one array replaced
    assert_same(want2, native.build(lp2, ids2, 8, out=out1))
    read_only = lp1.copy(), ids1.copy()
    for array in read_only:
        array.flags.writeable = False
    assert_same(want1, native.build(*read_only, 8))
    strided = np.zeros((3, 4, 16), np.float32), np.zeros((3, 4, 16), np.int64)
    strided[0][:, :, ::2], strided[1][:, :, ::2] = lp1, ids1
    assert_same(want1, native.build(strided[0][:, :, ::2], strided[1][:, :, ::2], 8))


def test_out_with_wrong_shape_is_refused(native, topk_inputs):
    lp, ids = topk_inputs("uniform", 2, 4, 6)
    with pytest.raises(ValueError, match="out.visibility"):
        out = TreeBatch.empty(2, 8)
        out.visibility = np.zeros((2, 9, 8), np.bool_)
        native.build(lp, ids, 8, out=out)
    with pytest.raises(ValueError, match="out.node_count"):
        native.build(lp, ids, 8, out=TreeBatch.empty(3, 8))


# -- properties -------------------------------------------------------------------------------------------

TIE_GRID = [0.0, -0.25, -0.5, -0.75, -1.0, -1.5, -2.0, -4.0]


@st.composite
def batches(draw):
    batch = draw(st.integers(1, 4))
    depth = draw(st.integers(1, 8))
    k = draw(st.integers(1, 40))
    budget = draw(st.integers(1, 80))
    n = batch * depth * k
    kind = draw(st.sampled_from(["ties", "floats", "bf16-like"]))
    if kind == "ties":
        values = draw(st.lists(st.sampled_from(TIE_GRID), min_size=n, max_size=n))
    elif kind == "floats":
        values = draw(st.lists(st.floats(-12.0, 0.0, width=32), min_size=n, max_size=n))
    else:  # few mantissa bits: ties between sums too
        values = draw(st.lists(st.integers(0, 64).map(lambda v: -v / 16.0), min_size=n, max_size=n))
    lp = -np.sort(-np.array(values, np.float32).reshape(batch, depth, k), axis=-1)
    ids = np.array(draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n)), np.int64)
    return np.ascontiguousarray(lp), ids.reshape(batch, depth, k), budget


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), st.sampled_from([1, 0, 2]))
def test_equals_reference_property(native_library, case, threads):
    lp, ids, budget = case
    builder = NativeBuilder(library=native_library, threads=threads)
    assert_matches_reference(builder, lp, ids, budget)


# -- the binding and its errors ---------------------------------------------------------------------------


def test_names_labels_and_info(native_library):
    one = get_builder("native", library=native_library)
    every = get_builder("native-mt", library=native_library)
    assert (one.name, one.threads, one.label) == ("native", 1, "native C++ (1 thread)")
    assert (every.name, every.threads) == ("native-mt", 0)
    assert "all cores" in every.label
    info = every.info()
    assert info["threads_requested"] == 0 and info["threads"] >= 1
    assert info["library"] == str(native_library)
    assert "-ffp-contract=off" in info["cxx_flags"]
    assert info["parallel_min_pops"] > 0
    with pytest.raises(ValueError, match="threads"):
        NativeBuilder(threads=-1)


def test_inputs_are_validated(native, topk_inputs):
    lp, ids = topk_inputs("uniform", 2, 3, 4)
    bad = lp.copy()
    bad[1, 2, 3] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        native.build(bad, ids, 4)
    with pytest.raises(ValueError, match="budget"):
        native.build(lp, ids, 0)
    with pytest.raises(ValueError, match="float32"):
        native.build(lp.astype(np.float64), ids, 4)


def test_validate_false_skips_value_checks_but_not_layout(native_library, topk_inputs):
    builder = NativeBuilder(library=native_library, validate=False)
    lp, ids = topk_inputs("uniform", 2, 3, 4)
    bad = lp.copy()
    bad[:, :, 1:] = np.nan  # meaningless trees, but in bounds
    builder.build(bad, ids, 30)
    with pytest.raises(ValueError, match="float32"):
        builder.build(lp.astype(np.float64), ids, 4)
    with pytest.raises(ValueError, match="one shape"):
        builder.build(lp, ids[:, :2], 4)
    with pytest.raises(ValueError, match="budget"):
        builder.build(lp, ids, -3)


def test_library_status_codes(native_library):
    lib = ctypes.CDLL(str(native_library))
    fn = lib.ddtree_build_batch
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 4 + [ctypes.c_int] + [ctypes.c_void_p] * 7
    out = uninitialised_batch(1, 4)
    lp = np.zeros((1, 2, 3), np.float32)
    ids = np.zeros((1, 2, 3), np.int64)
    ptrs = [a.ctypes.data for a in out.as_dict().values()]
    assert fn(lp.ctypes.data, ids.ctypes.data, 1, 2, 3, 4, 1, *ptrs) == 0
    assert fn(lp.ctypes.data, ids.ctypes.data, 0, 2, 3, 4, 1, *ptrs) == -1
    assert fn(lp.ctypes.data, ids.ctypes.data, 1, 2, 3, 0, 1, *ptrs) == -1
    assert fn(lp.ctypes.data, ids.ctypes.data, 1, 2, 3, 2**31, 1, *ptrs) == -1
    assert fn(None, ids.ctypes.data, 1, 2, 3, 4, 1, *ptrs) == -2
    assert fn(lp.ctypes.data, ids.ctypes.data, 1, 2, 3, 4, 1, *ptrs[:-1], None) == -2
    assert fn(lp.ctypes.data, ids.ctypes.data, 1, 2, 3, 4, -1, *ptrs) == -3


def _build_in_child(library: str, queue) -> None:
    lp = np.full((64, 4, 128), -1.0, np.float32)
    ids = np.zeros((64, 4, 128), np.int64)
    trees = NativeBuilder(library=library, threads=0).build(lp, ids, 128)
    queue.put(int(trees.node_count.sum()))


def test_pool_survives_fork(native_library):
    lp = np.full((64, 4, 128), -1.0, np.float32)
    ids = np.zeros((64, 4, 128), np.int64)
    NativeBuilder(library=native_library, threads=0).build(lp, ids, 128)  # the parent's pool exists now
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_build_in_child, args=(str(native_library), queue))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == 64 * 128


def test_library_from_environment(native_library, monkeypatch):
    monkeypatch.setenv("DDTREE_NATIVE_LIB", str(native_library))
    builder = NativeBuilder()
    assert builder.unavailable_reason() is None
    assert builder.info()["library"] == str(native_library)


def test_missing_library_is_unavailable(tmp_path, monkeypatch):
    missing = tmp_path / "nope.so"
    builder = NativeBuilder(library=missing)
    assert (
        "native library not found" in builder.unavailable_reason()
        and str(missing) in builder.info()["unavailable"]
    )
    with pytest.raises(BuilderUnavailable, match="not found"):
        builder.build(np.zeros((1, 1, 1), np.float32), np.zeros((1, 1, 1), np.int64), 1)
    monkeypatch.setenv("DDTREE_NATIVE_LIB", str(missing))
    assert "$DDTREE_NATIVE_LIB" in NativeBuilder().unavailable_reason()


def test_no_compiler_and_no_library_is_unavailable(tmp_path, monkeypatch):
    monkeypatch.delenv("DDTREE_NATIVE_LIB", raising=False)
    monkeypatch.setenv("DDTREE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "no-such-compiler-ddtree")
    reason = NativeBuilder().unavailable_reason()
    assert "no-such-compiler-ddtree" in reason and "no native library given" in reason


def test_not_a_native_library(tmp_path):
    bogus = tmp_path / "bogus.so"
    bogus.write_text("not a library")
    assert NativeBuilder(library=bogus).unavailable_reason()


# -- native_build -----------------------------------------------------------------------------------------


def test_build_failure_raises_with_the_compiler_message(tmp_path):
    if native_build.find_compiler() is None:
        pytest.skip("no C++ compiler")
    source = tmp_path / "broken.cpp"
    source.write_text('extern "C" int f() { return undeclared_name_xyz; }\n')
    output = tmp_path / "out" / "lib.so"
    with pytest.raises(RuntimeError, match="undeclared_name_xyz"):
        native_build.build_native_library(source, output)
    assert not output.exists()
    assert list(output.parent.iterdir()) == []  # no temporary left behind


def test_build_is_atomic_and_replaces(tmp_path, native_library):
    output = tmp_path / "lib.so"
    output.write_text("old")
    native_build.build_native_library(native_build.DEFAULT_SOURCE, output)
    assert output.read_bytes()[:4] == b"\x7fELF"
    assert [p.name for p in tmp_path.iterdir()] == ["lib.so"]


def test_cached_library_is_built_once_and_keyed_by_source(tmp_path, monkeypatch):
    if native_build.find_compiler() is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setenv("DDTREE_CACHE", str(tmp_path / "cache"))
    first = native_build.cached_native_library()
    assert first.parent == tmp_path / "cache" and first.is_file()
    stamp = first.stat().st_mtime_ns
    assert native_build.cached_native_library() == first and first.stat().st_mtime_ns == stamp
    edited = tmp_path / "tree_build_cpu.cpp"
    edited.write_text(native_build.DEFAULT_SOURCE.read_text() + "\n// edited\n")
    assert native_build.cached_library_path(edited) != first


def test_source_is_where_the_package_expects_it():
    root = Path(__file__).resolve().parents[2]
    assert native_build.DEFAULT_SOURCE == root / "kernels" / "native" / "tree_build_cpu.cpp"
    text = native_build.DEFAULT_SOURCE.read_text()
    assert "ffast-math" not in " ".join(native_build.CXX_FLAGS).replace("-fno-fast-math", "")
    assert 'extern "C"' in text
