"""The workload: when requests arrive and how long they are.

A serving measurement needs what real traffic has:
- arrival times: users do not wait for each other, so requests arrive on their
  own clock. A Poisson process (exponential gaps) is the standard model of many
  independent users, and its bursts are what make queues form; fixed gaps (a
  load generator ticking like a metronome) are easier to reason about.
- prompt lengths: prefill cost grows with the input, so the mix matters.
- output lengths: decode cost grows with the output, and a long reply holds a
  batch slot and KV-cache space for many steps.

Both the load generator for real servers (tinyinfer.bench) and the fleet
simulator (tinyinfer_course.fleet) draw their workloads with these functions, from
seeded generators: the same seed gives the same workload, so two runs (or two
servers, or a server and its simulation) can be compared fairly.
"""
from __future__ import annotations

import numpy as np

ARRIVALS = ("poisson", "fixed")


def arrival_times(n: int, request_rate: float, arrival: str = "poisson", seed=0) -> np.ndarray:
    """Arrival times in seconds after the start, the first at 0.

    poisson: gaps drawn from an exponential with mean 1/rate, the arrivals of many
             independent users (bursty: some gaps are much shorter than the mean);
    fixed:   every gap is exactly 1/rate;
    rate = inf: everything at t=0 (a burst; pair it with a concurrency cap).
    `seed` is an int, or a numpy Generator to draw from (the fleet draws a whole
    workload from one)."""
    if not n >= 1:
        raise ValueError(f"arrival_times: n={n} requests is invalid: must be >= 1")
    if not request_rate > 0:  # also catches NaN
        raise ValueError(f"request_rate must be > 0 requests/s (inf = all at once), got {request_rate}")
    if arrival not in ARRIVALS:
        raise ValueError(f"arrival must be one of {ARRIVALS}, got {arrival!r}")
    mean_gap = 1.0 / request_rate  # 0.0 when the rate is inf
    if arrival == "poisson":  # exponential gaps <=> a Poisson process of the given rate
        gaps = np.random.default_rng(seed).exponential(mean_gap, size=n)
    else:
        gaps = np.full(n, mean_gap)
    # The process starts one gap before the first request; shift it to t = 0.
    return np.cumsum(gaps) - gaps[0]


def parse_length(spec, name: str = "length"):
    """A length distribution from a number, a string, a sequence or a function:
    128 or "128" -> fixed; "64:256" or (64, 256) -> uniform in [64, 256];
    "32,64,128" or [32, 64, 128] -> drawn from the list (with replacement), so
    [16] * 9 + [512] is a bimodal mix; f(rng, n) -> n lengths, for anything else
    (a log-normal, a trace)."""
    if callable(spec):
        return spec
    try:
        if isinstance(spec, str):
            if ":" in spec:
                spec = tuple(int(x) for x in spec.split(":"))
            elif "," in spec:
                spec = [int(x) for x in spec.split(",") if x.strip()]
            else:
                spec = int(spec)
    except ValueError:
        raise ValueError(f"{name}: {spec!r} is not N, LO:HI or N1,N2,... (positive integers)") from None
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        spec = int(spec)
        values = [spec]
    elif isinstance(spec, tuple) and len(spec) == 2:
        spec = values = (int(spec[0]), int(spec[1]))
        if spec[0] > spec[1]:
            raise ValueError(f"{name}: range {spec[0]}:{spec[1]} has LO > HI")
    elif isinstance(spec, (list, tuple)) and len(spec) > 0:
        spec = values = [int(v) for v in spec]
    else:
        raise ValueError(f"{name}: {spec!r} is not N, (LO, HI), a non-empty list of positive integers "
                         "or a function f(rng, n)")
    if min(values) < 1:
        raise ValueError(f"{name}: lengths must be >= 1, got {spec!r}")
    return spec  # int (fixed), tuple (uniform range), list (choices) or a function


def sample_lengths(spec, n: int, rng: np.random.Generator, name: str = "length") -> list[int]:
    """n lengths drawn from a distribution given as parse_length accepts."""
    spec = parse_length(spec, name)
    if isinstance(spec, int):
        return [spec] * n
    if isinstance(spec, tuple):  # uniform over the integers LO..HI, both included
        return [int(x) for x in rng.integers(spec[0], spec[1] + 1, size=n)]
    if isinstance(spec, list):
        return [int(x) for x in rng.choice(spec, size=n)]
    out = np.asarray(spec(rng, n)).astype(int)
    if out.shape != (n,) or (out < 1).any():
        raise ValueError(f"{name}: the function must return {n} lengths, each an integer >= 1")
    return [int(x) for x in out]
