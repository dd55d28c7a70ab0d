"""Trace generation, the trace file format and its validation."""

from __future__ import annotations

import re
import sys
import types

import numpy as np
import pytest

from ddtree_bench import traces
from ddtree_bench.cli import main
from ddtree_bench.traces import (
    DISTRIBUTIONS,
    TraceSpec,
    arrays_sha256,
    bf16_round,
    generate,
    generate_trace,
    import_recorded,
    load_trace,
    peek_trace,
    resolve_device,
    save_trace,
    trace_sha256,
)
from ddtree_bench.validation import check_topk_arrays

V = 512
GENERATED = ("uniform", "peaked", "bf16")


def small(distribution="uniform", requests=4, depth=3, topk=16, vocab_size=V, seed=0, **options):
    return generate_trace(distribution, requests, depth, topk, vocab_size, seed, device="cpu", **options)


# ----------------------------------------------------------------------------------------- generation


@pytest.mark.parametrize("distribution", GENERATED)
def test_shapes_dtypes_and_format(distribution):
    lp, ids = small(distribution, requests=5, depth=4, topk=32)
    assert lp.shape == ids.shape == (5, 4, 32)
    assert lp.dtype == np.float32 and ids.dtype == np.int64
    check_topk_arrays(lp, ids)  # finite, <= 0, sorted descending, ids >= 0
    assert (ids < V).all()
    for row in ids.reshape(-1, 32):
        assert len(set(row.tolist())) == 32  # distinct tokens per position


@pytest.mark.parametrize("distribution", GENERATED)
def test_same_seed_same_trace_other_seed_other_trace(distribution):
    a = small(distribution, seed=7)
    b = small(distribution, seed=7)
    c = small(distribution, seed=8)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])
    assert not np.array_equal(a[1], c[1])


@pytest.mark.parametrize("distribution", GENERATED)
def test_log_probs_are_the_top_of_the_full_log_softmax(distribution):
    """With K = V every token is present: the probabilities sum to one, i.e. the top-K came from the
    full softmax over the vocabulary, and the top-K' is the prefix of the top-K."""
    lp, ids = small(distribution, requests=2, depth=2, topk=V)
    total = np.exp(lp.astype(np.float64)).sum(axis=-1)
    np.testing.assert_allclose(total, 1.0, rtol=1e-2 if distribution == "bf16" else 1e-5)
    assert (np.sort(ids, axis=-1) == np.arange(V)).all()
    lp8, ids8 = small(distribution, requests=2, depth=2, topk=8)
    np.testing.assert_array_equal(lp8, lp[..., :8])
    np.testing.assert_array_equal(ids8, ids[..., :8])


def test_ties_are_ordered_by_token_id():
    lp, ids = small("bf16", requests=8, depth=4, topk=128)
    equal = lp[..., 1:] == lp[..., :-1]
    assert equal.any()
    assert (ids[..., 1:][equal] > ids[..., :-1][equal]).all()


def test_topk_selection_is_canonical_at_the_cut():
    """Against a brute-force full sort (value descending, then id ascending) on rows full of ties."""
    rng = np.random.default_rng(3)
    values = rng.integers(-6, 0, size=(40, 300)).astype(np.float32)
    for k in (1, 7, 50, 299, 300):
        vals, cols = traces._topk_canonical(values, k)
        for r in range(values.shape[0]):
            order = np.lexsort((np.arange(300), -values[r]))[:k]
            np.testing.assert_array_equal(cols[r], order)
            np.testing.assert_array_equal(vals[r], values[r, order])


def test_bf16_has_exact_ties_and_bf16_values():
    lp, _ = small("bf16", requests=8, depth=4, topk=128)
    bits = lp.view(np.uint32)
    assert (bits & 0xFFFF == 0).all()  # exactly representable in bfloat16
    np.testing.assert_array_equal(bf16_round(lp), lp)
    tied = (lp[..., 1:] == lp[..., :-1]).mean()
    assert tied > 0.3, tied
    lp32, _ = small("peaked", requests=8, depth=4, topk=128)
    assert (lp32[..., 1:] == lp32[..., :-1]).mean() < 0.01


def test_bf16_round_to_nearest_even():
    one_ulp = 2.0**-7  # bf16 has 7 explicit mantissa bits
    x = np.array(
        [1.0, 1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-8 + 2.0**-20, -(1 + 3 * 2.0**-8), 0.0, -0.0], np.float32
    )
    got = bf16_round(x)
    want = [1.0, 1.0, 1 + 2 * one_ulp, 1 + one_ulp, -(1 + 2 * one_ulp), 0.0, -0.0]
    np.testing.assert_array_equal(got, np.array(want, np.float32))
    assert np.signbit(got[6])
    np.testing.assert_array_equal(x[1], np.float32(1 + 2.0**-8))  # the input is left alone


def test_peaked_is_confident_early_and_flatter_late():
    lp, _ = small("peaked", requests=64, depth=16, topk=8)
    top1 = np.exp(lp[:, :, 0]).mean(axis=0)
    assert top1[0] > 0.7
    assert top1[0] > top1[7] > top1[15]
    uniform, _ = small("uniform", requests=64, depth=16, topk=8)
    assert np.exp(uniform[:, :, 0]).mean() < 0.05


def test_chunking_and_threads_do_not_change_the_trace():
    base = small("peaked", requests=7, depth=3, topk=16)
    for options in ({"chunk_bytes": 1}, {"chunk_bytes": 3 * V * 4 * 2, "threads": 2}, {"threads": 1}):
        other = small("peaked", requests=7, depth=3, topk=16, **options)
        np.testing.assert_array_equal(base[0], other[0])
        np.testing.assert_array_equal(base[1], other[1])


def test_chunks_bound_the_memory(monkeypatch):
    seen = []
    real = traces._chunk_cpu

    def spy(distribution, first, count, *rest):
        seen.append(count)
        return real(distribution, first, count, *rest)

    monkeypatch.setattr(traces, "_chunk_cpu", spy)
    small("uniform", requests=10, depth=2, topk=4, chunk_bytes=3 * 2 * V * 4)
    assert sorted(seen) == [1, 3, 3, 3]


def test_a_batch_is_a_prefix_of_a_bigger_trace():
    big = small("bf16", requests=6, depth=4, topk=16)
    few = small("bf16", requests=2, depth=4, topk=16)
    np.testing.assert_array_equal(big[0][:2], few[0])
    np.testing.assert_array_equal(big[1][:2], few[1])


def test_metadata_records_device_and_generator():
    trace = generate(TraceSpec("uniform", 2, 2, 4, V, 5), device="cpu")
    assert trace.metadata["device"] == "cpu"
    assert trace.metadata["distribution"] == "uniform"
    assert trace.metadata["seed"] == 5
    assert trace.metadata["vocab_size"] == V
    assert trace.metadata["generator_version"] == traces.GENERATOR_VERSION


@pytest.mark.parametrize(
    "kwargs, problem",
    [
        ({"distribution": "zipf"}, "unknown distribution"),
        ({"distribution": "recorded"}, "import_recorded"),
        ({"requests": 0}, "requests must be >= 1"),
        ({"depth": 0}, "depth must be >= 1"),
        ({"depth": -3}, "depth must be >= 1"),
        ({"topk": 0}, "topk must be >= 1"),
        ({"topk": 1.5}, "topk must be an integer"),
        ({"topk": V + 1}, "larger than the vocabulary"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"device": "tpu"}, "unknown device"),
    ],
)
def test_bad_generation_arguments(kwargs, problem):
    args = {"distribution": "uniform", "requests": 2, "depth": 2, "topk": 4, "vocab_size": V, "seed": 0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=problem):
        generate_trace(**args)


def test_distributions_constant():
    assert DISTRIBUTIONS == (
        "uniform",
        "peaked",
        "bf16",
        "recorded",
        "drafter",
        "drafter-bf16",
        "drafter-k2.6",
    )


def _fake_cupy(monkeypatch, error):
    runtime = types.SimpleNamespace(getDeviceCount=lambda: (_ for _ in ()).throw(error))
    module = types.ModuleType("cupy")
    module.cuda = types.SimpleNamespace(runtime=runtime)
    monkeypatch.setitem(sys.modules, "cupy", module)


def test_device_falls_back_to_cpu_without_a_working_gpu(monkeypatch):
    class CUDARuntimeError(RuntimeError):
        pass

    _fake_cupy(
        monkeypatch, CUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")
    )
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="no working CUDA device"):
        resolve_device("cuda")
    trace = generate(TraceSpec("uniform", 2, 2, 4, V, 0), device="auto")
    assert trace.metadata["device"] == "cpu"
    np.testing.assert_array_equal(trace.top_log_probs, small("uniform", requests=2, depth=2, topk=4)[0])


def test_device_without_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import fails
    assert resolve_device("auto") == "cpu"


# ----------------------------------------------------------------------------------------- files


def test_save_load_round_trip(tmp_path):
    trace = generate(TraceSpec("bf16", 3, 2, 8, V, 4), device="cpu")
    path = tmp_path / "sub" / "t.npz"
    save_trace(path, trace.top_log_probs, trace.top_token_ids, **trace.metadata)
    loaded = load_trace(path)
    np.testing.assert_array_equal(loaded.top_log_probs, trace.top_log_probs)
    np.testing.assert_array_equal(loaded.top_token_ids, trace.top_token_ids)
    assert loaded.top_log_probs.dtype == np.float32 and loaded.top_token_ids.dtype == np.int64
    assert loaded.metadata == trace.metadata | {
        "sha256": arrays_sha256(trace.top_log_probs, trace.top_token_ids)
    }
    assert (loaded.requests, loaded.depth, loaded.topk) == (3, 2, 8)
    lp, ids = loaded.batch(2)
    np.testing.assert_array_equal(lp, trace.top_log_probs[:2])
    with pytest.raises(ValueError, match="batch 4 is larger than the 3 requests"):
        loaded.batch(4)
    assert sorted(p.name for p in path.parent.iterdir()) == ["t.npz"]  # no temporary left behind


def test_save_refuses_bad_arrays_and_writes_nothing(tmp_path):
    lp, ids = small(requests=2, depth=2, topk=4)
    lp = lp.copy()
    lp[1, 1, 2] = np.nan
    path = tmp_path / "t.npz"
    with pytest.raises(ValueError, match="non-finite"):
        save_trace(path, lp, ids)
    assert list(tmp_path.iterdir()) == []


def test_failed_write_leaves_no_partial_file(tmp_path, monkeypatch):
    lp, ids = small(requests=2, depth=2, topk=4)

    def broken(member, array, **options):
        member.write(b"\x93NUMPY partial")
        raise OSError("disk full")

    monkeypatch.setattr(np.lib.format, "write_array", broken)
    with pytest.raises(OSError, match="disk full"):
        save_trace(tmp_path / "t.npz", lp, ids)
    assert list(tmp_path.iterdir()) == []


def _valid(requests=2, depth=3, topk=4):
    lp, ids = small(requests=requests, depth=depth, topk=topk)
    return {"top_log_probs": lp.copy(), "top_token_ids": ids.copy()}


def _unsorted():
    arrays = _valid()
    arrays["top_log_probs"][1, 2, :] = arrays["top_log_probs"][1, 2, ::-1].copy()
    return arrays


def _with(**changes):
    arrays = _valid()
    arrays.update(changes)
    return arrays


def _set(name, index, value):
    arrays = _valid()
    arrays[name][index] = value
    return arrays


BAD_TRACES = {
    "missing-log-probs": (lambda: {"top_token_ids": _valid()["top_token_ids"]}, "missing array"),
    "missing-ids": (lambda: {"top_log_probs": _valid()["top_log_probs"]}, "missing array"),
    "shape-mismatch": (
        lambda: _with(top_token_ids=_valid(requests=3)["top_token_ids"]),
        "shape .* != top_log_probs shape",
    ),
    "not-3d": (lambda: _with(top_log_probs=np.zeros((2, 3), np.float32)), "must be 3-D"),
    "float64-log-probs": (
        lambda: _with(top_log_probs=_valid()["top_log_probs"].astype(np.float64)),
        "top_log_probs must be float32",
    ),
    "int32-ids": (
        lambda: _with(top_token_ids=_valid()["top_token_ids"].astype(np.int32)),
        "top_token_ids must be int64",
    ),
    "nan": (lambda: _set("top_log_probs", (1, 1, 1), np.nan), "non-finite"),
    "inf": (lambda: _set("top_log_probs", (0, 2, 3), -np.inf), "non-finite"),
    "positive": (lambda: _set("top_log_probs", (0, 0, 0), 0.5), "positive log-probability"),
    "unsorted": (_unsorted, "sorted descending"),
    "negative-id": (lambda: _set("top_token_ids", (1, 0, 2), -5), "negative token id"),
    "k0": (
        lambda: {
            "top_log_probs": np.zeros((2, 3, 0), np.float32),
            "top_token_ids": np.zeros((2, 3, 0), np.int64),
        },
        "K = 0",
    ),
    "l0": (
        lambda: {
            "top_log_probs": np.zeros((2, 0, 4), np.float32),
            "top_token_ids": np.zeros((2, 0, 4), np.int64),
        },
        "L = 0",
    ),
    "r0": (
        lambda: {
            "top_log_probs": np.zeros((0, 3, 4), np.float32),
            "top_token_ids": np.zeros((0, 3, 4), np.int64),
        },
        "R = 0",
    ),
}


def _write_bad(tmp_path, case):
    make, problem = BAD_TRACES[case]
    path = tmp_path / f"{case}.npz"
    np.savez(path, **make())
    return path, problem


@pytest.mark.parametrize("case", sorted(BAD_TRACES))
def test_load_rejects_bad_trace_files(tmp_path, case):
    path, problem = _write_bad(tmp_path, case)
    with pytest.raises(ValueError, match=problem) as info:
        load_trace(path)
    message = str(info.value)
    assert str(path) in message
    assert "\n" not in message


@pytest.mark.parametrize("case", sorted(BAD_TRACES))
@pytest.mark.parametrize("command", ["build", "check"])
def test_cli_rejects_bad_trace_files(tmp_path, capsys, case, command):
    path, problem = _write_bad(tmp_path, case)
    out = tmp_path / "out" / ("trees.npz" if command == "build" else "summary.json")
    code = main([command, "--builder", "reference", "--trace", str(path), "--budget", "4", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ddtree-bench: error: ")
    assert str(path) in lines[0]
    assert re.search(problem, lines[0])
    assert not out.exists()
    assert not (out.parent.exists() and any(out.parent.iterdir()))


@pytest.mark.parametrize(
    "content, problem",
    [(b"this is not a zip file", "not an .npz trace"), (None, "file not found")],
)
def test_load_rejects_unreadable_files(tmp_path, content, problem):
    path = tmp_path / "t.npz"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=problem):
        load_trace(path)


def test_load_rejects_pickled_objects(tmp_path):
    path = tmp_path / "t.npz"
    arrays = _valid()
    np.savez(path, **arrays, extra=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="cannot read it as an .npz"):
        load_trace(path)


# ----------------------------------------------------------------------------------------- recorded


def test_import_recorded_validates_slices_and_widens(tmp_path):
    lp, ids = small("peaked", requests=5, depth=4, topk=16)
    src = tmp_path / "captured.npz"
    np.savez(
        src, top_log_probs=lp.astype(np.float16), top_token_ids=ids.astype(np.int32), model=np.array("x")
    )
    dst = tmp_path / "traces" / "recorded.npz"
    written = import_recorded(src, dst, depth=2, topk=8, requests=3)
    loaded = load_trace(dst)
    assert loaded.top_log_probs.shape == (3, 2, 8)
    np.testing.assert_array_equal(loaded.top_log_probs, lp.astype(np.float16).astype(np.float32)[:3, :2, :8])
    np.testing.assert_array_equal(loaded.top_token_ids, ids[:3, :2, :8])
    assert loaded.metadata["distribution"] == "recorded"
    assert loaded.metadata["source"] == str(src)
    assert loaded.metadata["model"] == "x"
    np.testing.assert_array_equal(written.top_log_probs, loaded.top_log_probs)
    import_recorded(src, tmp_path / "whole.npz")
    assert load_trace(tmp_path / "whole.npz").top_log_probs.shape == (5, 4, 16)


@pytest.mark.parametrize(
    "kwargs, problem",
    [({"depth": 9}, "depth 9 requested but the file has only 4"), ({"topk": 0}, "topk must be >= 1")],
)
def test_import_recorded_rejects_bad_slices(tmp_path, kwargs, problem):
    lp, ids = small(requests=2, depth=4, topk=8)
    src = tmp_path / "captured.npz"
    np.savez(src, top_log_probs=lp, top_token_ids=ids)
    with pytest.raises(ValueError, match=problem):
        import_recorded(src, tmp_path / "out.npz", **kwargs)
    assert not (tmp_path / "out.npz").exists()


@pytest.mark.parametrize("case", ["unsorted", "nan", "missing-ids", "float64-log-probs"])
def test_import_recorded_rejects_bad_files(tmp_path, case):
    path, problem = _write_bad(tmp_path, case)
    with pytest.raises(ValueError, match=problem):
        import_recorded(path, tmp_path / "out.npz")
    assert not (tmp_path / "out.npz").exists()


def test_two_generations_with_one_seed_give_identical_bytes(tmp_path):
    """The default generation (the CPU's) is a function of its arguments: the same file, byte for byte, and
    the same sha256, which every row computed from it records."""
    paths = []
    for name in ("a", "b"):
        trace = generate(TraceSpec("peaked", 4, 3, 16, V, 7))
        assert trace.metadata["device"] == "cpu"  # the default: never CuPy's generator unless asked for
        paths.append(tmp_path / f"{name}.npz")
        save_trace(paths[-1], trace.top_log_probs, trace.top_token_ids, **trace.metadata)
    first, second = (path.read_bytes() for path in paths)
    assert first == second
    digest = arrays_sha256(trace.top_log_probs, trace.top_token_ids)
    assert trace_sha256(paths[0]) == digest == load_trace(paths[1]).sha256
    other = generate(TraceSpec("peaked", 4, 3, 16, V, 8))
    assert arrays_sha256(other.top_log_probs, other.top_token_ids) != digest
    assert peek_trace(paths[0]) == (4, 3, 16)


def test_peek_trace_names_what_is_wrong(tmp_path):
    lp, ids = small(requests=2, depth=2, topk=4)
    np.savez(tmp_path / "mixed.npz", top_log_probs=lp, top_token_ids=ids[:, :1])
    np.savez(tmp_path / "floats.npz", top_log_probs=lp.astype(np.float64), top_token_ids=ids)
    for name, message in (
        ("absent.npz", "file not found"),
        ("mixed.npz", "must be one 3-D shape"),
        ("floats.npz", "top_log_probs must be float32"),
    ):
        with pytest.raises(ValueError, match=message):
            peek_trace(tmp_path / name)


# ----------------------------------------------------------------------------------------- digests, checks


def test_the_digest_is_computed_from_the_arrays_never_read_from_the_file(tmp_path):
    lp, ids = generate_trace("bf16", 3, 2, 4, 64, 1)
    original = tmp_path / "original.npz"
    save_trace(original, lp, ids, distribution="bf16")
    stored = str(np.load(original)["sha256"])
    edited_lp = lp.copy()
    edited_lp[0, 0, :] -= 1.0  # still a valid trace: sorted, finite, <= 0
    edited = tmp_path / "edited.npz"
    np.savez(edited, top_log_probs=edited_lp, top_token_ids=ids, sha256=np.asarray(stored))  # the old digest
    digest = traces.arrays_sha256(edited_lp, ids)
    assert digest != stored
    trace = load_trace(edited)
    assert trace.sha256 == digest and traces.trace_sha256(edited) == digest
    assert traces.row_sha256(edited, trace.metadata) == digest  # what every timing row records
    assert traces.trace_sha256(original) == stored == load_trace(original).sha256


def test_check_trace_file_reads_every_request(tmp_path, monkeypatch):
    monkeypatch.setattr(traces, "CHECK_CHUNK_VALUES", 8)  # one request (2 x 4 values) per chunk
    lp, ids = generate_trace("uniform", 5, 2, 4, 64, 2)
    good = tmp_path / "good.npz"
    np.savez(good, top_log_probs=lp.astype(np.float16), top_token_ids=ids.astype(np.int32), vocab_size=64)
    assert traces.check_trace_file(good) == (5, 2, 4)  # float16 and int32 widen losslessly
    cases = {  # (array, index, value), the vocabulary given, the problem named (positions: the trace's)
        "nan": (("lp", (4, 1, 2), np.nan), None, "non-finite value (NaN or inf) at (4, 1, 2)"),
        "unsorted": (("lp", (3, 0, 3), 0.0), None, "row (3, 0) is not"),
        "vocab": (("ids", (2, 1, 0), 64), None, "token id 64 at (2, 1, 0), not below"),
        "given-vocab": (None, 10, "not below the vocabulary size 10"),
    }
    for name, (edit, vocab, problem) in cases.items():
        bad = {"lp": lp.copy(), "ids": ids.copy()}
        if edit is not None:
            bad[edit[0]][edit[1]] = edit[2]
        bad_lp, bad_ids = bad["lp"], bad["ids"]
        path = tmp_path / f"{name}.npz"
        np.savez(path, top_log_probs=bad_lp, top_token_ids=bad_ids, vocab_size=64)
        with pytest.raises(ValueError) as error:
            traces.check_trace_file(path, vocab)
        text = str(error.value)
        assert "\n" not in text and text.startswith(f"{path}: "), text
        assert problem in text, text


@pytest.mark.parametrize("threads", [0, -3, 1.5])
def test_generate_refuses_threads_below_one(threads):
    with pytest.raises(ValueError, match="threads must be"):
        generate_trace("uniform", 2, 2, 4, 64, 0, threads=threads)
