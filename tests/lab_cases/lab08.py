"""Lab 8 (from one machine to a fleet): wrong implementations each check must
reject, and the reference each must accept, and the course answers each must refuse. Collected by tests/test_labs.py."""
import math
from types import SimpleNamespace

import numpy as np

from tinyinfer import labcheck
from tinyinfer.bench.results import calculate_metrics
from tinyinfer.fleet.router import PowerOfTwo


def _least_loaded_overall(loads, rng):
    # least-outstanding, not power of two: it never draws, so it ignores rng
    return int(np.argmin(loads))


def _one_random_replica(loads, rng):
    # random routing: one draw, no comparison
    return int(rng.integers(len(loads)))


def _more_loaded_of_two(loads, rng):
    if len(loads) == 1:
        return 0
    i, j = rng.choice(len(loads), size=2, replace=False)
    return int(max(i, j, key=lambda r: (loads[r], -r)))


def _with_replacement(loads, rng):
    # may draw the same replica twice: then there is no choice at all
    i, j = rng.choice(len(loads), size=2)
    return int(min(i, j, key=lambda r: (loads[r], r)))


def _tie_to_higher_index(loads, rng):
    if len(loads) == 1:
        return 0
    i, j = rng.choice(len(loads), size=2, replace=False)
    return int(min(i, j, key=lambda r: (loads[r], -r)))


def _tie_to_first_drawn(loads, rng):
    # a tie goes to whichever was drawn first, not to the lower index
    if len(loads) == 1:
        return 0
    i, j = rng.choice(len(loads), size=2, replace=False)
    return int(i if loads[i] <= loads[j] else j)


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
    "check_power_of_two": [_least_loaded_overall, _one_random_replica, _more_loaded_of_two, _with_replacement,
                           _tie_to_higher_index, _tie_to_first_drawn],
    "check_p95_and_goodput": [_nearest_rank_p95, _p95_in_seconds, _slos_compared_in_seconds, _goodput_per_request,
                              _any_slo_is_enough, _one_token_misses_tpot, _strict_less_than, _p95_of_ttft,
                              _p95_over("failed as 0"), _p95_over("with a tpot"), _p95_over("good")],
}


# --- correct implementations written here, independently of labcheck and the engine


def _two_choices(loads, rng):
    if len(loads) < 2:
        return 0
    pair = [int(x) for x in rng.choice(len(loads), size=2, replace=False)]
    pair.sort(key=lambda r: (loads[r], r))  # fewer outstanding first; a tie to the lower index
    return pair[0]


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


def _engine_router(loads, rng):
    router = PowerOfTwo()
    router.rng = rng  # the check's generator, so the draws are the same
    return router.choose(None, [SimpleNamespace(id=i, outstanding=n) for i, n in enumerate(loads)]).id


def _library(records, slos, duration):
    res = calculate_metrics(records, duration, percentiles=(95,), goodput=slos)
    return res.e2el.p(95), res.request_goodput


REFERENCE = {
    "check_power_of_two": lambda: _two_choices,
    "check_p95_and_goodput": lambda: _p95_goodput,
}
ANSWERS = {
    "check_power_of_two": [labcheck.reference_power_of_two, _engine_router],
    # The definition itself: tinyinfer.bench's metrics, which follow vLLM's benchmark.
    "check_p95_and_goodput": [labcheck.reference_p95_and_goodput, _library],
}
