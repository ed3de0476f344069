"""The readable BPE in tinyinfer_course.text.bpe must give exactly tiktoken's ids."""
import pytest

from tinyinfer_course.text.bpe import BPETokenizer, bpe_encode_piece, train_bpe
from tinyinfer.tokenizer import get_tiktoken_encoding

CORPUS = [
    "antidisestablishmentarianism",
    "The quick brown fox jumps over the lazy dog.",
    "It's, they'll, we've, I'm, you'd, DON'T, SHE'LL",
    "def f(x):\n    return x ** 2  # square\n\n\nprint(f(12345678))",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "Le café est déjà prêt, n'est-ce pas ? Où êtes-vous ?",
    "Grüße aus Köln: Straßenbahnhaltestelle",
    "大语言模型的推理是如何工作的？",
    "Привет, мир! こんにちは世界",
    "emoji 🙂🚀👩‍👩‍👧 and flags 🇫🇷🇩🇪",
    "   leading spaces, trailing spaces   ",
    "tabs\tand\t\tnewlines\n\n\n\r\nand   \n  mixed \u00a0nbsp",
    "<|endoftext|> typed by a user is just text <|im_end|>",
    "numbers: 1 12 123 1234 12345 3.14159 1,000,000",
    "URLs https://example.com/a?b=c&d=e#frag",
    "",
    " ",
    "\n",
    "a" * 100,
    "ab" * 60,
]


@pytest.fixture(scope="module")
def enc():
    return get_tiktoken_encoding("cl100k_base")


@pytest.fixture(scope="module")
def bpe(enc):
    return BPETokenizer.from_tiktoken(enc)


@pytest.mark.parametrize("text", CORPUS)
def test_encode_equals_tiktoken(bpe, enc, text):
    assert bpe.encode(text) == enc.encode(text, disallowed_special=())


@pytest.mark.parametrize("text", CORPUS)
def test_decode_round_trips(bpe, text):
    assert bpe.decode(bpe.encode(text)) == text


def test_documented_example(bpe):
    ids = bpe.encode("antidisestablishmentarianism")
    assert ids == [519, 85342, 34500, 479, 8997, 2191]
    assert [bpe.decode([i]) for i in ids] == ["ant", "idis", "establish", "ment", "arian", "ism"]


def test_piece_encoder_equals_tiktoken(enc):
    for piece in [b" hello", b"antidisestablishmentarianism", "🙂".encode(), b"   ", b"\xff\xfe"]:
        assert bpe_encode_piece(piece, enc._mergeable_ranks) == enc._encode_single_piece(piece)


def test_special_tokens_only_when_allowed(bpe, enc):
    text = "hi<|endoftext|>there"
    assert 100257 not in bpe.encode(text)
    assert bpe.encode(text, allow_special=True) == enc.encode(text, allowed_special="all")
    assert bpe.decode(bpe.encode(text, allow_special=True)) == text


def test_vocab_size(bpe, enc):
    assert bpe.vocab_size == len(enc._mergeable_ranks) + len(enc._special_tokens)


def test_pieces_that_are_tokens_merge_to_one_id(enc):
    # tiktoken returns a piece's own id when the whole piece is a token; the
    # merge loop must reach the same id. Spot-check a spread of the vocabulary.
    ranks = enc._mergeable_ranks
    for token, rank in list(ranks.items())[::997]:
        assert bpe_encode_piece(token, ranks) == [rank]


def test_train_bpe_learns_frequent_pairs():
    text = "low lower lowest " * 20 + "new newer newest " * 10
    ranks = train_bpe(text, num_merges=8)
    assert len(ranks) == 256 + 8
    assert ranks[b"lo"] == 256 and b" low" in ranks  # the most frequent pairs come first
    tok = BPETokenizer(ranks, r" ?\w+|\s+")
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(" lowest")) < len(" lowest".encode())


def test_train_bpe_stops_when_nothing_is_left_to_merge():
    ranks = train_bpe("ab ab", num_merges=50)
    assert b"ab" in ranks and len(ranks) < 256 + 50


# --- one training step: a hand-worked case, the tie-break, and an independent version

from collections import Counter  # noqa: E402

from tinyinfer_course.text.bpe import best_pair, count_pairs, merge_pair, merge_step, word_counts  # noqa: E402


def _w(*parts: str):
    return tuple(p.encode() for p in parts)


def test_merge_step_on_sennrichs_example():
    # Sennrich et al. (2016), worked by hand: low x5, lower x2, newest x6, widest x3.
    # (e, s) and (s, t) both occur 6 + 3 = 9 times, more than any other pair;
    # the tie goes to the smaller pair in byte order, b"e" < b"s".
    words = {_w(*"low"): 5, _w(*"lower"): 2, _w(*"newest"): 6, _w(*"widest"): 3}
    pairs = count_pairs(words)
    assert pairs[(b"e", b"s")] == pairs[(b"s", b"t")] == 9 and pairs[(b"w", b"e")] == 8
    assert pairs[(b"l", b"o")] == pairs[(b"o", b"w")] == 7
    pair, merged = merge_step(words)
    assert pair == (b"e", b"s")
    assert merged == {_w(*"low"): 5, _w(*"lower"): 2, _w("n", "e", "w", "es", "t"): 6, _w("w", "i", "d", "es", "t"): 3}
    assert words[_w(*"newest")] == 6 and len(words) == 4  # the given table is not modified
    pair, merged = merge_step(merged)
    assert pair == (b"es", b"t") and _w("n", "e", "w", "est") in merged  # 9 again, now alone at the top


def test_merge_pair_is_left_to_right_without_overlaps():
    assert merge_pair(_w(*"aaa"), (b"a", b"a")) == _w("aa", "a")
    assert merge_pair(_w(*"aaaa"), (b"a", b"a")) == _w("aa", "aa")
    assert merge_pair(_w(*"abcab"), (b"a", b"b")) == _w("ab", "c", "ab")
    assert count_pairs({_w(*"aaa"): 2})[(b"a", b"a")] == 4  # every position counts, times the word's count


def test_best_pair_breaks_ties_by_byte_order_not_by_order_seen():
    assert best_pair(Counter({(b"x", b"y"): 2, (b"a", b"b"): 2, (b"q", b"r"): 1})) == (b"a", b"b")
    assert best_pair(Counter({(b"a", b"c"): 1, (b"a", b"b"): 1})) == (b"a", b"b")  # then the second part
    assert best_pair(Counter({(b"a", b"b"): 1, (b" ", b"t"): 1})) == (b" ", b"t")  # a space sorts before letters
    assert best_pair(Counter()) is None


def test_merge_step_stops_when_every_word_is_one_part():
    words = {_w("hello"): 3, _w(" world"): 1}
    assert merge_step(words) == (None, words)


def _independent_merge_step(words):
    # Written from the rule alone: count by scanning each word's byte string
    # positions, sort all pairs, then rebuild each word by a regex-free scan.
    counts = {}
    for word, n in words.items():
        for i in range(len(word) - 1):
            counts[word[i], word[i + 1]] = counts.get((word[i], word[i + 1]), 0) + n
    if not counts:
        return None, dict(words)
    top = max(counts.values())
    pair = sorted(p for p, c in counts.items() if c == top)[0]
    out = {}
    for word, n in words.items():
        parts, rest = [], list(word)
        while rest:
            if len(rest) > 1 and (rest[0], rest[1]) == pair:
                parts.append(rest.pop(0) + rest.pop(0))
            else:
                parts.append(rest.pop(0))
        out[tuple(parts)] = out.get(tuple(parts), 0) + n
    return pair, out


def test_merge_step_equals_an_independent_version_for_sixty_steps():
    words = word_counts(" ".join(CORPUS[:12]) + " the theme then there these " * 3)
    mine = theirs = words
    for _ in range(60):
        pair, mine = merge_step(mine)
        pair2, theirs = _independent_merge_step(theirs)
        assert pair == pair2 and mine == theirs


def test_train_bpe_ranks_are_the_merge_steps_in_order():
    text = "low lower lowest " * 20 + "new newer newest " * 10
    words, learned = word_counts(text), []
    for _ in range(8):
        pair, words = merge_step(words)
        learned.append(pair[0] + pair[1])
    ranks = train_bpe(text, num_merges=8)
    assert [t for t, r in sorted(ranks.items(), key=lambda kv: kv[1]) if r >= 256] == learned
