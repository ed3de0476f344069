"""A chat-like workload with real text: shared system prompts and multi-turn sessions.

Real assistants send the same long system prompt in front of many users'
messages, and each turn of a conversation re-sends the turns before it. Both
are prompt prefixes a replica's prefix cache can reuse, if the router sends the
request where that prefix already is. This workload has both:

  - `num_system_prompts` system prompts of `system_len` tokens; each session
    picks one at random;
  - sessions start as a Poisson process (`session_rate` per second); each has
    `turns` turns, `turn_gap_s` apart;
  - turn t's prompt is the system prompt, then the user's messages 1..t. The
    model's replies are left out of the next prompt, so every prompt is known
    before the run and two runs send exactly the same text.

The same turns become SimRequests for the simulator (to_sim_requests). The
simulator knows one shared prefix per request: here the system prompt (its
whole KV blocks). A session's earlier turns are a prefix the real engine's
cache also reuses, and the simulator does not see; the report counts those
tokens, so the difference can be computed, not guessed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyinfer.bench.prompts import synthetic_prompt
from tinyinfer.workload import arrival_times
from .workload import SimRequest


@dataclass(frozen=True)
class Turn:
    """One request of the session workload, as text and as token counts."""

    request_id: int
    arrival_time: float  # seconds after the first session started
    session: int
    turn: int  # 0 for the first message
    system_id: int
    prompt: str
    prompt_len: int  # tokens of the whole prompt
    system_len: int  # tokens of the system prompt (whole KV blocks of it, see to_sim_requests)
    history_len: int  # tokens of the session's earlier turns' prompt (0 on the first turn)
    output_len: int


def make_session_workload(tokenizer, num_sessions: int = 12, turns: int = 3, num_system_prompts: int = 3,
                          system_len: int = 192, user_len: int = 24, output_len: int = 8,
                          session_rate: float = 1.0, turn_gap_s: float = 2.0, seed: int = 0) -> list[Turn]:
    """The turns of every session, sorted by arrival time. `tokenizer` (with
    encode/decode) makes the lengths exact."""
    for name, v in (("num_sessions", num_sessions), ("turns", turns), ("num_system_prompts", num_system_prompts),
                    ("system_len", system_len), ("user_len", user_len), ("output_len", output_len)):
        if not (isinstance(v, int) and v >= 1):
            raise ValueError(f"{name}={v!r} is invalid: must be an integer >= 1")
    if not turn_gap_s >= 0:
        raise ValueError(f"turn_gap_s={turn_gap_s!r} is invalid: must be >= 0 seconds")
    rng = np.random.default_rng(seed)
    systems = [synthetic_prompt(system_len, rng, tokenizer)[0] for _ in range(num_system_prompts)]
    starts = arrival_times(num_sessions, session_rate, "poisson", rng)
    picks = rng.integers(0, num_system_prompts, size=num_sessions)

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    out = []
    for s in range(num_sessions):
        sid = int(picks[s])
        text, before = systems[sid], 0
        for t in range(turns):
            user = synthetic_prompt(user_len, rng, tokenizer)[0]
            history = before
            text = f"{text}\nUser: {user}"
            before = count(text)
            out.append(Turn(0, float(starts[s] + t * turn_gap_s), s, t, sid, text, before, count(systems[sid]),
                            history if t else 0, output_len))
    out.sort(key=lambda r: (r.arrival_time, r.session, r.turn))
    return [Turn(i, *(getattr(r, f) for f in Turn.__dataclass_fields__ if f != "request_id"))
            for i, r in enumerate(out)]


def to_sim_requests(turns: list[Turn], block_size: int = 16) -> list[SimRequest]:
    """The simulator's view: prefix_id is the system prompt, prefix_len its whole
    KV blocks (a prefix cache shares whole blocks only)."""
    reqs = []
    for r in turns:
        shared = min((r.system_len // block_size) * block_size, r.prompt_len - 1)
        reqs.append(SimRequest(r.request_id, r.arrival_time, r.prompt_len, r.output_len, r.system_id, shared))
    return reqs
