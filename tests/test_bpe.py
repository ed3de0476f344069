"""The readable BPE in tinyinfer.bpe must give exactly tiktoken's ids."""
import pytest

from tinyinfer.bpe import BPETokenizer, bpe_encode_piece, train_bpe
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
