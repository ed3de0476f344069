"""Lab 8 (from one machine to a fleet): checks for a routing policy of the
learner's design, judged in the fleet simulator against power of two on a
workload of chat sessions, and for p95 latency and goodput computed from a
benchmark's per-request records (expected values from tinyinfer.bench's
calculate_metrics)."""
from __future__ import annotations

import functools
import math
import numpy as np

from .core import Case, run_check
from .registry import Lab

# ---------------------------------------------------------------- lab 8: fleets


class ReferenceSessionRouter:
    """The course's answer to lab 8's routing design task: session affinity with a
    bounded load. A conversation's turns go to the replica that served its last
    turn (its cache holds the history), unless that replica has more than `slack`
    requests beyond the least loaded one; a first turn goes to the least loaded
    replica, preferring one that already served the same system prompt."""

    def __init__(self, slack: int = 2):
        self.slack, self.home, self.prompt_home = slack, {}, {}

    def choose(self, request, replicas):
        least = min(r.outstanding for r in replicas)
        by_id = {r.id: r for r in replicas}
        wanted = self.home.get(request.session_id, self.prompt_home.get(request.prefix_id))
        pick = by_id.get(wanted)
        if pick is None or pick.outstanding > least + self.slack:  # gone, or too busy: move
            idlest = [r for r in replicas if r.outstanding == least]
            warm = self.prompt_home.get(request.prefix_id)
            pick = next((r for r in idlest if r.id == warm), idlest[0])
        self.home[request.session_id] = pick.id
        self.prompt_home.setdefault(request.prefix_id, pick.id)
        return pick


def reference_p95_and_goodput(records, slos_ms: dict, duration: float) -> tuple[float, float]:
    """The course's answer to lab 8's p95_and_goodput exercise."""
    ok = [r for r in records if r.ok]
    p95 = float(np.percentile([r.e2el * 1e3 for r in ok], 95))  # linear interpolation, as vLLM
    values = lambda r: {"ttft": r.ttft, "tpot": r.tpot or 0.0, "e2el": r.e2el}  # noqa: E731
    good = [r for r in ok if all(values(r)[k] * 1e3 <= slo for k, slo in slos_ms.items())]
    return p95, len(good) / duration


# --- a routing policy of the learner's design ------------------------------------


class UnboundedSessionAffinity:
    """Session affinity with no bound on load, a row of lab 8's routing table. A
    first turn goes to the least loaded replica; every later turn returns to the
    replica of the turn before, however busy it is (it moves only when that replica
    is out of the healthy list), as vllm-router's consistent_hash keeps sessions.
    On this simulator's session workload it passes check_session_router: see the
    note on SESSION_MARGIN below."""

    def __init__(self):
        self.home = {}

    def choose(self, request, replicas):
        pick = next((r for r in replicas if r.id == self.home.get(request.session_id)), None)
        if pick is None:
            pick = min(replicas, key=lambda r: (r.outstanding, r.id))
        self.home[request.session_id] = pick.id
        return pick


# The fleet the routing task is judged on: SESSION_FLEET's chat sessions on 8
# replicas, for each seed in SESSION_SEEDS (a fresh workload each, so a policy
# cannot be tuned to one draw), then SESSION_MORE's two other fleets. On every
# one, a router's p95 TTFT must be SESSION_MARGIN below power of two's.
# Unbounded session affinity (above) clears that bar too: on every workload
# tried on this simulator (longer and skewed sessions, shorter think times, a
# higher rate, smaller caches, fewer batch slots, a replica lost part-way),
# moving a session costs a whole history's prefill, and that cost outweighed
# what the bound saves. Lab 8's text says so; the check does not demand a bound.
SESSION_SEEDS = (1, 2, 3, 4, 5)
SESSION_MARGIN = 0.25
SESSION_FLEET = dict(num_sessions=120, rate=2.0, turns=(2, 6), think_time=8.0, replicas=8, max_num_seqs=8,
                     prefix_cache_slots=16, failure=None, shuffled=False)
SESSION_MORE = (  # (seed, what differs from SESSION_FLEET)
    (6, dict(replicas=5, num_sessions=75, rate=1.25)),
    # failure: (replica id, down at s, back at s). shuffled: the check hands the
    # learner's router the healthy list in a new order at every request, as no
    # balancer promises an order: a replica is known by its id, not its place.
    (7, dict(failure=(0, 20.0, 50.0), shuffled=True)),
)


def _fleet(seed: int, changes: dict) -> dict:
    return SESSION_FLEET | dict(changes) | {"seed": seed}


def session_fleet(seed: int, **changes):
    """(workload, replicas, cost model, replica config) of the routing task for one
    seed; `changes` replace SESSION_FLEET's settings (as in SESSION_MORE)."""
    from ..fleet import ReplicaConfig, StepCostModel, make_chat_workload

    f = _fleet(seed, changes)
    workload = make_chat_workload(f["num_sessions"], f["rate"], turns=f["turns"], think_time=f["think_time"],
                                  seed=seed)
    return (workload, f["replicas"], StepCostModel(),
            ReplicaConfig(max_num_seqs=f["max_num_seqs"], prefix_cache_slots=f["prefix_cache_slots"]))


def session_report(policy, seed: int, **changes):
    """The simulator's FleetReport of the routing task for this seed under `policy`
    (a name or an object), with SESSION_FLEET's failure (or changes'), if any."""
    from ..fleet import Failure, simulate

    workload, n, cost, config = session_fleet(seed, **changes)
    failure = _fleet(seed, changes)["failure"]
    return simulate(workload, n, cost, policy, config, failures=[Failure(*failure)] if failure else (), seed=seed)


def session_p95(policy, seed: int, **changes) -> float:
    """p95 TTFT (s) of the routing task for this seed under `policy` (a name or an object)."""
    return session_report(policy, seed, **changes).ttft.p95


def _describe_fleet(seed: int, changes: dict) -> str:
    f = _fleet(seed, changes)
    text = f"seed {seed}: {f['num_sessions']} chat sessions on {f['replicas']} replicas"
    if f["failure"]:
        rid, down, up = f["failure"]
        text += f", replica {rid} down from {down:g} s to {up:g} s"
    if f["shuffled"]:
        text += ", the healthy list in a new order at every request"
    return text


class _Run:
    """What one simulated run shows: p95 TTFT, and two figures that say where the time went."""

    def __init__(self, report, workload):
        self.p95 = report.ttft.p95
        self.cached = report.prefix_cache_hit_tokens / sum(q.prompt_len for q in workload)
        self.busiest = max(r.completed for r in report.replicas) / max(report.completed, 1)
        self.replicas = len(report.replicas)

    def figures(self) -> str:
        return (f"{self.cached:.0%} of prompt tokens read from the prefix cache, the busiest replica served "
                f"{self.busiest:.0%} of the requests")

    def __repr__(self):
        return f"p95 TTFT {self.p95:.2f} s ({self.figures()})"


class _Broken:
    """A run the simulator could not finish: the learner's router broke its API."""

    def __init__(self, why: str):
        self.why = why

    def __repr__(self):
        return self.why


class _Refused(Exception):
    pass


class _Guard:
    """The learner's router, as the simulator calls it: choose() must return one of
    the replicas it was given (the healthy list), and raise nothing."""

    def __init__(self, router, shuffle_seed: int | None = None):
        self.router = router
        self.rng = None if shuffle_seed is None else np.random.default_rng(shuffle_seed)

    def choose(self, request, replicas):
        if self.rng is not None:
            replicas = [replicas[i] for i in self.rng.permutation(len(replicas))]
        try:
            pick = self.router.choose(request, replicas)
        except NotImplementedError:
            raise
        except Exception as e:
            raise _Refused(f"choose() raised {type(e).__name__}: {e}, {_on(request, replicas)}") from e
        for r in replicas:
            if pick is r:
                return pick
        got = f"replica {pick.id}" if hasattr(pick, "id") and hasattr(pick, "outstanding") else repr(pick)[:60]
        raise _Refused(f"choose() returned {got}, which is not in the list it was given, {_on(request, replicas)}")


def _on(request, replicas) -> str:
    return (f"on request {request.request_id} (session {request.session_id}) with healthy replicas "
            f"{[r.id for r in replicas]}")


class _AtMost:
    """The target of one case: a p95 TTFT bound, printed with the run that set it."""

    def __init__(self, power_of_two: _Run):
        self.power_of_two = power_of_two
        self.limit = (1 - SESSION_MARGIN) * power_of_two.p95

    def ok(self, got) -> bool:
        return isinstance(got, _Run) and got.p95 <= self.limit

    def __repr__(self):
        return (f"p95 TTFT <= {self.limit:.2f} s ({SESSION_MARGIN:.0%} below power of two's "
                f"{self.power_of_two.p95:.2f} s)")


class _Again:
    """Two runs of one seed, each with a fresh router."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __repr__(self):
        show = lambda run: f"{run.p95:.4f} s" if isinstance(run, _Run) else repr(run)  # noqa: E731
        return f"p95 TTFT {show(self.first)} the first time, {show(self.second)} the second"


class _Same:
    def ok(self, got) -> bool:
        return (isinstance(got, _Again) and isinstance(got.first, _Run) and isinstance(got.second, _Run)
                and got.first.p95 == got.second.p95)

    def __repr__(self):
        return "the same p95 TTFT twice (the same workload, a fresh router each time)"


def _meets(got, expected) -> bool:
    return expected.ok(got)


@functools.lru_cache(maxsize=None)
def _power_of_two(seed: int, changes: tuple) -> _Run:
    # The same for every learner: computed once per process.
    return _Run(session_report("power_of_two", seed, **dict(changes)), session_fleet(seed, **dict(changes))[0])


def _explain(got, expected) -> str | None:
    if isinstance(got, _Again) and isinstance(got.first, _Run) and isinstance(got.second, _Run):
        return ("the same workload gave two different results: something outside the new router's own state "
                "changed its choices (state shared between instances, in a class attribute, a default argument or "
                "a global, or random numbers drawn without a seed)")
    if isinstance(got, _Run) and isinstance(expected, _AtMost):
        return f"for comparison, power of two: {expected.power_of_two.figures()}"
    return None


SESSION_CASES = tuple((seed, {}) for seed in SESSION_SEEDS) + SESSION_MORE  # (seed, changes) of every fleet


def _session_cases() -> list[Case]:
    cases = []
    for seed, changes in SESSION_CASES:
        key = tuple(sorted(changes.items()))
        target = _AtMost(_power_of_two(seed, key))
        cases.append(Case((seed, key), target, _describe_fleet(seed, changes)))
    again = SESSION_SEEDS[0]  # after the other seeds: a router that shares its memory has it filled by then
    cases.insert(len(SESSION_SEEDS), Case((again, (), "again"), _Same(),
                                          f"{_describe_fleet(again, {})}, run again with a fresh router"))
    return cases


def check_session_router(make_router) -> bool:
    """make_router() -> a fresh policy object with .choose(request, replicas). On
    every fleet of SESSION_CASES, its p95 TTFT must be SESSION_MARGIN below power of
    two's; one seed run again with a fresh router must give the same p95; and
    choose() must return one of the replicas it is given."""
    first = {}

    def run(seed, key):
        workload = session_fleet(seed, **dict(key))[0]
        guard = _Guard(make_router(), seed if _fleet(seed, dict(key))["shuffled"] else None)
        try:
            return _Run(session_report(guard, seed, **dict(key)), workload)
        except _Refused as e:
            return _Broken(str(e))

    def p95(seed, key, again=None):
        if again:
            return _Again(first.get((seed, key)), run(seed, key))
        first[seed, key] = run(seed, key)  # a fresh router per run: no memory carried between runs
        return first[seed, key]

    return run_check("session_router", p95, _session_cases, same=_meets, forbidden=(ReferenceSessionRouter,),
                     explain=_explain)


# --- p95 and goodput -----------------------------------------------------------


def _record(i: int, send: float, chunks: list[float], status: str = "ok", tokens: int | None = None):
    from tinyinfer.bench.results import RequestRecord  # here, not at the top: tinyinfer.bench takes seconds to import

    r = RequestRecord(i, prompt_len=32, max_tokens=16, arrival_time=send, send_time=send,
                      chunk_times=list(chunks), status=status)
    r.completion_tokens = tokens if tokens is not None else (len(chunks) if status == "ok" else None)
    return r


def _show(records, slos, duration) -> str:
    def one(r):
        if not r.ok:
            return f"#{r.index} {r.status}"
        tpot = "None" if r.tpot is None else f"{r.tpot * 1e3:g}"
        return f"#{r.index} ttft={r.ttft * 1e3:g} tpot={tpot} e2el={r.e2el * 1e3:g}"
    body = "; ".join(one(r) for r in records[:12]) + ("; ..." if len(records) > 12 else "")
    return f"{len(records)} records (ms: {body}), slos_ms={slos}, duration={duration}"


def _goodput_cases() -> list[Case]:
    from tinyinfer.bench.results import calculate_metrics

    # Times are multiples of 1/8 s: exact in binary, so a latency can equal an SLO exactly.
    twenty = [_record(i, i * 0.5, [i * 0.5 + 0.25 + 0.125 * (i % 3), i * 0.5 + 0.5 + 0.25 * i], tokens=9)
              for i in range(20)]
    mixed = [
        _record(0, 0.0, [0.25, 0.5, 0.75, 1.0, 1.25]),  # TTFT 250 ms, TPOT 250 ms
        _record(1, 0.5, [1.5, 1.625, 1.75]),  # TTFT 1000 ms: misses a 500 ms TTFT SLO
        _record(2, 1.0, [], status="failed"),  # never answered: not in p95, never good
        _record(3, 1.0, [1.5]),  # one token: TPOT None, counted as 0 for the SLO
        _record(4, 2.0, [2.5, 2.625, 2.75, 2.875]),  # TTFT exactly 500 ms: meets "ttft <= 500"
        _record(5, 2.0, [], status="rejected"),  # HTTP 429
        _record(6, 2.5, [2.75, 3.75]),  # TPOT 1000 ms
    ]
    # The slowest successful request is a one-token reply, and a third of the
    # requests failed: the p95 changes if either is left out or counted as 0.
    uneven = ([_record(i, 0.0, [0.125 * (i + 1), 0.125 * (i + 2)]) for i in range(6)]
              + [_record(6, 0.0, [4.0]), _record(7, 0.5, [], status="failed"), _record(8, 0.5, [], status="failed"),
                 _record(9, 1.0, [], status="rejected"), _record(10, 1.0, [1.125 + 0.5 * i for i in range(4)])])
    rows = [
        (twenty, {"e2el": 6000.0}, 10.0, "20 requests; p95 falls between two of them"),
        (uneven, {"e2el": 1000.0}, 5.0, "the slowest success is a one-token reply (4000 ms), 3 of 11 failed: "
                                        "p95 over the 8 successes, every one of them"),
        (mixed, {"ttft": 500.0}, 4.0, "failed and rejected requests, a TTFT exactly on the SLO"),
        (mixed, {"ttft": 500.0, "tpot": 300.0}, 4.0, "two SLOs: a request must meet both"),
        (mixed, {"tpot": 100.0}, 2.0, "a one-token reply has no TPOT to miss"),
        (twenty[:7], {"ttft": 400.0, "e2el": 2500.0}, 3.5, "7 requests"),
    ]
    cases = []
    for records, slos, duration, note in rows:
        res = calculate_metrics(records, duration, percentiles=(95,), goodput=slos)
        cases.append(Case((records, dict(slos), duration), (res.e2el.p(95), res.request_goodput),
                          f"{_show(records, slos, duration)}  ({note})"))
    return cases


def _close(got, expected) -> bool:
    return (isinstance(got, (tuple, list)) and len(got) == len(expected)
            and all(isinstance(g, (int, float, np.floating, np.integer)) and math.isclose(g, e, rel_tol=1e-6)
                    for g, e in zip(got, expected)))


def check_p95_and_goodput(fn) -> bool:
    """fn(records, slos_ms, duration) -> (p95 end-to-end latency in ms over the
    successful requests, goodput in requests per second), against
    tinyinfer.bench's calculate_metrics."""
    from tinyinfer.bench.results import Latency, calculate_metrics, is_good

    return run_check("p95_and_goodput", fn, _goodput_cases, same=_close,
                     forbidden=(reference_p95_and_goodput, calculate_metrics, is_good, Latency))


LAB = Lab(8, "from one machine to a fleet",
          exports=("check_session_router", "check_p95_and_goodput", "ReferenceSessionRouter",
                   "reference_p95_and_goodput", "session_fleet", "session_report", "session_p95", "SESSION_SEEDS",
                   "SESSION_CASES", "SESSION_MARGIN", "UnboundedSessionAffinity"),
          fallbacks={"check_session_router": ReferenceSessionRouter,
                     "check_p95_and_goodput": reference_p95_and_goodput})
