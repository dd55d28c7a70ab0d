"""Our own stand-ins for the few SGLang modules that its kernel files import but that cannot (or must not) be
loaded from the wheel's files here (``STAND_INS``, by module name; each a factory of the module's attributes):

- platform queries (``sglang.srt.utils``, ``.common``: CUDA, Hopper or not, the device's core count);
- no-op registration decorators (``register_custom_op``: eager calls run the function itself);
- the serving runtime's defaults: no symmetric memory, no fused all-reduce, no deterministic mode, no MoE
  padding (``_Defaults``: every setting off);
- for the ``sgl_kernel`` wheel (not installable next to torch 2.11): ``scalar_types`` (the ``uint4b8`` id
  computed as ``scalar_type.hpp`` defines it), ``moe_sum_reduce`` (the top-k sum, in PyTorch) and its AOT
  ``moe_align_block_size`` (replaced by SGLang's JIT kernel of the same contract);
- fp8/int8 quantisation entry points that the W4A16 path never calls (they raise if called).

torch is imported inside the factories only.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import types
from dataclasses import dataclass

#: Tests of the import path on machines without a GPU set ``"cuda"`` to True (None: ask torch).
PLATFORM_OVERRIDE: dict = {"cuda": None}


def _platform_is_cuda() -> bool:
    import torch  # noqa: PLC0415

    if PLATFORM_OVERRIDE["cuda"] is not None:  # tests of the import path on machines without a GPU
        return bool(PLATFORM_OVERRIDE["cuda"])
    return bool(torch.version.cuda) and torch.cuda.is_available()


class _Defaults:
    """A runtime setting object whose every attribute is another falsy ``_Defaults``: SGLang's serving
    runtime's options all default to off (no fused all-reduce, no deterministic mode, no symmetric
    memory), which is the configuration measured here."""

    def __init__(self, path: str = "runtime"):
        self._path = path

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Defaults(f"{self._path}.{name}")

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<default off: {self._path}>"


def _register_custom_op(*args, **kwargs):
    """SGLang's ``register_custom_op`` registers a torch custom op for torch.compile; eager calls run the
    function itself, which is what this decorator returns (bare or with arguments)."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda fn: fn


def _unavailable_function(name: str, why: str):
    def call(*args, **kwargs):
        raise RuntimeError(f"{name} is not available here ({why})")

    call.__name__ = name.rsplit(".", 1)[-1]
    return call


def _stub_srt_utils() -> dict:
    import torch  # noqa: PLC0415

    def get_bool_env_var(name: str, default: str = "false") -> bool:
        return os.getenv(name, default).lower() in ("true", "1")

    def capability() -> tuple[int, int]:
        return torch.cuda.get_device_capability() if _platform_is_cuda() else (0, 0)

    return {
        "is_cuda": _platform_is_cuda,
        "is_cuda_alike": _platform_is_cuda,
        "is_hip": lambda: False,
        "is_musa": lambda: False,
        "is_xpu": lambda: False,
        "is_npu": lambda: False,
        "is_cpu": lambda: False,
        "cpu_has_amx_support": lambda: False,
        "is_gfx95_supported": lambda: False,
        "is_gfx1250_supported": lambda: False,
        "is_sm90_supported": lambda device=None: capability()[0] == 9,
        "is_sm100_supported": lambda device=None: capability()[0] == 10,
        "get_bool_env_var": get_bool_env_var,
        "get_device_name": lambda device_id=0: torch.cuda.get_device_name(device_id),
        "get_device_core_count": lambda device_id=0: (
            torch.cuda.get_device_properties(device_id).multi_processor_count
        ),
    }


def _stub_srt_utils_common() -> dict:
    import torch  # noqa: PLC0415

    def get_cuda_version() -> tuple[int, ...]:
        return tuple(int(part) for part in (torch.version.cuda or "0.0").split(".")[:2])

    return {"is_cuda": _platform_is_cuda, "get_cuda_version": get_cuda_version}


#: the uint4b8 ScalarType, as sglang/kernels/jit/include/sgl_kernel/scalar_type.hpp builds it:
#: ScalarType::uint(4, 8) = (exponent 0, mantissa 4, signed false, bias 8, finite_values_only false,
#: nan_repr NAN_IEEE_754 = 1), fields packed low to high at widths 8, 8, 1, 32, 1, 8 bits (``id()``)
_SCALAR_FIELDS = (("exponent", 8), ("mantissa", 8), ("signed", 1), ("bias", 32), ("finite", 1), ("nan", 8))


def scalar_type_id(exponent: int, mantissa: int, signed: bool, bias: int, finite: bool, nan_repr: int) -> int:
    """``ScalarType::id()`` of ``scalar_type.hpp``: the fields packed in constructor order."""
    value, offset = 0, 0
    for (_, bits), member in zip(
        _SCALAR_FIELDS, (exponent, mantissa, int(signed), bias, int(finite), nan_repr), strict=True
    ):
        value |= (int(member) & ((1 << bits) - 1)) << offset
        offset += bits
    return value


UINT4B8_ID = scalar_type_id(0, 4, False, 8, False, 1)
UINT8B128_ID = scalar_type_id(0, 8, False, 128, False, 1)


@dataclass(frozen=True)
class _ScalarType:
    name: str
    id: int
    size_bits: int


def _stub_sgl_kernel_scalar_type() -> dict:
    def unavailable(name):
        return _ScalarType(name, -1, 0)  # not used by the W4A16 path; the kernel rejects id -1

    types_ = types.SimpleNamespace(
        uint4b8=_ScalarType("uint4b8", UINT4B8_ID, 4),
        uint8b128=_ScalarType("uint8b128", UINT8B128_ID, 8),
        uint4=unavailable("uint4"),
        float4_e2m1f=unavailable("float4_e2m1f"),
    )
    return {"ScalarType": _ScalarType, "scalar_types": types_}


def _stub_sgl_kernel() -> dict:
    import torch  # noqa: PLC0415

    def moe_sum_reduce(input, output, routed_scaling_factor: float = 1.0):
        """sgl_kernel's top-k sum: ``output = sum_k input[:, k] * routed_scaling_factor`` (PyTorch)."""
        torch.sum(input, dim=1, out=output)
        if routed_scaling_factor != 1.0:
            output.mul_(routed_scaling_factor)
        return output

    why = "the sgl_kernel wheel is not installed; only moe_sum_reduce is provided, in PyTorch"
    return {
        "moe_sum_reduce": moe_sum_reduce,
        "silu_and_mul": _unavailable_function("sgl_kernel.silu_and_mul", why),
        "__getattr__": _missing("sgl_kernel", why),
    }


def _missing(module: str, why: str):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"{module}.{name} is not available here ({why})")

    return __getattr__


def _stub_ops_moe() -> dict:
    """``sglang.kernels.ops.moe``'s ``moe_align_block_size`` dispatches to sgl_kernel's AOT kernel; here it
    runs SGLang's JIT kernel of the same contract (``moe_align.py``, no inactive-prefix count)."""

    def moe_align_block_size(*args, ignore_invalid_expert=False):
        """``(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids, num_tokens_post_pad,
        cumsum_buffer[, pad_sorted_token_ids[, ignore_invalid_expert]])``, as SGLang's dispatcher passes
        them."""
        if len(args) > 8:
            args, ignore_invalid_expert = args[:8], args[8]
        if ignore_invalid_expert:
            raise RuntimeError("ignore_invalid_expert needs sgl_kernel's AOT moe_align_block_size")
        jit = importlib.import_module("sglang.kernels.ops.moe.moe_align").moe_align_block_size
        return jit(*args)

    return {"moe_align_block_size": moe_align_block_size}


def _lazy(module: str, attribute: str):
    """A module ``__getattr__`` that resolves ``attribute`` from ``module`` on first use."""

    def __getattr__(name: str):
        if name == attribute:
            return getattr(importlib.import_module(module), attribute)
        raise AttributeError(f"{name} (only {attribute} is provided by this stand-in)")

    return __getattr__


def stand_ins() -> dict:
    """Stand-in modules by name (each a factory of its attributes)."""
    fp8 = "fp8/int8 activation quantisation is not part of the W4A16 path"
    runtime = {
        "get_exec": lambda: _Defaults("get_exec()"),
        "get_parallel": lambda: _Defaults("get_parallel()"),
        "get_platform": lambda: types.SimpleNamespace(
            is_sm90=_stub_srt_utils()["is_sm90_supported"](), is_sm100=False
        ),
    }
    return {
        "sglang.srt.utils": _stub_srt_utils,
        "sglang.srt.utils.common": _stub_srt_utils_common,
        "sglang.srt.utils.custom_op": lambda: {"register_custom_op": _register_custom_op},
        "sglang.utils": lambda: {"is_in_ci": lambda: False},
        "sglang.srt.runtime_context": lambda: runtime,
        "sglang.srt.batch_invariant_ops": lambda: {"is_batch_invariant_mode_enabled": lambda: False},
        "sglang.srt.distributed": dict,
        "sglang.srt.distributed.device_communicators": dict,
        "sglang.srt.distributed.device_communicators.pynccl_allocator": lambda: {
            "use_symmetric_memory": lambda *a, **k: contextlib.nullcontext()
        },
        "sglang.srt.layers.dp_attention": lambda: {"is_allocation_symmetric": lambda: False},
        "sglang.srt.layers.zero_copy_context": lambda: {"get_moe_output": lambda hidden_states: None},
        "sglang.srt.layers.moe.moe_runner": lambda: {"MoeRunnerConfig": _MoeRunnerConfig},
        "sglang.srt.layers.moe.utils": lambda: {
            "get_moe_padding_size": lambda use_aiter=False: 0,
            "get_moe_runner_backend": lambda: _Defaults("moe_runner_backend"),
        },
        "sglang.srt.layers.moe.fused_moe_triton": lambda: {
            "__getattr__": _lazy(
                "sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size", "moe_align_block_size"
            )
        },
        "sglang.srt.layers.moe.moe_runner.triton_utils": lambda: {"get_config": lambda: None},
        "sglang.kernels.ops.moe": _stub_ops_moe,
        "sglang.kernels.ops.activation.minimax_m3_swiglu": lambda: {
            "swiglu_oai_split": _unavailable_function("swiglu_oai_split", "GPT-OSS activation, not used")
        },
        "sglang.kernels.ops.quantization.fp8_kernel": lambda: {
            n: _unavailable_function(n, fp8)
            for n in ("per_token_group_quant_fp8", "scaled_fp8_quant", "sglang_per_token_group_quant_fp8")
        },
        "sglang.kernels.ops.quantization.int8_kernel": lambda: {
            n: _unavailable_function(n, fp8)
            for n in (
                "per_token_group_quant_int8",
                "per_token_quant_int8",
                "sglang_per_token_group_quant_int8",
            )
        },
        "sglang.kernels.ops.quantization.per_token_group_quant": lambda: {
            "per_token_group_quant": _unavailable_function("per_token_group_quant", fp8)
        },
        "sgl_kernel": _stub_sgl_kernel,
        "sgl_kernel.scalar_type": _stub_sgl_kernel_scalar_type,
    }


class _MoeRunnerConfig:
    """Stand-in for SGLang's MoeRunnerConfig (only constructed as a default argument)."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)
