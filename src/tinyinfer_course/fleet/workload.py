"""The requests a fleet serves: when each arrives, how big it is, and which
shared prefix (a system prompt, a long document) it starts with.

Two numbers per request matter most for an inference server: the prompt length
(work for prefill, which decides TTFT) and the output length (number of decode
steps, which decides how long the request occupies a batch slot and KV-cache
space). Arrival times and length distributions come from tinyinfer.workload,
shared with the load generator for real servers; the shared prefixes, which a
replica's prefix cache can skip, are the simulator's own. The whole workload is
drawn from one seeded generator, so the same seed gives the same workload.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyinfer.workload import arrival_times, sample_lengths


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
    session_id: int | None = None  # the conversation this turn belongs to (make_chat_workload)

    def __post_init__(self):
        if self.prompt_len < 1:
            raise ValueError(f"prompt_len={self.prompt_len} is invalid: must be >= 1")
        if self.output_len < 1:
            raise ValueError(f"output_len={self.output_len} is invalid: must be >= 1")
        if not (0 <= self.prefix_len < self.prompt_len):
            raise ValueError(f"prefix_len={self.prefix_len} is invalid: "
                             f"must be in [0, prompt_len-1={self.prompt_len - 1}]")
        if self.arrival_time < 0:
            raise ValueError(f"arrival_time={self.arrival_time} is invalid: must be >= 0")


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
    if not rate > 0:  # checked here too, so the error names this function's argument
        raise ValueError(f"rate={rate!r} is invalid: must be > 0 requests/s")
    if num_prefixes < 0 or prefix_len < 0:
        raise ValueError("num_prefixes and prefix_len must be >= 0")
    rng = np.random.default_rng(seed)  # one stream, drawn in this order: arrivals, lengths, prefixes
    times = arrival_times(num_requests, rate, arrival, rng)
    prompts = sample_lengths(prompt_len, num_requests, rng, "prompt_len")
    outputs = sample_lengths(output_len, num_requests, rng, "output_len")
    prefixes = rng.integers(0, num_prefixes, size=num_requests) if num_prefixes else [None] * num_requests
    reqs = []
    for i in range(num_requests):
        pid = None if prefixes[i] is None else int(prefixes[i])
        # A prompt always keeps at least one token of its own after the prefix.
        plen = int(prompts[i]) + (prefix_len if pid is not None else 0)
        reqs.append(SimRequest(i, float(times[i]), plen, int(outputs[i]), pid, prefix_len if pid is not None else 0))
    return reqs


def make_chat_workload(num_sessions: int, rate: float, turns=(2, 6), num_system_prompts: int = 4,
                          system_len: int = 400, user_len=(16, 64), output_len=(16, 64),
                          think_time: float = 8.0, seed: int = 0) -> list[SimRequest]:
    """Chat sessions: a seeded list of requests sorted by arrival time.

    Sessions start as a Poisson process of `rate` per second. Each picks one of
    `num_system_prompts` system prompts of `system_len` tokens and has a number
    of turns (drawn from `turns`); a turn arrives on average `think_time` s after
    the one before. A chat client sends the whole conversation every turn, so:

      turn 1 of a session   prompt = system prompt + the user's message;
                            its prefix is the system prompt, shared with every
                            session that picked it: prefix_id = the prompt's number
                            (0 .. num_system_prompts - 1)
      turn k > 1            prompt = everything so far (system prompt, earlier
                            messages and replies) + the new message; its prefix is
                            that history, which only this session has:
                            prefix_id = num_system_prompts + session number

    A replica that served turn k - 1 holds turn k's prefix in its cache; any other
    replica must compute it again. Every request carries its session_id."""
    if not (isinstance(num_sessions, int) and num_sessions >= 1):
        raise ValueError(f"num_sessions={num_sessions!r} is invalid: must be an integer >= 1")
    if not rate > 0:
        raise ValueError(f"rate={rate!r} is invalid: must be > 0 sessions/s")
    if not (isinstance(num_system_prompts, int) and num_system_prompts >= 1) or system_len < 1:
        raise ValueError("num_system_prompts and system_len must be integers >= 1")
    if not think_time > 0:
        raise ValueError(f"think_time={think_time!r} is invalid: must be > 0 seconds")
    rng = np.random.default_rng(seed)
    starts = arrival_times(num_sessions, rate, "poisson", rng)
    num_turns = sample_lengths(turns, num_sessions, rng, "turns")
    systems = rng.integers(0, num_system_prompts, size=num_sessions)
    rows = []
    for s in range(num_sessions):
        t, history = float(starts[s]), system_len
        users = sample_lengths(user_len, num_turns[s], rng, "user_len")
        outputs = sample_lengths(output_len, num_turns[s], rng, "output_len")
        for k in range(num_turns[s]):
            pid = int(systems[s]) if k == 0 else num_system_prompts + s
            rows.append((t, history + users[k], outputs[k], pid, history, s))
            history += users[k] + outputs[k]  # the reply joins the conversation
            t += float(rng.exponential(think_time))
    rows.sort(key=lambda r: r[0])
    return [SimRequest(i, t, plen, out, pid, plen_prefix, sid) for i, (t, plen, out, pid, plen_prefix, sid)
            in enumerate(rows)]


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
