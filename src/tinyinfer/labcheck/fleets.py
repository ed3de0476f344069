"""Lab 8 (from one machine to a fleet): checks for the power-of-two-choices
routing policy, and for p95 latency and goodput computed from a benchmark's
per-request records. Expected values come from the engine: the fleet
simulator's PowerOfTwo router and tinyinfer.bench's calculate_metrics."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from .core import Case, run_check
from .registry import Lab

# ---------------------------------------------------------------- lab 8: fleets


def reference_power_of_two(loads: list[int], rng: np.random.Generator) -> int:
    """The course's answer to lab 8's power_of_two exercise."""
    if len(loads) == 1:
        return 0  # nothing to choose between, and no random draw spent
    i, j = (int(x) for x in rng.choice(len(loads), size=2, replace=False))
    return min(i, j, key=lambda r: (loads[r], r))  # fewer outstanding; a tie goes to the lower index


def reference_p95_and_goodput(records, slos_ms: dict, duration: float) -> tuple[float, float]:
    """The course's answer to lab 8's p95_and_goodput exercise."""
    ok = [r for r in records if r.ok]
    p95 = float(np.percentile([r.e2el * 1e3 for r in ok], 95))  # linear interpolation, as vLLM
    values = lambda r: {"ttft": r.ttft, "tpot": r.tpot or 0.0, "e2el": r.e2el}  # noqa: E731
    good = [r for r in ok if all(values(r)[k] * 1e3 <= slo for k, slo in slos_ms.items())]
    return p95, len(good) / duration


# --- power of two choices ------------------------------------------------------


def _replay(fn, loads: list[int], seed: int, calls: int) -> list[int]:
    """The indices fn picks in `calls` calls sharing one seeded generator (the
    loads stay fixed, so the draws are all that changes)."""
    rng = np.random.default_rng(seed)
    return [fn(list(loads), rng) for _ in range(calls)]


def _same_picks(got, expected) -> bool:
    return (isinstance(got, list) and len(got) == len(expected)
            and all(isinstance(g, (int, np.integer)) and int(g) == e for g, e in zip(got, expected)))


def _engine_picks(loads: list[int], seed: int, calls: int) -> list[int]:
    """What the fleet simulator's PowerOfTwo router picks, call after call, for
    replicas with these outstanding counts (ids 0, 1, ...; its rng seeded alike)."""
    from ..fleet.router import PowerOfTwo  # here, not at the top: tinyinfer.fleet takes a while to import

    router = PowerOfTwo(seed)
    replicas = [SimpleNamespace(id=i, outstanding=n) for i, n in enumerate(loads)]
    return [router.choose(None, replicas).id for _ in range(calls)]


def _power_of_two_cases() -> list[Case]:
    rows = [
        ([5, 0, 3, 7], 0, 8, "four replicas, one idle"),
        ([2, 2, 2], 1, 6, "all equal: every tie goes to the lower index"),
        ([4], 2, 3, "a single replica: return 0 without drawing"),
        ([9, 1], 3, 4, "two replicas: both are always drawn"),
        ([3, 8, 1, 1, 6, 0, 2, 5], 4, 12, "eight replicas"),
        ([0, 4, 4, 9, 4, 1], 5, 10, "six replicas with ties"),
    ]
    return [Case((loads, seed, calls), _engine_picks(loads, seed, calls),
                 f"loads={loads}, {calls} calls with rng = np.random.default_rng({seed})  ({note})")
            for loads, seed, calls, note in rows]


def check_power_of_two(fn) -> bool:
    """fn(loads, rng) -> index: draw two different replicas with
    rng.choice(len(loads), size=2, replace=False) and take the less loaded."""
    # Each case replays several calls on one seeded generator, so a learner who
    # draws differently (with replacement, say) gets different picks.
    from ..fleet.router import PowerOfTwo

    return run_check("power_of_two", lambda loads, seed, calls: _replay(fn, loads, seed, calls),
                     _power_of_two_cases, same=_same_picks, forbidden=(reference_power_of_two, PowerOfTwo))


# --- p95 and goodput -----------------------------------------------------------


def _record(i: int, send: float, chunks: list[float], status: str = "ok", tokens: int | None = None):
    from ..bench.results import RequestRecord  # here, not at the top: tinyinfer.bench takes seconds to import

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
    from ..bench.results import calculate_metrics

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
    from ..bench.results import Latency, calculate_metrics, is_good

    return run_check("p95_and_goodput", fn, _goodput_cases, same=_close,
                     forbidden=(reference_p95_and_goodput, calculate_metrics, is_good, Latency))


LAB = Lab(8, "from one machine to a fleet",
          exports=("check_power_of_two", "check_p95_and_goodput", "reference_power_of_two",
                   "reference_p95_and_goodput"),
          fallbacks={"check_power_of_two": reference_power_of_two, "check_p95_and_goodput": reference_p95_and_goodput})
