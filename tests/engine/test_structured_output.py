"""Structured output (structured_output.py): the grammar mask never allows a
token that breaks the grammar, every constrained greedy reply parses (tiny and
default model), a batch gives each row's sequential tokens, and bad grammars
are refused with the field named."""
import json
import random

import pytest
import torch

from tinyinfer import LLM, SamplingParams
from tinyinfer.structured_output import (StructuredOutputManager, StructuredOutputsParams, allowed_token_ids,
                                         tool_call_grammar)
from tinyinfer_course.text.tools import parse_tool_call

pytest.importorskip("llguidance")

EOS = 2
CHOICES = ["get_weather", "get_time", "add"]
# Only enums, booleans and bounded integers: a random walk through it always ends.
SCHEMA = {"type": "object",
          "properties": {"tool": {"enum": CHOICES}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "ok": {"type": "boolean"}},
          "required": ["tool", "n", "ok"], "additionalProperties": False}
REGEX = r"[0-9]{3}-[a-c]{2}"


def _valid(obj) -> bool:
    return (isinstance(obj, dict) and set(obj) == {"tool", "n", "ok"} and obj["tool"] in CHOICES
            and type(obj["n"]) is int and 0 <= obj["n"] <= 99 and type(obj["ok"]) is bool)


@pytest.fixture(scope="module")
def vocab(default_model_dir):
    """Each token's text; "" for the special tokens, which no grammar lets through."""
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(f"{default_model_dir}/tokenizer.json")
    special = set(hf.get_added_tokens_decoder())
    return hf, ["" if i in special else hf.decode([i]) for i in range(hf.get_vocab_size())]


@pytest.fixture(scope="module")
def manager(default_model_dir):
    return StructuredOutputManager(f"{default_model_dir}/tokenizer.json", [EOS], 49152)


def slow_choice_mask(prefix: str, choices: list[str], vocab: list[str]) -> set[int]:
    """The plain-Python mask: every token whose text keeps the reply a prefix of a choice."""
    out = {i for i, t in enumerate(vocab) if t and any(c.startswith(prefix + t) for c in choices)}
    return out | ({EOS} if prefix in choices else set())


@pytest.mark.parametrize("prefix", ["", "get", "get_", "get_w", "get_weather", "a", "ad", "add"])
def test_the_choice_mask_allows_only_what_the_plain_python_mask_allows(manager, vocab, prefix):
    hf, texts = vocab
    fast = set(allowed_token_ids(manager, StructuredOutputsParams(choice=CHOICES), hf.encode(prefix).ids))
    slow = slow_choice_mask(prefix, CHOICES, texts)
    assert fast and fast <= slow  # never a token that leaves the choices
    # Where one string alone can follow ("get_w" -> "eather"), llguidance keeps only the tokens of
    # that string's usual tokenization; where several can, it allows every token the slow mask does.
    if sum(c.startswith(prefix) and c != prefix for c in CHOICES) > 1:
        assert fast == slow


def _random_walk(manager, params, rng, max_steps=200) -> str:
    """Draw uniformly among the allowed tokens until end-of-sequence; the matcher must never fail."""
    m = manager.matcher(params)
    tokens = []
    for _ in range(max_steps):
        allowed = manager.allowed([m])[0].nonzero().flatten().tolist()
        token = EOS if EOS in allowed and rng.random() < 0.5 else rng.choice(allowed)
        assert m.consume_token(token) and not m.is_error(), m.get_error()
        if token == EOS:
            return manager.tokenizer.decode_str(tokens)
        tokens.append(token)
    raise AssertionError(f"no end after {max_steps} tokens: {manager.tokenizer.decode_str(tokens)!r}")


def test_random_walks_through_the_mask_always_give_valid_replies(manager):
    import re

    rng = random.Random(0)
    for _ in range(15):
        assert _valid(json.loads(_random_walk(manager, StructuredOutputsParams(json=SCHEMA), rng)))
        assert re.fullmatch(REGEX, _random_walk(manager, StructuredOutputsParams(regex=REGEX), rng))
        assert _random_walk(manager, StructuredOutputsParams(choice=CHOICES), rng) in CHOICES


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return LLM(tiny_dir, dtype="float32", device="cpu", max_num_seqs=8)


def _parses(kind: str, text: str) -> bool:
    import re

    if kind == "json":
        try:
            return _valid(json.loads(text))
        except json.JSONDecodeError:
            return False
    return bool(re.fullmatch(REGEX, text)) if kind == "regex" else text in CHOICES


STRUCTURED = {"json": StructuredOutputsParams(json=SCHEMA), "regex": StructuredOutputsParams(regex=REGEX),
              "choice": StructuredOutputsParams(choice=CHOICES)}
PROMPTS = ["The weather today", "Numbers: 1, 2,", "Hello"]


def test_every_constrained_greedy_reply_of_a_random_model_parses(tiny):
    """The tiny model's weights are random: unconstrained it writes noise, constrained it must parse."""
    for kind, so in STRUCTURED.items():
        outs = tiny.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=0, structured_outputs=so))
        for o in outs:
            assert _parses(kind, o.outputs[0].text) and o.outputs[0].finish_reason == "stop", (kind, o.outputs[0])
    free = tiny.generate(PROMPTS, SamplingParams(max_tokens=20, temperature=0))
    assert not any(_parses(kind, o.outputs[0].text) for o in free for kind in STRUCTURED)


def test_seeded_and_random_constrained_replies_parse_and_seeds_repeat(tiny):
    for kind, so in STRUCTURED.items():
        params = [SamplingParams(max_tokens=40, temperature=1.0, seed=s, structured_outputs=so) for s in (1, 2)]
        params.append(SamplingParams(max_tokens=40, temperature=1.5, top_p=0.9, structured_outputs=so, n=2))
        first = tiny.generate(PROMPTS[:3], params)
        for o in first:
            assert all(_parses(kind, c.text) for c in o.outputs), (kind, o.outputs)
        again = tiny.generate(PROMPTS[:2], params[:2])
        assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in first[:2]]


def test_a_batch_gives_each_row_its_sequential_tokens(tiny):
    """Constrained, unconstrained, greedy and seeded rows side by side: each row's
    mask is its own, so the batch equals the requests run one at a time."""
    rows = [(PROMPTS[0], SamplingParams(max_tokens=24, temperature=0, structured_outputs=STRUCTURED["json"])),
            (PROMPTS[1], SamplingParams(max_tokens=24, temperature=0)),
            (PROMPTS[2], SamplingParams(max_tokens=24, temperature=0.8, seed=7,
                                        structured_outputs=STRUCTURED["regex"])),
            (PROMPTS[0], SamplingParams(max_tokens=24, temperature=0.8, seed=3,
                                        structured_outputs=STRUCTURED["choice"])),
            (PROMPTS[1], SamplingParams(max_tokens=24, temperature=0, structured_outputs=STRUCTURED["regex"]))]
    batched = [o.outputs[0].token_ids for o in tiny.generate([p for p, _ in rows], [s for _, s in rows])]
    alone = [tiny.generate([p], [s])[0].outputs[0].token_ids for p, s in rows]
    assert batched == alone


def test_the_mask_leaves_logprobs_from_the_models_own_distribution(tiny):
    so = SamplingParams(max_tokens=3, temperature=0, logprobs=0, structured_outputs=STRUCTURED["choice"])
    free = SamplingParams(max_tokens=1, temperature=0, logprobs=0)
    constrained, unconstrained = tiny.generate([PROMPTS[0]] * 2, [so, free])
    first_constrained = constrained.outputs[0].logprobs[0]
    first_free = unconstrained.outputs[0].logprobs[0]
    token = constrained.outputs[0].token_ids[0]
    free_token = unconstrained.outputs[0].token_ids[0]
    assert token != free_token  # the random model's favourite is not the start of a choice
    assert first_constrained[token].rank > 1  # ranked in the model's own distribution, not the masked one
    assert first_free[free_token].rank == 1


@pytest.mark.parametrize("fields, field", [
    ({"json": {"type": "foo"}}, "structured_outputs.json"),
    ({"json": "{not json"}, "structured_outputs.json"),
    ({"json": ["a list"]}, "structured_outputs.json"),
    ({"regex": "a(b"}, "structured_outputs.regex"),
    ({"regex": ""}, "structured_outputs.regex"),
    ({"choice": []}, "structured_outputs.choice"),
    ({"choice": ["yes", 3]}, "structured_outputs.choice"),
    ({"grammar": "start: undefined_rule"}, "structured_outputs.grammar"),
    ({"json": SCHEMA, "regex": REGEX}, "structured_outputs: set exactly one"),
    ({}, "structured_outputs: set exactly one"),
    ({"guided_json": SCHEMA}, "structured_outputs: unknown field"),
])
def test_bad_grammars_are_refused_naming_the_field(tiny, fields, field):
    with pytest.raises(ValueError) as e:
        tiny.generate("hi", SamplingParams(max_tokens=2, structured_outputs=dict(fields)))
    assert str(e.value).startswith(field), str(e.value)


def test_a_structured_outputs_of_the_wrong_type_is_refused():
    with pytest.raises(ValueError, match="SamplingParams.structured_outputs"):
        SamplingParams(structured_outputs="json")


# --- the default model ------------------------------------------------------------

TOOLS_SYSTEM = {"role": "system", "content": "You can call the tools get_weather (arguments: city) and add "
                                             "(arguments: a, b). Call one."}
QUESTIONS = ["What is the weather in Paris?", "What is 2 plus 3?", "Is it raining in Oslo?"]


def test_every_constrained_greedy_tool_call_of_the_default_model_parses(llm):
    # Each tool's arguments as a schema (free-form arguments can go on until max_tokens).
    city = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"],
            "additionalProperties": False}
    numbers = {"type": "object", "properties": {"a": {"type": "integer", "maximum": 10**6},
                                                "b": {"type": "integer", "maximum": 10**6}},
               "required": ["a", "b"], "additionalProperties": False}
    so = StructuredOutputsParams(grammar=tool_call_grammar({"get_weather": city, "add": numbers}))
    params = SamplingParams(max_tokens=60, temperature=0, structured_outputs=so)
    outs = llm.chat([[TOOLS_SYSTEM, {"role": "user", "content": q}] for q in QUESTIONS], params)
    for o in outs:
        call = parse_tool_call(o.outputs[0].text)
        assert call is not None and call.name in ("get_weather", "add"), o.outputs[0].text
        assert set(call.arguments) == ({"city"} if call.name == "get_weather" else {"a", "b"})
    schema_outs = llm.chat([[{"role": "user", "content": q}] for q in QUESTIONS],
                           SamplingParams(max_tokens=60, temperature=0, structured_outputs=STRUCTURED["json"]))
    assert all(_valid(json.loads(o.outputs[0].text)) for o in schema_outs)


def test_the_bitmask_unpacks_bit_i_of_word_w_to_token_32w_plus_i(manager):
    """The unpacking in StructuredOutputManager.allowed, on a matcher that allows one known token."""
    class OneToken:  # stands in for an LLMatcher: fill_next_token_bitmask calls unsafe_compute_mask_ptr
        def __init__(self, token):
            self.token = token

        def unsafe_compute_mask_ptr(self, ptr, size):
            words = torch.zeros(size // 4, dtype=torch.int32)
            bit = 1 << (self.token % 32)
            words[self.token // 32] = bit - (1 << 32) if bit >= 1 << 31 else bit  # bit 31 is int32's sign
            import ctypes
            ctypes.memmove(ptr, words.data_ptr(), size)

    for token in (0, 31, 32, 1000, 49151):
        allowed = manager.allowed([OneToken(token)])
        assert allowed.shape == (1, 49152) and allowed[0].nonzero().flatten().tolist() == [token]


def test_a_right_tool_call_names_the_questions_tool_and_exactly_its_arguments():
    from tinyinfer_course.reports import tool_calls

    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert tool_calls.is_right_call(call, "get_weather")
    assert not tool_calls.is_right_call(call, "get_time")  # parses, but the question asked for another tool
    assert not tool_calls.is_right_call(call.replace('"city"', '"name"'), "get_weather")  # its argument misnamed
    assert not tool_calls.is_right_call(call.replace("}}", ', "unit": "C"}}'), "get_weather")  # one too many
    assert not tool_calls.is_right_call("Paris is sunny.", "get_weather")
    right = [call, call.replace("get_weather", "get_time"), '<tool_call>{"name": "add", "arguments": {"b": 4, "a": 3}}']
    assert tool_calls.count_right(right + ["no call"] * 3) == 3


def test_the_stored_tool_call_counts_are_stamped_and_the_mask_made_every_call_parse():
    """The copy lab 10 shows: a named machine and date, an engine stamp its note can read, and
    counts that say what the lab says they do (the grammar made every call parse, free ones did not)."""
    from tinyinfer_course.reports import tool_calls

    report = tool_calls.load()
    meta, counts = report["meta"], report["counts"]
    assert meta["date"] and meta["machine"] and len(meta["engine_stamp"]["engine_fingerprint"]) == 16
    assert counts["constrained"]["parsed"] == counts["constrained"]["total"] == len(tool_calls.QUESTIONS)
    assert counts["free"]["parsed"] < counts["constrained"]["parsed"]
    assert all(parse_tool_call(r) is not None for r in counts["constrained"]["replies"])
    # Parsed is not right: the stored constrained replies include get_weather with "name" for "city".
    assert tool_calls.count_right(counts["constrained"]["replies"]) < counts["constrained"]["parsed"]
    assert "Stored counts: measured" in tool_calls.note(report)
    today = tool_calls.engine_stamp()
    older = {**today, "engine_fingerprint": "0" * 16}
    assert "older engine" in tool_calls.note({**report, "meta": {**meta, "engine_stamp": older}}, today)
