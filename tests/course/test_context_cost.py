"""tinyinfer_course.text.context (choosing what to send) and tinyinfer_course.analysis.cost (dollars per
million tokens from a step log), including a step log of the real engine."""
import pytest

from tinyinfer import SamplingParams
from tinyinfer_course.text.context import select_context, words
from tinyinfer_course.analysis.cost import conversation_prefill_tokens, log_steps, token_costs


def test_words_are_lower_case_distinct_and_without_stopwords():
    assert words("When does THE train to Lyon leave? Lyon!") == {"train", "lyon", "leave"}


def test_select_context_ranks_fills_the_budget_and_keeps_document_order():
    chunks = ["Lyon trains leave at nine.", "Lunch is at noon.", "The Lyon night train has beds.", "Train wifi."]
    count = lambda s: len(s.split())  # noqa: E731
    assert select_context(chunks, "night train to Lyon", 100, count) == [chunks[0], chunks[2], chunks[3]]
    # chunk 2 ranks first (3 words); chunk 0 (5 tokens) no longer fits in 8, chunk 3 (2) does
    assert select_context(chunks, "night train to Lyon", 8, count) == [chunks[2], chunks[3]]
    assert select_context(chunks, "soup?", 100, count) == []


def test_token_costs_from_a_hand_made_log():
    steps = [{"num_prefill_tokens": 1000, "num_decode_tokens": 0, "step_time_s": 1.0},
             {"num_prefill_tokens": 10, "num_decode_tokens": 3, "step_time_s": 9.0},  # mixed: left out
             {"num_prefill_tokens": 0, "num_decode_tokens": 4, "step_time_s": 0.1}]
    costs = token_costs(steps, price_per_hour=3.6)  # $0.001 a second
    assert costs["input_tokens_per_s"] == pytest.approx(1000) and costs["output_tokens_per_s"] == pytest.approx(40)
    assert costs["input_per_million"] == pytest.approx(1.0) and costs["output_per_million"] == pytest.approx(25.0)
    assert token_costs(steps[:1], 1.0)["output_per_million"] is None
    with pytest.raises(ValueError, match="price_per_hour"):
        token_costs(steps, -1)


def test_log_steps_on_the_real_engine(llm):
    prompts = [{"prompt_token_ids": list(range(100, 140))}, {"prompt_token_ids": list(range(200, 230))}]
    steps = log_steps(llm, prompts, SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    assert sum(s["num_prefill_tokens"] for s in steps) == 70  # every prompt token prefilled once
    assert sum(s["num_decode_tokens"] for s in steps) == 2 * 4  # 5 tokens each, the first from the prefill
    costs = token_costs(steps, 1.0)
    assert costs["input_tokens_per_s"] > 0 and costs["output_tokens_per_s"] > 0


def test_conversation_prefill_tokens_without_and_with_the_prefix_cache():
    # lab 10's stored conversation: prompts of 39, 71, 104 and 135 tokens, 16-token replies,
    # found 0, 48, 80 and 112 tokens in the cache, so it computed 39, 23, 24 and 23
    assert conversation_prefill_tokens([39, 71, 104, 135], [16] * 4) == [39, 23, 24, 23]
    assert conversation_prefill_tokens([39, 71, 104, 135], [16] * 4, block_size=None) == [39, 71, 104, 135]
    # chapter 10's problem 1: a 500-token system prompt, 100-token questions, 200-token replies, 20 turns
    prompts = [500 + t * 300 + 100 for t in range(20)]
    assert sum(conversation_prefill_tokens(prompts, [200] * 20, block_size=None)) == 69_000
    computed = conversation_prefill_tokens(prompts, [200] * 20)
    assert computed[0] == 600 and all(101 <= c <= 116 for c in computed[1:])  # question + 1 to 16 of tail
    with pytest.raises(ValueError, match="block_size"):
        conversation_prefill_tokens(prompts, [200] * 20, block_size=0)
    with pytest.raises(ValueError, match="shorter"):
        conversation_prefill_tokens([100, 50], [10])


def test_conversation_prefill_tokens_is_what_the_engine_computes(tiny_dir):
    """A conversation of token ids through the real engine and its prefix cache."""
    from tinyinfer import LLM

    llm = LLM(tiny_dir, dtype="float32", device="cpu", num_kv_blocks=64)
    params = SamplingParams(max_tokens=11, temperature=0, ignore_eos=True)
    ids, prompts, replies, computed = list(range(1000, 1037)), [], [], []
    for turn in range(4):
        ids = ids + list(range(2000 + 20 * turn, 2009 + 20 * turn))  # the new message, 9 tokens
        hits = llm.llm_engine.stats.prefix_cache_hit_tokens
        out = llm.generate({"prompt_token_ids": ids}, params)[0]
        prompts.append(len(ids))
        computed.append(len(ids) - (llm.llm_engine.stats.prefix_cache_hit_tokens - hits))
        reply = list(out.outputs[0].token_ids)
        replies.append(len(reply))
        ids = ids + reply
    assert computed == conversation_prefill_tokens(prompts, replies)
    assert computed[1:] != [9, 9, 9]  # the tails were computed again, as the function says
