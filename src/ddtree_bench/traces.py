"""Traces: the per-request top-K drafter outputs every builder is timed on.

A trace holds ``R`` requests of ``L`` block positions each, and per position the top ``K`` entries of the
full log-softmax over a vocabulary of ``V`` tokens:

=================  ============  =======  ==================================================
array              shape         dtype    meaning
=================  ============  =======  ==================================================
top_log_probs      [R, L, K]     float32  log-probabilities, each row sorted descending, <= 0
top_token_ids      [R, L, K]     int64    the matching token ids (>= 0)
=================  ============  =======  ==================================================

Trace files are ``.npz`` archives with those two arrays plus optional 0-d metadata arrays
(``distribution``, ``seed``, ``vocab_size``, ``generator_version``, ``device``, ...). A batch of size ``b``
is the first ``b`` requests of a trace.

Generated distributions (``generate_trace``), with ``z ~ N(0, 1)`` i.i.d. per (request, position, token):

- ``uniform``: ``logits = z``.
- ``peaked`` (the block-diffusion drafter shape: confident early positions, flatter later): one "hot" token
  ``h[d]`` per position, drawn uniformly from the vocabulary, gets a boost::

      logits[d, v] = z[d, v] + a[d] * (v == h[d])
      p[d] = 0.9 * 0.85 ** d                              (d = 0 .. L-1, the block position)
      a[d] = ln(p[d] / (1 - p[d])) + ln(V) + 1/2

  so that the hot token's expected probability is about ``p[d]`` (``E[sum exp z] = V e^(1/2)``): 0.90 at the
  first position, 0.29 at d = 7, 0.08 at d = 15.
- ``bf16``: the ``peaked`` logits rounded to bfloat16, then the log-softmax (in float32) rounded to bfloat16
  again, as a bf16 model's ``log_softmax`` output: many exact ties. Rounding is round-to-nearest-even.
- ``recorded``: a user's file, imported with ``import_recorded`` (never generated).
- ``drafter`` and ``drafter-bf16``: a mixture of confident and uncertain blocks whose mass after the top-1
  sits on a few alternatives, with parameters (``drafter=``) fitted to the DDTree paper's acceptance; see
  ``ddtree_bench.drafter``. Generated on the CPU from ``spawn_key=(r, 2)`` without full-vocabulary logits.

The log-softmax is ``logits - lse`` in float32 with ``lse = max + ln(sum(exp(logits - max)))`` (the sum in
float64). The top K are chosen on those final values, canonically: largest value first, equal values by
increasing token id (so the top-K' of a trace is the prefix of its top-K for K' < K).

Determinism: request ``r`` draws its noise from ``PCG64(SeedSequence(seed, spawn_key=(r, 0)))`` and its hot
tokens from ``spawn_key=(r, 1)``, so a trace is a function of its arguments only (not of chunking or
threads), and the first ``b`` requests of a trace equal a trace of ``b`` requests. Generation runs on the CPU
by default (``device="cpu"``), so the same arguments give bit-identical traces on every machine. Only as an
explicit opt-in (``device="cuda"``, or ``"auto"``: the GPU where CuPy finds one) does the noise come from
CuPy's generator instead: the same seeds, different numbers, so other traces; the metadata records the device.

Identity: the SHA-256 of the two arrays (``arrays_sha256``: each array's dtype, shape and C-order bytes).
``save_trace`` also stores it in the file (``sha256``) and writes the archive with fixed timestamps, so the
same trace gives the same file; but the digest every row carries (``trace_sha256``) is always computed from
the arrays, never read from that field, so an edited trace never passes for the original. Two machines'
results can so be told apart by their inputs, not only by their labels.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import os
import warnings
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ddtree_bench import catalog
from ddtree_bench.bf16 import bf16_round
from ddtree_bench.drafter import DRAFTER_DISTRIBUTIONS, generate_drafter
from ddtree_bench.drafter import check_params as check_drafter_params
from ddtree_bench.io import atomic_output
from ddtree_bench.validation import check_topk_arrays

DISTRIBUTIONS = catalog.DISTRIBUTIONS
GENERATED_DISTRIBUTIONS = ("uniform", "peaked", "bf16", "drafter", "drafter-bf16", "drafter-k2.6")
DEVICES = ("auto", "cpu", "cuda")
DEFAULT_VOCAB_SIZE = 163840
GENERATOR_VERSION = 1
DEFAULT_CHUNK_BYTES = 64 << 20
ARRAYS = ("top_log_probs", "top_token_ids")

PEAKED_TOP1 = 0.9
PEAKED_DECAY = 0.85


@dataclass
class Trace:
    """A loaded (validated) trace: ``top_log_probs`` [R, L, K] float32, ``top_token_ids`` [R, L, K] int64."""

    top_log_probs: np.ndarray
    top_token_ids: np.ndarray
    metadata: dict = field(default_factory=dict)
    path: Path | None = None
    _sha256: str | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def requests(self) -> int:
        return int(self.top_log_probs.shape[0])

    @property
    def depth(self) -> int:
        return int(self.top_log_probs.shape[1])

    @property
    def topk(self) -> int:
        return int(self.top_log_probs.shape[2])

    def batch(self, size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The first ``size`` requests (all when ``None``)."""
        if size is None:
            return self.top_log_probs, self.top_token_ids
        size = check_positive_int(size, "batch")
        if size > self.requests:
            where = f"trace {self.path}" if self.path else "trace"
            raise ValueError(f"batch {size} is larger than the {self.requests} requests in {where}")
        return self.top_log_probs[:size], self.top_token_ids[:size]

    @property
    def sha256(self) -> str:
        """The trace's identity: ``arrays_sha256`` of its two arrays, computed (once) from them; a digest the
        file stores is never taken for it."""
        if self._sha256 is None:
            self._sha256 = arrays_sha256(self.top_log_probs, self.top_token_ids)
        return self._sha256


def arrays_sha256(top_log_probs: np.ndarray, top_token_ids: np.ndarray) -> str:
    """SHA-256 over each array's dtype, shape and C-order bytes: equal exactly for bit-identical traces (the
    file around them, whose metadata names e.g. the numpy version, does not enter it)."""
    digest = hashlib.sha256()
    for array in (top_log_probs, top_token_ids):
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{tuple(int(n) for n in array.shape)}".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------- validation


def check_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def check_distribution(distribution) -> str:
    if distribution not in DISTRIBUTIONS:
        raise ValueError(
            f"unknown distribution {distribution!r}; known distributions: {', '.join(DISTRIBUTIONS)}"
        )
    return distribution


@dataclass(frozen=True)
class TraceSpec:
    """What a generated trace is (module docstring): its distribution, ``requests`` (R), ``depth`` (L),
    ``topk`` (K), the vocabulary size (V) and the seed; the same spec gives the same trace."""

    distribution: str
    requests: int
    depth: int
    topk: int
    vocab_size: int = DEFAULT_VOCAB_SIZE
    seed: int = 0

    def checked(self) -> TraceSpec:
        """The spec with every field checked (one-line ValueError naming the first bad one)."""
        check_distribution(self.distribution)
        if self.distribution == "recorded":
            raise ValueError("distribution 'recorded' is not generated: import the file with import_recorded")
        requests = check_positive_int(self.requests, "requests")
        depth = check_positive_int(self.depth, "depth")
        topk = check_positive_int(self.topk, "topk")
        vocab_size = check_positive_int(self.vocab_size, "vocab_size")
        if topk > vocab_size:
            raise ValueError(f"topk {topk} is larger than the vocabulary size {vocab_size}")
        seed = self.seed
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        return TraceSpec(self.distribution, requests, depth, topk, vocab_size, int(seed))


# ----------------------------------------------------------------------------------------- bfloat16


# ----------------------------------------------------------------------------------------- generation


def peaked_boosts(depth: int, vocab_size: int) -> np.ndarray:
    """The hot-token boost ``a[d]`` per block position (see the module docstring), float32 [depth]."""
    d = np.arange(depth, dtype=np.float64)
    p = PEAKED_TOP1 * PEAKED_DECAY**d
    return (np.log(p / (1.0 - p)) + math.log(vocab_size) + 0.5).astype(np.float32)


def _seed_sequence(seed: int, request: int, stream: int) -> np.random.SeedSequence:
    return np.random.SeedSequence(seed, spawn_key=(request, stream))


def _hot_tokens(seed: int, request: int, depth: int, vocab_size: int) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64(_seed_sequence(seed, request, 1)))
    return rng.integers(0, vocab_size, size=depth)


def _topk_canonical(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` of each row of ``values`` [rows, V]: (values [rows, k] descending, ids [rows, k] int64),
    equal values by increasing id, on exactly the k canonical survivors (ties at the cut included)."""
    rows, vocab = values.shape
    threshold = np.partition(values, vocab - k, axis=-1)[:, vocab - k]
    row_of, cols = np.nonzero(values >= threshold[:, None])  # row-major: ids ascending within a row
    vals = values[row_of, cols]
    counts = np.bincount(row_of, minlength=rows)
    if (counts != k).any():  # ties at the cut: keep everything above it, then the lowest ids equal to it
        above = vals > threshold[row_of]
        need = k - np.bincount(row_of, weights=above, minlength=rows).astype(np.int64)
        at_cut = ~above
        before = np.cumsum(at_cut) - at_cut  # how many at-cut entries precede each entry (overall)
        row_start = np.concatenate(([0], np.cumsum(counts)[:-1]))
        rank = before - before[row_start[row_of]]
        keep = above | (rank < need[row_of])
        cols, vals = cols[keep], vals[keep]
    cols = cols.reshape(rows, k)
    vals = vals.reshape(rows, k)
    order = np.lexsort((cols, np.negative(vals)), axis=-1)
    return np.take_along_axis(vals, order, -1), np.take_along_axis(cols, order, -1).astype(np.int64)


def _log_softmax_inplace_cpu(x: np.ndarray) -> None:
    """``x`` [rows, V] float32 becomes ``x - logsumexp(x)`` in place."""
    peak = x.max(axis=-1, keepdims=True)
    tmp = np.subtract(x, peak)
    np.exp(tmp, out=tmp)
    total = tmp.sum(axis=-1, dtype=np.float64)
    del tmp
    lse = (peak[:, 0].astype(np.float64) + np.log(total)).astype(np.float32)
    np.subtract(x, lse[:, None], out=x)


def _chunk_cpu(spec: TraceSpec, first: int, count: int):
    depth, topk, vocab_size, seed = spec.depth, spec.topk, spec.vocab_size, spec.seed
    logits = np.empty((count, depth, vocab_size), np.float32)
    boosts = peaked_boosts(depth, vocab_size) if spec.distribution in ("peaked", "bf16") else None
    positions = np.arange(depth)
    for i in range(count):
        rng = np.random.Generator(np.random.PCG64(_seed_sequence(seed, first + i, 0)))
        rng.standard_normal(out=logits[i], dtype=np.float32)
        if boosts is not None:
            logits[i, positions, _hot_tokens(seed, first + i, depth, vocab_size)] += boosts
    x = logits.reshape(count * depth, vocab_size)
    if spec.distribution == "bf16":
        bf16_round(x, out=x)
    _log_softmax_inplace_cpu(x)
    if spec.distribution == "bf16":
        bf16_round(x, out=x)
    vals, ids = _topk_canonical(x, topk)
    return vals.reshape(count, depth, topk), ids.reshape(count, depth, topk)


def _chunk_gpu(cp, spec: TraceSpec, first: int, count: int):
    depth, topk, vocab_size, seed = spec.depth, spec.topk, spec.vocab_size, spec.seed
    logits = cp.empty((count, depth, vocab_size), cp.float32)
    boosts = peaked_boosts(depth, vocab_size) if spec.distribution in ("peaked", "bf16") else None
    positions = np.arange(depth)
    for i in range(count):
        request_seed = int(_seed_sequence(seed, first + i, 0).generate_state(1, np.uint32)[0])
        logits[i] = cp.random.RandomState(request_seed).standard_normal((depth, vocab_size), dtype=cp.float32)
        if boosts is not None:
            hot = _hot_tokens(seed, first + i, depth, vocab_size)
            logits[i, cp.asarray(positions), cp.asarray(hot)] += cp.asarray(boosts)
    x = logits.reshape(count * depth, vocab_size)

    def round_bf16(a):
        bits = a.view(cp.uint32)
        bits += ((bits >> cp.uint32(16)) & cp.uint32(1)) + cp.uint32(0x7FFF)
        bits &= cp.uint32(0xFFFF0000)

    if spec.distribution == "bf16":
        round_bf16(x)
    peak = x.max(axis=-1, keepdims=True)
    total = cp.exp(x - peak).sum(axis=-1, dtype=cp.float64)
    lse = (peak[:, 0].astype(cp.float64) + cp.log(total)).astype(cp.float32)
    x -= lse[:, None]
    if spec.distribution == "bf16":
        round_bf16(x)
    # Candidates on the device (a stable sort), the canonical order of the k survivors on the host.
    order = cp.argsort(-x, axis=-1)[:, :topk]
    vals = cp.asnumpy(cp.take_along_axis(x, order, axis=-1))
    cols = cp.asnumpy(order).astype(np.int64)
    del logits, x, order
    final = np.lexsort((cols, np.negative(vals)), axis=-1)
    vals = np.take_along_axis(vals, final, -1)
    cols = np.take_along_axis(cols, final, -1)
    return vals.reshape(count, depth, topk), cols.reshape(count, depth, topk)


def _cuda_module():
    """CuPy when a CUDA device works here, else ``None`` (no CuPy, no driver, no device: all mean CPU)."""
    try:
        import cupy as cp  # noqa: PLC0415
    except Exception:  # ImportError, or a broken CUDA install failing at import
        return None
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:  # CUDARuntimeError, e.g. cudaErrorInsufficientDriver on machines without a GPU
        return None
    return cp


def resolve_device(device: str = "auto") -> str:
    """``"cuda"`` or ``"cpu"``: what ``device`` ("auto", "cpu", "cuda") means on this machine."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; known devices: {', '.join(DEVICES)}")
    if device == "cpu":
        return "cpu"
    if _cuda_module() is not None:
        return "cuda"
    if device == "cuda":
        raise ValueError("device 'cuda' requested but no working CUDA device (CuPy import or driver failed)")
    return "cpu"


def _metadata(spec: TraceSpec) -> dict:
    return {
        "distribution": spec.distribution,
        "seed": spec.seed,
        "vocab_size": spec.vocab_size,
        "generator_version": GENERATOR_VERSION,
        "numpy": np.__version__,
    }


def generate(
    spec: TraceSpec,
    device: str = "cpu",
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    threads: int | None = None,
    drafter: dict | None = None,
) -> Trace:
    """Generate the trace ``spec`` describes (see the module docstring) and its metadata (including the
    device actually used); ``drafter``: the ``drafter`` distributions' parameters (None: the defaults).

    Work is split into chunks of requests whose logits take at most ``chunk_bytes`` (at least one request
    per chunk), run on ``threads`` threads (default: all cores); the result does not depend on either.
    """
    spec = spec.checked()
    chunk_bytes = check_positive_int(chunk_bytes, "chunk_bytes")
    if threads is not None:
        threads = check_positive_int(threads, "threads")
    if spec.distribution in DRAFTER_DISTRIBUTIONS:
        return _generate_drafter(spec, device, drafter)
    if resolve_device(device) == "cuda":
        trace = _generate_gpu(spec, device)
        if trace is not None:
            return trace
    return _generate_cpu(spec, chunk_bytes, threads)


def _generate_gpu(spec: TraceSpec, device: str) -> Trace | None:
    """The trace from CuPy's generator (chunks of at most 1 GiB of logits); None where the GPU failed and
    ``device`` is "auto" (a warning says why; the CPU generates it instead)."""
    requests = spec.requests
    lp = np.empty((requests, spec.depth, spec.topk), np.float32)
    ids = np.empty((requests, spec.depth, spec.topk), np.int64)
    cp = _cuda_module()
    try:
        step = max(1, (1 << 30) // (spec.depth * spec.vocab_size * 4))
        for first in range(0, requests, step):
            count = min(step, requests - first)
            lp[first : first + count], ids[first : first + count] = _chunk_gpu(cp, spec, first, count)
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"]
        metadata = _metadata(spec)
        metadata["device"] = "cuda"
        metadata["device_name"] = name.decode() if isinstance(name, bytes) else str(name)
        metadata["cupy"] = cp.__version__
        return Trace(lp, ids, metadata)
    except Exception as error:
        if device == "cuda":
            raise
        warnings.warn(f"trace generation on the GPU failed ({error}); generating on the CPU", stacklevel=3)
    return None


def _generate_cpu(spec: TraceSpec, chunk_bytes: int, threads: int | None) -> Trace:
    """The trace on the CPU: chunks of requests whose logits take at most ``chunk_bytes``, on ``threads``
    threads (default: all cores)."""
    requests = spec.requests
    lp = np.empty((requests, spec.depth, spec.topk), np.float32)
    ids = np.empty((requests, spec.depth, spec.topk), np.int64)
    step = max(1, chunk_bytes // (spec.depth * spec.vocab_size * 4))
    starts = list(range(0, requests, step))
    workers = max(1, min(threads or os.cpu_count() or 1, len(starts)))

    def run(first: int) -> None:
        count = min(step, requests - first)
        lp[first : first + count], ids[first : first + count] = _chunk_cpu(spec, first, count)

    if workers == 1:
        for first in starts:
            run(first)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(run, starts))  # numpy releases the GIL in the heavy loops
    return Trace(lp, ids, {**_metadata(spec), "device": "cpu"})


def _generate_drafter(spec: TraceSpec, device: str, drafter) -> Trace:
    """The ``drafter`` distributions (``ddtree_bench.drafter``): always on the CPU, whatever ``device``."""
    resolve_device(device)  # the device name is still checked
    profile = catalog.profile_of_distribution(spec.distribution)
    params = check_drafter_params(dict(profile.params) if profile is not None else drafter)
    lp, ids = generate_drafter(
        spec.distribution, spec.requests, spec.depth, spec.topk, spec.vocab_size, spec.seed, params
    )
    metadata = {
        **_metadata(spec),
        "device": "cpu",
        **{f"drafter_{key}": value for key, value in params.as_dict().items()},
    }
    return Trace(lp, ids, metadata)


def generate_trace(
    distribution: str,
    requests: int,
    depth: int,
    topk: int,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    device: str = "cpu",
    **options,
) -> tuple[np.ndarray, np.ndarray]:
    """``(top_log_probs [R, L, K] float32, top_token_ids [R, L, K] int64)``; see ``generate``."""
    trace = generate(TraceSpec(distribution, requests, depth, topk, vocab_size, seed), device, **options)
    return trace.top_log_probs, trace.top_token_ids


# ----------------------------------------------------------------------------------------- files


def _metadata_array(key: str, value) -> np.ndarray:
    if isinstance(value, bool | np.bool_):
        return np.asarray(bool(value))
    if isinstance(value, numbers.Integral):
        return np.asarray(int(value), np.int64)
    if isinstance(value, numbers.Real):
        return np.asarray(float(value), np.float64)
    if isinstance(value, str | Path):
        return np.asarray(str(value))
    raise ValueError(f"trace metadata {key!r} must be a string or a number, got {type(value).__name__}")


def save_trace(path, top_log_probs: np.ndarray, top_token_ids: np.ndarray, **metadata) -> None:
    """Validate and write a trace file (``.npz``) atomically; metadata values are strings or numbers
    (``None`` values are skipped). The file also stores ``sha256`` (``arrays_sha256``, computed here, never
    taken from ``metadata``), and its archive has fixed timestamps: the same trace gives the same bytes."""
    check_topk_arrays(top_log_probs, top_token_ids, where=f"trace {path}")
    arrays = {"top_log_probs": top_log_probs, "top_token_ids": top_token_ids}
    for key, value in metadata.items():
        if key in ARRAYS or not key.isidentifier():
            raise ValueError(f"trace metadata key {key!r} is not allowed")
        if value is not None and key != "sha256":
            arrays[key] = _metadata_array(key, value)
    arrays["sha256"] = np.asarray(arrays_sha256(top_log_probs, top_token_ids))
    with atomic_output(path) as tmp, open(tmp, "wb") as handle:
        _write_npz(handle, arrays)
        handle.flush()
        os.fsync(handle.fileno())


def _write_npz(handle, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez`` (uncompressed members ``NAME.npy``), but with a fixed date on every member, so the bytes
    depend on the arrays only."""
    with zipfile.ZipFile(handle, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, value in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)


def peek_trace(path) -> tuple[int, int, int]:
    """``(R, L, K)`` of a trace file, read from the arrays' headers only (cheap for any size), after checking
    that it exists, is readable, is an .npz archive and holds both arrays, 3-D, of one shape, with dtypes
    ``import_recorded`` accepts. Every problem is one line naming the file (``ValueError``)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: file not found")
    if not path.is_file():
        raise ValueError(f"{path}: not a file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{path}: not readable (permission denied)")
    _check_zip(path, str(path))
    shapes = {}
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            missing = [name for name in ARRAYS if f"{name}.npy" not in names]
            if missing:
                raise ValueError(f"{path}: not a trace: missing array(s) {', '.join(missing)}")
            for name in ARRAYS:
                with archive.open(f"{name}.npy") as member:
                    version = np.lib.format.read_magic(member)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(member)
                    else:
                        shape, _, dtype = np.lib.format.read_array_header_2_0(member)
                    shapes[name] = (tuple(shape), np.dtype(dtype))
    except ValueError as error:
        message = _one_line(error)
        raise ValueError(message if message.startswith(str(path)) else f"{path}: {message}") from None
    except (OSError, zipfile.BadZipFile, EOFError) as error:
        raise ValueError(f"{path}: cannot read it as an .npz trace ({_one_line(error)})") from None
    (lp_shape, lp_dtype), (ids_shape, ids_dtype) = shapes["top_log_probs"], shapes["top_token_ids"]
    if len(lp_shape) != 3 or lp_shape != ids_shape:
        raise ValueError(
            f"{path}: top_log_probs {list(lp_shape)} and top_token_ids {list(ids_shape)} must be one 3-D "
            "shape [R, L, K]"
        )
    if lp_dtype not in _LOSSLESS_LP or ids_dtype not in _LOSSLESS_IDS:
        raise ValueError(
            f"{path}: top_log_probs must be float32 (or float16) and top_token_ids int64 (or a smaller "
            f"integer type), got {lp_dtype} and {ids_dtype}"
        )
    return tuple(int(n) for n in lp_shape)


#: Requests validated at a time by ``check_trace_file`` (bounds its temporaries, not what it checks).
CHECK_CHUNK_VALUES = 1 << 22


def check_trace_file(path, vocab_size: int | None = None) -> tuple[int, int, int]:
    """``(R, L, K)`` of a trace file after checking all of it as ``import_recorded`` does, so that a file
    passing here imports: ``peek_trace``'s checks (readable .npz, both arrays, one 3-D shape, dtypes), then
    every value: log-probabilities finite, <= 0 and each row sorted descending, token ids >= 0 and below
    ``vocab_size`` (default: the one the file records, if any). Reads the arrays once, checked a few
    requests at a time; every problem is one line naming the file (``ValueError``)."""
    path = Path(path)
    shape = peek_trace(path)
    data = _read_npz(path)
    if vocab_size is None:
        vocab_size = recorded_vocab_size({k: _metadata_value(v) for k, v in data.items()}, path)
    lp, ids = data["top_log_probs"], data["top_token_ids"]
    step = max(1, CHECK_CHUNK_VALUES // max(1, shape[1] * shape[2]))
    for first in range(0, max(1, shape[0]), step):  # one empty chunk where R = 0: refused
        try:
            check_topk_arrays(
                lp[first : first + step].astype(np.float32, copy=False),
                ids[first : first + step].astype(np.int64, copy=False),
                where=str(path),
                vocab_size=vocab_size,
                first_request=first,
            )
        except ValueError as error:
            raise ValueError(_one_line(error)) from None
    return shape


def row_sha256(path, metadata: dict | None = None) -> str:
    """What a row records as ``trace_sha256``: ``trace_sha256(path)``, computed from the file's arrays (a
    ``sha256`` in ``metadata``, as the file stores it, is not trusted: an edited trace keeps it)."""
    return trace_sha256(path)


def trace_sha256(path) -> str:
    """The sha256 (``arrays_sha256``) of a trace file, computed from its two arrays."""
    data = _read_npz(Path(path))
    missing = [name for name in ARRAYS if name not in data]
    if missing:
        raise ValueError(f"trace {path}: missing array(s) {', '.join(missing)}")
    return arrays_sha256(data["top_log_probs"], data["top_token_ids"])


def _check_zip(path: Path, where: str) -> None:
    """A file that is no zip archive (a text file, a bare .npy, a pickle) is no trace: one line saying so
    (numpy's own words for it speak of pickled data)."""
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{where}: not an .npz trace (not a zip archive; a trace is an .npz of top_log_probs and "
            "top_token_ids, as `ddtree-bench trace` writes)"
        )


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise ValueError(f"trace {path}: file not found")
    _check_zip(path, f"trace {path}")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except Exception as error:  # not a zip, a bare .npy, pickled objects, a truncated archive, ...
        raise ValueError(f"trace {path}: cannot read it as an .npz file ({_one_line(error)})") from None


def _one_line(error) -> str:
    return " ".join(str(error).split())


def _metadata_value(array: np.ndarray):
    if array.ndim == 0:
        return array.item()
    return array


def load_trace(path) -> Trace:
    """Read and validate a trace file; every problem is a one-line ``ValueError`` naming it and the file."""
    path = Path(path)
    data = _read_npz(path)
    missing = [name for name in ARRAYS if name not in data]
    if missing:
        raise ValueError(f"trace {path}: missing array(s) {', '.join(missing)}")
    lp, ids = data.pop("top_log_probs"), data.pop("top_token_ids")
    metadata = {key: _metadata_value(value) for key, value in data.items()}
    check_topk_arrays(lp, ids, where=f"trace {path}", vocab_size=recorded_vocab_size(metadata, path))
    return Trace(lp, ids, metadata, path)


def recorded_vocab_size(metadata: dict, path=None) -> int | None:
    """The vocabulary size a trace's metadata records (its token ids must be below it), or None."""
    value = metadata.get("vocab_size")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        where = f"trace {path}: " if path is not None else ""
        raise ValueError(f"{where}vocab_size must be an integer >= 1, got {value!r}")
    return int(value)


_LOSSLESS_LP = (np.float16, np.float32)
_LOSSLESS_IDS = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32)


def import_recorded(
    src, dst, depth: int | None = None, topk: int | None = None, *, requests=None, vocab_size=None
) -> Trace:
    """Validate a recorded trace file ``src`` and write it to ``dst`` (atomically), optionally keeping only
    the first ``requests`` requests, ``depth`` positions and ``topk`` columns. Lossless dtype widening is
    applied (float16 log-probs to float32, smaller integer ids to int64); anything else must already match
    the trace format. Token ids must be below ``vocab_size`` (default: the ``vocab_size`` the file records,
    if any), which the written trace records. Returns the written trace."""
    src = Path(src)
    if vocab_size is not None:
        vocab_size = check_positive_int(vocab_size, "vocab_size")
    data = _read_npz(src)
    missing = [name for name in ARRAYS if name not in data]
    if missing:
        raise ValueError(f"trace {src}: missing array(s) {', '.join(missing)}")
    lp, ids = data.pop("top_log_probs"), data.pop("top_token_ids")
    if lp.dtype in _LOSSLESS_LP:
        lp = lp.astype(np.float32)
    if ids.dtype in _LOSSLESS_IDS:
        ids = ids.astype(np.int64)
    if vocab_size is None:
        vocab_size = recorded_vocab_size({k: _metadata_value(v) for k, v in data.items()}, src)
    check_topk_arrays(lp, ids, where=f"trace {src}", vocab_size=vocab_size)
    for name, value, limit in (
        ("requests", requests, lp.shape[0]),
        ("depth", depth, lp.shape[1]),
        ("topk", topk, lp.shape[2]),
    ):
        if value is not None and check_positive_int(value, name) > limit:
            raise ValueError(f"trace {src}: {name} {value} requested but the file has only {limit}")
    lp = np.ascontiguousarray(lp[:requests, :depth, :topk])
    ids = np.ascontiguousarray(ids[:requests, :depth, :topk])
    metadata = {key: _metadata_value(value) for key, value in data.items() if value.ndim == 0}
    metadata.update(distribution="recorded", source=str(src), vocab_size=vocab_size)
    save_trace(dst, lp, ids, **metadata)
    return Trace(lp, ids, metadata, Path(dst))


__all__ = [
    "DEFAULT_VOCAB_SIZE",
    "DISTRIBUTIONS",
    "GENERATOR_VERSION",
    "Trace",
    "TraceSpec",
    "arrays_sha256",
    "bf16_round",
    "check_trace_file",
    "generate",
    "generate_trace",
    "import_recorded",
    "load_trace",
    "peek_trace",
    "resolve_device",
    "save_trace",
    "trace_sha256",
]
