"""The compiled-kernel cache: a fatbin or native library built under other flags or by another compiler
(another ``--version``) is never reused; the same compiler and flags reuse the build; the version is read
once per process."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_compiler import FakeCompiler

from ddtree_bench import compile_cache, native_build
from ddtree_bench.cuda import loader as cuda


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeCompiler:
    """A fake nvcc ($NVCC) and C++ compiler ($CXX), the cache in tmp_path, the versions read afresh (as
    in a new process)."""
    compiler = FakeCompiler(tmp_path / "bin")
    monkeypatch.setenv("NVCC", str(compiler.path))
    monkeypatch.setenv("CXX", str(compiler.path))
    monkeypatch.setenv("DDTREE_CACHE", str(tmp_path / "cache"))
    compile_cache.compiler_version.cache_clear()
    yield compiler
    compile_cache.compiler_version.cache_clear()


def _new_process():
    """What a new process sees: no version read yet."""
    compile_cache.compiler_version.cache_clear()


def _kernel(tmp_path: Path) -> Path:
    source = tmp_path / "k" / "k.cu"
    source.parent.mkdir()
    source.write_text('#include "k.cuh"\nextern "C" __global__ void k() {}\n')
    (source.parent / "k.cuh").write_text("// header\n")
    return source


def test_a_fatbin_is_keyed_by_nvccs_version_and_every_flag(tmp_path, fake, monkeypatch):
    source = _kernel(tmp_path)
    first = cuda.cached_fatbin(source, ["sm_90"])
    assert first.parent == tmp_path / "cache" and first.read_text().startswith(
        "built by release 12.4 with -O3"
    )
    assert cuda.cached_fatbin(source, ["sm_90"]) == first and fake.compiles() == 1  # same: reused

    fake.version = "release 13.0"  # another nvcc: another file, built by it; the old one left as it was
    _new_process()
    second = cuda.cached_fatbin(source, ["sm_90"])
    assert second != first and fake.compiles() == 2
    assert second.read_text().startswith("built by release 13.0")
    assert first.read_text().startswith("built by release 12.4")

    with monkeypatch.context() as patch:  # another flag: another file
        patch.setattr(cuda, "NVCC_FLAGS", (*cuda.NVCC_FLAGS, "-G"))
        third = cuda.cached_fatbin(source, ["sm_90"])
    assert third not in (first, second) and fake.compiles() == 3 and " -G " in third.read_text()
    assert cuda.cached_fatbin(source, ["sm_90"]) == second and fake.compiles() == 3  # the flags as they were

    fake.version = "release 12.4"  # the first nvcc back: its build is found again, not rebuilt
    _new_process()
    assert cuda.cached_fatbin(source, ["sm_90"]) == first and fake.compiles() == 3
    assert cuda.cached_fatbin(source, ["sm_90", "sm_120"]) not in (first, second, third)


def test_nvccs_version_is_read_once_per_process(tmp_path, fake):
    source = _kernel(tmp_path)
    for archs in (["sm_90"], ["sm_90"], ["sm_120"]):
        fatbin = cuda.cached_fatbin(source, archs)  # two builds (each records nvcc's version), one reuse
    assert fake.compiles() == 2 and fake.versions() == 1
    assert cuda.fatbin_toolchain(source, ["sm_90"]) == cuda.fatbin_toolchain(source, ["sm_90"])
    assert fake.versions() == 1
    info = (fatbin.parent / f"{fatbin.name}.json").read_text()
    assert '"nvcc": "release 12.4"' in info


def test_the_workflows_toolchain_key_follows_nvcc_and_flags(tmp_path, fake, monkeypatch):
    source = _kernel(tmp_path)
    key = cuda.fatbin_toolchain(source, ["sm_90"])
    assert cuda.fatbin_toolchain(source, ["sm_90", "sm_120"]) != key
    fake.version = "release 13.0"
    _new_process()
    assert cuda.fatbin_toolchain(source, ["sm_90"]) != key
    fake.version = "release 12.4"
    _new_process()
    assert cuda.fatbin_toolchain(source, ["sm_90"]) == key
    monkeypatch.setattr(cuda, "NVCC_FLAGS", ("-O2",))
    assert cuda.fatbin_toolchain(source, ["sm_90"]) != key


def test_a_native_library_is_keyed_by_the_compilers_version_and_every_flag(tmp_path, fake, monkeypatch):
    source = tmp_path / "tree_build_cpu.cpp"
    source.write_text(native_build.DEFAULT_SOURCE.read_text())
    first = native_build.cached_native_library(source)
    assert first.name.startswith("tree_build_cpu-") and first.suffix == ".so"
    assert native_build.cached_native_library(source) == first and fake.compiles() == 1
    key = native_build.toolchain()

    fake.version = "g++ 14.2"  # the compiler upgraded in place ($CXX unchanged): rebuilt
    _new_process()
    second = native_build.cached_native_library(source)
    assert second != first and fake.compiles() == 2 and second.read_text().startswith("built by g++ 14.2")
    assert native_build.toolchain() != key

    monkeypatch.setattr(native_build, "CXX_FLAGS", (*native_build.CXX_FLAGS, "-march=native"))
    third = native_build.cached_native_library(source)
    assert third not in (first, second) and "-march=native" in third.read_text()
    assert fake.compiles() == 3 and fake.versions() == 2  # once per process (two "processes" here)


def test_a_compiler_that_does_not_run_gives_a_key_of_its_own():
    assert "did not run" in compile_cache.compiler_version(("/no/such/compiler-ddtree",))
    key = compile_cache.toolchain_key(["/no/such/compiler-ddtree"], ["-O3"])
    assert key != compile_cache.toolchain_key(["/no/such/compiler-ddtree"], ["-O2"])
