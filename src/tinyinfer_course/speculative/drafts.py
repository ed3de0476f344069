"""Two drafts that guess the next k tokens cheaply.

Each draft has the same two methods:
  start(capacity)                               a new request begins
  propose(context, k, params, generator)        -> (tokens, probs [len(tokens), V] or None)
`probs` are the distributions the tokens were drawn from (q in the acceptance
rule); None means the draft is deterministic, i.e. q is one-hot on each token.
A draft may return fewer than k tokens (even none): the verifying pass then
simply checks fewer.
"""
from __future__ import annotations

import torch

from tinyinfer.forward import forward_tokens, new_cache
from tinyinfer.kv_cache import KVCache
from tinyinfer.sampling import SamplingParams, draw, processed_probs


class NgramDraft:
    """Prompt lookup: if the last n tokens already occurred earlier in the prompt
    or the output, guess that what followed them then follows them again.

    It costs no model at all, and it shines where text repeats: code that reuses
    names, answers that quote the prompt, edits of a given document. Longer
    matches (n = prompt_lookup_max) are tried first, as they are better evidence."""

    def __init__(self, prompt_lookup_max: int = 3, prompt_lookup_min: int = 1):
        self.prompt_lookup_max = prompt_lookup_max
        self.prompt_lookup_min = prompt_lookup_min
        self.num_forward_passes = 0  # never runs a model

    def start(self, capacity: int) -> None:
        pass  # no state between steps: every lookup reads the whole context afresh

    def propose(self, context: list[int], k: int, params: SamplingParams, generator=None):
        for n in range(self.prompt_lookup_max, self.prompt_lookup_min - 1, -1):
            if len(context) <= n:
                continue
            pattern = context[-n:]
            # Scan backwards so the most recent earlier occurrence wins; the match
            # at the very end is the pattern itself and is skipped.
            for i in range(len(context) - n - 1, -1, -1):
                if context[i : i + n] == pattern:
                    return context[i + n : i + n + k], None
        return [], None


class LayerDraft:
    """Self-speculation: the target's own first `num_layers` layers, followed by
    its final norm and LM head, act as a smaller model. It needs no extra
    weights, only its own (smaller) KV cache for those layers.

    Its guesses are worse than the full model's, since the later layers never
    get to refine them, but each costs about num_layers / num_hidden_layers of a
    target pass."""

    def __init__(self, model, num_layers: int):
        self.model = model
        self.num_layers = num_layers
        self.cache: KVCache | None = None
        self.cached: list[int] = []  # tokens whose keys/values sit in cache columns 0, 1, ...
        self.num_forward_passes = 0

    def start(self, capacity: int) -> None:
        self.cache = new_cache(self.model, capacity, num_layers=self.num_layers)  # its layers only
        self.cached = []
        self.num_forward_passes = 0

    def propose(self, context: list[int], k: int, params: SamplingParams, generator=None):
        # Keep the cached columns that still agree with the context (tokens that
        # were proposed and then accepted); re-read the rest in one pass. At least
        # the last token is fed, because its logits give the first guess.
        valid = min(_common_prefix(self.cached, context), len(context) - 1)
        feed, tokens, probs = context[valid:], [], []
        for _ in range(k):
            logits = forward_tokens(self.model, feed, valid, self.cache, self.num_layers)[-1]
            self.num_forward_passes += 1
            self.cached = self.cached[:valid] + feed
            seen = (torch.tensor(sorted(set(context + tokens)), device=logits.device)  # the penalty's tokens
                    if params.repetition_penalty != 1.0 else None)
            q = processed_probs(logits, params, seen)
            token = int(torch.argmax(q)) if params.greedy else draw(q, generator)
            tokens.append(token)
            probs.append(q)
            valid, feed = valid + len(feed), [token]
        return tokens, (torch.stack(probs) if probs else None)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
