"""The requests a fleet serves: when each arrives and how big it is.

A serving benchmark is only as honest as its workload. Two numbers per request
matter most for an inference server: the prompt length (work for prefill, which
decides TTFT) and the output length (number of decode steps, which decides how
long the request occupies a batch slot and KV-cache space).

Arrivals are either a Poisson process (independent users: the gaps between
requests are exponential, which produces the bursts that make queues form) or
a fixed rate (a load generator ticking like a metronome). Everything is drawn
from one seeded generator, so the same seed gives the same workload.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ARRIVALS = ("poisson", "fixed")


@dataclass(frozen=True)
class SimRequest:
    """One request as the load generator sends it (nothing about how it is served).

    prefix_id names a shared prompt prefix (a system prompt, a long document):
    requests with the same id start with the same `prefix_len` tokens, so a
    replica that has those tokens' KV cached can skip computing them."""

    request_id: int
    arrival_time: float  # seconds since the start of the run
    prompt_len: int  # tokens, including the shared prefix
    output_len: int  # tokens to generate (the request runs to max_tokens)
    prefix_id: int | None = None
    prefix_len: int = 0

    def __post_init__(self):
        if self.prompt_len < 1:
            raise ValueError(f"prompt_len={self.prompt_len} is invalid: must be >= 1")
        if self.output_len < 1:
            raise ValueError(f"output_len={self.output_len} is invalid: must be >= 1")
        if not (0 <= self.prefix_len < self.prompt_len):
            raise ValueError(f"prefix_len={self.prefix_len} is invalid: must be in [0, prompt_len-1={self.prompt_len - 1}]")
        if self.arrival_time < 0:
            raise ValueError(f"arrival_time={self.arrival_time} is invalid: must be >= 0")


def _lengths(spec, n: int, rng: np.random.Generator, name: str) -> np.ndarray:
    """Draw n lengths from a spec:
      int            every request the same (deterministic service: handy for theory)
      (lo, hi)       uniform integers in [lo, hi]
      list of ints   sampled uniformly from the list (e.g. a bimodal mix [16]*9 + [512])
      callable       f(rng, n) -> n lengths, for anything else (log-normal, a trace...)"""
    if isinstance(spec, (int, np.integer)):
        out = np.full(n, int(spec))
    elif isinstance(spec, tuple) and len(spec) == 2:
        lo, hi = spec
        if not (1 <= lo <= hi):
            raise ValueError(f"{name}={spec!r} is invalid: need 1 <= lo <= hi")
        out = rng.integers(lo, hi + 1, size=n)
    elif isinstance(spec, list) and spec:
        out = rng.choice(np.asarray(spec), size=n)
    elif callable(spec):
        out = np.asarray(spec(rng, n)).astype(int)
    else:
        raise ValueError(f"{name}={spec!r} is invalid: expected an int, a (lo, hi) tuple, a list or a callable")
    if out.shape != (n,) or (out < 1).any():
        raise ValueError(f"{name}: every length must be an integer >= 1")
    return out.astype(int)


def make_workload(num_requests: int, rate: float, prompt_len=128, output_len=64,
                  arrival: str = "poisson", num_prefixes: int = 0, prefix_len: int = 0,
                  seed: int = 0) -> list[SimRequest]:
    """A seeded list of requests sorted by arrival time.

    rate is requests per second on average. With num_prefixes > 0, every request
    picks one of that many shared prefixes (uniformly) whose first `prefix_len`
    tokens it shares with the others that picked it; `prompt_len` then counts
    the request's own tokens, after the prefix."""
    if not (isinstance(num_requests, int) and num_requests >= 1):
        raise ValueError(f"num_requests={num_requests!r} is invalid: must be an integer >= 1")
    if not rate > 0:
        raise ValueError(f"rate={rate!r} is invalid: must be > 0 requests/s")
    if arrival not in ARRIVALS:
        raise ValueError(f"arrival={arrival!r} is invalid: must be one of {ARRIVALS}")
    if num_prefixes < 0 or prefix_len < 0:
        raise ValueError("num_prefixes and prefix_len must be >= 0")
    rng = np.random.default_rng(seed)
    if arrival == "poisson":  # exponential gaps <=> a Poisson process of the given rate
        gaps = rng.exponential(1.0 / rate, size=num_requests)
    else:
        gaps = np.full(num_requests, 1.0 / rate)
    times = np.cumsum(gaps) - gaps[0]  # the first request arrives at t = 0
    prompts = _lengths(prompt_len, num_requests, rng, "prompt_len")
    outputs = _lengths(output_len, num_requests, rng, "output_len")
    prefixes = rng.integers(0, num_prefixes, size=num_requests) if num_prefixes else [None] * num_requests
    reqs = []
    for i in range(num_requests):
        pid = None if prefixes[i] is None else int(prefixes[i])
        # A prompt always keeps at least one token of its own after the prefix.
        plen = int(prompts[i]) + (prefix_len if pid is not None else 0)
        reqs.append(SimRequest(i, float(times[i]), plen, int(outputs[i]), pid, prefix_len if pid is not None else 0))
    return reqs


def workload_from(records) -> list[SimRequest]:
    """Build a workload from what a benchmark actually sent to a real server, so
    the simulator and the server see the same requests. Each record is a dict
    (or object) with arrival_time, prompt_len, output_len and optional
    prefix_id / prefix_len. Arrival times are shifted so the first is 0."""
    def get(r, k, default=None):
        return r.get(k, default) if isinstance(r, dict) else getattr(r, k, default)

    records = list(records)
    if not records:
        raise ValueError("records: expected at least one request")
    t0 = min(float(get(r, "arrival_time")) for r in records)
    reqs = [SimRequest(i, float(get(r, "arrival_time")) - t0, int(get(r, "prompt_len")), int(get(r, "output_len")),
                       get(r, "prefix_id"), int(get(r, "prefix_len", 0) or 0)) for i, r in enumerate(records)]
    return sorted(reqs, key=lambda r: (r.arrival_time, r.request_id))
