"""Lab 1 (tokens): checks for the BPE piece encoder and one training step of BPE."""
from __future__ import annotations

from functools import lru_cache
import regex

from ..text import bpe
from tinyinfer.tokenizer import get_tiktoken_encoding
from .core import Case, run_check
from .registry import Lab

# ---------------------------------------------------------------- lab 1: tokens

# Text that exercises every branch of cl100k's pre-tokenizer: words, fragments,
# contractions, digits, punctuation, code, whitespace runs, several scripts, emoji.
BPE_CORPUS = [
    "antidisestablishmentarianism",
    "Tokenization splits unbelievably long words into familiar fragments.",
    "It's 3:45pm; they'll arrive at 12345 Main St. (apt #7)!",
    "def greet(name):\n    return f'Hello, {name}!'\n",
    "Les élèves préfèrent l'été à l'hiver.",
    "Die Straßenbahnhaltestelle ist geschlossen.",
    "推理就是用训练好的模型生成回答。",
    "emoji 🙂🚀👩‍💻 and spaces     then\t\ttabs\n\n\nnewlines",
]


@lru_cache(maxsize=1)
def _cl100k():
    return get_tiktoken_encoding("cl100k_base")


def _toy_bpe_cases() -> list[Case]:
    # Small rank tables where the order of merges matters, so a wrong loop
    # fails here first, with a message small enough to read.
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"bc": 3, b"ab": 4}
    runs = {b"a": 0, b"aa": 1, b"aaa": 2}
    return [
        Case((b"abc", ranks), [0, 3], f"piece=b'abc', ranks={ranks}  (lowest rank first, not leftmost)"),
        Case((b"cab", ranks), [2, 4], f"piece=b'cab', ranks={ranks}"),
        Case((b"c", ranks), [2], f"piece=b'c', ranks={ranks}"),
        Case((b"aaaaa", runs), [1, 2], f"piece=b'aaaaa', ranks={runs}  (a tie: the leftmost pair wins)"),
    ]


def _cl100k_bpe_cases() -> list[Case]:
    enc = _cl100k()
    cases, seen = [], set()
    for text in BPE_CORPUS:
        for piece in regex.findall(enc._pat_str, text):
            piece = piece.encode("utf-8")
            if piece not in seen:
                seen.add(piece)
                expected = enc._encode_single_piece(piece)
                cases.append(Case((piece, enc._mergeable_ranks), expected, f"piece={piece!r}, ranks=cl100k_base"))
    return cases


def _bpe_answers() -> tuple:
    """The course's own BPE encoders: the engine's, and tiktoken's Python entry
    to its piece encoder (its Rust core is reached only through that method)."""
    answers = (bpe.bpe_encode_piece, bpe.bpe_merge_steps, bpe._lowest_rank_pair)
    try:
        import tiktoken

        return answers + (tiktoken.Encoding._encode_single_piece,)
    except (ImportError, AttributeError):
        return answers


def check_bpe_encode_piece(encode_piece) -> bool:
    """encode_piece(piece: bytes, ranks: dict[bytes, int]) -> list[int], against
    hand-made toy tables and tiktoken. Kept as "encode_piece" on a pass."""
    return run_check("bpe_encode_piece", encode_piece, lambda: _toy_bpe_cases() + _cl100k_bpe_cases(),
                     forbidden=_bpe_answers(), keep=("encode_piece", encode_piece))


# ------------------------------------------------- one training step of BPE

def _w(*parts: str) -> tuple[bytes, ...]:
    return tuple(part.encode("utf-8") for part in parts)


def _chars(word: str) -> tuple[bytes, ...]:
    return tuple(bytes([b]) for b in word.encode("utf-8"))


# (word table, why the case exists). Each table is consistent: every word is
# split the way the same merges would split it, as in real training.
SENNRICH = {_chars("low"): 5, _chars("lower"): 2, _chars("newest"): 6, _chars("widest"): 3}
MERGE_CASES = [
    (SENNRICH, "Sennrich et al.'s example: (e, s) and (s, t) both occur 9 times; the tie goes to the "
               "smaller pair in byte order"),
    ({_chars("ab"): 1, _chars("cd"): 3}, "a pair counts once per occurrence of its word: (c, d) 3 times, (a, b) once"),
    ({_chars("xy"): 2, _chars("ab"): 2}, "a tie: the smaller pair in byte order wins, not the one seen first"),
    ({_chars("ac"): 1, _chars("ab"): 1}, "a tie on the first part: the second part decides"),
    ({_chars("aaa"): 1}, "left to right, no overlaps: (a, a, a) becomes (aa, a)"),
    ({_chars("aaaa"): 1}, "(a, a, a, a) becomes (aa, aa)"),
    ({_chars("zzz"): 1, _chars("ab"): 1}, "zzz holds (z, z) at two positions: it counts twice and beats (a, b)"),
    ({_chars("abcab"): 2}, "the pair twice in one word: both are merged"),
    ({_w(" th", "e"): 4, _w(" th", "en"): 2, _w("en", "d"): 3}, "parts of several bytes, and a word that "
                                                                "becomes one part"),
    ({_w(" the"): 4, _w("end"): 3, _chars("a"): 1}, "no word has two parts left: nothing to merge"),
    ({}, "an empty table"),
]
# Real text: the course's corpus as training sees it, after 0, 5 and 40 steps.
MERGE_TEXT = " ".join(BPE_CORPUS[:6])


class _Merge:
    """What a merge step returned, compared as (pair, table) with the table's
    order ignored; shown small enough to read."""

    def __init__(self, pair, words):
        self.pair, self.words = pair, words

    def __eq__(self, other):
        return isinstance(other, _Merge) and self.pair == other.pair and self.words == other.words

    def __repr__(self):
        words = self.words
        if isinstance(words, dict) and len(words) > 6:
            return f"(pair {self.pair!r}, a table of {len(words)} words)"
        return f"(pair {self.pair!r}, {words!r})"


class _Changed:
    def __repr__(self):
        return "<the table you were given was changed: return a new one and leave the argument alone>"


def _merge_probe(words: dict):
    def probe(fn):
        given = {word: count for word, count in words.items()}
        out = fn(given)
        if given != words:
            return _Changed()
        if not (isinstance(out, tuple) and len(out) == 2):
            return f"not a (pair, table) tuple: {out!r}"[:200]
        pair, table = out
        return _Merge(pair, dict(table) if isinstance(table, dict) else table)
    return probe


def _merge_cases() -> list[Case]:
    cases = []
    for words, why in MERGE_CASES:
        pair, table = bpe.merge_step(words)
        cases.append(Case((_merge_probe(words),), _Merge(pair, table), f"words={words}  ({why})"))
    words = bpe.word_counts(MERGE_TEXT)
    for step in range(41):
        if step in (0, 5, 40):
            pair, table = bpe.merge_step(words)
            cases.append(Case((_merge_probe(words),), _Merge(pair, table),
                              f"the lab's corpus ({len(words)} distinct pieces) after {step} merges"))
        words = bpe.merge_step(words)[1]
    return cases


def check_bpe_merge_step(merge_step) -> bool:
    """merge_step(words: {tuple of parts: count}) -> (the pair merged, the new
    table), or (None, the same table) when nothing is left to merge: count every
    adjacent pair weighted by its word's count, take the most frequent (ties:
    the smallest pair in byte order), merge it everywhere, left to right.
    Against tinyinfer_course.text.bpe.merge_step, on hand-made tables and real text."""
    return run_check("bpe_merge_step", lambda probe: probe(merge_step), _merge_cases,
                     forbidden=(bpe.merge_step, bpe.count_pairs, bpe.best_pair, bpe.merge_pair, bpe.train_bpe))


LAB = Lab(1, "tokens",
          exports=("check_bpe_encode_piece", "check_bpe_merge_step", "_cl100k"),
          pieces={"encode_piece": None},
          fallbacks={"check_bpe_encode_piece": bpe.bpe_encode_piece, "check_bpe_merge_step": bpe.merge_step})
