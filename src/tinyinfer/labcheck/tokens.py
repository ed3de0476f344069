"""Lab 1 (tokens): checks for the BPE piece encoder, token counting and
comparing tokenizers."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import regex

from .. import bpe
from ..tokenizer import TiktokenTokenizer, get_tiktoken_encoding
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


class _CharTokenizer:
    """One token per character: a stand-in that catches a counter which
    ignores the tokenizer it is given."""

    def encode(self, text: str) -> list[int]:
        return [ord(ch) for ch in text]


class _WordTokenizer:
    """One token per whitespace-separated word."""

    def encode(self, text: str) -> list[int]:
        return [len(word) for word in text.split()]


def _tokenizers() -> dict[str, Any]:
    return {"cl100k": TiktokenTokenizer("cl100k_base"), "chars": _CharTokenizer(), "words": _WordTokenizer()}


# text -> its token count under (cl100k, chars, words). cl100k's counts are
# tiktoken's, written out (tests/test_labs.py recomputes them); the other two
# are the characters and the whitespace-separated words, counted by hand.
COUNTS = {
    "": (0, 0, 0),
    "Hello, world!": (4, 13, 2),
    "  two  spaces  ": (5, 15, 2),
    "antidisestablishmentarianism": (6, 28, 1),
    "x = [1, 2, 3]\n": (11, 14, 5),
    "日本語のテキスト": (8, 8, 1),
}
COUNT_TEXTS = list(COUNTS)


def reference_count_tokens(text: str, tokenizer) -> int:
    """The course's answer to lab 1's count_tokens exercise."""
    return len(tokenizer.encode(text))


def reference_compare_tokenizers(texts: dict[str, str], tokenizers: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The course's answer to lab 1's compare_tokenizers exercise."""
    return {
        text_name: {tok_name: reference_count_tokens(text, tok) for tok_name, tok in tokenizers.items()}
        for text_name, text in texts.items()
    }


def _count_cases() -> list[Case]:
    cases = []
    for k, (name, tok) in enumerate(_tokenizers().items()):
        for text, counts in COUNTS.items():
            cases.append(Case((text, tok), counts[k], f"text={text!r}, tokenizer={name}"))
    return cases


def check_count_tokens(count_tokens) -> bool:
    """count_tokens(text, tokenizer) -> int."""
    return run_check("count_tokens", count_tokens, _count_cases, forbidden=(reference_count_tokens,))


# The compare check's texts, with their counts under (cl100k, chars, words), as above.
COMPARE_TEXTS = {"greeting": ("Hello, world!", (4, 13, 2)),
                 "code": ("for i in range(10):\n    print(i)", (11, 32, 5)),
                 "empty": ("", (0, 0, 0))}


def _compare_cases() -> list[Case]:
    toks = _tokenizers()
    texts = {name: text for name, (text, _) in COMPARE_TEXTS.items()}
    table = {name: dict(zip(toks, counts)) for name, (_, counts) in COMPARE_TEXTS.items()}
    one = {"chars": toks["chars"]}
    return [
        Case((texts, toks), table, f"texts={texts}, tokenizers={list(toks)}"),
        Case(({"x": "abc"}, one), {"x": {"chars": 3}}, "texts={'x': 'abc'}, tokenizers=['chars']"),
    ]


def check_compare_tokenizers(compare_tokenizers) -> bool:
    """compare_tokenizers(texts: {name: text}, tokenizers: {name: tokenizer})
    -> {text name: {tokenizer name: token count}}."""
    return run_check("compare_tokenizers", compare_tokenizers, _compare_cases,
                     forbidden=(reference_compare_tokenizers, reference_count_tokens))


LAB = Lab(1, "tokens",
          exports=("check_bpe_encode_piece", "check_count_tokens", "check_compare_tokenizers",
                   "reference_count_tokens", "reference_compare_tokenizers", "_cl100k"),
          pieces={"encode_piece": None},
          fallbacks={"check_bpe_encode_piece": bpe.bpe_encode_piece, "check_count_tokens": reference_count_tokens,
                     "check_compare_tokenizers": reference_compare_tokenizers})
