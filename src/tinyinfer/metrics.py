"""Latency and throughput across many requests, the way serving benchmarks
report them (vLLM's `vllm bench serve` uses the same definitions).

Each RequestOutput carries its own timings in `.metrics` (see request.py),
defined once, in token_latencies below:

    ttft  time to first token: arrival -> first token (queueing + prefill)
    tpot  time per output token after the first: (last - first) / (n - 1)
    itl   inter-token latencies: every gap between consecutive tokens
    e2e   end to end: arrival -> last token

One request is an anecdote. `summarize` pools many and reports the mean and
the tail (p95, p99): users remember the slow replies, and averages hide them.

    outs = llm.generate(prompts, params)
    print(summarize(outs))

A client outside the engine (tinyinfer bench, tinyinfer_course.analysis.replay) times each
request itself, in a RequestRecord; LatencyStats pools either kind.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

PERCENTILES = (50, 95, 99)


def percentile(values, q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between the two
    nearest ranks: numpy's default, as vLLM's benchmark uses. NaN if empty."""
    values = list(values)
    return float(np.percentile(values, q)) if values else math.nan


def token_latencies(start: float, times: list[float], num_tokens: int | None = None, with_itl: bool = True) -> dict:
    """One request's latencies, from `start` (its arrival, or when a client sent
    it) and the times its tokens came, or the chunks that carried them:

        ttft  times[0] - start
        tpot  (times[-1] - times[0]) / (num_tokens - 1), None below 2 tokens
        e2e   times[-1] - start
        itl   every gap between consecutive times (with_itl: it costs O(reply))

    num_tokens defaults to len(times); a server that sends several tokens in one
    chunk reports more tokens than there are chunks. {} when nothing came."""
    if not times:
        return {}
    n = len(times) if num_tokens is None else num_tokens
    m = {"ttft": times[0] - start, "tpot": (times[-1] - times[0]) / (n - 1) if n > 1 else None,
         "e2e": times[-1] - start}
    if with_itl:
        m["itl"] = [b - a for a, b in zip(times, times[1:])]
    return m


_UNITS = {"s": 1.0, "ms": 1e3}  # a latency in seconds times this is in the unit


@dataclass(frozen=True)
class LatencyStats:
    """Count, mean, median, standard deviation and percentiles of one latency.

    The values are in `unit`: seconds for the engine's and the fleet simulator's
    reports, milliseconds for `tinyinfer bench`, which prints what vLLM's `bench
    serve` prints. The *_ms properties read milliseconds whatever the unit."""

    count: int
    mean: float
    median: float
    std: float
    percentiles: dict  # {95.0: value, ...}, one entry per percentile asked for
    unit: str = "s"

    @classmethod
    def of(cls, seconds, percentiles=PERCENTILES, unit: str = "s") -> "LatencyStats":
        """The statistics of `seconds` (an iterable of latencies in seconds)."""
        values = [float(v) * _UNITS[unit] for v in seconds]
        mean, std = (float(np.mean(values)), float(np.std(values))) if values else (math.nan, math.nan)
        return cls(len(values), mean, percentile(values, 50), std,
                   {float(q): percentile(values, q) for q in percentiles}, unit)

    def p(self, q: float) -> float:
        """The q-th percentile, in this object's unit (one of those asked for)."""
        return self.percentiles[float(q)]

    p50 = property(lambda self: self.median)
    p95 = property(lambda self: self.p(95))
    p99 = property(lambda self: self.p(99))

    def _to_ms(self, value: float) -> float:
        return value * 1e3 / _UNITS[self.unit]

    mean_ms = property(lambda self: self._to_ms(self.mean))
    median_ms = property(lambda self: self._to_ms(self.median))
    std_ms = property(lambda self: self._to_ms(self.std))
    percentiles_ms = property(lambda self: {q: self._to_ms(v) for q, v in self.percentiles.items()})

    def to_dict(self) -> dict:
        """Flat and JSON-ready: count, mean, median, std, p50, p95, ..., unit."""
        d = {"count": self.count, "mean": self.mean, "median": self.median, "std": self.std}
        d.update({f"p{q:g}": v for q, v in self.percentiles.items()})
        return {**d, "unit": self.unit}

    def __str__(self) -> str:
        cells = [f"mean={_ms_text(self.mean_ms)} ms"]
        cells += [f"p{q:g}={_ms_text(v)} ms" for q, v in self.percentiles_ms.items()]
        return f"LatencyStats(n={self.count}, {', '.join(cells)})"

    __repr__ = __str__


@dataclass
class RequestRecord:
    """One request as a client saw it: what was asked, when things happened
    (seconds since the run started) and what came back.

    `tinyinfer bench` fills one per HTTP request; tinyinfer_course.analysis.replay fills one per
    request it adds to an engine, with one chunk per token. The definitions are
    those of vLLM's `bench serve`, counted from the send (which is later than
    the arrival when a concurrency cap held the request back), as computed by
    token_latencies from the send and the chunk times:

        ttft   first content chunk - send
        e2el   last content chunk - send (vLLM's name for e2e)
        tpot   (e2el - ttft) / (output_tokens - 1): per token after the first
        itl    every gap between consecutive content chunks

    TPOT and ITL differ when a server sends several tokens in one chunk: TPOT
    divides by the token count the server reports (usage), ITL sees chunk gaps."""

    index: int
    prompt_len: int  # input tokens we meant to send (usage's prompt_tokens wins when present)
    max_tokens: int
    arrival_time: float = math.nan  # when the workload released it
    send_time: float = math.nan  # when it went out (later than arrival if the concurrency cap held it)
    chunk_times: list[float] = field(default_factory=list)  # one per content chunk
    prompt_tokens: int | None = None  # from the server's usage report
    completion_tokens: int | None = None
    status: str = "pending"  # "ok", "failed" or "rejected" (HTTP 429: the server said "not now")
    http_status: int | None = None
    error: str = ""
    retry_after: float | None = None  # seconds, from a 429's Retry-After header
    text: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def input_tokens(self) -> int:
        return self.prompt_tokens if self.prompt_tokens is not None else self.prompt_len

    @property
    def output_tokens(self) -> int:
        """Usage's completion_tokens; without usage, one token per content chunk."""
        return self.completion_tokens if self.completion_tokens is not None else len(self.chunk_times)

    def _latency(self, name: str, with_itl: bool = False):
        if not self.ok:
            return [] if name == "itl" else None
        return token_latencies(self.send_time, self.chunk_times, self.output_tokens, with_itl).get(name)

    ttft = property(lambda self: self._latency("ttft"))
    e2el = property(lambda self: self._latency("e2e"))
    tpot = property(lambda self: self._latency("tpot"), doc="None when there is no second token to time.")
    itl = property(lambda self: self._latency("itl", with_itl=True))

    # What a timeline of requests draws (lab 7 plots replay's records by these names).
    arrival = property(lambda self: self.arrival_time)
    first_token = property(lambda self: self.chunk_times[0] if self.chunk_times else None)
    finish = property(lambda self: self.chunk_times[-1] if self.chunk_times else None)
    output_len = property(lambda self: self.output_tokens)


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
            lines.append(f"{name.upper():<6}{latency_cells(getattr(self, name))}")
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


def latency_cells(stats: LatencyStats, width: int = 9) -> str:
    """Mean, p50, p95 and p99 in ms, right-aligned: one row of a latency table."""
    values = (stats.mean, stats.p50, stats.p95, stats.p99)
    return "".join(f"{_ms_text(stats._to_ms(v)):>{width}}" for v in values)


def _ms_text(ms: float) -> str:
    return "-" if math.isnan(ms) else f"{ms:.1f}"


def json_safe(x):
    """NaN and inf are not JSON: write them as null (and dict keys as strings)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x
