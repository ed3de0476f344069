"""Expected answers of the quizzes whose arithmetic is the question.

A quiz's check cell grades the reader's number against one the course computes
(labcheck.grade_answer). Most compute it with an engine function whose name
gives nothing away (memory.estimate, hardware.arithmetic_intensity). Where the
formula itself is what the quiz asks for, writing it in the check cell would
print the answer right under the question: JupyterLab folds a check cell's
source in the labs, but VS Code and Colab show it. Those formulas live here.

Each function returns {quiz name: {"expected": value, "explain": why}}, for
`labcheck.grade_answer(what, answer, **answers[name], rel_tol=...)`. The
explanation is shown only under a ✗.
"""
from __future__ import annotations


def _mean(values) -> float:
    values = [float(v) for v in values]
    return sum(values) / len(values)


def ten_turns(off: list[dict], on: list[dict]) -> dict:
    """Lab 10: tokens computed over ten turns of a conversation, from the
    measured turns without the prefix cache (`off`) and with it (`on`); each
    turn a dict with its "prompt" tokens and its cache "hit"."""
    first = float(off[0]["prompt"])
    growth = _mean(b["prompt"] - a["prompt"] for a, b in zip(off, off[1:]))
    later = _mean(t["prompt"] - t["hit"] for t in on[1:])
    without = sum(first + n * growth for n in range(10))
    return {
        "without": {"expected": without, "explain": (
            f"Turn n's prompt is the first one ({first:.0f}) plus n - 1 growths of {growth:.1f}: "
            f"{without:,.0f} in all. Each turn re-computes everything before it, so the total grows with the "
            "square of the number of turns.")},
        "with": {"expected": first + 9 * later, "explain": (
            f"The first turn computes its whole prompt ({first:.0f}), each of the nine others about {later:.0f} "
            f"tokens: {first + 9 * later:,.0f} in all, growing in proportion to the turns.")},
    }


def decode_gathers(num_requests: int, num_layers: int) -> dict:
    """Lab 11: reads of the K and V pools in one decode step of `num_requests`
    requests through `num_layers` layers, per request and grouped."""
    per_request, grouped = 2 * num_requests * num_layers, 2 * num_layers
    return {
        "per_request": {"expected": per_request, "explain": (
            f"paged_attention gathers keys and values (2) for each of {num_requests} requests in each of "
            f"{num_layers} layers: {per_request:,}.")},
        "grouped": {"expected": grouped, "explain": (
            f"grouped_paged_attention gathers all decodes' slots with one index_select per pool (2) per layer, "
            f"whatever the number of requests: {grouped}.")},
    }


def speculative(code_stats, k: int, tokens_per_pass: float, pass_cost: float) -> dict:
    """Lab 9: tokens per pass that 1 + a + ... + a^k predicts from `code_stats`'
    accepted and proposed drafts, and the speed-up that `tokens_per_pass` tokens
    for `pass_cost` times a one-token pass would give."""
    a = code_stats.num_accepted / code_stats.num_proposed
    predicted = sum(a ** i for i in range(k + 1))
    return {
        "tokens_per_pass": {"expected": predicted, "explain": (
            f"a = {code_stats.num_accepted}/{code_stats.num_proposed} = {a:.3f}; 1 + a + ... + a^{k} = "
            f"(1 - a^{k + 1}) / (1 - a) = {predicted:.2f}.")},
        "speedup": {"expected": tokens_per_pass / pass_cost, "explain": (
            f"Each pass yields {tokens_per_pass:.2f} tokens for {pass_cost:g} times the time of a one-token "
            f"pass: {tokens_per_pass:.2f} / {pass_cost:g} = {tokens_per_pass / pass_cost:.2f}.")},
    }
