"""The accept/reject rule of speculative sampling (Leviathan et al. 2023;
Chen et al. 2023), as one pure function.

The draft proposed tokens x_1..x_k, drawing x_i from its distribution q_i. The
target then scored the same positions and gave p_1..p_{k+1}. Walking left to right:

  accept x_i with probability min(1, p_i(x_i) / q_i(x_i));
  on the first rejection, draw a replacement from norm(max(0, p_i - q_i)) and stop;
  if all k are accepted, draw one bonus token from p_{k+1}.

Why this is exact: a token y comes out at position i either because the draft
proposed it and it was kept, with probability q(y) * min(1, p(y)/q(y)) =
min(p(y), q(y)), or because a rejection (probability 1 - sum_y min(p, q)) was
followed by drawing y from the leftover mass max(0, p - q), normalised. The
leftover mass sums to exactly that rejection probability, so the two add up to
min(p, q)(y) + max(0, p - q)(y) = p(y). Every output token is distributed as if
the target alone had sampled it; the draft only changes how many tokens each
target pass yields.

A deterministic draft (n-gram lookup) has q = one-hot on its proposal: it is
kept with probability p(x), and a rejection redraws from p with x removed.
At temperature 0 the target's p is one-hot on its argmax too, so the rule
reduces to "keep x iff x == argmax p; else emit argmax p": plain greedy decoding.
"""
from __future__ import annotations

import operator

import torch

from tinyinfer.sampling import draw


def accept_draft_tokens(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, draft_tokens: list[int],
                        generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """Apply the rejection rule to k drafted tokens.

    target_probs [k+1, V]: the target's processed distributions (after
        temperature, top-k, top-p) at the k drafted positions and one past them.
    draft_probs [k, V]: the draft's processed distributions the tokens were drawn
        from, or None for a deterministic draft (q = one-hot on each proposal).
    draft_tokens: the k proposed token ids.

    Returns (tokens, num_accepted): the num_accepted leading draft tokens that
    were kept, followed by exactly one token drawn from the target (the
    replacement for the first rejected draft, or the bonus token), so
    len(tokens) == num_accepted + 1.
    """
    draft_tokens = _check_inputs(target_probs, draft_probs, draft_tokens)
    accepted: list[int] = []
    for i, x in enumerate(draft_tokens):
        p = target_probs[i]
        q = _one_hot(x, p) if draft_probs is None else draft_probs[i]
        # u < p(x)/q(x), written as u * q(x) < p(x) so q(x) = 0 cannot divide by zero.
        u = torch.rand((), generator=generator, device=_device(generator, p))
        if u * q[x] < p[x]:
            accepted.append(x)
            continue
        residual = torch.clamp(p - q, min=0)
        # Rejection implies p(x) < q(x), so p != q and the residual has mass; the
        # fallback only guards against rounding.
        if residual.sum() <= 0:
            residual = p
        accepted.append(draw(residual, generator))  # draw() normalises the weights itself
        return accepted, i
    accepted.append(draw(target_probs[len(draft_tokens)], generator))  # all kept: a free bonus token
    return accepted, len(draft_tokens)


def _one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q


def _device(generator: torch.Generator | None, like: torch.Tensor):
    return generator.device if generator is not None else like.device


def _check_inputs(target_probs, draft_probs, draft_tokens) -> list[int]:
    """Validate shapes and ids; return the ids as plain ints (a tensor or numpy row is fine)."""
    try:
        draft_tokens = [operator.index(t) for t in draft_tokens]
    except TypeError:
        raise ValueError(f"draft_tokens: expected a list of integer token ids, got {draft_tokens!r}") from None
    k = len(draft_tokens)
    if target_probs.dim() != 2 or target_probs.shape[0] != k + 1:
        raise ValueError(f"target_probs: expected shape [k+1, V] = [{k + 1}, V] for k={k} draft tokens, "
                         f"got {list(target_probs.shape)}")
    vocab = target_probs.shape[1]
    if draft_probs is not None and tuple(draft_probs.shape) != (k, vocab):
        raise ValueError(f"draft_probs: expected shape [k, V] = [{k}, {vocab}] or None, got {list(draft_probs.shape)}")
    if any(not 0 <= t < vocab for t in draft_tokens):
        raise ValueError(f"draft_tokens: every id must be in [0, {vocab - 1}], got {draft_tokens}")
    return draft_tokens
