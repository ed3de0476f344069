"""Cost per token, from what the engine measured.

A machine rented for `price_per_hour` costs price_per_hour / 3600 every second,
whatever it does. Divide by the tokens it processes per second and you have
the cost of a token. Prefill (reading input tokens) and decode (writing output
tokens) run at very different speeds (chapter 4), so one machine-second buys
many input tokens but few output tokens: that is why providers price output
tokens higher (chapter 10).

    steps = log_steps(llm, prompts, SamplingParams(max_tokens=16))
    print(token_costs(steps, price_per_hour=2.0))
"""
from __future__ import annotations

from tinyinfer.llm_engine import run_until_done
from tinyinfer.sampling import SamplingParams


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
