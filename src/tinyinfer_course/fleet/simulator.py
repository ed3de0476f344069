"""A discrete-event simulation of N replicas behind a load balancer.

Nothing here sleeps or uses threads. The simulation keeps a heap of future
events, each a (time, function) pair; it repeatedly pops the earliest, moves
the clock to its time and calls it. Calling it may schedule more events (a
step that starts now ends at now + step_time). Because time jumps from event
to event, an hour of traffic simulates in well under a second.

The events:
  arrival        the load balancer routes a request to a replica it believes healthy
  step done      a replica's forward pass ends: tokens appear, finished requests
                 leave, and the next step is scheduled right away if there is work
  failure        a replica dies; every request on it is re-sent elsewhere (a retry)
  recovery       it comes back, empty; the balancer notices at the next check
  health check   every `health_check_interval` s the balancer refreshes which
                 replicas are up (until then it may still send to a dead one: the
                 connection is refused and that request is retried elsewhere),
                 and the autoscaler looks at queue lengths
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from .cost import StepCostModel
from .sim_replica import Batch, Replica, ReplicaConfig, RequestState
from .report import FleetReport, build_report
from .router import make_policy
from .workload import SimRequest


class EventLoop:
    def __init__(self):
        self.now = 0.0
        self._heap = []
        self._order = itertools.count()  # breaks ties: same-time events run in the order scheduled

    def at(self, time: float, fn, *args) -> None:
        heapq.heappush(self._heap, (time, next(self._order), fn, args))

    def run(self, done) -> None:
        while self._heap and not done():
            self.now, _, fn, args = heapq.heappop(self._heap)
            fn(*args)


@dataclass(frozen=True)
class Failure:
    """Replica `replica_id` dies at time `at` and, if given, restarts at `recover_at`."""

    replica_id: int
    at: float
    recover_at: float | None = None


@dataclass(frozen=True)
class Autoscale:
    """Add a replica (ready after `startup_delay_s`: loading weights takes time) when the
    mean number of waiting requests per replica exceeds `queue_threshold`; retire
    one that has been idle for `idle_timeout_s`. Checked at every health check."""

    max_replicas: int
    min_replicas: int = 1
    queue_threshold: float = 4.0
    startup_delay_s: float = 30.0
    idle_timeout_s: float = 60.0


class FleetSimulator:
    def __init__(self, workload: list[SimRequest], replicas: int = 1, cost_model: StepCostModel | None = None,
                 policy="least_outstanding", replica_config: ReplicaConfig | None = None,
                 failures=(), health_check_interval: float = 1.0, autoscale: Autoscale | None = None,
                 seed: int = 0, roles: list[str] | None = None):
        _check(workload, replicas, health_check_interval, failures)
        self.loop = EventLoop()
        self.cost = cost_model or StepCostModel()
        self.config = replica_config or ReplicaConfig()
        self.policy = make_policy(policy, seed)
        roles = roles or ["both"] * replicas
        self.replicas = [Replica(i, self.config, self.cost, role) for i, role in enumerate(roles)]
        self.believed_up = {r.id for r in self.replicas}  # the balancer's view, refreshed by health checks
        self.states = [RequestState(r) for r in workload]
        self.unresolved = len(self.states)
        self.failures, self.interval, self.autoscale = list(failures), health_check_interval, autoscale
        self.starting = 0  # replicas booting
        self.scale_events: list[tuple[str, float, int]] = []
        self.last_arrival = max(r.arrival_time for r in workload)

    def run(self) -> FleetReport:
        for s in self.states:
            self.loop.at(s.req.arrival_time, self.route, s)
        for f in self.failures:
            self.loop.at(f.at, self.fail, self.replicas[f.replica_id])
            if f.recover_at is not None:
                self.loop.at(f.recover_at, self.replicas[f.replica_id].recover, f.recover_at)
        self.loop.at(self.interval, self.health_check)
        self.loop.run(lambda: self.unresolved == 0)
        for r in self.replicas:
            r.close(self.loop.now)
        return build_report(self.states, self.replicas, self.extra())

    def extra(self) -> dict:
        return {"scale_events": self.scale_events} if self.autoscale else {}

    # --- the load balancer -------------------------------------------------------

    def entry_pool(self) -> list[Replica]:
        """Replicas that take new requests (all of them, unless the fleet is disaggregated)."""
        return [r for r in self.replicas if r.role != "decode"]

    def route(self, s: RequestState, avoid: frozenset = frozenset()) -> None:
        candidates = [r for r in self.entry_pool() if r.id in self.believed_up and r.id not in avoid and not r.retired]
        if not candidates:
            return self.reject(s, "no healthy replica")
        r = self.policy.choose(s.req, candidates)
        if not r.alive:  # it died since the last health check: connection refused, try another
            s.retries += 1
            return self.route(s, avoid | {r.id})
        if not r.can_ever_fit(s):
            return self.reject(s, "larger than a replica's KV cache")
        if r.queue_full() and s.retries == 0:
            # Back-pressure: refusing now (HTTP 429) beats a queue that grows without
            # bound. A retry was already accepted once, so it is never refused here.
            return self.reject(s, "queue full")
        self.enqueue(r, s)

    def enqueue(self, r: Replica, s: RequestState) -> None:
        s.replica_id = r.id
        r.waiting.append(s)
        self.kick(r)

    def reject(self, s: RequestState, why: str) -> None:
        s.rejected = why
        self.unresolved -= 1

    # --- a replica's steps -------------------------------------------------------

    def kick(self, r: Replica) -> None:
        """Start a forward pass if the replica is up, idle, and has work."""
        if not r.alive or r.stepping:
            return
        batch = r.schedule(self.loop.now)
        if not batch.decodes and not batch.prefills:
            return
        batch.duration = r.step_time(batch)
        r.stepping, r.step_started = True, self.loop.now
        self.loop.at(self.loop.now + batch.duration, self.step_done, r, r.epoch, batch)

    def step_done(self, r: Replica, epoch: int, batch: Batch) -> None:
        if epoch != r.epoch:
            return  # the replica died during this pass; its requests were already re-sent
        r.stepping = False
        r.busy_time += batch.duration
        r.steps += 1
        finished, prefilled = r.complete(batch, self.loop.now)
        self.unresolved -= len(finished)
        for s in prefilled:
            self.handoff(r, s)
        self.kick(r)
        if not r.stepping:
            r.idle_since = self.loop.now

    def handoff(self, r: Replica, s: RequestState) -> None:
        raise NotImplementedError("only a disaggregated fleet has prefill-only replicas")

    # --- faults, health checks, scaling -----------------------------------------

    def fail(self, r: Replica) -> None:
        if not r.alive:
            return
        if r.stepping:  # the pass it was running counts as busy time, though it is lost
            r.busy_time += self.loop.now - r.step_started
        for s in r.fail(self.loop.now):
            s.restart()
            self.route(s, frozenset({r.id}))  # its connection broke, so we know to avoid it

    def health_check(self) -> None:
        self.believed_up = {r.id for r in self.replicas if r.alive and not r.retired}
        if self.autoscale:
            self.scale()
        if self.unresolved > 0:
            if self.loop.now > self.last_arrival + 1e7:
                raise RuntimeError("fleet simulation stalled: requests unresolved long after the last arrival")
            self.loop.at(self.loop.now + self.interval, self.health_check)

    def scale(self) -> None:
        a = self.autoscale
        up = [r for r in self.replicas if r.id in self.believed_up]
        mean_queue = sum(len(r.waiting) for r in up) / len(up) if up else math.inf
        if mean_queue > a.queue_threshold and self.starting == 0 and len(up) < a.max_replicas:
            self.starting += 1
            self.loop.at(self.loop.now + a.startup_delay_s, self.add_replica)
            return
        for r in up:
            idle = r.outstanding == 0 and not r.stepping and self.loop.now - r.idle_since >= a.idle_timeout_s
            if idle and len(up) > a.min_replicas and self.starting == 0:
                r.close(self.loop.now)
                r.retired = True
                self.believed_up.discard(r.id)
                self.scale_events.append(("down", self.loop.now, r.id))
                return

    def add_replica(self) -> None:
        r = Replica(len(self.replicas), self.config, self.cost, "both", start_time=self.loop.now)
        self.replicas.append(r)
        self.believed_up.add(r.id)  # a new replica registers itself once it is ready
        self.starting -= 1
        self.scale_events.append(("up", self.loop.now, r.id))


def _check(workload, replicas, interval, failures) -> None:
    if not workload:
        raise ValueError("workload: expected at least one request (see make_workload)")
    if not (isinstance(replicas, int) and replicas >= 1):
        raise ValueError(f"replicas={replicas!r} is invalid: must be an integer >= 1")
    if not (interval > 0):
        raise ValueError(f"health_check_interval={interval!r} is invalid: must be > 0 seconds")
    for f in failures:
        if not (0 <= f.replica_id < replicas):
            raise ValueError(f"Failure.replica_id={f.replica_id} is invalid: must be in [0, {replicas - 1}]")
        if f.recover_at is not None and f.recover_at <= f.at:
            raise ValueError(f"Failure.recover_at={f.recover_at} is invalid: must be after at={f.at}")


def simulate(workload: list[SimRequest], replicas: int = 1, cost_model: StepCostModel | None = None,
             policy="least_outstanding", replica_config: ReplicaConfig | None = None, *,
             failures=(), health_check_interval: float = 1.0, autoscale: Autoscale | None = None,
             seed: int = 0) -> FleetReport:
    """Serve `workload` with `replicas` identical replicas behind a load balancer.

    policy: "round_robin", "least_outstanding", "power_of_two" (uses `seed`),
    "prefix_affinity", or any object with .choose(request, replicas)."""
    return FleetSimulator(workload, replicas, cost_model, policy, replica_config, failures,
                          health_check_interval, autoscale, seed).run()
