"""What a fleet simulation reports, in the units a serving benchmark uses.

The latency statistics reuse tinyinfer.metrics.LatencyStats, so a simulated
run and a real benchmark (tinyinfer.metrics.summarize) print the same table and
can be compared number for number.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from tinyinfer.metrics import LatencyStats, json_safe, latency_cells
from .sim_replica import Replica, RequestState


@dataclass(frozen=True)
class ReplicaStats:
    replica_id: int
    role: str
    # Fraction of its up time spent running forward passes. One sequence keeps a
    # replica "busy" as much as sixteen do, so 100% does not mean full batches.
    utilization: float
    busy_time_s: float
    alive_time_s: float
    steps: int
    completed: int
    prefix_cache_hit_tokens: int


@dataclass(frozen=True)
class RequestResult:
    """One request's fate, for comparing with a real server request by request."""

    request_id: int
    arrival_time: float
    replica_id: int | None
    retries: int
    rejected: str | None
    ttft: float | None
    e2e: float | None
    queue_wait: float | None  # arrival -> first scheduled on the replica that served it


@dataclass(frozen=True)
class FleetReport:
    num_requests: int
    completed: int
    rejected: int  # refused: queue full, no healthy replica, or too big to ever fit
    retries: int  # re-sends after a replica failed (one request may count several)
    duration: float  # first arrival to last completion, seconds
    output_tokens: int
    ttft: LatencyStats
    e2e: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    queue_wait: LatencyStats
    prefix_cache_hit_tokens: int
    replicas: list[ReplicaStats]
    requests: list[RequestResult] = field(repr=False, default_factory=list)
    extra: dict = field(default_factory=dict)  # e.g. KV-transfer times in disaggregated runs

    @property
    def request_throughput(self) -> float:
        return self.completed / self.duration if self.duration > 0 else math.nan

    @property
    def output_throughput(self) -> float:
        """Generated tokens per second, the whole fleet together."""
        return self.output_tokens / self.duration if self.duration > 0 else math.nan

    def to_dict(self, include_requests: bool = False) -> dict:
        """Plain JSON types; NaN (an empty statistic) becomes None."""
        d = asdict(self)
        if not include_requests:
            d.pop("requests")
        for name in ("ttft", "e2e", "tpot", "itl", "queue_wait"):
            d[name] = getattr(self, name).to_dict()  # p95 as a key, not inside a dict keyed by 95.0
        d["request_throughput"] = self.request_throughput
        d["output_throughput"] = self.output_throughput
        return json_safe(d)

    def table(self) -> str:
        lines = [
            f"{self.completed}/{self.num_requests} completed, {self.rejected} rejected, {self.retries} retries; "
            f"{self.request_throughput:.2f} req/s, {self.output_throughput:.1f} output tok/s "
            f"over {self.duration:.1f} s",
            f"{'(ms)':<6}{'mean':>9}{'p50':>9}{'p95':>9}{'p99':>9}",
        ]
        for name in ("ttft", "tpot", "itl", "e2e", "queue_wait"):
            s = getattr(self, name)
            lines.append(f"{name.upper().replace('QUEUE_WAIT', 'WAIT'):<6}" + latency_cells(s))
        lines.append("utilisation: " + ", ".join(f"#{r.replica_id} {r.utilization:.0%}" for r in self.replicas))
        return "\n".join(lines)

    __str__ = table


def build_report(states: list[RequestState], replicas: list[Replica], extra: dict | None = None) -> FleetReport:
    done = [s for s in states if s.finish_time is not None]
    arrivals = [s.req.arrival_time for s in states]
    end = max((s.finish_time for s in done), default=min(arrivals))
    ttft = [s.token_times[0] - s.req.arrival_time for s in done]
    e2e = [s.finish_time - s.req.arrival_time for s in done]
    tpot = [(s.token_times[-1] - s.token_times[0]) / (len(s.token_times) - 1) for s in done if len(s.token_times) > 1]
    itl = [b - a for s in done for a, b in zip(s.token_times, s.token_times[1:])]
    wait = [s.admit_time - s.req.arrival_time for s in done]
    return FleetReport(
        num_requests=len(states),
        completed=len(done),
        rejected=sum(s.rejected is not None for s in states),
        retries=sum(s.retries for s in states),
        duration=end - min(arrivals),
        output_tokens=sum(s.generated for s in done),
        ttft=LatencyStats.of(ttft), e2e=LatencyStats.of(e2e), tpot=LatencyStats.of(tpot),
        itl=LatencyStats.of(itl), queue_wait=LatencyStats.of(wait),
        prefix_cache_hit_tokens=sum(r.prefix_hit_tokens for r in replicas),
        replicas=[ReplicaStats(r.id, r.role, r.utilization, r.busy_time, r.alive_time, r.steps, r.completed,
                               r.prefix_hit_tokens) for r in replicas],
        requests=[_result(s) for s in states],
        extra=extra or {},
    )


def _result(s: RequestState) -> RequestResult:
    ok = s.finish_time is not None
    a = s.req.arrival_time
    return RequestResult(s.req.request_id, a, s.replica_id, s.retries, s.rejected,
                         s.token_times[0] - a if ok else None, s.finish_time - a if ok else None,
                         s.admit_time - a if ok else None)
