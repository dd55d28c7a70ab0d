"""``native`` / ``native-mt``: the C++ CPU builder (``kernels/native/tree_build_cpu.cpp``), bound thinly
through ctypes.

One call builds the whole batch into preallocated, padded buffers. The library writes every element of
every output (padding included), so new outputs are allocated uninitialised, all seven in one buffer, and a
caller may pass ``out=`` to reuse a batch's buffers from call to call.

The binding is kept thin on purpose: a ctypes call pays per argument and ``ndarray.ctypes.data`` costs
microseconds, more than building a small batch. So the call goes through ``ddtree_build_packed`` (one
pointer to the 14 arguments in a persistent int64 array), and the addresses of the arrays of the previous
call (inputs, ``out``) are reused while the very same array objects come back (the builder holds them, so
numpy cannot resize them in place). Calls on one builder object are serialised by a lock.

The library is ``library=`` if given, else ``$DDTREE_NATIVE_LIB``, else the package's C++ source compiled on
demand into the cache (see :mod:`ddtree_bench.native_build`).
"""

from __future__ import annotations

import ctypes
import functools
import operator
import os
import platform
import threading
from pathlib import Path

import numpy as np

from ddtree_bench import catalog, native_build
from ddtree_bench.builders.base import Builder, BuilderUnavailable
from ddtree_bench.tree import FIELD_DTYPES, TREE_FIELDS, TreeBatch
from ddtree_bench.validation import check_budget

ABI_VERSION = 1

_STATUS = {
    -1: "shape it cannot take (B, L, K or budget < 1, or beyond int32 indices)",
    -2: "null pointer",
    -3: "bad thread count",
    -4: "out of memory",
    -5: "internal C++ error",
}

# positions in ddtree_build_packed's argument array
_LP, _IDS, _B, _L, _K, _N, _THREADS = range(7)
_OUT_SLOTS = {
    "node_count": 7,
    "node_token_ids": 8,
    "node_depths": 9,
    "parents": 10,
    "visibility": 11,
    "retrieve_next_token": 12,
    "retrieve_next_sibling": 13,
}

_fields_of = operator.attrgetter(*TREE_FIELDS)
_F32, _I64 = np.dtype(np.float32), np.dtype(np.int64)
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}


def _address(array: np.ndarray) -> int:
    """The address of a C-contiguous array's data (through ctypes' buffer export where the array is
    writeable: several times cheaper than ``ndarray.ctypes.data``)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError, BufferError):  # read-only or empty
        return array.ctypes.data


def _load(path: Path) -> ctypes.CDLL:
    """Load (once per path) and bind the library, checking its interface version."""
    key = str(Path(path).resolve())
    with _lock:
        lib = _loaded.get(key)
        if lib is not None:
            return lib
        lib = ctypes.CDLL(key)
        try:
            for name, restype in [
                ("ddtree_native_abi_version", ctypes.c_int),
                ("ddtree_native_cpu_count", ctypes.c_int),
                ("ddtree_native_parallel_min_pops", ctypes.c_int64),
            ]:
                getattr(lib, name).restype = restype
                getattr(lib, name).argtypes = []
            batch_fn, packed_fn = lib.ddtree_build_batch, lib.ddtree_build_packed
        except AttributeError as error:
            raise RuntimeError(f"{path} is not a ddtree-bench native library: {error}") from None
        version = lib.ddtree_native_abi_version()
        if version != ABI_VERSION:
            raise RuntimeError(f"{path} has interface version {version}, this binding needs {ABI_VERSION}")
        batch_fn.restype = ctypes.c_int
        batch_fn.argtypes = (
            [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 4 + [ctypes.c_int] + [ctypes.c_void_p] * 7
        )
        packed_fn.restype = ctypes.c_int
        packed_fn.argtypes = [ctypes.c_void_p]
        _loaded[key] = lib
        return lib


def _shapes(batch_size: int, budget: int) -> dict[str, tuple[int, ...]]:
    n1 = budget + 1
    return {
        "node_count": (batch_size,),
        "node_token_ids": (batch_size, budget),
        "node_depths": (batch_size, budget),
        "parents": (batch_size, n1),
        "visibility": (batch_size, n1, n1),
        "retrieve_next_token": (batch_size, n1),
        "retrieve_next_sibling": (batch_size, n1),
    }


@functools.lru_cache(maxsize=64)
def _layout(
    batch_size: int, budget: int
) -> tuple[tuple[tuple[str, tuple[int, ...], np.dtype, int], ...], int]:
    """Where each field lives in one allocation: ``((name, shape, dtype, byte offset), ...), total bytes``
    (8-byte fields first, every field 64-byte aligned)."""
    shapes = _shapes(batch_size, budget)
    order = sorted(TREE_FIELDS, key=lambda name: -np.dtype(FIELD_DTYPES[name]).itemsize)
    fields, offset = [], 0
    for name in order:
        dtype = np.dtype(FIELD_DTYPES[name])
        fields.append((name, shapes[name], dtype, offset))
        offset += (int(np.prod(shapes[name])) * dtype.itemsize + 63) // 64 * 64
    return tuple(fields), offset


def uninitialised_batch(batch_size: int, budget: int) -> TreeBatch:
    """A TreeBatch of the right shapes and dtypes with no fill (for builders that write every element):
    the seven arrays are views of one 64-byte aligned allocation."""
    return _allocate(batch_size, budget)[0]


def _allocate(batch_size: int, budget: int) -> tuple[TreeBatch, int, tuple]:
    """A new uninitialised batch, the address of its allocation (64-byte aligned) and its layout."""
    fields, total = _layout(batch_size, budget)
    raw = np.empty(total + 64, np.uint8)
    address = _address(raw)
    skip = -address % 64
    arrays = {name: np.ndarray(shape, dtype, raw, skip + offset) for name, shape, dtype, offset in fields}
    return TreeBatch(**arrays), address + skip, fields


class NativeBuilder(Builder):
    """The C++ builder. ``threads=1``: one thread (``native``); ``threads=0``: every CPU this process may
    use, one request per thread (``native-mt``); ``threads=t > 1``: t threads. Calls with fewer than
    ``parallel_min_pops`` pops (batch x budget) run on the calling thread whatever ``threads`` says.

    ``validate=False`` skips the O(B*L*K) value checks of the inputs (finite, sorted, non-negative ids) for
    callers that validated them already, e.g. a trace checked on load; dtypes and shapes are always checked,
    and the library never reads or writes out of bounds whatever the values."""

    device = "cpu"

    def __init__(self, library: str | os.PathLike | None = None, threads: int = 1, validate: bool = True):
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
            raise ValueError(f"threads must be an integer >= 0 (0 = all cores), got {threads!r}")
        self.threads = threads
        self.validate = bool(validate)
        self._library_arg = Path(library) if library is not None else None
        self._lib: ctypes.CDLL | None = None
        self._library_path: Path | None = None
        self._error: str | None = None
        self._call_lock = threading.Lock()
        self._args = np.zeros(14, np.int64)  # ddtree_build_packed's arguments
        self._args_address: int | None = None
        self._last_inputs: tuple = (None, None)  # the previous call's arrays, whose addresses are in _args
        self._last_out: tuple = ()
        self.name = catalog.NATIVE if threads == 1 else catalog.NATIVE_MT
        if threads == 1:
            self.label = "native C++ (1 thread)"
        elif threads == 0:
            self.label = "native C++ (all cores, one request per thread)"
        else:
            self.label = f"native C++ ({threads} threads, one request per thread)"

    # -- library resolution -------------------------------------------------------------------------------
    def _library_source(self) -> tuple[Path | None, str]:
        if self._library_arg is not None:
            return self._library_arg, "library="
        env = os.environ.get("DDTREE_NATIVE_LIB")
        if env:
            return Path(env), "$DDTREE_NATIVE_LIB"
        return None, "cache"

    def _ensure_loaded(self) -> ctypes.CDLL:
        if self._lib is not None:
            return self._lib
        if self._error is not None:
            raise BuilderUnavailable(self._error)
        path, origin = self._library_source()
        try:
            if path is not None:
                if not path.is_file():
                    raise RuntimeError(f"native library not found: {path} (from {origin})")
            else:
                reason = native_build.compiler_unavailable_reason()
                if reason is not None:
                    raise RuntimeError(
                        f"{reason}, and no native library given (library= or $DDTREE_NATIVE_LIB)"
                    )
                path = native_build.cached_native_library()
            self._lib = _load(path)
            self._library_path = path
            self._args_address = self._args.ctypes.data
        except (OSError, RuntimeError) as error:
            self._error = str(error).strip()
            raise BuilderUnavailable(self._error) from None
        return self._lib

    def unavailable_reason(self) -> str | None:
        try:
            self._ensure_loaded()
        except BuilderUnavailable as error:
            return str(error)
        return None

    @property
    def effective_threads(self) -> int:
        """The thread count ``threads=0`` resolves to here (before the per-call cap at the batch size)."""
        if self.threads != 0:
            return self.threads
        return int(self._ensure_loaded().ddtree_native_cpu_count())

    # -- building -----------------------------------------------------------------------------------------
    def build(self, top_log_probs, top_token_ids, budget, *, out: TreeBatch | None = None) -> TreeBatch:
        """Build the batch's trees; ``out`` (a TreeBatch of this batch's shapes) is filled in place and
        returned instead of a new one, so its buffers can be reused from call to call."""
        if self.validate:
            budget = self.check(top_log_probs, top_token_ids, budget)
        else:
            if type(budget) is not int or budget < 1:
                budget = check_budget(budget)
            _check_layout(top_log_probs, top_token_ids)
        lib = self._ensure_loaded()
        lp = np.ascontiguousarray(top_log_probs)
        ids = np.ascontiguousarray(top_token_ids)
        batch, depth, topk = lp.shape
        with self._call_lock:
            args = self._args
            last_lp, last_ids = self._last_inputs
            if lp is not last_lp or ids is not last_ids:
                args[_LP] = _address(lp)
                args[_IDS] = _address(ids)
                self._last_inputs = (lp, ids)
            args[_B], args[_L], args[_K], args[_N], args[_THREADS] = batch, depth, topk, budget, self.threads
            if out is None:
                out, base, fields = _allocate(batch, budget)
                for name, _, _, offset in fields:
                    args[_OUT_SLOTS[name]] = base + offset
                self._last_out = ()
            elif not self._same_out(out):
                _check_out(out, batch, budget)
                arrays = _fields_of(out)
                for name, array in zip(TREE_FIELDS, arrays, strict=True):
                    args[_OUT_SLOTS[name]] = _address(array)
                self._last_out = (out, arrays, batch, budget)
            elif self._last_out[2:] != (batch, budget):
                _check_out(out, batch, budget)
                self._last_out = self._last_out[:2] + (batch, budget)
            status = lib.ddtree_build_packed(self._args_address)
        if status != 0:
            raise RuntimeError(f"native builder failed: {_STATUS.get(status, f'status {status}')}")
        return out

    def _same_out(self, out: TreeBatch) -> bool:
        """Whether ``out`` holds the very arrays of the previous call's ``out`` (so their addresses are in
        the argument array already)."""
        last = self._last_out
        return bool(last) and last[0] is out and all(map(operator.is_, _fields_of(out), last[1]))

    def info(self) -> dict:
        info = super().info()
        info["threads_requested"] = self.threads
        reason = self.unavailable_reason()
        if reason is None:
            info["threads"] = self.effective_threads
            info["parallel_min_pops"] = int(self._lib.ddtree_native_parallel_min_pops())
            info["library"] = str(self._library_path)
        else:
            info["threads"] = self.threads
            info["unavailable"] = reason
        compiler = native_build.find_compiler()
        info["compiler"] = " ".join(compiler) if compiler else None
        info["cxx_flags"] = " ".join(native_build.CXX_FLAGS)
        info["machine"] = platform.machine()
        info["validate"] = self.validate
        return info


def _check_layout(lp, ids) -> None:
    """What the library needs to stay in bounds: numpy arrays, float32/int64, the same non-empty 3-D shape."""
    if type(lp) is not np.ndarray or type(ids) is not np.ndarray:
        if not isinstance(lp, np.ndarray) or not isinstance(ids, np.ndarray):
            raise ValueError("inputs: top_log_probs and top_token_ids must be numpy arrays")
    if lp.dtype != _F32 or ids.dtype != _I64:
        raise ValueError(
            f"inputs: need float32 log-probs and int64 token ids, got {lp.dtype} and {ids.dtype}"
        )
    if lp.ndim != 3 or ids.shape != lp.shape or 0 in lp.shape:
        raise ValueError(
            f"inputs: need two non-empty [B, L, K] arrays of one shape, got {lp.shape}, {ids.shape}"
        )


def _check_out(out: TreeBatch, batch: int, budget: int) -> None:
    for name, shape in _shapes(batch, budget).items():
        array = getattr(out, name)
        dtype = np.dtype(FIELD_DTYPES[name])
        if not isinstance(array, np.ndarray) or array.shape != shape or array.dtype != dtype:
            raise ValueError(
                f"out.{name} must be a {dtype} array of shape {shape}, "
                f"got {getattr(array, 'dtype', type(array).__name__)} {getattr(array, 'shape', '')}"
            )
        if not array.flags.c_contiguous or not array.flags.writeable:
            raise ValueError(f"out.{name} must be C-contiguous and writeable")
