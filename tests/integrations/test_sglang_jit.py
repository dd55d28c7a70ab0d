"""SGLang's JIT modules built ahead: the names are SGLang's, a prebuilt folder replaces SGLang's loader with a
lookup that never compiles (a module missing there is an error naming it), and a bad folder is refused; why
the JIT cannot build here is one line naming what is missing."""

from __future__ import annotations

import sys
import types

import pytest

from ddtree_bench.integrations.sglang import jit as sglang_jit


def test_module_names_are_sglangs():
    assert sglang_jit.module_name("moe_align_block_size", "int32_t", "true") == (
        "sgl_kernel_jit_moe_align_block_size_int32_t_true"
    )


def test_a_prebuilt_folder_replaces_the_loader_and_never_compiles(tmp_path, monkeypatch):
    utils = types.ModuleType("sglang.kernels.jit.utils")

    def compile_it(*args, **kwargs):  # SGLang's own loader: must not be reached
        raise AssertionError("compiled")

    utils.load_jit = compile_it
    monkeypatch.setitem(sys.modules, "sglang.kernels.jit.utils", utils)
    monkeypatch.delenv("SGLANG_CRASH_ON_JIT_COMPILE", raising=False)
    sglang_jit.use_prebuilt(tmp_path)
    assert utils.load_jit is not compile_it
    assert utils.load_jit.prebuilt_folder == tmp_path.resolve()
    with pytest.raises(RuntimeError, match="sgl_kernel_jit_activation_bf16_t_true is not prebuilt in"):
        utils.load_jit("activation", "bf16_t", "true", cuda_files=["x.cuh"])
    import os  # noqa: PLC0415

    assert os.environ["SGLANG_CRASH_ON_JIT_COMPILE"] == "1"


def test_a_missing_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is not a folder of prebuilt SGLang JIT modules"):
        sglang_jit.use_prebuilt(tmp_path / "none")


def test_the_forward_modules_name_both_marlin_variants():
    torch = pytest.importorskip("torch", reason="the module list takes torch dtypes (PyTorch not installed)")
    modules = sglang_jit.forward_modules(torch)
    marlin = [args for module, _, args, _ in modules if module.endswith("moe_wna16_marlin")]
    assert {args[4] for args in marlin} == {False, True}  # zero_inactive_output, as fused_marlin_moe calls it


def test_jit_reason_names_a_missing_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "tvm_ffi", None)  # "import tvm_ffi" now raises ImportError
    reason = sglang_jit.jit_reason("/usr/local/cuda/bin/nvcc")
    assert reason.startswith("tvm_ffi does not import (") and "pip install apache-tvm-ffi==0.1.11" in reason
    assert "\n" not in reason


def test_jit_reason_without_nvcc_or_ninja(monkeypatch, tmp_path):
    for module, _ in sglang_jit.JIT_PACKAGES:
        monkeypatch.setitem(sys.modules, module, types.ModuleType(module))
    assert sglang_jit.jit_reason(None).startswith("no nvcc (SGLang's JIT compiles the kernels with it")
    monkeypatch.setattr(sglang_jit.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "ninja", None)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert sglang_jit.jit_reason(str(tmp_path / "bin" / "nvcc")).startswith("no ninja on PATH")
