"""Lab 1 (tokens): wrong implementations each check must reject, and the
reference each must accept, and the course answers each must refuse. Collected by tests/test_labs.py."""
from tinyinfer import bpe, labcheck


def _greedy_left_to_right_bpe(piece, ranks):
    # Merges the first mergeable pair it meets instead of the lowest rank.
    parts = [bytes([b]) for b in piece]
    i = 0
    while i < len(parts) - 1:
        if parts[i] + parts[i + 1] in ranks:
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
            i = 0
        else:
            i += 1
    return [ranks[p] for p in parts]


def _bpe_rightmost_on_ties(piece, ranks):
    parts = [bytes([b]) for b in piece]
    while True:
        candidates = [(ranks[parts[i] + parts[i + 1]], -i) for i in range(len(parts) - 1)
                      if parts[i] + parts[i + 1] in ranks]
        if not candidates:
            return [ranks[p] for p in parts]
        i = -min(candidates)[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def _raw_bytes(piece, ranks):
    return [ranks[bytes([b])] for b in piece]


WRONG = {
    "check_bpe_encode_piece": [_greedy_left_to_right_bpe, _bpe_rightmost_on_ties, _raw_bytes],
    "check_count_tokens": [
        lambda text, tok: len(tok.encode(text)) + 1,  # off by one
        lambda text, tok: len(text.split()),  # counts words
        lambda text, tok: len(labcheck._cl100k().encode(text, disallowed_special=())),  # ignores `tok`
    ],
    "check_compare_tokenizers": [
        # the table's two levels swapped: {tokenizer: {text: count}}
        lambda texts, toks: {n: {t: len(tok.encode(x)) for t, x in texts.items()} for n, tok in toks.items()},
        # characters instead of tokens
        lambda texts, toks: {t: {n: len(x) for n in toks} for t, x in texts.items()},
    ],
}


# --- correct implementations written here, independently of labcheck and the engine


def _bpe_by_lowest_rank(piece, ranks):
    # Each round, scan the pairs and remember the lowest rank; stop when no pair is a token.
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while True:
        ranked = [(ranks[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:])) if a + b in ranks]
        if not ranked:
            return [ranks[p] for p in parts]
        _, i = min(ranked)  # lowest rank, then the leftmost position
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


def _count(text, tok):
    return sum(1 for _ in tok.encode(text))


def _compare(texts, toks):
    return {t: {n: sum(1 for _ in tok.encode(x)) for n, tok in toks.items()} for t, x in texts.items()}


def _tiktoken_piece(piece, ranks):
    return labcheck._cl100k()._encode_single_piece(piece)  # ignores the toy ranks, and is tiktoken's answer


def _last_merge_step(piece, ranks):
    return [ranks[p] for p in bpe.bpe_merge_steps(piece, ranks)[-1]]


REFERENCE = {
    "check_bpe_encode_piece": lambda: _bpe_by_lowest_rank,
    "check_count_tokens": lambda: _count,
    "check_compare_tokenizers": lambda: _compare,
}
ANSWERS = {
    "check_bpe_encode_piece": [bpe.bpe_encode_piece, _tiktoken_piece, _last_merge_step],
    "check_count_tokens": [labcheck.reference_count_tokens],
    "check_compare_tokenizers": [labcheck.reference_compare_tokenizers],
}
