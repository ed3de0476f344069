"""tinyinfer_course.text.context (choosing what to send) and tinyinfer_course.analysis.cost (dollars per
million tokens from a step log), including a step log of the real engine."""
import pytest

from tinyinfer import SamplingParams
from tinyinfer_course.text.context import select_context, words
from tinyinfer_course.analysis.cost import log_steps, token_costs


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
