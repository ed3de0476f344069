"""Expected answers of the labs' graded quizzes, computed out of sight.

A quiz's check cell grades the reader's number against one the course computes
(labcheck.grade_answer). Writing that computation in the check cell would print
the answer right under the question: JupyterLab folds a check cell's source in
the labs, but VS Code and Colab show it. So every quiz whose check would show
its formula, or call a given function with the question's own numbers, gets its
expected values here.

Each function returns {quiz name: {"expected": value, "explain": why}}, for
`labcheck.grade_answer(what, answer, **answers[name], rel_tol=...)`. The
explanation is shown only under a ✗, and says what the quantity counts and how
it is made up, never the run's numbers: only the first answer is graded, and
the expected value must not be one copy away (tests/course/test_labs.py runs
every function here with a wrong answer and looks for it).
"""
from __future__ import annotations

import math


def _mean(values) -> float:
    values = [float(v) for v in values]
    return sum(values) / len(values)


def tokenizers(technical_tokens: int, technical_words: int, chinese_tokens: dict) -> dict:
    """Lab 1: SmolLM2 tokens per 1,000 words of the technical text, from its
    token and word counts, and the tokenizer with fewer tokens for the Chinese
    message (`chinese_tokens`: {tokenizer: tokens})."""
    return {
        "technical": {"expected": 1000 * technical_tokens / technical_words, "explain": (
            "Count SmolLM2's tokens for the technical text and divide by its words (split on spaces): that is "
            "tokens per word; a thousand words take a thousand times as many. Identifiers, units and rare "
            "terms split into several pieces each, far more than the rule of thumb (a token is 3/4 of a "
            "word) predicts.")},
        "cheaper": {"expected": min(chinese_tokens, key=chinese_tokens.get), "explain": (
            "Read the Chinese row of the table: the tokenizer with fewer tokens is the cheaper one. A larger "
            "table, trained on more languages, holds longer pieces of Chinese text.")},
    }


def kv_full_context(config) -> dict:
    """Lab 2: MiB of the KV cache of one request as long as the context window,
    fp32 keys and values, by the course's memory model."""
    from ..analysis import memory  # here: it reads model configs, which labcheck's import does not need

    full = memory.estimate(config, context_tokens=config.max_position_embeddings, kv_bytes_per_value=4,
                           weight_bits=32)
    return {"kv_mib": {"expected": full.kv_total / 2 ** 20, "explain": (
        "One token's keys and values: 2 (K and V) x layers x KV heads x head_dim values of 4 bytes (fp32). "
        "Times the tokens of the whole context window, over 2^20 bytes per MiB. Query heads do not count: "
        "only the key/value heads are cached.")}}


def min_p_cut(logits, paris_id: int, the_id: int, open_probs) -> dict:
    """Lab 3: the lowest temperature at which min_p = 0.1 keeps ' the' (found on
    the engine's apply_min_p, in steps of 0.001), and the min_p that cuts where
    top_p = 0.9 does on the open prompt's probabilities."""
    import torch
    from tinyinfer.sampling import apply_min_p

    grid = [t / 1000 for t in range(500, 3001)]
    lowest = next((t for t in grid if torch.isfinite(apply_min_p(logits / t, 0.1)[the_id])), math.nan)
    ranked = torch.sort(open_probs, descending=True).values.double()
    last = int(torch.searchsorted(ranked.cumsum(-1), torch.tensor([0.9], dtype=torch.float64)))
    last = min(last, ranked.numel() - 1)
    return {
        "temperature": {"expected": lowest, "explain": (
            "min_p keeps ' the' while its probability is at least 0.1 times the top token's (' Paris'). Their "
            "ratio is e^(-gap / T), where gap is the difference of their logits: solve e^(-gap / T) >= 0.1 for "
            "the smallest T.")},
        "min_p": {"expected": float(ranked[last] / ranked[0]), "explain": (
            "Sort the probabilities, largest first: top_p = 0.9 keeps tokens until the running total reaches 0.9. "
            "min_p keeps a token when its probability is at least min_p times the top token's, so the min_p "
            "that cuts at the same place is the last kept token's probability over the top token's.")},
    }


def down_proj_intensity(weight_shape, tokens: int = 64, bytes_per_value: int = 4) -> dict:
    """Lab 4: FLOPs per byte of `tokens` tokens through down_proj, whose weight
    has `weight_shape` [n, k], fp32."""
    from ..analysis.hardware import arithmetic_intensity

    n, k = (int(d) for d in weight_shape)
    return {"intensity": {"expected": arithmetic_intensity(tokens, n, k, bytes_per_value), "explain": (
        "FLOPs over bytes. FLOPs: 2 (a multiply and an add) for each product of an m x k input with a k x n "
        "weight. Bytes: the input (m x k), the weight (k x n) and the output (m x n), 4 bytes each in fp32, "
        "with m the tokens and n, k read from the weight's shape. The weight dominates the bytes, so the "
        "intensity grows almost in proportion to m.")}}


def cache_work(prompt_len: int, new_tokens: int) -> dict:
    """Lab 5: token positions run through the model to generate `new_tokens`
    after a prompt of `prompt_len`, without the KV cache, and that over the
    positions with it."""
    without = sum(prompt_len + i for i in range(new_tokens))
    with_cache = prompt_len + new_tokens - 1
    return {
        "without": {"expected": without, "explain": (
            "Without the cache, the pass for each new token runs the whole prompt and every token generated "
            "before it: add up those lengths, one per new token.")},
        "ratio": {"expected": without / with_cache, "explain": (
            "With the cache the prompt runs once, then one position per further token (the last token needs "
            "no pass of its own). Divide the positions without the cache by those with it.")},
    }


def prefix_blocks(block_size: int, prompt_len: int = 100, shared: int = 40) -> dict:
    """Lab 7: full blocks of a prompt of `prompt_len` tokens, and the blocks a
    second prompt that shares only its first `shared` tokens finds hashed,
    by the course's prefix_hashes."""
    from .scheduling_answers import reference_prefix_hashes

    first = list(range(prompt_len))
    second = first[:shared] + [t + 1000 for t in first[shared:]]
    hashes = reference_prefix_hashes(first, block_size)
    reused = sum(a == b for a, b in zip(hashes, reference_prefix_hashes(second, block_size)))
    return {
        "full_blocks": {"expected": len(hashes), "explain": (
            "Only full blocks get a hash: divide the prompt's tokens by the block size and drop the remainder. "
            "The last tokens wait in a partly filled block, with no hash yet.")},
        "reused": {"expected": reused, "explain": (
            "The prompts part inside a block. That block's hash differs, and through the chain so does every "
            "later one: only the full blocks before the one where they part match.")},
    }


def server_counters(counters: dict) -> dict:
    """Lab 8: prompt tokens the server computed itself, from its Prometheus
    counters (name: value)."""
    sent, hits = counters["vllm:prompt_tokens_total"], counters["vllm:prefix_cache_hits_total"]
    return {"computed": {"expected": sent - hits, "explain": (
        "vllm:prompt_tokens_total counts every prompt token the server received; "
        "vllm:prefix_cache_hits_total counts those it read from the prefix cache instead of computing. "
        "Sending the same question again found its first full blocks in the cache.")}}


def ten_turns(off: list[dict], on: list[dict]) -> dict:
    """Lab 10: tokens computed over ten turns of a conversation, from the
    measured turns without the prefix cache (`off`) and with it (`on`); each
    turn a dict with its "prompt" tokens and its cache "hit"."""
    first = float(off[0]["prompt"])
    growth = _mean(b["prompt"] - a["prompt"] for a, b in zip(off, off[1:]))
    later = _mean(t["prompt"] - t["hit"] for t in on[1:])
    return {
        "without": {"expected": sum(first + n * growth for n in range(10)), "explain": (
            "Without the cache each turn computes its whole prompt, which grows by about the same number of "
            "tokens every turn: add the first prompt and the nine after it, each one growth longer. Every turn "
            "re-computes everything before it, so the total grows with the square of the number of turns.")},
        "with": {"expected": first + 9 * later, "explain": (
            "The first turn computes its whole prompt; each of the nine others only what the cache did not "
            "hold (its prompt minus its hit, about the same every turn). The total grows in proportion to the "
            "turns.")},
    }


def decode_gathers(num_requests: int, num_layers: int) -> dict:
    """Lab 11: reads of the K and V pools in one decode step of `num_requests`
    requests through `num_layers` layers, per request and grouped."""
    return {
        "per_request": {"expected": 2 * num_requests * num_layers, "explain": (
            "paged_attention gathers keys and values (two gathers) for each request, in each layer.")},
        "grouped": {"expected": 2 * num_layers, "explain": (
            "grouped_paged_attention gathers every decode's slots with one index_select per pool (keys, values) "
            "per layer, whatever the number of requests.")},
    }


def speculative(code_stats, k: int, tokens_per_pass: float, pass_cost: float) -> dict:
    """Lab 9: tokens per pass that 1 + a + ... + a^k predicts from `code_stats`'
    accepted and proposed drafts, and the speed-up that `tokens_per_pass` tokens
    for `pass_cost` times a one-token pass would give."""
    a = code_stats.num_accepted / code_stats.num_proposed
    return {
        "tokens_per_pass": {"expected": sum(a ** i for i in range(k + 1)), "explain": (
            "a is the accepted drafts over the proposed drafts of the code prompt's run. A pass yields the first "
            "token for sure, the second with probability a, the third with a^2, and so on up to a^k: "
            "1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a).")},
        "speedup": {"expected": tokens_per_pass / pass_cost, "explain": (
            "Each pass yields the measured tokens per target pass of the repetitive prompt, for r times the time "
            "of a one-token pass: divide the one by the other.")},
    }
