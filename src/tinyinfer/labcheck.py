"""The checks that lab notebooks call after each exercise.

Every check has the same shape: `check_<name>(student_fn) -> bool`. It runs the
learner's function on a list of cases, prints one line,

    ✓ <name>: N cases passed
    ✗ <name>: <the first failing case: input, expected, got>

and returns True or False. A check never raises: a stub's NotImplementedError,
or any other exception from the learner's code, is reported as a failure. That
way a lab notebook runs top to bottom in its unsolved state.

To add a check for a new lab, write a function that builds `Case`s (each with
the arguments, the expected answer, and a short description of the input for
the failure message) and pass them to `_report`.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

MAX_SHOWN = 300  # characters of a value shown in a failure message


@dataclass
class Case:
    args: tuple  # what the learner's function is called with
    expected: Any
    show: str  # the input, described for a human (args may be too big to print)


def _report(name: str, fn: Callable, make_cases: Callable[[], list[Case]], same=operator.eq) -> bool:
    """Run `fn` on every case; print ✓ or the first failure; return a bool."""
    try:
        cases = make_cases()
    except Exception as e:  # the course's fault, not the learner's; still never raise
        print(f"✗ {name}: could not build the test cases ({type(e).__name__}: {e})")
        return False
    for case in cases:
        try:
            got = fn(*case.args)
        except NotImplementedError as e:  # an untouched stub: no case worth showing
            print(f"✗ {name}: raised NotImplementedError: {_short(e)}")
            return False
        except Exception as e:
            print(f"✗ {name}: {case.show}\n    raised {type(e).__name__}: {_short(e)}")
            return False
        if not _safe_same(same, got, case.expected):
            print(f"✗ {name}: {case.show}\n    expected {_short(case.expected)}\n    got      {_short(got)}")
            return False
    print(f"✓ {name}: {len(cases)} cases passed")
    return True


def _safe_same(same, got, expected) -> bool:
    # A learner's odd return value (a numpy array, say) must not crash the comparison.
    try:
        return bool(same(got, expected))
    except Exception:
        return False


def _short(value) -> str:
    text = str(value) if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 5] + " ...]"


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
    from .tokenizer import get_tiktoken_encoding

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
    from .tokenizer import TiktokenTokenizer

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
