"""What a whole benchmark run adds up to: counts, throughputs, latency
statistics and goodput, from one metrics.RequestRecord per request (whose
docstring gives vLLM's definitions of TTFT, TPOT, ITL and E2EL, measured on
the client from the moment a request is sent).

Goodput counts only the requests a user would call good: those that meet every
latency target (SLO) given. Throughput can rise while goodput falls, when a
server accepts more work than it can serve on time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..metrics import LatencyStats, RequestRecord, json_safe

SLO_METRICS = ("ttft", "tpot", "e2el")


@dataclass
class BenchResult:
    """The outcome of a run: counts, throughputs, latency statistics, and every
    request's record (for plots)."""

    completed: int
    failed: int
    rejected: int
    duration: float  # seconds, first send to last response
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # completed requests / s
    output_throughput: float  # generated tokens / s
    total_token_throughput: float  # (input + output tokens) / s
    request_goodput: float | None  # good requests / s; None without SLOs
    ttft: LatencyStats  # in ms, as vLLM reports them
    tpot: LatencyStats
    itl: LatencyStats
    e2el: LatencyStats
    percentiles: tuple = (50, 95, 99)
    goodput_slos_ms: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    records: list = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        """JSON-ready: vLLM-style summary keys plus per-request arrays (seconds)."""
        d = {"config": self.config, "goodput_slos_ms": self.goodput_slos_ms, "percentiles": list(self.percentiles)}
        for k in ("completed", "failed", "rejected", "duration", "total_input_tokens", "total_output_tokens",
                  "request_throughput", "output_throughput", "total_token_throughput", "request_goodput"):
            d[k] = getattr(self, k)
        for name in ("ttft", "tpot", "itl", "e2el"):
            s = getattr(self, name)
            d[f"mean_{name}_ms"], d[f"median_{name}_ms"], d[f"std_{name}_ms"] = s.mean_ms, s.median_ms, s.std_ms
            for q, v in s.percentiles_ms.items():
                d[f"p{q:g}_{name}_ms"] = v
        rs = self.records
        d.update(statuses=[r.status for r in rs], http_statuses=[r.http_status for r in rs],
                 errors=[r.error for r in rs], retry_afters=[r.retry_after for r in rs],
                 arrival_times=[r.arrival_time for r in rs], send_times=[r.send_time for r in rs],
                 input_lens=[r.input_tokens for r in rs], output_lens=[r.output_tokens if r.ok else 0 for r in rs],
                 ttfts=[r.ttft for r in rs], tpots=[r.tpot for r in rs], e2els=[r.e2el for r in rs],
                 itls=[r.itl for r in rs], chunk_times=[r.chunk_times for r in rs])
        return json_safe(d)

    def table(self) -> str:
        return format_table(self)

    __str__ = table


def parse_goodput(slos) -> dict:
    """{"ttft": 500.0, ...} in ms from a dict or from strings like "ttft:500"."""
    if not slos:
        return {}
    if isinstance(slos, str):
        slos = slos.split()
    items = slos.items() if isinstance(slos, dict) else (_split_slo(s) for s in slos)
    out = {}
    for key, value in items:
        if key not in SLO_METRICS:
            raise ValueError(f"goodput: unknown metric {key!r}; allowed: {', '.join(SLO_METRICS)}")
        value = float(value)
        if not value >= 0:
            raise ValueError(f"goodput: {key} must be a latency >= 0 in ms, got {value}")
        out[key] = value
    return out


def _split_slo(item: str):
    key, sep, value = str(item).partition(":")
    if not sep:
        raise ValueError(f"goodput: {item!r} is not METRIC:MS, e.g. ttft:500")
    try:
        return key.strip(), float(value)
    except ValueError:
        raise ValueError(f"goodput: {item!r}: {value!r} is not a number of ms") from None


def is_good(record: RequestRecord, slos_ms: dict) -> bool:
    """A finished request meets every SLO given. As vLLM does, a one-token reply
    has TPOT 0 here (nothing to time), so it can only miss on TTFT or E2EL."""
    values = {"ttft": record.ttft, "tpot": record.tpot or 0.0, "e2el": record.e2el}
    return record.ok and all(values[k] <= slo / 1e3 for k, slo in slos_ms.items())


def calculate_metrics(records, duration: float, percentiles=(50, 95, 99), goodput=None, config=None) -> BenchResult:
    """Pool the records of one run. `duration` is the run's wall time in seconds."""
    if not duration > 0:
        raise ValueError(f"duration must be > 0 seconds, got {duration}")
    for q in percentiles:
        if not 0 <= q <= 100:
            raise ValueError(f"percentiles must lie in [0, 100], got {q}")
    slos = parse_goodput(goodput)
    ok = [r for r in records if r.ok]
    total_in = sum(r.input_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    return BenchResult(
        completed=len(ok),
        failed=sum(r.status == "failed" for r in records),
        rejected=sum(r.status == "rejected" for r in records),
        duration=duration,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=len(ok) / duration,
        output_throughput=total_out / duration,
        total_token_throughput=(total_in + total_out) / duration,
        request_goodput=sum(is_good(r, slos) for r in ok) / duration if slos else None,
        ttft=LatencyStats.of([r.ttft for r in ok], percentiles, unit="ms"),
        tpot=LatencyStats.of([r.tpot for r in ok if r.tpot is not None], percentiles, unit="ms"),
        itl=LatencyStats.of([g for r in ok for g in r.itl], percentiles, unit="ms"),
        e2el=LatencyStats.of([r.e2el for r in ok], percentiles, unit="ms"),
        percentiles=tuple(percentiles),
        goodput_slos_ms=slos,
        config=dict(config or {}),
        records=list(records),
    )


_TITLES = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
           "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}


def format_table(res: BenchResult) -> str:
    """The summary, laid out like vLLM's `bench serve` so the two compare line by line."""
    cfg = res.config
    rows = [("Successful requests:", res.completed), ("Failed requests:", res.failed),
            ("Rejected requests (429):", res.rejected)]
    if cfg.get("max_concurrency"):
        rows.append(("Maximum request concurrency:", cfg["max_concurrency"]))
    if cfg.get("request_rate") not in (None, math.inf):
        rows.append(("Request rate configured (RPS):", cfg["request_rate"]))
    rows += [("Benchmark duration (s):", res.duration), ("Total input tokens:", res.total_input_tokens),
             ("Total generated tokens:", res.total_output_tokens),
             ("Request throughput (req/s):", res.request_throughput)]
    if res.request_goodput is not None:
        rows.append(("Request goodput (req/s):", res.request_goodput))
    rows += [("Output token throughput (tok/s):", res.output_throughput),
             ("Total token throughput (tok/s):", res.total_token_throughput)]
    lines = ["{:=^50}".format(" Serving Benchmark Result ")]
    lines += [f"{k:<40} {_fmt(v):<10}" for k, v in rows]
    for name, title in _TITLES.items():
        s = getattr(res, name)
        lines.append("{:-^50}".format(title))
        short = name.upper()
        lines.append(f"{'Mean ' + short + ' (ms):':<40} {_fmt(s.mean_ms):<10}")
        lines.append(f"{'Median ' + short + ' (ms):':<40} {_fmt(s.median_ms):<10}")
        lines += [f"{f'P{q:g} {short} (ms):':<40} {_fmt(v):<10}" for q, v in s.percentiles_ms.items()
                  if q != 50]  # p50 is the median, already shown
    lines.append("=" * 50)
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.2f}"
    return str(v)


Latency = LatencyStats  # the name this module gave its latency statistics before they joined metrics.py

__all__ = ["RequestRecord", "Latency", "BenchResult", "calculate_metrics", "parse_goodput", "is_good",
           "format_table"]
