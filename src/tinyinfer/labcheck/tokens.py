"""Lab 1 (tokens): checks for the BPE piece encoder, token counting and
comparing tokenizers."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from .core import Case, _report

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
    from ..tokenizer import get_tiktoken_encoding

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
    import regex

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


def check_bpe_encode_piece(encode_piece) -> bool:
    """encode_piece(piece: bytes, ranks: dict[bytes, int]) -> list[int], against tiktoken."""
    return _report("bpe_encode_piece", encode_piece, lambda: _toy_bpe_cases() + _cl100k_bpe_cases())


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
    from ..tokenizer import TiktokenTokenizer

    return {"cl100k": TiktokenTokenizer("cl100k_base"), "chars": _CharTokenizer(), "words": _WordTokenizer()}


COUNT_TEXTS = ["", "Hello, world!", "  two  spaces  ", "antidisestablishmentarianism", "x = [1, 2, 3]\n", "日本語のテキスト"]


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
    for name, tok in _tokenizers().items():
        for text in COUNT_TEXTS:
            cases.append(Case((text, tok), reference_count_tokens(text, tok), f"text={text!r}, tokenizer={name}"))
    return cases


def check_count_tokens(count_tokens) -> bool:
    """count_tokens(text, tokenizer) -> int."""
    return _report("count_tokens", count_tokens, _count_cases)


def _compare_cases() -> list[Case]:
    toks = _tokenizers()
    texts = {"greeting": "Hello, world!", "code": "for i in range(10):\n    print(i)", "empty": ""}
    one = {"chars": toks["chars"]}
    return [
        Case((texts, toks), reference_compare_tokenizers(texts, toks), f"texts={texts}, tokenizers={list(toks)}"),
        Case(({"x": "abc"}, one), {"x": {"chars": 3}}, "texts={'x': 'abc'}, tokenizers=['chars']"),
    ]


def check_compare_tokenizers(compare_tokenizers) -> bool:
    """compare_tokenizers(texts: {name: text}, tokenizers: {name: tokenizer})
    -> {text name: {tokenizer name: token count}}."""
    return _report("compare_tokenizers", compare_tokenizers, _compare_cases)
