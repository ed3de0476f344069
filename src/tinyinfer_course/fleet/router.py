"""Load-balancing policies: which replica gets the next request.

A policy sees only what a real load balancer sees: the replicas it believes
healthy (from the last health check) and how many requests it has sent to each
that have not finished yet ("outstanding"). It does not know how long a request
will take: output lengths are unknown until the model stops.

  round_robin         take turns. Fair in count, blind to load: a replica stuck
                      with long requests keeps getting its share of new ones.
  least_outstanding   the replica with the fewest unfinished requests. Needs a
                      counter per replica; adapts to slow replicas and long jobs.
  power_of_two        sample two replicas at random, take the less loaded one.
                      Nearly as good as least-outstanding, but needs no global
                      view (many balancers, each sampling) and avoids herding.
  prefix_affinity     requests sharing a prefix id go to the same replica, so its
                      prefix cache keeps that prefix's KV; falls back to
                      least-outstanding when the home replica is unhealthy or has
                      `max_outstanding` requests already.
"""
from __future__ import annotations

import hashlib

import numpy as np

POLICIES = ("round_robin", "least_outstanding", "power_of_two", "prefix_affinity")


class RoundRobin:
    name = "round_robin"

    def __init__(self):
        self.next = 0

    def choose(self, req, replicas):
        r = replicas[self.next % len(replicas)]
        self.next += 1
        return r


class LeastOutstanding:
    name = "least_outstanding"

    def choose(self, req, replicas):
        # Ties go to the lowest id: deterministic, and a learner can trace it by hand.
        return min(replicas, key=lambda r: (r.outstanding, r.id))


class PowerOfTwo:
    name = "power_of_two"

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def choose(self, req, replicas):
        if len(replicas) == 1:
            return replicas[0]
        a, b = self.rng.choice(len(replicas), size=2, replace=False)
        return min(replicas[a], replicas[b], key=lambda r: (r.outstanding, r.id))


class PrefixAffinity:
    name = "prefix_affinity"

    def __init__(self, max_outstanding: int = 32):
        self.max_outstanding = max_outstanding
        self.fallback = LeastOutstanding()

    def choose(self, req, replicas):
        if req.prefix_id is None:
            return self.fallback.choose(req, replicas)
        # Rendezvous hashing: every replica gets a pseudo-random score for this
        # prefix and the highest wins. When a replica dies only its own prefixes
        # move (a plain `hash % n` would reshuffle all of them).
        home = max(replicas, key=lambda r: _score(req.prefix_id, r.id))
        if home.outstanding < self.max_outstanding and not home.queue_full():
            return home
        return self.fallback.choose(req, replicas)


def _score(prefix_id, replica_id) -> int:
    """A well-mixed, reproducible hash. (Python's hash() is salted per process, and
    crc32 is linear: it would give every prefix the same winner.)"""
    digest = hashlib.blake2b(f"{prefix_id}/{replica_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def make_policy(policy, seed: int = 0):
    """A policy object from its name (or pass an object with .choose(req, replicas))."""
    if hasattr(policy, "choose"):
        return policy
    if policy == "round_robin":
        return RoundRobin()
    if policy == "least_outstanding":
        return LeastOutstanding()
    if policy == "power_of_two":
        return PowerOfTwo(seed)
    if policy == "prefix_affinity":
        return PrefixAffinity()
    raise ValueError(f"policy={policy!r} is invalid: must be one of {POLICIES} or an object with .choose()")
