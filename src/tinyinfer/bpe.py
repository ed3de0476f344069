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
    `num_merges` times add the most frequent adjacent pair as a new token.
    Returns ranks usable by bpe_encode_piece and BPETokenizer."""
    ranks = {bytes([b]): b for b in range(256)}
    # Each distinct piece is stored once, with how often it occurs.
    words = Counter(tuple(bytes([b]) for b in p.encode("utf-8")) for p in regex.findall(pattern, text))
    for _ in range(num_merges):
        pairs = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break  # every piece is already a single token
        best = max(pairs, key=pairs.get)  # ties: the pair seen first wins
        # setdefault: two different pairs can spell the same bytes ("a"+"bc",
        # "ab"+"c"); the token keeps the rank it got first.
        ranks.setdefault(best[0] + best[1], len(ranks))
        words = Counter({_merge(word, best): n for word, n in words.items()})
    return ranks


def _merge(word: tuple[bytes, ...], pair: tuple[bytes, bytes]) -> tuple[bytes, ...]:
    """Replace every occurrence of `pair` in `word`, left to right."""
    out, i = [], 0
    while i < len(word):
        if word[i : i + 2] == pair:
            out.append(pair[0] + pair[1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)
