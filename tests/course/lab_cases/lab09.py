"""Lab 9 (speculative decoding): wrong accept/reject rules the check must
reject, a correct rule written here that it must accept, and the course's
answer (the engine's accept_draft_tokens) that it must refuse. Collected by tests/course/test_labs.py.

Each wrong rule returns well-formed answers; some pass every exact (greedy)
case and are caught only by the distribution test."""
import torch

from tinyinfer_course import labcheck
from tinyinfer_course import speculative


def _one_hot(x, like):
    q = torch.zeros_like(like)
    q[x] = 1.0
    return q


def _rule(residual, bonus_row=lambda k: k, accept=lambda u, px, qx: u * qx < px, bonus=True):
    """A family of accept/reject rules; the correct one has every default, and
    residual(p, q) = max(0, p - q). Each wrong rule below changes one piece."""
    def rule(target_probs, draft_probs, draft_tokens, generator=None):
        out = []
        for i, x in enumerate(draft_tokens):
            p = target_probs[i]
            q = _one_hot(x, p) if draft_probs is None else draft_probs[i]
            u = torch.rand((), generator=generator)
            if accept(u, p[x], q[x]):
                out.append(x)
                continue
            r = residual(p, q)
            out.append(int(torch.multinomial(r if r.sum() > 0 else p, 1, generator=generator)))
            return out, i
        k = len(draft_tokens)
        if bonus:
            out.append(int(torch.multinomial(target_probs[bonus_row(k)], 1, generator=generator)))
        return out, k
    return rule


_RESIDUAL = lambda p, q: torch.clamp(p - q, min=0)  # noqa: E731

WRONG = {
    "check_accept_draft_tokens": [
        # always accept: the output follows the draft's distribution, not the target's
        _rule(_RESIDUAL, accept=lambda u, px, qx: True),
        # on rejection, resample from p instead of max(0, p - q): passes every greedy case
        _rule(lambda p, q: p),
        # the bonus token drawn from the last drafted position's row instead of the next one (off by one)
        _rule(_RESIDUAL, bonus_row=lambda k: max(k - 1, 0)),
        # no bonus token when every draft is kept
        _rule(_RESIDUAL, bonus=False),
        # accept with probability p(x) alone, forgetting to divide by q(x)
        _rule(_RESIDUAL, accept=lambda u, px, qx: u < px),
        # the residual p - q without clamping negatives to 0 (multinomial then refuses it, or misweights)
        _rule(lambda p, q: (p - q).abs()),
    ],
}
REFERENCE = {
    # every default of _rule: accept with probability min(1, p/q), resample from max(0, p - q), a bonus token
    "check_accept_draft_tokens": lambda: _rule(_RESIDUAL),
}
ANSWERS = {
    "check_accept_draft_tokens": [labcheck.reference_accept_draft_tokens, speculative.accept_draft_tokens],
}
