"""How tinyinfer.quant decides whether torch's CUDA INT8 kernel is worth using.

torch's CUDA INT8 kernel is a naive loop, so on a GPU it is timed against the
reference path (de-quantize + cuBLAS) and used only if it is not slower. This
machine may have no GPU: the tests fake one, replacing the two steps that
need it (the numbers check and the timing) and keeping the decision itself.
"""
from __future__ import annotations

import time

import pytest
import torch

from tinyinfer import quant
from tinyinfer.quant import Int8Linear, choose_int8_cuda


@pytest.fixture
def fresh_decisions(monkeypatch):
    """Empty decision caches, restored afterwards (other tests keep theirs)."""
    for name in ("_KERNEL_OK", "_KERNEL_ERRORS", "_KERNEL_NOTES"):
        monkeypatch.setattr(quant, name, {})


@pytest.fixture
def fake_gpus(monkeypatch, fresh_decisions):
    """Two fake GPUs: on cuda:0 the INT8 kernel is slower than the reference
    path, on cuda:1 faster. Returns the list of timings taken."""
    timings = {"cuda:0": {1: (0.40, 0.10), 16: (0.90, 0.12)},  # {rows: (kernel ms, reference ms)}
               "cuda:1": {1: (0.05, 0.10), 16: (0.11, 0.12)}}
    taken = []

    def fake_timing(device, dtype):
        taken.append((quant.device_key(device), dtype))
        return timings[quant.device_key(device)]

    def numbers_ok(kind, device, dtype):
        if torch.device(device).type == "cuda":
            return None  # as a GPU whose kernel computes the reference's numbers would
        raise AssertionError("a CPU must still check its kernel's numbers for real")

    monkeypatch.setattr(quant, "check_kernel_numbers", numbers_ok)
    monkeypatch.setattr(quant, "time_int8_cuda", fake_timing)
    return taken


def test_a_slower_cuda_int8_kernel_is_not_used_and_says_why(fake_gpus):
    assert not quant.kernel_available("int8", "cuda:0", torch.bfloat16)
    assert quant.kernel_error("int8", "cuda:0", torch.bfloat16) is None  # slow is not broken
    reason = quant.kernel_reason("int8", "cuda:0", torch.bfloat16)
    assert reason.startswith("torch's CUDA INT8 kernel was slower than de-quantize + cuBLAS here "
                             "(1 row: 0.40 ms vs 0.10 ms; 16 rows: 0.90 ms vs 0.12 ms)"), reason


def test_a_faster_cuda_int8_kernel_is_used(fake_gpus):
    assert quant.kernel_available("int8", "cuda:1", torch.bfloat16)
    assert "was not slower than de-quantize + cuBLAS here (1 row: 0.05 ms vs 0.10 ms" in \
        quant.kernel_reason("int8", "cuda:1", torch.bfloat16)


def test_the_cuda_int8_timing_runs_once_per_gpu_and_dtype_and_never_on_a_cpu(fake_gpus):
    for _ in range(3):
        quant.kernel_available("int8", "cuda:0", torch.bfloat16)
        quant.kernel_available("int8", "cuda:1", torch.bfloat16)
    quant.kernel_available("int8", "cuda:1", torch.float16)
    assert fake_gpus == [("cuda:0", torch.bfloat16), ("cuda:1", torch.bfloat16), ("cuda:1", torch.float16)]


def test_a_cpu_decides_as_before_without_timing(monkeypatch, fresh_decisions):
    """On a CPU the numbers check alone decides (KERNEL_MAX_ROWS and
    kernel_choice.py handle speed there): no timing, no note."""
    def no_timing(device, dtype):
        raise AssertionError("a CPU decision must not time the CUDA kernel")

    monkeypatch.setattr(quant, "time_int8_cuda", no_timing)
    available = quant.kernel_available("int8", "cpu", torch.float32)
    assert quant._KERNEL_NOTES == {}
    if available:
        assert quant.kernel_reason("int8", "cpu", torch.float32).startswith("torch's packed INT8 kernel serves")


def test_the_decision_needs_the_kernel_no_slower_at_every_row_count():
    """The kernel serves every decode batch from 1 row to its limit, so losing at
    either end means the reference path; a tie keeps the kernel (fewer bytes)."""
    assert choose_int8_cuda({1: (0.10, 0.10), 16: (0.20, 0.30)})[0]
    assert not choose_int8_cuda({1: (0.05, 0.10), 16: (0.31, 0.30)})[0]  # wins at 1 row, loses at 16
    assert not choose_int8_cuda({1: (0.11, 0.10), 16: (0.20, 0.30)})[0]
    use, why = choose_int8_cuda({1: (1.234, 0.5)})
    assert not use and why == ("torch's CUDA INT8 kernel was slower than de-quantize + cuBLAS here "
                               "(1 row: 1.23 ms vs 0.50 ms), so INT8 layers de-quantize, then multiply")


def test_kernel_reason_says_why_an_old_gpu_has_no_int4_kernel(monkeypatch, fresh_decisions):
    monkeypatch.setattr(quant, "cuda_capability", lambda device: (7, 5))  # a T4
    assert quant.kernel_reason("int4", "cuda:0", torch.bfloat16) == (
        "INT4 layers de-quantize, then multiply: torch's CUDA INT4 kernel needs compute capability 8.0 or above")


def naive_cuda_int8_kernel(x, w, scales):
    """What torch's CUDA _weight_int8pack_mm does with x: reads x[b*K + k] from
    its first element whatever its strides, and (in some versions) returns fp32."""
    rows, k = x.shape
    as_read = torch.as_strided(x, (rows, k), (k, 1))  # the raw offsets, as the kernel indexes them
    return (as_read.float() @ w.float().T) * scales.float()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_int8_kernel_gets_a_contiguous_input_and_returns_its_dtype(monkeypatch, dtype):
    """A strided input (every other column of a wider tensor) must reach such a
    kernel contiguous, and its fp32 result must come back in x's dtype, or the
    residual stream would turn fp32."""
    monkeypatch.setattr(torch.ops.aten, "_weight_int8pack_mm", naive_cuda_int8_kernel)
    layer = Int8Linear.from_weight((torch.randn(48, 256) * 0.05).to(dtype))
    layer.kernel_scales = layer.scales.to(dtype)  # the kernel layout, whether or not this CPU has the kernel
    x = torch.randn(3, 512).to(dtype)[:, ::2]
    assert not x.is_contiguous()
    y = layer._kernel_forward(x)
    layer.use_kernel = False
    assert y.dtype is dtype
    torch.testing.assert_close(y.float(), layer(x).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_on_a_gpu_the_int8_timing_is_quick_and_the_reason_is_reported():
    """The real timing, where there is a GPU: well under a second, positive
    times for 1 row and the kernel's row limit, and a reason either way."""
    torch.ones(8, 8, device="cuda") @ torch.ones(8, 8, device="cuda")  # the CUDA context and cuBLAS: not the probe's
    torch.cuda.synchronize()
    start = time.perf_counter()
    times = quant.time_int8_cuda("cuda", torch.bfloat16)
    assert time.perf_counter() - start < 1.0
    assert set(times) == {1, quant.KERNEL_MAX_ROWS["int8", torch.bfloat16]}
    assert all(kernel > 0 and reference > 0 for kernel, reference in times.values())
    assert "de-quantize + cuBLAS here" in quant.kernel_reason("int8", "cuda", torch.bfloat16)
