"""Byte-level BPE, small enough to read, that gives the same ids as tiktoken.

Encoding happens in two stages:
1. A regex cuts the text into pieces (roughly: words with their leading space,
   runs of digits, punctuation, whitespace). Merges never cross a piece
   boundary, so " cat" and " cats" share their start no matter what follows.
2. Each piece starts as single bytes. We repeatedly merge the adjacent pair
   whose merged bytes have the lowest rank, until no adjacent pair is in the
   vocabulary. A rank is both a token's id and its merge priority: training
   learned the low ranks first, so they are merged first.

Working on bytes rather than characters means any string (any language, emoji,
stray control characters) can be encoded: all 256 single bytes are tokens.

Training (train_bpe) runs the other way: it learns the ranks. Starting from the
256 bytes, each step counts every adjacent pair in the corpus, adds the most
frequent one as the next rank and merges it everywhere (merge_step).
"""
from __future__ import annotations

from collections import Counter

import regex

# GPT-2's pre-tokenizer pattern, a sensible default for train_bpe on toy text.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bpe_encode_piece(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """The heart of BPE: token ids for one pre-tokenized piece."""
    parts = [bytes([b]) for b in piece]
    while len(parts) > 1:
        i = _lowest_rank_pair(parts, ranks)
        if i is None:
            break  # no adjacent pair is a token: this piece is done
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    return [ranks[part] for part in parts]


def bpe_merge_steps(piece: bytes, ranks: dict[bytes, int]) -> list[list[bytes]]:
    """Every state bpe_encode_piece's loop passes through, for display."""
    steps = [[bytes([b]) for b in piece]]
    while (i := _lowest_rank_pair(steps[-1], ranks)) is not None:
        parts = steps[-1]
        steps.append(parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2 :])
    return steps


def _lowest_rank_pair(parts: list[bytes], ranks: dict[bytes, int]) -> int | None:
    """Index of the adjacent pair to merge next, or None. On a tie (the same
    pair twice) the leftmost wins, as in tiktoken."""
    best_i, best_rank = None, None
    for i in range(len(parts) - 1):
        rank = ranks.get(parts[i] + parts[i + 1])
        if rank is not None and (best_rank is None or rank < best_rank):
            best_i, best_rank = i, rank
    return best_i


class BPETokenizer:
    """encode/decode with a rank table and a pre-tokenizer regex."""

    def __init__(self, ranks: dict[bytes, int], pattern: str, special_tokens: dict[str, int] | None = None):
        self.ranks = ranks
        self.pattern = regex.compile(pattern)
        self.special_tokens = dict(special_tokens or {})
        # decode needs the reverse maps: id -> bytes.
        self.id_to_bytes = {i: b for b, i in ranks.items()}
        self.id_to_bytes.update({i: s.encode("utf-8") for s, i in self.special_tokens.items()})

    @classmethod
    def from_tiktoken(cls, enc) -> "BPETokenizer":
        """Reuse a tiktoken Encoding's data (ranks, regex, special tokens)."""
        return cls(enc._mergeable_ranks, enc._pat_str, enc._special_tokens)

    @property
    def vocab_size(self) -> int:
        return len(self.id_to_bytes)

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Ids for `text`. By default a special-token string such as
        "<|endoftext|>" inside the text is encoded as ordinary characters, so
        text from a user can never smuggle in a control token."""
        if not (allow_special and self.special_tokens):
            return self.encode_ordinary(text)
        # Split around special-token strings; the capture group keeps them.
        # Longest first, so a marker that contains another one wins.
        names = sorted(self.special_tokens, key=len, reverse=True)
        alternatives = "|".join(regex.escape(s) for s in names)
        ids = []
        for i, chunk in enumerate(regex.split(f"({alternatives})", text)):
            ids += [self.special_tokens[chunk]] if i % 2 else self.encode_ordinary(chunk)
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        ids = []
        for piece in self.pattern.findall(text):
            ids += bpe_encode_piece(piece.encode("utf-8"), self.ranks)
        return ids

    def decode_bytes(self, ids: list[int]) -> bytes:
        return b"".join(self.id_to_bytes[i] for i in ids)

    def decode(self, ids: list[int]) -> str:
        # A token can end in the middle of a multi-byte character; "replace"
        # shows such a cut as U+FFFD instead of raising, as tiktoken does.
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def train_bpe(text: str, num_merges: int, pattern: str = GPT2_PATTERN) -> dict[bytes, int]:
    """Learn a rank table from `text`: start from the 256 bytes, then
    `num_merges` times add the most frequent adjacent pair as a new token
    (merge_step). Returns ranks usable by bpe_encode_piece and BPETokenizer."""
    ranks = {bytes([b]): b for b in range(256)}
    words = word_counts(text, pattern)
    for _ in range(num_merges):
        pair, words = merge_step(words)
        if pair is None:
            break  # every piece is already a single token
        # setdefault: two different pairs can spell the same bytes ("a"+"bc",
        # "ab"+"c"); the token keeps the rank it got first.
        ranks.setdefault(pair[0] + pair[1], len(ranks))
    return ranks


# --- one training step, in three parts (lab 1 writes merge_step itself) ---------

Word = tuple[bytes, ...]  # a distinct piece of the corpus, as its current parts


def word_counts(text: str, pattern: str = GPT2_PATTERN) -> dict[Word, int]:
    """The corpus as training sees it: each distinct piece once, split into
    single bytes, with how often it occurs. Counting a frequent word once, with
    its count, is what makes training fast: the pairs of " the" are counted
    once per step, not once per occurrence."""
    return dict(Counter(tuple(bytes([b]) for b in p.encode("utf-8")) for p in regex.findall(pattern, text)))


def count_pairs(words: dict[Word, int]) -> Counter:
    """How often each adjacent pair of parts occurs, every position of every
    word counted, weighted by the word's count ("aaa" holds ("a", "a") twice)."""
    pairs = Counter()
    for word, count in words.items():
        for pair in zip(word, word[1:]):
            pairs[pair] += count
    return pairs


def best_pair(pairs: Counter) -> tuple[bytes, bytes] | None:
    """The most frequent pair; on a tie, the smallest one in byte order (Python's
    order of (bytes, bytes) tuples: first parts compared, then second parts).
    A stated rule, so that any implementation picks the same pair. "The pair
    seen first" (max() over a dict) would depend on the order the corpus was
    read in; Hugging Face's trainer breaks ties by its own token ids instead."""
    return min(pairs, key=lambda pair: (-pairs[pair], pair)) if pairs else None


def merge_pair(word: Word, pair: tuple[bytes, bytes]) -> Word:
    """Replace every occurrence of `pair` in `word`, left to right, without
    overlaps: ("a", "a", "a") becomes ("aa", "a")."""
    out, i = [], 0
    while i < len(word):
        if word[i : i + 2] == pair:
            out.append(pair[0] + pair[1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def merge_step(words: dict[Word, int]) -> tuple[tuple[bytes, bytes] | None, dict[Word, int]]:
    """One step of BPE training: count the pairs (count_pairs), choose the best
    (best_pair), merge it in every word (merge_pair). Returns (the pair, the new
    table), or (None, an unchanged copy) when no word has two parts left. The
    table given is not modified."""
    pair = best_pair(count_pairs(words))
    if pair is None:
        return None, dict(words)
    merged = Counter()
    for word, count in words.items():
        merged[merge_pair(word, pair)] += count  # two spellings of the same bytes would add up
    return pair, dict(merged)
