"""Choosing what to send: a context selector, the simplest form of retrieval.

Every token of a prompt is processed on every request (chapter 10): a long
document pasted into each question costs its whole prefill every time, and its
KV cache for as long as the request lives. Retrieval sends only the pieces
that look relevant. Real systems rank pieces by embedding similarity or with a
search index (BM25); this selector ranks them by the words they share with the
question, which is enough to see what selection saves.

    chosen = select_context(chunks, question, budget_tokens=64,
                            count_tokens=lambda s: len(tok.encode(s)))
"""
from __future__ import annotations

import re
from typing import Callable

# Words that say nothing about which chunk is relevant.
STOPWORDS = frozenset(
    "a an and are at be by can do does for from how i in is it its me my of on or the this "
    "to was what when where which who why will with you your".split())


def words(text: str) -> set[str]:
    """The distinct lower-case words of a text (letters and digits), stopwords removed."""
    return set(re.findall(r"[a-z0-9]+", text.lower())) - STOPWORDS


def select_context(chunks: list[str], question: str, budget_tokens: int,
                   count_tokens: Callable[[str], int]) -> list[str]:
    """The chunks to send with a question, in their original order.

    Rank the chunks that share at least one word with the question by how many
    distinct words they share (ties: the earlier chunk first). Take them in that
    order while they fit in budget_tokens; a chunk that does not fit is skipped,
    and a smaller one further down may still fit."""
    wanted = words(question)
    scores = [len(words(chunk) & wanted) for chunk in chunks]
    ranked = sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: (-scores[i], i))
    chosen, used = [], 0
    for i in ranked:
        cost = count_tokens(chunks[i])
        if used + cost <= budget_tokens:
            chosen.append(i)
            used += cost
    return [chunks[i] for i in sorted(chosen)]
