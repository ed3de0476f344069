"""Latency and throughput across many requests, the way serving benchmarks
report them (vLLM's `vllm bench serve` uses the same definitions).

Each RequestOutput carries its own timings in `.metrics` (see sequence.py):

    ttft  time to first token: arrival -> first token (queueing + prefill)
    tpot  time per output token after the first: (last - first) / (n - 1)
    itl   inter-token latencies: every gap between consecutive tokens
    e2e   end to end: arrival -> last token

One request is an anecdote. `summarize` pools many and reports the mean and
the tail (p95, p99): users remember the slow replies, and averages hide them.

    outs = llm.generate(prompts, params)
    print(summarize(outs))
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PERCENTILES = (50, 95, 99)


def percentile(values, q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between the two
    nearest ranks: numpy's default, as vLLM's benchmark uses. NaN if empty."""
    values = list(values)
    return float(np.percentile(values, q)) if values else math.nan


@dataclass(frozen=True)
class LatencyStats:
    """Mean and percentiles of one latency, in seconds."""

    count: int
    mean: float
    p50: float
    p95: float
    p99: float

    @classmethod
    def of(cls, values) -> "LatencyStats":
        values = [float(v) for v in values]
        mean = float(np.mean(values)) if values else math.nan
        return cls(len(values), mean, *(percentile(values, q) for q in PERCENTILES))

    def __str__(self) -> str:
        cells = ", ".join(f"{k}={_ms(getattr(self, k))} ms" for k in ("mean", "p50", "p95", "p99"))
        return f"LatencyStats(n={self.count}, {cells})"

    __repr__ = __str__


@dataclass(frozen=True)
class BenchmarkMetrics:
    """What a serving benchmark reports for a set of finished requests."""

    num_requests: int
    output_tokens: int  # generated tokens, all requests together
    duration: float  # seconds from the first arrival to the last token
    ttft: LatencyStats
    tpot: LatencyStats  # one value per request with >= 2 output tokens
    itl: LatencyStats  # every gap between tokens, all requests pooled
    e2e: LatencyStats

    @property
    def output_throughput(self) -> float:
        """Generated tokens per second, across all requests: the machine's view."""
        return self.output_tokens / self.duration if self.duration > 0 else math.nan

    @property
    def request_throughput(self) -> float:
        return self.num_requests / self.duration if self.duration > 0 else math.nan

    def table(self) -> str:
        lines = [
            f"{self.num_requests} requests, {self.output_tokens} output tokens in {self.duration:.2f} s: "
            f"{self.output_throughput:.1f} tok/s output throughput",
            f"{'(ms)':<6}{'mean':>9}{'p50':>9}{'p95':>9}{'p99':>9}",
        ]
        for name in ("ttft", "tpot", "itl", "e2e"):
            s = getattr(self, name)
            cells = "".join(f"{_ms(getattr(s, k)):>9}" for k in ("mean", "p50", "p95", "p99"))
            lines.append(f"{name.upper():<6}{cells}")
        return "\n".join(lines)

    __str__ = __repr__ = table


def summarize(outputs, duration: float | None = None) -> BenchmarkMetrics:
    """Pool the metrics of finished RequestOutputs. Without `duration`, the
    benchmark runs from the earliest arrival to the latest last token."""
    ms = [o.metrics for o in outputs if "ttft" in o.metrics]  # requests that produced a token
    if not ms:
        raise ValueError("summarize: no request in `outputs` produced a token")
    if duration is None:
        duration = max(m["arrival_time"] + m["e2e"] for m in ms) - min(m["arrival_time"] for m in ms)
    return BenchmarkMetrics(
        num_requests=len(ms),
        output_tokens=sum(len(o.outputs[0].token_ids) for o in outputs if "ttft" in o.metrics),
        duration=duration,
        ttft=LatencyStats.of(m["ttft"] for m in ms),
        tpot=LatencyStats.of(m["tpot"] for m in ms if m["tpot"] is not None),
        itl=LatencyStats.of(gap for m in ms for gap in m["itl"]),
        e2e=LatencyStats.of(m["e2e"] for m in ms),
    )


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.1f}"


def json_safe(x):
    """NaN and inf are not JSON: write them as null (and dict keys as strings)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x
