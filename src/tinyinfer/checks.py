"""Checking input: one shape for every error about a bad value.

The engine's config, SamplingParams and the speculative decoder reject bad
input the same way, with a ValueError that names the field, shows the value and
says what is allowed, so a learner (or a client of the server, which answers
400 with the message) can fix the call without reading this code:

    SamplingParams.max_tokens=0 is invalid: must be an integer >= 1

The last two checks are the ones every generation loop makes of a prompt
(LLMEngine's and SpeculativeDecoder's).
"""
from __future__ import annotations


def is_int(x) -> bool:
    """An int, but not a bool: True is an int in Python, and never a valid count."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x) -> bool:
    """An int or a float, but not a bool and not NaN (NaN fails every comparison,
    so a range check alone would not catch it)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x


def require(ok: bool, field: str, value, allowed: str) -> None:
    """Raise the field-named error unless `ok`."""
    if not ok:
        raise ValueError(f"{field}={value!r} is invalid: must be {allowed}")


def check_int(field: str, value, low: int) -> None:
    require(is_int(value) and value >= low, field, value, f"an integer >= {low}")


def check_choice(field: str, value, allowed: tuple) -> None:
    require(value in allowed, field, value, f"one of {', '.join(map(repr, allowed))}")


def check_prompt_ids(ids: list, vocab_size: int, where: str) -> None:
    """A prompt as token ids: at least one, and each an id in the vocabulary
    (an id past it would index outside the embedding table)."""
    if not ids:
        raise ValueError(f"{where}: the prompt is empty (0 tokens); give at least one token")
    if any(not (is_int(t) and 0 <= t < vocab_size) for t in ids):
        raise ValueError(f"{where}: every id must be an integer in [0, {vocab_size - 1}]")


def check_context_window(num_prompt_tokens: int, max_tokens: int, max_model_len: int, where: str) -> None:
    """The prompt and the longest reply it may get fit in the context window,
    the positions the model (and its KV cache) can hold."""
    over = num_prompt_tokens + max_tokens - max_model_len
    if over > 0:
        raise ValueError(f"{where}: {num_prompt_tokens} prompt tokens + max_tokens {max_tokens} exceeds the "
                         f"context window of {max_model_len} tokens by {over} tokens")
