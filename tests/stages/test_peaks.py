"""The GPU's measured peaks: 'unavailable' rows (with the reason) where there is no GPU or no torch, and
``peak_rates`` medians from hand-built frames; on a GPU, ok rows with sane rates."""

from __future__ import annotations

import math

import pytest

from ddtree_bench.cuda import loader as cuda
from ddtree_bench.ops import attention_peers
from ddtree_bench.stages import peaks
from ddtree_bench.stages.peaks import IMPLS, Job, peak_rates
from ddtree_bench.stages.peaks import run as run_job
from ddtree_bench.timing.records import STAGE_COLUMNS, stage_frame


def run_peaks(**fields):
    return run_job(Job(**fields))


TIMING = {
    "warmup": 1,
    "repeats": 3,
    "min_seconds": 0.0,
    "max_seconds": 5.0,
    "min_repeats": 1,
    "max_repeats": 5,
}
GPU_REASON = cuda.gpu_unavailable_reason()
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"needs a CUDA GPU: {GPU_REASON}")


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(cuda, "gpu_unavailable_reason", lambda: "no usable CUDA device (test)")


def test_no_gpu_gives_one_unavailable_row_per_peak(no_gpu):
    df = run_peaks(timing=TIMING, machine="test-machine")
    assert list(df.columns) == list(STAGE_COLUMNS)
    assert list(df["impl"]) == list(IMPLS) == ["floor", "bf16-gemm", "device-copy"]
    assert (df["stage"] == "peak").all() and (df["status"] == "unavailable").all()
    assert (df["status_reason"] == "no usable CUDA device (test)").all()
    assert (df["phase"] == "timed").all() and (df["repetition"] == 0).all()
    assert (df["batch"] == 0).all() and (df["budget"] == 0).all()
    assert (df["timing"] == "cuda-events").all() and (df["cache"] == "warm").all()
    assert df["seconds"].isna().all() and df["flops"].isna().all()
    assert (df["machine"] == "test-machine").all() and df["python"].notna().all()
    assert peak_rates(df) == {"gemm_tflops": None, "copy_tbps": None, "floor_seconds": None}


def test_arguments_are_checked(no_gpu):
    with pytest.raises(ValueError, match="repeats"):
        run_peaks(timing={**TIMING, "repeats": 0}, machine=None)
    with pytest.raises(TypeError):
        run_peaks(timing={**TIMING, "speed": 1}, machine=None)
    with pytest.raises(ValueError, match="gemm_n"):
        run_peaks(timing=TIMING, machine=None, gemm_n=0)
    with pytest.raises(ValueError, match="copy_bytes"):
        run_peaks(timing=TIMING, machine=None, copy_bytes=1.5)


def _row(impl, seconds, *, phase="timed", rep=0, status="ok", stage="peak", flops=None, nbytes=None):
    return {
        "stage": stage,
        "impl": impl,
        "repetition": rep,
        "phase": phase,
        "timing": "cuda-events",
        "cache": "warm",
        "seconds": seconds,
        "flops": flops,
        "bytes": nbytes,
        "status": status,
    }


def test_peak_rates_are_medians_of_per_call_rates():
    gemm = 1e12  # flops per call
    rows = [
        _row("bf16-gemm", 1e-6, phase="warmup", flops=gemm),  # warm-up: ignored
        *(_row("bf16-gemm", s, rep=i, flops=gemm) for i, s in enumerate((1e-3, 2e-3, 4e-3))),
        _row("bf16-gemm", math.nan, status="failed"),
        _row("device-copy", 1e-3, nbytes=2e9),
        _row("device-copy", 2e-3, rep=1, nbytes=2e9),
        *(_row("floor", s, rep=i) for i, s in enumerate((8e-6, 7e-6, 9e-6, 100e-6))),
        _row("floor", 1e-9, phase="warmup"),
        _row("ours", 1e-9, stage="verify-attention"),
    ]
    rates = peak_rates(stage_frame(rows))
    assert rates["gemm_tflops"] == pytest.approx(500.0)  # rates 1000, 500, 250 TFLOP/s
    assert rates["copy_tbps"] == pytest.approx(1.5)  # median of 2 and 1 TB/s (not 2e9 / 1.5e-3)
    assert rates["floor_seconds"] == pytest.approx(8.5e-6)


def test_peak_rates_partly_unavailable():
    rows = [
        {**_row("bf16-gemm", math.nan, status="unavailable"), "status_reason": "no torch"},
        _row("device-copy", 1e-3, nbytes=4e9),
        _row("floor", 8e-6),
    ]
    assert peak_rates(stage_frame(rows)) == {
        "gemm_tflops": None,
        "copy_tbps": pytest.approx(4.0),
        "floor_seconds": pytest.approx(8e-6),
    }


# --- on a GPU -------------------------------------------------------------------------------------------


@needs_gpu
@pytest.mark.skipif(
    attention_peers.torch_unavailable_reason() is not None,
    reason=f"the GEMM peak needs PyTorch with CUDA: {attention_peers.torch_unavailable_reason()}",
)
def test_peaks_on_a_gpu():
    df = run_peaks(timing=TIMING, machine="test", gemm_n=4096, copy_bytes=2**26)
    assert list(df.columns) == list(STAGE_COLUMNS)
    assert (df["status"] == "ok").all(), df[["impl", "status", "status_reason"]].to_string()
    assert set(df["impl"]) == set(IMPLS) and set(df["phase"]) == {"warmup", "timed"}
    assert (df["seconds"] > 0).all() and (df["clock"] == "cudaEventElapsedTime").all()
    gemm = df[df["impl"] == "bf16-gemm"]
    assert (gemm["flops"] == 2.0 * 4096**3).all()
    assert (df.loc[df["impl"] == "device-copy", "bytes"] == 2.0 * 2**26).all()
    rates = peak_rates(df)
    assert 1 <= rates["gemm_tflops"] <= 5000, rates
    assert 0.05 <= rates["copy_tbps"] <= 100, rates
    assert 0 < rates["floor_seconds"] < 1e-3, rates


@needs_gpu
def test_peaks_without_torch_still_time_floor_and_copy(monkeypatch):
    monkeypatch.setattr(
        attention_peers, "torch_unavailable_reason", lambda: "PyTorch is not installed (test)"
    )
    df = run_peaks(timing=TIMING, machine="test", copy_bytes=2**24)
    gemm = df[df["impl"] == "bf16-gemm"]
    assert len(gemm) == 1 and gemm["status"].iloc[0] == "unavailable"
    assert gemm["status_reason"].iloc[0] == "PyTorch is not installed (test)"
    others = df[df["impl"] != "bf16-gemm"]
    assert (others["status"] == "ok").all() and (others["seconds"] > 0).all()
    assert peaks.peak_rates(df)["gemm_tflops"] is None
