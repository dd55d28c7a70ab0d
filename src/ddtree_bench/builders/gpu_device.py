"""Device-array entry points of the ``gpu`` builder: the tree built from top-K already on the GPU, left there.

- :class:`DeviceTreeBuilder` takes CuPy arrays, or any tensor exporting ``__cuda_array_interface__`` or DLPack
  (a torch CUDA tensor), viewed in place (no copy), enqueues the build on the caller's current stream (CuPy's;
  for torch inputs torch's current stream) and returns :class:`~ddtree_bench.builders.gpu.DeviceTrees`
  (CuPy arrays on the device). No host synchronisation, and after the first call of a shape (the warm-up: it
  loads the kernels and allocates that shape's outputs) no allocation, so a call can be captured in a CUDA
  graph (CuPy's ``stream.begin_capture()`` or ``torch.cuda.graph``).
- :func:`build_ddtree_batch_torch` is shaped like SGLang's ``build_ddtree_tree_from_topk`` followed by
  ``pad_ddtree_build_outputs``, for a whole batch: torch CUDA tensors in, padded torch CUDA tensors out.
  torch is imported only when it is called.

Only shapes and dtypes are checked (a host-side check of the values would need a synchronisation): the
log-probs must be finite and each row sorted descending, as for every builder.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ddtree_bench.builders.gpu import DeviceTrees, GpuBuilder, LaunchPlan
from ddtree_bench.validation import check_budget


def _is_torch(value) -> bool:
    return type(value).__module__.split(".")[0] == "torch"


def as_device_array(value, name: str):
    """``value`` as a CuPy array viewing the same device memory (no copy); ValueError where it is not a
    device array."""
    import cupy as cp  # noqa: PLC0415

    if isinstance(value, cp.ndarray):
        return value
    if _is_torch(value) and getattr(value, "is_cuda", False):
        return torch_as_cupy(value, name)
    try:
        value.__cuda_array_interface__  # noqa: B018 - raises for host tensors
    except (AttributeError, RuntimeError, TypeError):
        pass
    else:
        return cp.asarray(value)
    if hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__"):
        kind = int(value.__dlpack_device__()[0])
        if kind in (2, 13):  # kDLCUDA, kDLCUDAManaged
            return cp.from_dlpack(value)
    raise ValueError(
        f"{name}: not an array on the CUDA device ({type(value).__name__}); pass a CuPy array or a CUDA "
        "tensor (__cuda_array_interface__ or DLPack), or use GpuBuilder.build for host arrays"
    )


_TORCH_TO_NUMPY = {
    name: getattr(np, name) for name in ("float16", "float32", "float64", "int32", "int64", "uint8")
}


def torch_as_cupy(tensor, name: str):
    """A CuPy view of a contiguous torch CUDA tensor, made without any CUDA call (the device is the tensor's;
    CuPy's own import would ask the driver for the pointer's attributes), so it may run inside a capture."""
    import cupy as cp  # noqa: PLC0415

    dtype = _TORCH_TO_NUMPY.get(str(tensor.dtype).removeprefix("torch."))
    if dtype is None:
        raise ValueError(f"{name}: dtype {tensor.dtype} is not one the builder takes")
    if not tensor.is_contiguous():
        raise ValueError(f"{name}: must be C-contiguous (a copy would allocate on every call)")
    nbytes = tensor.numel() * tensor.element_size()
    memory = cp.cuda.UnownedMemory(tensor.data_ptr(), nbytes, tensor, tensor.device.index)
    return cp.ndarray(tuple(tensor.shape), dtype, cp.cuda.MemoryPointer(memory, 0))


def check_device_inputs(lp, ids, budget) -> int:
    """Shapes and dtypes of device top-K (no values: that would need a synchronisation); the budget."""
    budget = check_budget(budget)
    if lp.ndim != 3 or tuple(ids.shape) != tuple(lp.shape) or 0 in lp.shape:
        raise ValueError(
            f"inputs: need two non-empty [B, L, K] arrays of one shape, got {tuple(lp.shape)} and "
            f"{tuple(ids.shape)}"
        )
    if lp.dtype != np.float32 or ids.dtype != np.int64:
        raise ValueError(
            f"inputs: need float32 log-probs and int64 token ids, got {lp.dtype} and {ids.dtype}"
        )
    if not (lp.flags.c_contiguous and ids.flags.c_contiguous):
        raise ValueError(
            "inputs: the top-K arrays must be C-contiguous (a copy would allocate on every call)"
        )
    return budget


class DeviceTreeBuilder:
    """``builder(top_log_probs, top_token_ids, budget, *, packed_only=False, out=None, stream=None)``:
    the whole batch's trees built on the device (module docstring).

    - ``packed_only``: write only the packed-bit visibility (``out.visibility_bits``, [B, N+1, ceil((N+1)/32)]
      uint32, bit ``j % 32`` of word ``j // 32`` marks key ``j``), not the bool mask (``out.visibility`` is
      then left as it was); every other field is written either way.
    - ``out``: a :class:`DeviceTrees` of this (batch, budget) to write; ``None``: this object's own outputs
      for the shape, allocated on its first call and reused, so the next call of the same shape overwrites
      them (pass ``out`` to keep several).
    - ``stream``: a CuPy stream; ``None``: torch's current stream for torch inputs, else CuPy's current one.
    """

    def __init__(self, builder: GpuBuilder | None = None, **options):
        if builder is not None and options:
            raise ValueError("DeviceTreeBuilder: pass a GpuBuilder or its options, not both")
        self.gpu = builder if builder is not None else GpuBuilder(**options)
        self._plans: dict[tuple[int, int, int, int], LaunchPlan] = {}
        self._outputs: dict[tuple[int, int], DeviceTrees] = {}

    def plan(self, batch: int, depth: int, k: int, budget: int) -> LaunchPlan:
        key = (batch, depth, k, budget)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self.gpu.plan(batch, depth, k, budget)
        return plan

    def outputs(self, batch: int, budget: int) -> DeviceTrees:
        """This object's reused outputs for a shape (allocated on first use)."""
        out = self._outputs.get((batch, budget))
        if out is None:
            out = self._outputs[(batch, budget)] = DeviceTrees(batch, budget)
        return out

    def __call__(
        self, top_log_probs, top_token_ids, budget, *, packed_only: bool = False, out=None, stream=None
    ) -> DeviceTrees:
        import cupy as cp  # noqa: PLC0415

        torch_stream = stream is None and _is_torch(top_log_probs)
        lp = as_device_array(top_log_probs, "top_log_probs")
        ids = as_device_array(top_token_ids, "top_token_ids")
        budget = check_device_inputs(lp, ids, budget)
        batch, depth, k = (int(x) for x in lp.shape)
        if out is None:
            out = self.outputs(batch, budget)
        elif not isinstance(out, DeviceTrees) or (out.batch, out.budget) != (batch, budget):
            raise ValueError(f"out: must be a DeviceTrees of batch {batch} and budget {budget}")
        if torch_stream:
            import torch  # noqa: PLC0415

            current = torch.cuda.current_stream(top_log_probs.device)
            stream = cp.cuda.ExternalStream(current.cuda_stream, top_log_probs.device.index)
        plan = self.plan(batch, depth, k, budget)
        self.gpu.launch(plan, lp, ids, out, stream=stream, bool_visibility=not packed_only)
        return out


class DDTreeBatchOutputs(NamedTuple):
    """The padded batch as torch CUDA tensors (``ddtree_bench.tree``'s contract, padded to N + 1)."""

    visibility: object  # bool [B, N+1, N+1]; None with packed_only
    retrieve_next_token: object  # int64 [B, N+1], -1 none
    retrieve_next_sibling: object  # int64 [B, N+1], -1 none
    node_token_ids: object  # int64 [B, N], -1 padding
    node_depths: object  # int64 [B, N], 0 padding
    parents: object  # int32 [B, N+1], parents[:, 0] = -1, -1 padding
    node_count: object  # int32 [B]
    visibility_bits: object  # uint32 [B, N+1, ceil((N+1)/32)] (always written)


_TORCH_DTYPES = {
    np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64",
    np.dtype(np.bool_): "bool",
    np.dtype(np.uint32): "uint32",
}
_default_builder: DeviceTreeBuilder | None = None


def torch_view(torch, buffer, offsets, name):
    """A torch view of field ``name`` of a ``DeviceTrees`` region held in the uint8 tensor ``buffer``
    (``offsets``: the trees' ``{field: (byte offset, shape, dtype)}``)."""
    at, shape, dtype = offsets[name]
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    kind = _TORCH_DTYPES[np.dtype(dtype)]
    if kind == "uint32" and not hasattr(torch, "uint32"):  # torch < 2.3: the same bits as int32
        kind = "int32"
    return buffer[at : at + nbytes].view(getattr(torch, kind)).reshape(shape)


def build_ddtree_batch_torch(
    top_log_probs,
    top_token_ids,
    budget,
    *,
    packed_only: bool = False,
    builder: DeviceTreeBuilder | None = None,
) -> DDTreeBatchOutputs:
    """SGLang's ``build_ddtree_tree_from_topk`` + ``pad_ddtree_build_outputs`` for a batch, on the GPU.

    ``top_log_probs`` float32 [B, L, K] and ``top_token_ids`` int64 [B, L, K], torch CUDA tensors (rows sorted
    descending, finite), and the budget N; returns :class:`DDTreeBatchOutputs`, torch CUDA tensors padded to
    N + 1 rows exactly as SGLang pads (pad rows and columns False, pad links -1), the same trees as SGLang's
    function, ties included. The build is enqueued on torch's current stream (no synchronisation). The
    outputs are fresh tensors from torch's allocator (one allocation per call), so the call can be captured in
    ``torch.cuda.graph`` after one warm-up call of the shape; ``packed_only`` writes the packed-bit mask only
    (``visibility`` is then ``None``)."""
    import torch  # noqa: PLC0415

    global _default_builder
    if not (isinstance(top_log_probs, torch.Tensor) and isinstance(top_token_ids, torch.Tensor)):
        raise ValueError("build_ddtree_batch_torch: inputs must be torch tensors")
    if not (top_log_probs.is_cuda and top_token_ids.is_cuda):
        raise ValueError("build_ddtree_batch_torch: inputs must be CUDA tensors")
    if top_log_probs.device != top_token_ids.device:
        raise ValueError("build_ddtree_batch_torch: inputs must be on one device")
    if builder is None:
        if _default_builder is None:
            _default_builder = DeviceTreeBuilder()
        builder = _default_builder
    import cupy as cp  # noqa: PLC0415

    device = top_log_probs.device
    lp = as_device_array(top_log_probs, "top_log_probs")
    ids = as_device_array(top_token_ids, "top_token_ids")
    budget = check_device_inputs(lp, ids, budget)
    batch = int(lp.shape[0])
    buffer = torch.empty(DeviceTrees.required_bytes(batch, budget), dtype=torch.uint8, device=device)
    with cp.cuda.Device(device.index):
        out = DeviceTrees(batch, budget, buffer=torch_as_cupy(buffer, "outputs"))
        builder(top_log_probs, top_token_ids, budget, packed_only=packed_only, out=out)
    views = {name: torch_view(torch, buffer, out.offsets, name) for name in out.offsets}
    return DDTreeBatchOutputs(
        visibility=None if packed_only else views["visibility"],
        retrieve_next_token=views["retrieve_next_token"],
        retrieve_next_sibling=views["retrieve_next_sibling"],
        node_token_ids=views["node_token_ids"],
        node_depths=views["node_depths"],
        parents=views["parents"],
        node_count=views["node_count"],
        visibility_bits=views["visibility_bits"],
    )
