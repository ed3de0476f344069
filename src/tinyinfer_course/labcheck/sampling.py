"""Lab 3 (sampling): checks for the four logits processors the lab asks for
(min-p, top-k, top-p, repetition penalty) and the sampler.

The processors are compared exactly with tinyinfer.sampling, on small logits
made by hand to hit the edge cases: ties, all-equal scores, negative scores,
tokens an earlier processor already removed (-inf), top_p = 1 and a tiny top_p.

A sampler draws at random, so its check is statistical: it draws many tokens
from a known distribution with a generator seeded by the check, counts them,
and runs a chi-square goodness-of-fit test. The seed is fixed, so the verdict
on a given function is the same on every run. A correct sampler fails a test
at level ALPHA = 0.001 one time in a thousand by bad luck; a sampler that
ignores the temperature or always takes the top token fails it by a mile.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from tinyinfer import sampling as engine
from tinyinfer.sampler import Sampler
from .core import Case, first_difference, run_check
from .registry import Lab

INF = float("inf")
NUM_DRAWS = 20_000
ALPHA = 1e-3
# The chi-square distribution's critical values at ALPHA = 0.001: a statistic
# above CHI2_CRITICAL[df] has less than a 0.1% chance under the expected
# distribution. (scipy.stats.chi2.ppf(1 - 0.001, df); tests recompute them.)
CHI2_CRITICAL = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322, 8: 26.124}


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _log(probs) -> torch.Tensor:
    """Logits whose softmax is exactly `probs` (up to rounding)."""
    return _t(probs).log()


# ------------------------------------------------------------------ comparing


class _ChangedInput:
    """What a check reports when the learner's function modified its argument."""

    def __init__(self, now: torch.Tensor):
        self.now = now

    def __repr__(self):
        return f"<the input tensor was changed in place; it is now {self.now!r}>"


def _call_on_copy(fn, logits: torch.Tensor, *rest):
    """Call fn on a copy of `logits`; report an in-place change instead of the result.
    (In the engine the same row of logits is read again later, for logprobs.)"""
    x = logits.clone()
    out = fn(x, *rest)
    if not torch.equal(x.isnan(), logits.isnan()) or not torch.equal(x.nan_to_num(), logits.nan_to_num()):
        return _ChangedInput(x)
    return out


def _same_logits(got, expected: torch.Tensor) -> bool:
    """Same shape, -inf in the same places, the other values equal up to rounding."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return False
    got = got.detach().float().cpu()
    cut = expected == -INF
    if not torch.equal(got == -INF, cut):
        return False
    return torch.allclose(got[~cut], expected[~cut], rtol=1e-5, atol=1e-6)


@dataclass
class _Cut:
    """The expected result of a filter like top-p, where ties can make more than
    one answer right: any top-scoring set of the reference's size, with the kept
    scores unchanged and every other score -inf."""

    reference: torch.Tensor
    original: torch.Tensor

    def __repr__(self):
        return repr(self.reference)


def _same_cut(got, expected: _Cut) -> bool:
    if not isinstance(got, torch.Tensor) or got.shape != expected.original.shape:
        return False
    got = got.detach().float().cpu()
    kept = got > -INF
    if int(kept.sum()) != int((expected.reference > -INF).sum()):
        return False
    if not bool((got[~kept] == -INF).all()):  # catches NaN as well
        return False
    original = expected.original
    if not torch.allclose(got[kept], original[kept], rtol=1e-5, atol=1e-6):
        return False
    dropped = ~kept & (original > -INF)
    return not (kept.any() and dropped.any()) or bool(original[kept].min() >= original[dropped].max())


def _engine(*names: str) -> tuple:
    """The engine's own versions of an exercise (tinyinfer.sampling), which the
    check refuses: the named functions, and process_logits, which runs them all."""
    return tuple(getattr(engine, name) for name in names + ("process_logits", "processed_probs"))


# ---------------------------------------------------------------------- min-p

# (logits, min_p, why the case exists). No score sits within rounding of its
# threshold, so working in probabilities or in logits gives the same answer.
MIN_P_CASES = [
    ([2.0, 1.0, 0.0, -1.0], 0.3, "relative to the top: e^-1 = 0.37 of it stays, e^-2 = 0.14 does not"),
    ([2.0, 1.0, 0.0, -1.0], 0.1, "a smaller min_p keeps more"),
    ([0.0, 2.0, -1.0, 1.0], 0.3, "the same scores, not sorted"),
    ([-3.0, -1.0, -2.0, -5.0], 0.2, "negative scores"),
    ([0.5, 0.3, 0.15, 0.05], 0.4, "log-probabilities: 0.4 x 0.5 = 0.2, so 0.3 stays; the threshold is relative, "
                                  "not an absolute probability"),
    ([2.0, 2.0, 0.0], 1.0, "min_p = 1: the top token and every token tied with it"),
    ([3.0, 3.0, 3.0], 0.9, "all equal: all stay"),
    ([1.0, -INF, 0.5, -INF], 0.5, "-inf: already removed, stays removed"),
    ([5.0, -20.0, 4.0, -60.0], 0.0, "min_p = 0 switches it off"),
]


def _real_sized_row(min_p: float) -> torch.Tensor:
    """1,000 random scores, nudged so that none sits within 1e-3 of the cut."""
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(3)) * 3
    threshold = float(logits.max()) + math.log(min_p)
    near = (logits - threshold).abs() < 1e-3
    return torch.where(near, logits + 0.01, logits)


def _min_p_cases() -> list[Case]:
    cases = []
    for values, min_p, why in MIN_P_CASES:
        logits = _log(values) if "log-probabilities" in why else _t(values)
        shown = f"log({values})" if "log-probabilities" in why else str(values)
        cases.append(Case((lambda f, x=logits, m=min_p: _call_on_copy(f, x, m),), engine.apply_min_p(logits, min_p),
                          f"logits={shown}, min_p={min_p}  ({why})"))
    for min_p in (0.05, 0.2):
        logits = _real_sized_row(min_p)
        cases.append(Case((lambda f, x=logits, m=min_p: _call_on_copy(f, x, m),), engine.apply_min_p(logits, min_p),
                          f"1,000 random scores, min_p={min_p}"))
    return cases


def check_min_p(fn) -> bool:
    """fn(logits, min_p) -> logits with -inf for every token whose probability
    is below min_p times the most likely token's (min_p = 0: off), against
    tinyinfer.sampling.apply_min_p. The input must not be modified."""
    return run_check("min_p", lambda probe: probe(fn), _min_p_cases, same=_same_logits,
                     forbidden=_engine("apply_min_p"))


# ---------------------------------------------------------------------- top-k

TOP_K_CASES = [
    ([1.0, 4.0, 2.0, 3.0], 2, ""),
    ([1.0, 4.0, 2.0, 3.0], 1, ""),
    ([3.0, 1.0, 2.0, 2.0], 2, "  (a tie at the k-th score: both stay)"),
    ([5.0, 5.0, 5.0, 5.0], 1, "  (all equal: all tied with the top, so all stay)"),
    ([-3.0, -1.0, -2.0, -5.0], 2, "  (negative scores)"),
    ([0.5, -INF, 2.0, -INF, 1.0], 2, "  (-inf: already removed)"),
    ([1.0, 4.0, 2.0, 3.0], 4, "  (k = vocabulary size: nothing to cut)"),
    ([1.0, 4.0, 2.0, 3.0], 10, "  (k > vocabulary size)"),
    ([1.0, 4.0, 2.0, 3.0], -1, "  (k = -1 switches top-k off)"),
    ([1.0, 4.0, 2.0, 3.0], 0, "  (k = 0 switches it off too, as in vLLM)"),
]


def _top_k_cases() -> list[Case]:
    cases = []
    for values, k, note in TOP_K_CASES:
        logits = _t(values)
        cases.append(Case((lambda f, x=logits, k=k: _call_on_copy(f, x, k),), engine.apply_top_k(logits, k),
                          f"logits={values}, k={k}{note}"))
    return cases


def check_top_k(fn) -> bool:
    """fn(logits, k) -> logits with every score below the k-th highest set to
    -inf (ties with the k-th are kept; k = -1 or 0 means off), against
    tinyinfer.sampling.apply_top_k."""
    return run_check("top_k", lambda probe: probe(fn), _top_k_cases, same=_same_logits,
                     forbidden=_engine("apply_top_k"))


# ---------------------------------------------------------------------- top-p

# (logits, p, note). Most logits are log-probabilities, so the masses are easy
# to add up by hand; no p sits exactly on a cumulative sum, where rounding would decide.
TOP_P_CASES = [
    (_log([0.5, 0.3, 0.15, 0.05]), 0.7, "keep tokens until their mass reaches p"),
    (_log([0.5, 0.3, 0.15, 0.05]), 0.9, ""),
    (_log([0.5, 0.3, 0.15, 0.05]), 0.4, "the top token alone is enough"),
    (_log([0.15, 0.05, 0.5, 0.3]), 0.7, "the same, not sorted"),
    (_log([0.5, 0.3, 0.15, 0.05]), 1.0, "p = 1 keeps everything"),
    (_log([0.5, 0.3, 0.15, 0.05]), 1e-6, "a tiny p still keeps the top token"),
    (_t([2.0, 1.0, 0.5, -1.0]), 0.75, "raw scores: softmax them first"),
    (_t([-3.0, -1.0, -2.0, -5.0]), 0.8, "negative scores"),
    (_t([1.0, 1.0, 1.0, 1.0]), 0.6, "all equal: any three of them"),
    (_t([1.0, -INF, 0.0, -INF, 0.5]), 0.6, "-inf entries carry no mass"),
]


def _top_p_cases() -> list[Case]:
    cases = []
    for logits, p, note in TOP_P_CASES:
        expected = _Cut(engine.apply_top_p(logits, p), logits)
        probs = [round(x, 3) for x in logits.softmax(-1).tolist()]
        cases.append(Case((lambda f, x=logits, p=p: _call_on_copy(f, x, p),), expected,
                          f"logits={logits!r}, p={p}  (softmax {probs}{'; ' + note if note else ''})"))
    return cases


def check_top_p(fn) -> bool:
    """fn(logits, p) -> logits with -inf outside the smallest set of most likely
    tokens whose probabilities sum to at least p, against
    tinyinfer.sampling.apply_top_p (tied tokens may be chosen either way)."""
    return run_check("top_p", lambda probe: probe(fn), _top_p_cases, same=_same_cut,
                     forbidden=_engine("apply_top_p"), explain=_where_cut)


def _where_cut(got, expected: _Cut) -> str | None:
    """How many tokens the cut kept against how many it should (ties may go
    either way, so the count is what is sure), or the first kept score changed."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.original.shape:
        return None
    got = got.detach().float().cpu()
    kept, should = int((got > -INF).sum()), int((expected.reference > -INF).sum())
    if kept != should:
        return f"kept {kept} tokens (scores above -inf), expected {should}"
    return first_difference(got, expected.reference)


# ------------------------------------------------------------ repetition penalty

REPETITION_CASES = [
    ([2.0, 1.0, -1.0, 0.5], [0], 2.0, "a positive score is divided"),
    ([2.0, 1.0, -1.0, 0.5], [2], 2.0, "a negative score is multiplied, so it goes down too"),
    ([2.0, 1.0, -1.0, 0.0, 0.5], [0, 2, 3], 1.3, "positive, negative and zero"),
    ([2.0, 1.0, -1.0, 0.5], [1, 1, 2, 1, 2], 1.5, "ids repeat in a text: the penalty applies once per token"),
    ([2.0, 1.0, -1.0, 0.5], [0, 2], 1.0, "penalty 1 changes nothing"),
    ([2.0, 1.0, -1.0, 0.5], [0, 2], 0.5, "a penalty below 1 favours seen tokens"),
    ([2.0, 1.0, -1.0, 0.5], [], 1.5, "nothing seen yet"),
]


def _repetition_cases() -> list[Case]:
    cases = []
    for values, seen, penalty, note in REPETITION_CASES:
        logits, ids = _t(values), torch.tensor(seen, dtype=torch.long)
        cases.append(Case((lambda f, x=logits, s=ids, r=penalty: _call_on_copy(f, x, s.clone(), r),),
                          engine.apply_repetition_penalty(logits, ids, penalty),
                          f"logits={values}, seen={seen}, penalty={penalty}  ({note})"))
    return cases


def check_repetition_penalty(fn) -> bool:
    """fn(logits, seen_ids, penalty) -> logits where every token in seen_ids has
    its positive score divided by the penalty and its negative score multiplied,
    against tinyinfer.sampling.apply_repetition_penalty."""
    return run_check("repetition_penalty", lambda probe: probe(fn), _repetition_cases, same=_same_logits,
                     forbidden=_engine("apply_repetition_penalty"))


# ------------------------------------------------------------------- sampler


def reference_sample(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None) -> int:
    """The course's answer to lab 3's sampler exercise, through the engine's own sampler."""
    return engine.sample(logits, engine.SamplingParams(temperature=temperature), generator)


def chi_square(counts: list[int], probs: list[float]) -> float:
    """Pearson's statistic: sum over outcomes of (observed - expected)^2 / expected.
    An outcome with probability 0 that was drawn anyway makes it infinite."""
    n = sum(counts)
    total = 0.0
    for c, p in zip(counts, probs):
        if p == 0:
            if c:
                return INF
            continue
        total += (c - n * p) ** 2 / (n * p)
    return total


class _Frequencies:
    """How often each token was drawn, with the test's verdict, for the report."""

    def __init__(self, counts: list[int], probs: list[float]):
        self.counts, self.probs = counts, probs
        self.df = sum(p > 0 for p in probs) - 1
        self.stat = chi_square(counts, probs)

    def passes(self) -> bool:
        return self.stat <= CHI2_CRITICAL[self.df]

    def __repr__(self):
        n = sum(self.counts)
        freqs = [round(c / n, 3) for c in self.counts]
        verdict = "above" if not self.passes() else "within"
        return f"frequencies {freqs} (chi-square {self.stat:.1f}, {verdict} {CHI2_CRITICAL[self.df]})"


class _ExpectedFrequencies:
    def __init__(self, probs: list[float]):
        self.probs = probs

    def __repr__(self):
        df = sum(p > 0 for p in self.probs) - 1
        return (f"frequencies near {[round(p, 3) for p in self.probs]} "
                f"(chi-square at most {CHI2_CRITICAL[df]}, df={df}, alpha={ALPHA})")


class _NotAnId:
    """What the check reports when a draw is not a Python int (a tensor, say)."""

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return (f"{self.value!r}, a {type(self.value).__name__}: return a Python int (int(...)); later labs "
                "test `token in stop_ids` and build lists of ids, where a tensor never equals an id")


class _Raised:
    """What the check reports when the sampler raised on a case's logits."""

    def __init__(self, error: Exception):
        self.error = error

    def __repr__(self):
        return f"raised {type(self.error).__name__}: {str(self.error)[:160]}"


def _is_id(token) -> bool:
    return isinstance(token, numbers.Integral) and not isinstance(token, bool)


def _changed(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Whether a call changed its input (NaN equal to NaN); one cheap comparison when it did not."""
    if torch.equal(before, after):
        return False
    return not (torch.equal(before.isnan(), after.isnan()) and torch.equal(before.nan_to_num(), after.nan_to_num()))


def _draws(fn, logits, temperature, seed, n) -> list:
    """n draws with one seeded generator; a draw that is not an int, or one that
    changed the logits it was given, is reported (as _NotAnId, _ChangedInput)
    and ends the list."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = logits.clone()
        token = fn(x, temperature, generator)
        if _changed(logits, x):  # the engine reads the same row again (logprobs): leave it alone
            return out + [_ChangedInput(x)]
        if not _is_id(token):
            return out + [_NotAnId(token)]
        out.append(int(token))
    return out


def _frequency_probe(logits: torch.Tensor, temperature: float, n: int = NUM_DRAWS):
    probs = (logits / temperature).softmax(-1).tolist()  # float32: far-below tokens get exactly 0

    def probe(fn):
        counts = [0] * len(probs)
        try:
            tokens = _draws(fn, logits, temperature, seed=1234, n=n)
        except NotImplementedError:
            raise
        except Exception as e:  # overflow in exp, say: shown against the expected frequencies
            return _Raised(e)
        for token in tokens:
            if isinstance(token, (_NotAnId, _ChangedInput)):
                return token
            if not 0 <= token < len(probs):
                return f"a token id out of range: {token}"
            counts[token] += 1
        return _Frequencies(counts, probs)

    return probe, _ExpectedFrequencies(probs)


SAME_DRAWS = "the same 30 tokens from two generators with the same seed"


def _same_draws(fn, logits, temperature):
    first = _draws(fn, logits, temperature, seed=7, n=30)
    again = _draws(fn, logits, temperature, seed=7, n=30)
    wrong = next((t for t in first + again if isinstance(t, (_NotAnId, _ChangedInput))), None)
    if wrong is not None:
        return wrong
    return SAME_DRAWS if first == again else f"two generators with the same seed gave {first} and {again}"


def _greedy_id(fn, logits):
    x = logits.clone()
    token = fn(x, 0.0, torch.Generator().manual_seed(0))
    if _changed(logits, x):
        return _ChangedInput(x)
    return token if _is_id(token) else _NotAnId(token)


def _same_sample(got, expected) -> bool:
    if isinstance(expected, _ExpectedFrequencies):
        return isinstance(got, _Frequencies) and got.passes()
    if isinstance(expected, str):
        return got == expected
    return _is_id(got) and int(got) == expected


def _sample_cases() -> list[Case]:
    cases = []
    # temperature 0: greedy, the highest score every time (and no division by 0)
    for values in ([1.0, 3.0, 2.0], [-5.0, -2.0, -3.0, -4.0], [0.5, -INF, 2.5, 1.0]):
        logits = _t(values)
        cases.append(Case((lambda f, x=logits: _greedy_id(f, x),),
                          int(torch.argmax(logits)), f"logits={values}, temperature=0  (greedy)"))
    # the generator is the only source of randomness: same seed, same draws
    logits = _log([0.4, 0.3, 0.2, 0.1])
    cases.append(Case((lambda f, x=logits: _same_draws(f, x, 1.0),), SAME_DRAWS,
                      "logits=log([0.4, 0.3, 0.2, 0.1]), temperature=1, "
                      "30 draws, twice, each time with torch.Generator().manual_seed(7)"))
    # the right distribution, at several temperatures; removed tokens never drawn
    for values, t, what in [
        ([0.5, 0.25, 0.15, 0.1], 1.0, "log(probs)"),
        ([0.5, 0.25, 0.15, 0.1], 0.5, "log(probs)"),
        ([0.5, 0.25, 0.15, 0.1], 2.0, "log(probs)"),
        ([2.0, -INF, 1.0, 0.0, -INF], 0.7, "raw scores, two removed"),
    ]:
        logits = _log(values) if what == "log(probs)" else _t(values)
        probe, expected = _frequency_probe(logits, t)
        shown = f"log({values})" if what == "log(probs)" else str(values)
        cases.append(Case((probe,), expected, f"logits={shown}, temperature={t}, {NUM_DRAWS:,} draws"))
    return cases + _real_sized_sample_cases()


def _model_sized_logits(top: list[float], seed: int, vocab: int = 1000) -> torch.Tensor:
    """A row of `vocab` scores like a real model's: a handful of candidates at
    the top (`top`), the rest N(0, 3), far below them."""
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 3
    logits[: len(top)] = torch.tensor(top)
    return logits


def _real_sized_sample_cases(n: int = 2_000) -> list[Case]:
    """Scores of the size a real model gives (SmolLM2's reach 20 to 30) at a low
    temperature: divided by 0.05 they reach 600, and exp(600) overflows even
    float64's range in a sum of many (float32's ends at exp(88)). A sampler must
    subtract the largest score before exp, as softmax does."""
    cases = []
    for top, t, what in [
        ([30.0, 29.95, 29.9, 29.8], 0.05, "four candidates near 30, the rest near 0"),
        ([30.0, 29.98, 29.97, 29.95], 0.01, "the same at temperature 0.01: scores / T reach 3,000"),
        ([-30.0, -30.05, -30.1, -30.2], 0.05, "all scores very negative (a large constant subtracted): "
                                             "exp(score / T) is 0 for every token"),
    ]:
        logits = _model_sized_logits(top, seed=len(cases))
        if top[0] < 0:
            logits[len(top):] = -60.0 + logits[len(top):]
        probe, expected = _frequency_probe(logits, t, n)
        cases.append(Case((probe,), expected, f"1,000 scores: {what}; top four {top}, temperature={t}, "
                                              f"{n:,} draws (the other 996 tokens have probability 0)"))
    return cases


def check_sample(fn) -> bool:
    """fn(logits, temperature, generator) -> one token id: the highest score at
    temperature 0, otherwise a draw from softmax(logits / temperature) using
    only `generator` for randomness. Greedy cases are exact; draws are tested
    with a chi-square test on 20,000 seeded draws per case. Kept as "sample"
    on a pass (later labs' generation loops use it)."""
    return run_check("sample", lambda probe: probe(fn), _sample_cases, same=_same_sample,
                     forbidden=(reference_sample, Sampler) + _engine("sample", "draw", "draw_rows"),
                     keep=("sample", fn))


LAB = Lab(3, "sampling",
          exports=("check_min_p", "check_top_k", "check_top_p", "check_repetition_penalty", "check_sample",
                   "reference_sample"),
          pieces={"sample": "reference_sample"},
          fallbacks={"check_min_p": engine.apply_min_p, "check_top_k": engine.apply_top_k,
                     "check_top_p": engine.apply_top_p, "check_repetition_penalty": engine.apply_repetition_penalty,
                     "check_sample": reference_sample})
