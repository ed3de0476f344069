"""Lab 4 (prefill and decode): checks for latency metrics from timestamps,
the arithmetic intensity of a matrix product, and the memory-bound prediction
of a decode step's time."""
from __future__ import annotations

import math

from .core import Case, _report

# ---------------------------------------------------------------- lab 4: prefill and decode


def reference_ttft_and_tpot(arrival_time: float, token_times: list[float]) -> tuple[float, float | None]:
    """The course's answer to lab 4's ttft_and_tpot exercise."""
    ttft = token_times[0] - arrival_time
    if len(token_times) < 2:
        return ttft, None  # one token: there is no gap to average
    return ttft, (token_times[-1] - token_times[0]) / (len(token_times) - 1)


def reference_arithmetic_intensity(m: int, n: int, k: int, bytes_per_value: float) -> float:
    """The course's answer to lab 4's arithmetic_intensity exercise."""
    flops = 2 * m * n * k
    nbytes = (m * k + k * n + m * n) * bytes_per_value
    return flops / nbytes


def reference_predict_decode_time(weight_bytes: float, kv_bytes_per_token: float, batch: int, context: int,
                                  bandwidth: float) -> float:
    """The course's answer to lab 4's predict_decode_time exercise."""
    return (weight_bytes + batch * context * kv_bytes_per_token) / bandwidth


def _close(got, expected) -> bool:
    """Equal up to float rounding, element by element; None only matches None."""
    if isinstance(expected, tuple):
        return isinstance(got, (tuple, list)) and len(got) == len(expected) and all(
            _close(g, e) for g, e in zip(got, expected))
    if expected is None or got is None:
        return got is expected
    return isinstance(got, (int, float)) and math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-12)


def _ttft_tpot_cases() -> list[Case]:
    # Timestamps as time.perf_counter() gives them: seconds from an arbitrary start.
    timings = [
        (1000.0, [1000.5, 1000.625, 1000.75, 1000.875], "steady gaps of 0.125 s after a 0.5 s prefill"),
        (52.25, [53.0, 53.25, 53.75, 54.75], "gaps of 0.25, 0.5 and 1 s"),
        (7.0, [7.125, 7.375], "two tokens"),
        (3.5, [4.0], "one token: no gap, so TPOT is None"),
        (0.0, [2.0, 2.5, 3.0, 3.5, 4.0, 4.5], "arrival at time 0"),
    ]
    return [Case((arrival, times), reference_ttft_and_tpot(arrival, times),
                 f"arrival_time={arrival}, token_times={times}  ({note})")
            for arrival, times, note in timings]


def check_ttft_and_tpot(fn) -> bool:
    """fn(arrival_time, token_times) -> (ttft, tpot), tpot None for a single token."""
    return _report("ttft_and_tpot", fn, _ttft_tpot_cases, same=_close)


def _intensity_cases() -> list[Case]:
    shapes = [
        (2, 3, 4, 1, "a tiny product you can do by hand: 48 FLOPs, 26 bytes"),
        (1, 4096, 4096, 2, "one token through a 4096 x 4096 bf16 weight: a matrix-vector product"),
        (512, 1728, 576, 4, "a 512-token prefill through SmolLM2's qkv_proj in fp32"),
        (1, 1728, 576, 4, "one decode token through the same weight"),
        (8, 1536, 576, 2, "a batch of 8 decode tokens, bf16"),
        (4096, 4096, 4096, 2, "a large square bf16 product"),
    ]
    return [Case((m, n, k, b), reference_arithmetic_intensity(m, n, k, b),
                 f"m={m}, n={n}, k={k}, bytes_per_value={b}  ({note})")
            for m, n, k, b, note in shapes]


def check_arithmetic_intensity(fn) -> bool:
    """fn(m, n, k, bytes_per_value) -> FLOPs per byte of an [m, k] @ [k, n] product."""
    return _report("arithmetic_intensity", fn, _intensity_cases, same=_close)


def _decode_time_cases() -> list[Case]:
    smol_fp32, smol_kv = 538_060_032, 46_080  # SmolLM2-135M: weight bytes, KV bytes per token (fp32)
    rows = [
        (140e9, 0, 1, 0, 3.35e12, "Inference 101: 140 GB of weights, 3.35 TB/s, cache ignored"),
        (140e9, 327_680, 1, 4000, 3.35e12, "the same model, one 4,000-token conversation (320 KiB per token)"),
        (140e9, 327_680, 64, 4000, 3.35e12, "64 such conversations in one batch"),
        (smol_fp32, smol_kv, 1, 512, 30e9, "SmolLM2 in fp32 at 512 tokens of context, 30 GB/s"),
        (smol_fp32, smol_kv, 8, 2048, 30e9, "SmolLM2, batch 8, 2,048 tokens each"),
    ]
    return [Case((w, kv, b, c, bw), reference_predict_decode_time(w, kv, b, c, bw),
                 f"weight_bytes={w:,.0f}, kv_bytes_per_token={kv:,}, batch={b}, context={c}, "
                 f"bandwidth={bw:,.0f}  ({note})")
            for w, kv, b, c, bw, note in rows]


def check_predict_decode_time(fn) -> bool:
    """fn(weight_bytes, kv_bytes_per_token, batch, context, bandwidth) -> seconds per decode step."""
    return _report("predict_decode_time", fn, _decode_time_cases, same=_close)
