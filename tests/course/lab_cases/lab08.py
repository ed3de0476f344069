"""Lab 8 (from one machine to a fleet): wrong implementations each check must
reject, and the reference each must accept, and the course answers each must refuse. Collected by
tests/course/test_labs.py."""
import hashlib
import math
import random

import numpy as np

from tinyinfer_course import labcheck
from tinyinfer.bench.results import calculate_metrics


# --- routing policies that are wrong for the session workload, each a class as the learner writes it


class _RoundRobin:
    # fair in count, blind to load and to where a conversation's cache lives
    def __init__(self):
        self.n = 0

    def choose(self, request, replicas):
        self.n += 1
        return replicas[self.n % len(replicas)]


class _OneRandom:
    def __init__(self):
        self.rng = np.random.default_rng(0)

    def choose(self, request, replicas):
        return replicas[int(self.rng.integers(len(replicas)))]


class _LeastOutstandingOnly:
    # balances load, but each turn lands wherever is idlest: the history is prefilled again
    def choose(self, request, replicas):
        return min(replicas, key=lambda r: (r.outstanding, r.id))


class _SystemPromptAffinityOnly:
    # keeps the small shared prefix (the system prompt) warm, but sends each later
    # turn to the least loaded replica: the long history is computed again
    def __init__(self):
        self.prompt_home = {}

    def choose(self, request, replicas):
        by_id = {r.id: r for r in replicas}
        if request.prefix_id in self.prompt_home and request.prefix_id in range(4):
            return by_id.get(self.prompt_home[request.prefix_id], replicas[0])
        pick = min(replicas, key=lambda r: (r.outstanding, r.id))
        self.prompt_home.setdefault(request.prefix_id, pick.id)
        return pick


class _AffinityByRequestId:
    # a typo: the request's id instead of the session's, so no two turns meet
    def choose(self, request, replicas):
        return replicas[request.request_id % len(replicas)]


class _StickyToTheBusiest:
    # remembers each session's replica, but falls back to the *most* loaded one
    def __init__(self):
        self.home = {}

    def choose(self, request, replicas):
        by_id = {r.id: r for r in replicas}
        pick = by_id.get(self.home.get(request.session_id)) or max(replicas, key=lambda r: (r.outstanding, r.id))
        self.home[request.session_id] = pick.id
        return pick


# --- routers that break a rule of the simulator's API: memory shared between
# --- routers, unseeded randomness, replicas outside the healthy list, list
# --- positions for ids, a fleet of 8 written in


def _bounded(home_id, replicas, slack=2):
    """Bounded-load affinity done right: the session's replica, unless it is gone or
    has more than `slack` requests beyond the idlest."""
    fewest = min(replicas, key=lambda r: (r.outstanding, r.id))
    home = next((r for r in replicas if r.id == home_id), None)
    return fewest if home is None or home.outstanding > fewest.outstanding + slack else home


class _MemoryInAClassAttribute:
    home = {}  # one dict for every router the check makes

    def choose(self, request, replicas):
        pick = _bounded(self.home.get(request.session_id), replicas)
        self.home[request.session_id] = pick.id
        return pick


class _MemoryInADefaultArgument:
    def __init__(self, home={}):  # noqa: B006 (the default is made once, and shared)
        self.home = home

    def choose(self, request, replicas):
        pick = _bounded(self.home.get(request.session_id), replicas)
        self.home[request.session_id] = pick.id
        return pick


_HOMES = {}


class _MemoryInAModuleGlobal:
    def choose(self, request, replicas):
        pick = _bounded(_HOMES.get(request.session_id), replicas)
        _HOMES[request.session_id] = pick.id
        return pick


class _UnseededRandomTieBreak:
    # ties among the idlest broken with the global, unseeded `random`
    def __init__(self):
        self.home = {}

    def choose(self, request, replicas):
        fewest = min(r.outstanding for r in replicas)
        home = next((r for r in replicas if r.id == self.home.get(request.session_id)), None)
        if home is None or home.outstanding > fewest + 2:
            home = random.choice([r for r in replicas if r.outstanding == fewest])
        self.home[request.session_id] = home.id
        return home


class _UnseededNumpyFirstTurn:
    # first turns by the power of two choices, drawn from numpy's global generator
    def __init__(self):
        self.home = {}

    def choose(self, request, replicas):
        home = next((r for r in replicas if r.id == self.home.get(request.session_id)), None)
        fewest = min(r.outstanding for r in replicas)
        if home is None or home.outstanding > fewest + 2:
            a, b = np.random.choice(len(replicas), size=2, replace=len(replicas) < 2)
            home = min(replicas[a], replicas[b], key=lambda r: r.outstanding)
        self.home[request.session_id] = home.id
        return home


class _KeepsReplicaObjects:
    # remembers the replica object itself, and returns it even when it left the healthy list
    def __init__(self):
        self.home = {}

    def choose(self, request, replicas):
        fewest = min(replicas, key=lambda r: (r.outstanding, r.id))
        home = self.home.get(request.session_id)
        if home is None or home.outstanding > fewest.outstanding + 2:
            home = fewest
        self.home[request.session_id] = home
        return home


class _ReturnsTheId:
    # returns the replica's id, not the replica
    def __init__(self):
        self.home = {}

    def choose(self, request, replicas):
        pick = _bounded(self.home.get(request.session_id), replicas)
        self.home[request.session_id] = pick.id
        return pick.id


class _RemembersListPositions:
    # remembers where the replica was in the list, not its id
    def __init__(self):
        self.home = {}

    def choose(self, request, replicas):
        fewest = min(range(len(replicas)), key=lambda i: (replicas[i].outstanding, i))
        i = self.home.get(request.session_id)
        if i is None or i >= len(replicas) or replicas[i].outstanding > replicas[fewest].outstanding + 2:
            i = fewest
        self.home[request.session_id] = i
        return replicas[i]


class _IdAsListIndex:
    # remembers the id, then looks it up as a position in the list
    def __init__(self):
        self.home = {}

    def choose(self, request, replicas):
        fewest = min(replicas, key=lambda r: (r.outstanding, r.id))
        rid = self.home.get(request.session_id)
        home = replicas[rid % len(replicas)] if rid is not None else fewest
        if home.outstanding > fewest.outstanding + 2:
            home = fewest
        self.home[request.session_id] = home.id
        return home


class _EightReplicasWrittenIn:
    # a session's home by hashing into 8 slots
    def choose(self, request, replicas):
        fewest = min(replicas, key=lambda r: (r.outstanding, r.id))
        home = replicas[request.session_id % 8]
        return home if home.outstanding <= fewest.outstanding + 2 else fewest


class _LoadTableOfEight:
    # a load table with one row per replica id, 0 to 7
    def __init__(self):
        self.home = {}

    def choose(self, request, replicas):
        by_id = {r.id: r for r in replicas}
        loads = [by_id[i].outstanding for i in range(8)]
        fewest = min(range(8), key=lambda i: (loads[i], i))
        rid = self.home.get(request.session_id)
        if rid is None or loads[rid] > loads[fewest] + 2:
            rid = fewest
        self.home[request.session_id] = rid
        return by_id[rid]


def _slo_met(r, slos):
    values = {"ttft": r.ttft, "tpot": r.tpot or 0.0, "e2el": r.e2el}
    return all(values[k] * 1e3 <= v for k, v in slos.items())


def _nearest_rank_p95(records, slos, duration):
    # the "nearest rank" percentile: no interpolation between neighbours
    ok = sorted(r.e2el * 1e3 for r in records if r.ok)
    p95 = ok[math.ceil(0.95 * len(ok)) - 1]
    return p95, sum(_slo_met(r, slos) for r in records if r.ok) / duration


def _p95_in_seconds(records, slos, duration):
    ok = [r for r in records if r.ok]
    return float(np.percentile([r.e2el for r in ok], 95)), sum(_slo_met(r, slos) for r in ok) / duration


def _slos_compared_in_seconds(records, slos, duration):
    # 500 (ms) compared with 0.5 (s): every request looks good
    ok = [r for r in records if r.ok]
    values = lambda r: {"ttft": r.ttft, "tpot": r.tpot or 0.0, "e2el": r.e2el}  # noqa: E731
    good = [r for r in ok if all(values(r)[k] <= v for k, v in slos.items())]
    return float(np.percentile([r.e2el * 1e3 for r in ok], 95)), len(good) / duration


def _goodput_per_request(records, slos, duration):
    # a fraction of requests, not requests per second
    ok = [r for r in records if r.ok]
    return float(np.percentile([r.e2el * 1e3 for r in ok], 95)), sum(_slo_met(r, slos) for r in ok) / len(records)


def _any_slo_is_enough(records, slos, duration):
    ok = [r for r in records if r.ok]
    values = lambda r: {"ttft": r.ttft, "tpot": r.tpot or 0.0, "e2el": r.e2el}  # noqa: E731
    good = [r for r in ok if any(values(r)[k] * 1e3 <= v for k, v in slos.items())]
    return float(np.percentile([r.e2el * 1e3 for r in ok], 95)), len(good) / duration


def _one_token_misses_tpot(records, slos, duration):
    # a reply of one token has no TPOT; treating that as a miss drops good requests
    ok = [r for r in records if r.ok]
    values = lambda r: {"ttft": r.ttft, "tpot": math.inf if r.tpot is None else r.tpot, "e2el": r.e2el}  # noqa: E731
    good = [r for r in ok if all(values(r)[k] * 1e3 <= v for k, v in slos.items())]
    return float(np.percentile([r.e2el * 1e3 for r in ok], 95)), len(good) / duration


def _strict_less_than(records, slos, duration):
    # "meets the SLO" is <=: a request exactly at the target is good
    ok = [r for r in records if r.ok]
    values = lambda r: {"ttft": r.ttft, "tpot": r.tpot or 0.0, "e2el": r.e2el}  # noqa: E731
    good = [r for r in ok if all(values(r)[k] * 1e3 < v for k, v in slos.items())]
    return float(np.percentile([r.e2el * 1e3 for r in ok], 95)), len(good) / duration


def _p95_over(which):
    """The p95 over another set of records than the successful ones; goodput right."""
    def p95_and_goodput(records, slos, duration):
        ok = [r for r in records if r.ok]
        if which == "failed as 0":  # every record counted, a failure as a latency of 0
            values = [(r.e2el or 0.0) * 1e3 for r in records]
        elif which == "with a tpot":  # only requests with a second token: a one-token reply left out
            values = [r.e2el * 1e3 for r in ok if r.tpot is not None]
        else:  # "good": only the requests that met the SLOs
            values = [r.e2el * 1e3 for r in ok if _slo_met(r, slos)]
        return float(np.percentile(values, 95)), sum(_slo_met(r, slos) for r in ok) / duration
    return p95_and_goodput


def _p95_of_ttft(records, slos, duration):
    ok = [r for r in records if r.ok]
    return float(np.percentile([r.ttft * 1e3 for r in ok], 95)), sum(_slo_met(r, slos) for r in ok) / duration


WRONG = {
    "check_session_router": [_RoundRobin, _OneRandom, _LeastOutstandingOnly, _SystemPromptAffinityOnly,
                             _AffinityByRequestId, _StickyToTheBusiest,
                             _MemoryInAClassAttribute, _MemoryInADefaultArgument, _MemoryInAModuleGlobal,
                             _UnseededRandomTieBreak, _UnseededNumpyFirstTurn, _KeepsReplicaObjects, _ReturnsTheId,
                             _RemembersListPositions, _IdAsListIndex, _EightReplicasWrittenIn, _LoadTableOfEight],
    "check_p95_and_goodput": [_nearest_rank_p95, _p95_in_seconds, _slos_compared_in_seconds, _goodput_per_request,
                              _any_slo_is_enough, _one_token_misses_tpot, _strict_less_than, _p95_of_ttft,
                              _p95_over("failed as 0"), _p95_over("with a tpot"), _p95_over("good")],
}


# --- correct implementations written here, independently of labcheck and the engine


class _BoundedSessionHash:
    """Bounded-load consistent hashing on the session: each session's replicas in
    the order of a keyed hash (rendezvous), the first one whose load is within
    one request of the fleet's mean plus one."""

    def choose(self, request, replicas):
        mean = sum(r.outstanding for r in replicas) / len(replicas)
        ranked = sorted(replicas, key=lambda r: hashlib.sha256(f"{request.session_id}:{r.id}".encode()).digest())
        return next((r for r in ranked if r.outstanding <= mean + 1), ranked[0])


class _IdlestWithAffinityTieBreak:
    """The hint's first design: the least loaded replica, the session's own among equals."""

    def __init__(self):
        self.home = {}

    def choose(self, request, replicas):
        fewest = min(r.outstanding for r in replicas)
        idlest = sorted((r for r in replicas if r.outstanding == fewest), key=lambda r: r.id)
        pick = next((r for r in idlest if r.id == self.home.get(request.session_id)), idlest[0])
        self.home[request.session_id] = pick.id
        return pick


class _BoundedByRatioSeededTies:
    """Another bound: stay unless the session's replica has more than 1.5 times the
    mean load plus one; moves go to one of the idlest, drawn with a seeded generator."""

    def __init__(self):
        self.home, self.rng = {}, np.random.default_rng(56)

    def choose(self, request, replicas):
        mean = sum(r.outstanding for r in replicas) / len(replicas)
        home = next((r for r in replicas if r.id == self.home.get(request.session_id)), None)
        if home is None or home.outstanding > 1.5 * mean + 1:
            fewest = min(r.outstanding for r in replicas)
            idlest = sorted((r for r in replicas if r.outstanding == fewest), key=lambda r: r.id)
            home = idlest[int(self.rng.integers(len(idlest)))]
        self.home[request.session_id] = home.id
        return home


def _percentile(values, q):
    """Linear interpolation between the two nearest ranks (numpy's default, and vLLM's)."""
    xs = sorted(values)
    rank = q / 100 * (len(xs) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def _p95_goodput(records, slos, duration):
    ok = [r for r in records if r.ok]
    good = 0
    for r in ok:
        ms = {"ttft": r.ttft * 1e3, "tpot": (r.tpot or 0.0) * 1e3, "e2el": r.e2el * 1e3}
        good += all(ms[k] <= slo for k, slo in slos.items())
    return _percentile([r.e2el * 1e3 for r in ok], 95), good / duration


def _library(records, slos, duration):
    res = calculate_metrics(records, duration, percentiles=(95,), goodput=slos)
    return res.e2el.p(95), res.request_goodput


REFERENCE = {
    "check_session_router": lambda: _BoundedSessionHash,
    "check_p95_and_goodput": lambda: _p95_goodput,
}
# More correct ways, each unlike the course's answer; the check must accept every one.
ALTERNATIVES = {
    "check_session_router": [_BoundedSessionHash, _IdlestWithAffinityTieBreak, _BoundedByRatioSeededTies],
}
ANSWERS = {
    "check_session_router": [labcheck.ReferenceSessionRouter],
    # The definition itself: tinyinfer.bench's metrics, which follow vLLM's benchmark.
    "check_p95_and_goodput": [labcheck.reference_p95_and_goodput, _library],
}
