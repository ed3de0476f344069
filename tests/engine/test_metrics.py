"""tinyinfer.metrics on hand-made timings: definitions, percentiles, units."""
import math

import numpy as np
import pytest

from tinyinfer.metrics import BenchmarkMetrics, LatencyStats, percentile, summarize
from tinyinfer.outputs import CompletionOutput, RequestOutput
from tinyinfer.request import Request
from tinyinfer.sampling import SamplingParams


def request(arrival, token_times):
    """A RequestOutput whose metrics come from the engine's own Request.metrics."""
    req = Request("r", None, [1, 2, 3], SamplingParams(max_tokens=len(token_times) or 1), arrival_time=arrival)
    seq = req.samples[0]
    seq.token_times = list(token_times)
    seq.token_ids += range(len(token_times))
    return req.to_output()


# arrival at 0; first token after 0.5 s (prefill), then one every 0.1 s
A = request(0.0, [0.5, 0.6, 0.7, 0.8, 0.9])
# arrival at 0.2; first token at 1.2, then gaps of 0.2 and 0.4
B = request(0.2, [1.2, 1.4, 1.8])
# one token only: it has a TTFT but no TPOT
C = request(0.1, [0.4])


def test_percentile_is_numpy_linear_interpolation():
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 95) == pytest.approx(4 + 0.8 * 6)  # rank 3.8: between 4 and 10
    assert percentile(values, 99) == float(np.percentile(values, 99))
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_latency_stats():
    s = LatencyStats.of([0.1, 0.2, 0.3, 0.4])
    assert s.count == 4 and s.mean == pytest.approx(0.25) and s.p50 == pytest.approx(0.25)
    assert s.p50 <= s.p95 <= s.p99 <= 0.4
    assert "ms" in str(s) and "250.0" in str(s)
    empty = LatencyStats.of([])
    assert empty.count == 0 and math.isnan(empty.mean)


def test_summarize_definitions():
    m = summarize([A, B, C])
    assert isinstance(m, BenchmarkMetrics)
    assert m.num_requests == 3 and m.output_tokens == 5 + 3 + 1
    assert m.ttft.mean == pytest.approx((0.5 + 1.0 + 0.3) / 3)
    assert m.tpot.count == 2  # C has no TPOT: one token has no gap
    assert m.tpot.mean == pytest.approx((0.1 + 0.3) / 2)  # per request: (last - first) / (n - 1)
    assert m.itl.count == 4 + 2  # every gap, pooled
    assert m.itl.mean == pytest.approx((0.4 + 0.2 + 0.4) / 6)
    assert m.e2e.p50 == pytest.approx(0.9)  # e2e are 0.9, 1.6, 0.3
    assert m.duration == pytest.approx(1.8)  # first arrival 0.0 -> last token 1.8
    assert m.output_throughput == pytest.approx(9 / 1.8)
    assert m.request_throughput == pytest.approx(3 / 1.8)


def test_ttft_plus_stream_is_e2e():
    for r in (A, B):
        x = r.metrics
        n = len(r.outputs[0].token_ids)
        assert x["ttft"] + (n - 1) * x["tpot"] == pytest.approx(x["e2e"])
        assert sum(x["itl"]) == pytest.approx(x["e2e"] - x["ttft"])


def test_duration_can_be_given():
    m = summarize([A, B], duration=3.0)
    assert m.output_throughput == pytest.approx(8 / 3.0)


def test_slower_requests_move_the_tail_more_than_the_median():
    fast = [request(0.0, [0.1 * (i + 1)]) for i in range(19)]
    slow = request(0.0, [5.0])
    m = summarize(fast + [slow])
    assert m.ttft.p50 < 1.1 < m.ttft.p99  # one slow request in twenty: the median hides it
    assert m.ttft.p50 <= m.ttft.p95 <= m.ttft.p99


def test_table_is_readable():
    text = str(summarize([A, B, C]))
    assert text == repr(summarize([A, B, C]))
    for word in ("TTFT", "TPOT", "ITL", "E2E", "p95", "tok/s", "3 requests"):
        assert word in text


def test_requests_without_tokens_are_skipped_and_empty_is_refused():
    none = RequestOutput("x", None, [1], None, [CompletionOutput(0, "", [], None, None)], False,
                         metrics={"arrival_time": 0.0})
    assert summarize([A, none]).num_requests == 1
    with pytest.raises(ValueError):
        summarize([none])
