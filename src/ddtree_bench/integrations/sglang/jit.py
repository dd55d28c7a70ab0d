"""SGLang's JIT kernels for the Marlin MoE, built ahead of time and loaded without a rebuild.

SGLang's loader (``sglang.kernels.jit.utils.load_jit``) compiles a module the first time it is asked for and
keys its cache on the GPU's capability, the nvcc and host compiler versions, the torch and tvm-ffi versions
and every header read. The Marlin GEMM is one translation unit of about 180 template instances: minutes of
nvcc per variant, paid on the GPU machine's lease. Here instead:

- ``prebuild(out)`` runs on any machine with nvcc, torch and apache-tvm-ffi, GPU or not: it
  asks SGLang's own module factories for every module the Marlin forward (and its tests) load, under
  SGLang's ``override_jit_cuda_arch`` (sm_90a by default), with SGLang's own ``load_jit``, and copies each
  built library to ``out/<module name>.so``.
- ``use_prebuilt(folder)`` (called by ``files.install_files`` once SGLang's files are on the import path,
  when the ``SGLANG_JIT_PREBUILT`` environment variable names a folder) replaces ``load_jit`` by a lookup of
  ``<folder>/<module name>.so`` loaded with ``tvm_ffi.load_module``: no key, no compiler. A module that is
  not there raises ``RuntimeError`` naming it; nothing is rebuilt silently (``SGLANG_CRASH_ON_JIT_COMPILE``
  is set too).

The module name is SGLang's (``sgl_kernel_jit_`` + the module's arguments joined by ``_``), so one folder
holds every variant. The libraries need the tvm-ffi runtime of the same version (0.1.11, which sglang 0.5.23
pins) and a driver for the target arch.

``jit_reason`` says why SGLang's JIT cannot build here (a Python package, nvcc or ninja missing).
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ddtree_bench.integrations.sglang.errors import describe

#: the environment variable naming a folder of prebuilt modules (``use_prebuilt``)
PREBUILT_ENV = "SGLANG_JIT_PREBUILT"
#: SGLang's module-name prefix (``sglang.kernels.jit.utils.compile.spec``)
MODULE_PREFIX = "sgl_kernel_jit_"
_JIT_UTILS = "sglang.kernels.jit.utils"
#: Python packages the JIT path imports besides torch (the ``ninja`` package only where no ninja is on PATH)
JIT_PACKAGES = (("tvm_ffi", "apache-tvm-ffi==0.1.11"), ("msgspec", "msgspec"))


def module_name(*args) -> str:
    """SGLang's name of the JIT module whose ``load_jit`` arguments are ``args``."""
    return MODULE_PREFIX + "_".join(str(arg) for arg in args)


def forward_modules(torch) -> list[tuple[str, str, tuple, dict]]:
    """``(module, factory, args, kwargs)`` of every JIT module SGLang's Marlin MoE path loads for a BF16
    W4A16 checkpoint without expert parallelism (``fused_marlin_moe``): the two Marlin GEMMs (gate-up, and
    down with inactive rows zeroed), the alignment kernels (one token; more tokens, with and without the
    inactive-prefix count), ``silu_and_mul``, and the Marlin repack the tests compare against."""
    bf16, i32 = torch.bfloat16, torch.int32
    marlin = "sglang.kernels.ops.moe.moe_wna16_marlin"
    align = "sglang.kernels.ops.moe.moe_align"
    # _jit_moe_wna16_marlin_module(dtype, is_ep, has_bias, ids_sorted, zero_inactive, inactive_prefix_count)
    return [
        (marlin, "_jit_moe_wna16_marlin_module", (bf16, False, False, True, False, True), {}),
        (marlin, "_jit_moe_wna16_marlin_module", (bf16, False, False, True, True, True), {}),
        (align, "_jit_moe_align_module", (i32,), {"write_inactive_prefix_count": True}),
        (align, "_jit_moe_align_module", (i32,), {}),
        ("sglang.kernels.ops.moe.moe_align_single_token", "_jit_align_single_token_module", (True,), {}),
        ("sglang.kernels.ops.activation.activation", "activation_module", (bf16,), {}),
        ("sglang.kernels.ops.quantization.gptq_marlin_repack", "_jit_gptq_marlin_repack_module", (), {}),
    ]


def use_prebuilt(folder) -> None:
    """Make SGLang's ``load_jit`` load ``<folder>/<module name>.so`` and never compile (module docstring).
    Must run after SGLang's files are importable and before any of its kernel modules is imported."""
    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise ValueError(f"{PREBUILT_ENV}: {folder} is not a folder of prebuilt SGLang JIT modules")
    os.environ["SGLANG_CRASH_ON_JIT_COMPILE"] = "1"
    utils = importlib.import_module(_JIT_UTILS)
    if getattr(utils.load_jit, "prebuilt_folder", None) == folder:
        return

    def load_jit(*args, **_build_options):
        name = module_name(*args)
        library = folder / f"{name}.so"
        if not library.is_file():
            raise RuntimeError(
                f"SGLang JIT module {name} is not prebuilt in {folder} (build it with "
                "tools/prebuild_sglang_jit.py); it is not compiled on this machine"
            )
        from tvm_ffi import load_module  # noqa: PLC0415

        return load_module(str(library))

    load_jit.prebuilt_folder = folder
    utils.load_jit = load_jit


def prebuild(out, *, arch: tuple[int, int] = (9, 0), jobs: int | None = None, only=None) -> list[Path]:
    """Build every module of ``forward_modules`` (``only``: those of these indices) for ``arch`` with
    SGLang's own loader and copy each library to ``out/<module name>.so``; returns their paths. SGLang's
    files must already be importable (``files.install_sglang_files``). ``jobs`` caps nvcc's parallel jobs
    (SGLang's ``MAX_JOBS``)."""
    import torch  # noqa: PLC0415

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if jobs:
        os.environ["MAX_JOBS"] = str(jobs)
    cache = Path(tempfile.mkdtemp(prefix="sglang-jit-"))
    os.environ["SGLANG_JIT_CACHE_DIR"] = str(cache)
    utils = importlib.import_module(_JIT_UTILS)
    real = utils.load_jit
    built: dict[str, Path] = {}

    def load_jit(*args, **options):
        module = real(*args, **options)
        name = module_name(*args)
        found = sorted(cache.rglob(f"{name}/**/*.so"))
        if not found:
            raise RuntimeError(f"SGLang built {name} but no library is under {cache}")
        target = out / f"{name}.so"
        shutil.copyfile(found[-1], target)
        built[name] = target
        return module

    utils.load_jit = load_jit
    try:
        with utils.override_jit_cuda_arch(*arch):
            for index, (module, factory, args, kwargs) in enumerate(forward_modules(torch)):
                if only is not None and index not in only:
                    continue
                getattr(importlib.import_module(module), factory)(*args, **kwargs)
    finally:
        utils.load_jit = real
        shutil.rmtree(cache, ignore_errors=True)
    return list(built.values())


def ensure_ninja() -> str | None:
    """SGLang's JIT runs ``ninja`` from PATH. Where none is, a ``ninja`` binary installed with the ``ninja``
    Python package is put on PATH: its ``BIN_DIR``, or ``bin/`` beside a ``pip install --target`` folder
    on ``sys.path``. Returns None, or why there is no ninja."""
    if shutil.which("ninja"):
        return None
    candidates = []
    try:
        import ninja  # noqa: PLC0415

        candidates.append(getattr(ninja, "BIN_DIR", "") or "")
        candidates.append(str(Path(ninja.__file__).resolve().parent.parent / "bin"))
    except Exception:
        pass
    candidates += [str(Path(entry) / "bin") for entry in sys.path if entry]
    for folder in candidates:
        binary = Path(folder, "ninja") if folder else None
        if binary is not None and binary.is_file() and os.access(binary, os.X_OK):
            os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"
            return None
    return (
        "no ninja on PATH or beside the ninja Python package (pip install ninja; SGLang's JIT builds with it)"
    )


def jit_reason(nvcc: str | None) -> str | None:
    """None where SGLang's JIT can build here, else why not (one line): ``JIT_PACKAGES`` that do not import,
    no ``nvcc`` (the path found by the caller, or None), no ninja. Sets ``CUDA_HOME`` from ``nvcc`` where
    neither it nor ``CUDA_PATH`` is set and nvcc is not on PATH (where SGLang's JIT looks)."""
    for module, package in JIT_PACKAGES:
        try:
            importlib.import_module(module)
        except Exception as exc:
            return f"{module} does not import ({describe(exc)}); pip install {package}"
    if nvcc is None:
        return "no nvcc (SGLang's JIT compiles the kernels with it; set CUDA_HOME or put nvcc on PATH)"
    if not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or shutil.which("nvcc")):
        os.environ["CUDA_HOME"] = str(Path(nvcc).resolve().parent.parent)
    return ensure_ninja()
