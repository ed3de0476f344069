"""Short runs of an engine that the decode-path tests (compiled steps, CUDA graphs
and their stand-in, planted bugs) compare: greedy tokens, and the reasons steps
gave for running eagerly."""
from __future__ import annotations

from tinyinfer import SamplingParams


def greedy_tokens(llm, prompts, max_tokens=5):
    """Each prompt's greedy tokens, EOS ignored, so every run is max_tokens long."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def eager_decode_reasons(engine, prompts, params) -> set[str | None]:
    """Runs the prompts through an LLMEngine step by step, and returns every reason
    a step gave for running its decode eagerly (stats.eager_decode_reason; None for
    a step with nothing to explain), so a test can ask why, not only how many."""
    for prompt in prompts:
        engine.add_request(prompt, params)
    reasons = set()
    while engine.has_unfinished_requests():
        engine.step()
        reasons.add(engine.stats.eager_decode_reason)
    return reasons
