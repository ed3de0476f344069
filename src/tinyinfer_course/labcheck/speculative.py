"""Lab 9 (speculative decoding): the accept/reject step of speculative decoding.

The learner writes fn(target_probs, draft_probs, draft_tokens, generator) ->
(tokens, num_accepted), the contract of tinyinfer_course.speculative.accept_draft_tokens.
Two kinds of cases check it:

- exact ones, where the rule leaves nothing to chance: a one-hot target (greedy
  decoding) keeps exactly the drafts that equal its argmax; a draft identical
  to the target is always kept in full;
- statistical ones: over thousands of seeded trials on a 6-token vocabulary,
  the token at every output position must follow the target's distribution
  (a chi-square test). This is what tells the correct residual max(0, p - q)
  apart from plausible wrong ones, which pass every exact case.
"""
from __future__ import annotations

import operator

import torch

from tinyinfer_course.speculative import accept_draft_tokens as reference_accept_draft_tokens
from tinyinfer_course.speculative import verify
from .core import Case, run_check
from .registry import Lab

# Target rows p_0..p_3 and draft rows q_0..q_2 for k = 3 drafted positions.
P = torch.tensor([[0.40, 0.25, 0.15, 0.10, 0.06, 0.04],
                  [0.05, 0.05, 0.10, 0.20, 0.30, 0.30],
                  [0.30, 0.10, 0.10, 0.10, 0.10, 0.30],
                  [0.10, 0.50, 0.10, 0.10, 0.10, 0.10]])
Q = torch.tensor([[0.10, 0.10, 0.20, 0.30, 0.20, 0.10],
                  [0.20, 0.20, 0.20, 0.20, 0.10, 0.10],
                  [0.25, 0.15, 0.10, 0.10, 0.15, 0.25]])
TRIALS = 3000
# 99.99% quantile of the chi-square distribution with 6 - 1 = 5 degrees of
# freedom: a correct rule exceeds it at one position once in 10,000 runs, while
# the wrong rules below score in the hundreds.
CHI2_CRITICAL = 25.74


class ChiSquare(list):
    """Per-position chi-square statistics, printed readably in a failure message."""

    def __repr__(self):
        return "chi-square per output position: " + ", ".join(
            f"#{j} {x:.1f}" + (" (too far from p)" if x >= CHI2_CRITICAL else "") for j, x in enumerate(self))


def _call(fn, p, q, drafts, generator):
    """Run fn once; return (tokens, num_accepted) as plain ints, or a string
    saying what is wrong with the shape of the answer (it then fails the case)."""
    result = fn(p, q, list(drafts), generator)
    try:
        tokens, n = result
        tokens, n = [operator.index(t) for t in tokens], operator.index(n)
    except (TypeError, ValueError):
        return f"{result!r}: expected a pair (list of token ids, num_accepted)"
    if len(tokens) != n + 1:
        return f"{len(tokens)} tokens for num_accepted={n}: expected num_accepted + 1 (the kept drafts, then one more)"
    if tokens[:n] != list(drafts[:n]):
        return f"tokens {tokens} do not start with the {n} accepted drafts {list(drafts[:n])}"
    return tokens, n


# ---------------------------------------------------------------- exact cases


def _greedy_cases() -> list[Case]:
    # A one-hot target is what temperature 0 gives: its argmax per position is 2, 4, 1 and the bonus 5.
    one_hot = torch.eye(6)[[2, 4, 1, 5]]
    rows = [
        ([2, 4, 1], None, ([2, 4, 1, 5], 3), "all three drafts equal the argmax: keep them, then the bonus token"),
        ([2, 3, 1], None, ([2, 4], 1), "the second draft is wrong: keep one, then the target's own choice"),
        ([0, 4, 1], None, ([2], 0), "the first draft is wrong: nothing kept, the target's choice instead"),
        ([], None, ([2], 0), "k = 0, no drafts: plain decoding, one token from p_0"),
        ([2, 4], "one-hot", ([2, 4, 1], 2), "a one-hot draft distribution on the same tokens"),
        ([2, 0, 0], "one-hot", ([2, 4], 1), "a one-hot draft distribution, wrong at the second position"),
    ]
    cases = []
    for drafts, q_kind, expected, note in rows:
        k = len(drafts)
        q = torch.eye(6)[drafts] if q_kind == "one-hot" and k else None
        show = (f"target_probs = one-hot on [2, 4, 1, 5][:{k + 1}], draft_probs = "
                f"{'one-hot on the drafts' if q is not None else 'None'}, draft_tokens = {drafts}  ({note})")
        cases.append(Case((one_hot[: k + 1], q, drafts, 0), expected, show))
    return cases


def _identical_cases() -> list[Case]:
    # p == q: every draft must be kept (u * q(x) < p(x) holds for any u < 1).
    trials = 100
    return [Case(("identical", trials, 0), f"num_accepted = 3 in {trials} of {trials} trials",
                 f"draft_probs equal to target_probs[:3] (k = 3), {trials} seeded drafts sampled from it: "
                 "every num_accepted must be 3")]


def _run_exact(fn, p, q, drafts, seed):
    return _call(fn, p, q, drafts, torch.Generator().manual_seed(seed))


def _run_identical(fn, trials, seed):
    g = torch.Generator().manual_seed(seed)
    accepted = []
    for _ in range(trials):
        drafts = [int(torch.multinomial(row, 1, generator=g)) for row in P[:3]]
        out = _call(fn, P, P[:3].clone(), drafts, g)
        if isinstance(out, str):
            return out
        accepted.append(out[1])
    return f"num_accepted = 3 in {sum(n == 3 for n in accepted)} of {trials} trials"


# ---------------------------------------------------------------- the distribution test


def _chi_square(tokens: list[int], probs: torch.Tensor) -> float:
    observed = torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=probs.numel()).double()
    expected = probs.double() * observed.sum()
    return float(((observed - expected) ** 2 / expected).sum())


def _run_distribution(fn, draft_kind: str, trials: int, seed: int):
    """Draw drafts (from q, or fixed ones for a deterministic draft), apply fn,
    and test each output position's tokens against p at that position."""
    g = torch.Generator().manual_seed(seed)
    outs = []
    # A learner's code may draw from torch's global generator instead of `generator`:
    # seed that too, inside fork_rng so the notebook's own random state is left alone.
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for _ in range(trials):
            if draft_kind == "sampled":
                q = Q
                drafts = [int(torch.multinomial(row, 1, generator=g)) for row in Q]
            else:  # n-gram style: q is one-hot on fixed guesses, passed as None
                q, drafts = None, [0, 4, 5]
            out = _call(fn, P, q, drafts, g)
            if isinstance(out, str):
                return out
            outs.append(out[0])
    return ChiSquare(_chi_square([o[j] for o in outs if len(o) > j], P[j]) for j in range(len(P)))


def _distribution_cases() -> list[Case]:
    expected = f"chi-square below {CHI2_CRITICAL} (99.99% quantile, 5 degrees of freedom) at every position"
    return [
        Case(("sampled", TRIALS, 0), expected,
             f"{TRIALS} seeded trials, 6-token vocabulary, k = 3 drafts sampled from draft_probs q: "
             "the token at every output position must follow target_probs p there"),
        Case(("deterministic", TRIALS, 1), expected,
             f"{TRIALS} seeded trials, draft_probs = None (one-hot on the drafts [0, 4, 5]): "
             "the token at every output position must follow target_probs p there"),
    ]


def _same(got, expected) -> bool:
    if isinstance(expected, str) and expected.startswith("chi-square below"):  # a distribution case
        return isinstance(got, ChiSquare) and len(got) == len(P) and max(got) < CHI2_CRITICAL
    return got == expected


def _cases() -> list[Case]:
    exact = [Case(("exact",) + c.args, c.expected, c.show) for c in _greedy_cases()]
    return exact + _identical_cases() + _distribution_cases()


def check_accept_draft_tokens(fn) -> bool:
    """fn(target_probs [k+1, V], draft_probs [k, V] or None, draft_tokens, generator)
    -> (tokens, num_accepted), with len(tokens) == num_accepted + 1."""
    def run(kind, *args):  # each case's first argument says which kind of test it is
        if kind == "exact":
            return _run_exact(fn, *args)
        if kind == "identical":
            return _run_identical(fn, *args)
        return _run_distribution(fn, kind, *args)

    # labcheck's reference is the engine's own function (tinyinfer_course.speculative.verify).
    return run_check("accept_draft_tokens", run, _cases, same=_same,
                     forbidden=(reference_accept_draft_tokens, verify.accept_draft_tokens))


LAB = Lab(9, "the toolbox: speculative decoding",
          exports=("check_accept_draft_tokens", "reference_accept_draft_tokens"),
          fallbacks={"check_accept_draft_tokens": reference_accept_draft_tokens})
