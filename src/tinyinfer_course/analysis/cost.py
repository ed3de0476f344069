"""Cost per token, from what the engine measured.

A machine rented for `price_per_hour` costs price_per_hour / 3600 every second,
whatever it does. Divide by the tokens it processes per second and you have
the cost of a token. Prefill (reading input tokens) and decode (writing output
tokens) run at very different speeds (chapter 4), so one machine-second buys
many input tokens but few output tokens: that is why providers price output
tokens higher (chapter 10).

    steps = log_steps(llm, prompts, SamplingParams(max_tokens=16))
    print(token_costs(steps, price_per_hour=2.0))

A conversation re-sends every earlier turn, so what its prompts cost depends on
what the prefix cache keeps (conversation_prefill_tokens, chapter 10).
"""
from __future__ import annotations

from dataclasses import fields

from tinyinfer.config import EngineConfig
from tinyinfer.llm_engine import run_until_done
from tinyinfer.sampling import SamplingParams

# The engine's default KV block size: the prefix cache finds whole blocks only.
DEFAULT_BLOCK_SIZE = next(f.default for f in fields(EngineConfig) if f.name == "block_size")


def log_steps(llm, prompts, params: SamplingParams) -> list[dict]:
    """Run the prompts through llm's engine together and record every step:
    its prefill tokens, its decode tokens and its time (from LLMEngine.stats)."""
    engine = llm.llm_engine
    for prompt in prompts:
        engine.add_request(prompt, params)
    steps, st = [], engine.stats
    run_until_done(engine, on_step=lambda: steps.append({"num_prefill_tokens": st.num_prefill_tokens,
                                                          "num_decode_tokens": st.num_decode_tokens,
                                                          "step_time_s": st.step_time_s}))
    return steps


def token_costs(steps: list[dict], price_per_hour: float) -> dict:
    """Input and output throughput, and dollars per million tokens of each.

    Only pure steps count: a prefill step (prefill tokens, no decode tokens)
    times input tokens, a decode step times output tokens. A mixed step's time
    cannot be split between the two, so it is left out. Throughput is total
    tokens over total seconds (not an average of per-step rates, which would
    weigh a short step as much as a long one). None where no step of a kind ran."""
    if not price_per_hour >= 0:
        raise ValueError(f"price_per_hour={price_per_hour!r} is invalid: must be >= 0")
    per_second = price_per_hour / 3600
    out = {}
    for kind, mine, other in (("input", "num_prefill_tokens", "num_decode_tokens"),
                              ("output", "num_decode_tokens", "num_prefill_tokens")):
        pure = [s for s in steps if s[mine] > 0 and s[other] == 0]
        tokens, seconds = sum(s[mine] for s in pure), sum(s["step_time_s"] for s in pure)
        rate = tokens / seconds if pure and seconds > 0 else None
        out[f"{kind}_tokens_per_s"] = rate
        out[f"{kind}_per_million"] = per_second / rate * 1e6 if rate else None
    return out


def conversation_prefill_tokens(prompt_lengths: list[int], reply_lengths: list[int],
                                block_size: int | None = DEFAULT_BLOCK_SIZE) -> list[int]:
    """The prompt tokens each turn of a conversation computes, turn by turn.

    Turn t sends prompt_lengths[t] tokens: the whole conversation so far, so
    each prompt starts with the previous prompt and the previous reply
    (reply_lengths[t - 1] tokens). With block_size None there is no prefix
    cache and every turn computes its whole prompt. With a prefix cache (the
    engine's, as lab 10 measures it) a finished request leaves its blocks
    behind, its reply's as well as its prompt's, but only full blocks can be
    found again, and the reply's last token was sampled, never fed through the
    model, so it has no keys and values: the next turn finds the largest whole
    number of blocks in (previous prompt + previous reply - 1) tokens, and
    computes the rest (its new message, plus 1 to block_size tokens of tail)."""
    if len(reply_lengths) < len(prompt_lengths) - 1:
        raise ValueError("reply_lengths: need a reply for every turn but the last")
    if block_size is not None and not (isinstance(block_size, int) and block_size >= 1):
        raise ValueError(f"block_size={block_size!r} is invalid: must be a whole number >= 1, or None")
    computed = []
    for t, prompt in enumerate(prompt_lengths):
        if block_size is None or t == 0:
            computed.append(prompt)
            continue
        previous = prompt_lengths[t - 1] + reply_lengths[t - 1]
        if prompt < previous:
            raise ValueError(f"prompt_lengths[{t}]={prompt} is shorter than the conversation before it ({previous})")
        cached = (previous - 1) // block_size * block_size
        computed.append(prompt - cached)
    return computed
