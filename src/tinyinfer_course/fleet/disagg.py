"""Disaggregated serving: prefill on some replicas, decode on others.

In a colocated replica, a long prompt's prefill chunk shares forward passes with
sequences that are decoding; each such step takes longer (the StepCostModel's
prefill term), so every decoding user sees a stutter: a longer inter-token gap.
Splitting the fleet into a prefill pool and a decode pool removes that
interference: decode steps carry decode work only.

The price is moving the KV cache. When a prompt finishes prefilling (and has
produced the first token), its keys and values, prompt_len x kv_bytes_per_token
bytes, travel over a link to a decode replica:

    transfer time = latency_s + bytes / bandwidth_bytes_per_s

and each prefill replica's link sends one cache at a time (later ones queue).
The wait shows up as the gap between the first and second token, so a slow link
can cost more TPOT than the interference it removes. Fewer replicas also decode
(D instead of P + D), so with short prompts there is little to gain.

Failures and autoscaling are not modelled here (see simulator.py for those).
"""
from __future__ import annotations

from dataclasses import dataclass

from tinyinfer.metrics import LatencyStats
from .cost import StepCostModel
from .sim_replica import Replica, ReplicaConfig, RequestState
from .report import FleetReport
from .simulator import FleetSimulator, simulate
from .workload import SimRequest


@dataclass(frozen=True)
class KVLink:
    """The network between the pools: e.g. 50e9 B/s with 10 us for a fast
    RDMA fabric, 1.25e9 B/s (10 Gbit Ethernet) with 100 us for a slow one."""

    bandwidth_bytes_per_s: float = 50e9
    latency_s: float = 10e-6

    def __post_init__(self):
        if not self.bandwidth_bytes_per_s > 0:
            raise ValueError(f"KVLink.bandwidth_bytes_per_s={self.bandwidth_bytes_per_s!r} is invalid: must be > 0")
        if not self.latency_s >= 0:
            raise ValueError(f"KVLink.latency_s={self.latency_s!r} is invalid: must be >= 0")

    def send_time(self, nbytes: float) -> float:
        """Seconds the link is busy serialising nbytes (latency excluded: it overlaps)."""
        return nbytes / self.bandwidth_bytes_per_s


class DisaggSimulator(FleetSimulator):
    def __init__(self, workload, prefill_replicas: int, decode_replicas: int, cost_model, link: KVLink,
                 kv_bytes_per_token: float, replica_config=None, policy="least_outstanding", seed: int = 0):
        for name, n in (("prefill_replicas", prefill_replicas), ("decode_replicas", decode_replicas)):
            if not (isinstance(n, int) and n >= 1):
                raise ValueError(f"{name}={n!r} is invalid: must be an integer >= 1")
        if not kv_bytes_per_token > 0:
            raise ValueError(f"kv_bytes_per_token={kv_bytes_per_token!r} is invalid: must be > 0")
        roles = ["prefill"] * prefill_replicas + ["decode"] * decode_replicas
        super().__init__(workload, len(roles), cost_model, policy, replica_config, seed=seed, roles=roles)
        self.link, self.kv_bytes_per_token = link, kv_bytes_per_token
        self.link_free_at = {r.id: 0.0 for r in self.replicas if r.role == "prefill"}
        self.transfer_times: list[float] = []  # handoff -> arrival at the decode replica
        self.bytes_sent = 0.0

    def handoff(self, r: Replica, s: RequestState) -> None:
        """Ship the prompt's KV from prefill replica r; the link sends one cache at a time."""
        nbytes = s.req.prompt_len * self.kv_bytes_per_token
        start = max(self.loop.now, self.link_free_at[r.id])
        self.link_free_at[r.id] = start + self.link.send_time(nbytes)
        arrive = self.link_free_at[r.id] + self.link.latency_s
        self.transfer_times.append(arrive - self.loop.now)
        self.bytes_sent += nbytes
        self.loop.at(arrive, self.deliver, r, s)

    def deliver(self, src: Replica, s: RequestState) -> None:
        src.release(s.kv_reserved)  # the prefill replica held the KV until it was sent
        s.kv_reserved = 0
        self.kick(src)  # freed cache space may let a waiting prompt in
        pool = [r for r in self.replicas if r.role == "decode"]
        dst = min(pool, key=lambda r: (r.outstanding, r.id))  # least outstanding
        self.enqueue(dst, s)

    def extra(self) -> dict:
        return {"kv_transfer": LatencyStats.of(self.transfer_times).to_dict(), "kv_bytes_sent": self.bytes_sent}


def simulate_disaggregated(workload: list[SimRequest], prefill_replicas: int = 1, decode_replicas: int = 1,
                           cost_model: StepCostModel | None = None, link: KVLink | None = None,
                           kv_bytes_per_token: float = 46080, replica_config: ReplicaConfig | None = None,
                           policy="least_outstanding", seed: int = 0) -> FleetReport:
    """Serve `workload` with P prefill and D decode replicas joined by `link`.

    The default kv_bytes_per_token is the course model's (SmolLM2-135M: 30 layers
    x 3 KV heads x 64 dims x K and V x 4 bytes in fp32); see tinyinfer.config.kv_bytes_per_token."""
    return DisaggSimulator(workload, prefill_replicas, decode_replicas, cost_model, link or KVLink(),
                           kv_bytes_per_token, replica_config, policy, seed).run()


def compare_disaggregation(workload: list[SimRequest], prefill_replicas: int, decode_replicas: int,
                           cost_model: StepCostModel | None = None, link: KVLink | None = None,
                           kv_bytes_per_token: float = 46080,
                           replica_config: ReplicaConfig | None = None) -> dict[str, FleetReport]:
    """The same workload on P + D colocated replicas and on P prefill + D decode
    replicas: the same number of machines, divided differently."""
    return {
        "colocated": simulate(workload, prefill_replicas + decode_replicas, cost_model,
                              "least_outstanding", replica_config),
        "disaggregated": simulate_disaggregated(workload, prefill_replicas, decode_replicas, cost_model, link,
                                                kv_bytes_per_token, replica_config),
    }
