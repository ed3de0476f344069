"""Lab 1 (tokens): wrong implementations each check must reject, and the
reference each must accept, and the course answers each must refuse. Collected by tests/course/test_labs.py."""
from tinyinfer_course.text import bpe
from tinyinfer_course import labcheck


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


# --- one training step: plausible wrong versions


def _pairs(words, weighted=True):
    counts = {}
    for word, n in words.items():
        for pair in zip(word, word[1:]):
            counts[pair] = counts.get(pair, 0) + (n if weighted else 1)
    return counts


def _merge_left_to_right(word, pair):
    out, i = [], 0
    while i < len(word):
        if word[i:i + 2] == pair:
            out.append(pair[0] + pair[1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def _step(words, counts, choose, merge=_merge_left_to_right):
    if not counts:
        return None, dict(words)
    pair = choose(counts)
    return pair, {merge(word, pair): n for word, n in words.items()}


def _smallest_most_frequent(counts):
    return min(counts, key=lambda p: (-counts[p], p))


def _merge_ignores_counts(words):
    return _step(words, _pairs(words, weighted=False), _smallest_most_frequent)


def _merge_first_seen_on_ties(words):
    return _step(words, _pairs(words), lambda counts: max(counts, key=counts.get))  # minbpe's rule


def _merge_right_to_left(words):  # (a, a, a) becomes (a, aa)
    return _step(words, _pairs(words), _smallest_most_frequent, _right_to_left)


def _right_to_left(word, pair):
    out, i = [], len(word)
    while i > 0:
        if i >= 2 and word[i - 2:i] == pair:
            out.insert(0, pair[0] + pair[1])
            i -= 2
        else:
            out.insert(0, word[i - 1])
            i -= 1
    return tuple(out)


def _merge_in_place(words):
    counts = _pairs(words)
    if not counts:
        return None, words
    pair = _smallest_most_frequent(counts)
    for word in list(words):
        words[_merge_left_to_right(word, pair)] = words.pop(word)
    return pair, words


def _merge_counts_pairs_once_per_word(words):
    counts = {}
    for word, n in words.items():
        for pair in set(zip(word, word[1:])):  # "aaa" holds (a, a) twice, counted once
            counts[pair] = counts.get(pair, 0) + n
    return _step(words, counts, _smallest_most_frequent)


def _merge_loses_the_table_when_done(words):
    counts = _pairs(words)
    return _step(words, counts, _smallest_most_frequent) if counts else (None, {})  # loses the table


WRONG = {
    "check_bpe_encode_piece": [_greedy_left_to_right_bpe, _bpe_rightmost_on_ties, _raw_bytes],
    "check_bpe_merge_step": [_merge_ignores_counts, _merge_first_seen_on_ties, _merge_right_to_left,
                             _merge_in_place, _merge_counts_pairs_once_per_word, _merge_loses_the_table_when_done],
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


def _merge_step_by_sorting(words):
    # Every adjacent pair with its weighted count, sorted by (-count, pair); then
    # each word rebuilt by a left-to-right scan.
    counts = {}
    for word, n in words.items():
        for i in range(len(word) - 1):
            counts[word[i:i + 2]] = counts.get(word[i:i + 2], 0) + n
    if not counts:
        return None, dict(words)
    pair = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    new = {}
    for word, n in words.items():
        out, i = [], 0
        while i < len(word):
            if tuple(word[i:i + 2]) == pair:
                out, i = out + [word[i] + word[i + 1]], i + 2
            else:
                out, i = out + [word[i]], i + 1
        new[tuple(out)] = new.get(tuple(out), 0) + n
    return pair, new


def _tiktoken_piece(piece, ranks):
    return labcheck._cl100k()._encode_single_piece(piece)  # ignores the toy ranks, and is tiktoken's answer


def _engine_parts(words):  # writes the loop, borrows the engine's three parts
    pair = bpe.best_pair(bpe.count_pairs(words))
    return (None, dict(words)) if pair is None else (pair, {bpe.merge_pair(w, pair): n for w, n in words.items()})


def _train_one_merge(words):  # the engine's training loop, one step of it
    return bpe.merge_step(words)


def _last_merge_step(piece, ranks):
    return [ranks[p] for p in bpe.bpe_merge_steps(piece, ranks)[-1]]


REFERENCE = {
    "check_bpe_encode_piece": lambda: _bpe_by_lowest_rank,
    "check_bpe_merge_step": lambda: _merge_step_by_sorting,
}
ANSWERS = {
    "check_bpe_encode_piece": [bpe.bpe_encode_piece, _tiktoken_piece, _last_merge_step],
    "check_bpe_merge_step": [bpe.merge_step, _engine_parts, _train_one_merge],
}
