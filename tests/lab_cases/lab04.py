"""Lab 4 (prefill and decode): wrong implementations each check must reject,
and the reference each must accept. Collected by tests/test_labs.py."""
from tinyinfer import labcheck


def _tpot_divides_by_n(arrival, times):
    # n tokens have n - 1 gaps, not n
    return times[0] - arrival, (times[-1] - times[0]) / len(times) if len(times) > 1 else None


def _tpot_includes_prefill(arrival, times):
    # averages the whole request over its tokens: prefill leaks into the stream's pace
    return times[0] - arrival, (times[-1] - arrival) / len(times) if len(times) > 1 else None


def _ttft_forgets_arrival(arrival, times):
    # a timestamp, not a duration
    return times[0], (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None


def _tpot_zero_for_one_token(arrival, times):
    # a single token has no gap to measure: None, not 0
    return times[0] - arrival, (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0


WRONG = {
    "check_ttft_and_tpot": [_tpot_divides_by_n, _tpot_includes_prefill, _ttft_forgets_arrival,
                            _tpot_zero_for_one_token],
    "check_arithmetic_intensity": [
        lambda m, n, k, b: m * n * k / ((m * k + k * n + m * n) * b),  # a multiply-add counted as one FLOP
        lambda m, n, k, b: 2 * m * n * k / ((m * k + k * n) * b),  # forgets to write the output
        lambda m, n, k, b: 2 * m * n * k / (m * k + k * n + m * n),  # FLOPs per value, not per byte
    ],
    "check_predict_decode_time": [
        lambda w, kv, b, c, bw: (w + c * kv) / bw,  # one sequence's cache, whatever the batch
        lambda w, kv, b, c, bw: b * (w + c * kv) / bw,  # re-reads the weights for every sequence
        lambda w, kv, b, c, bw: w / bw,  # ignores the KV cache
        lambda w, kv, b, c, bw: bw / (w + b * c * kv),  # steps per second, not seconds per step
    ],
}
REFERENCE = {
    "check_ttft_and_tpot": lambda: labcheck.reference_ttft_and_tpot,
    "check_arithmetic_intensity": lambda: __import__("tinyinfer.hardware", fromlist=["x"]).arithmetic_intensity,
    "check_predict_decode_time": lambda: labcheck.reference_predict_decode_time,
}
