"""tinyinfer_course.text.tools: reading a tool call out of a reply, and the agent loop around it.

The loop is tested with a scripted model (a list of replies), so every pass,
message and token count is known in advance; one test runs the real model."""
import pytest

from tinyinfer import SamplingParams
from tinyinfer_course.text.tools import (AgentResult, ModelReply, ToolCall, format_tool_call, parse_tool_call,
                                        run_agent, run_tool, tool_system_prompt)


@pytest.mark.parametrize("text, expected", [
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
     ToolCall("get_weather", {"city": "Paris"})),
    # generation stopped on "</tool_call>", which is not part of the text
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}', ToolCall("get_weather", {"city": "Oslo"})),
    # prose before, whitespace inside, trailing text after the JSON
    ('Let me check.\n<tool_call>\n {"name": "add", "arguments": {"a": 1, "b": 2}} \n</tool_call> ok',
     ToolCall("add", {"a": 1, "b": 2})),
    ('<tool_call>{"name": "now"}</tool_call>', ToolCall("now", {})),  # no arguments: an empty dict
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b"}</tool_call>',
     ToolCall("a", {})),  # the first call only
])
def test_parse_tool_call_reads_calls(text, expected):
    assert parse_tool_call(text) == expected


@pytest.mark.parametrize("text", [
    "The capital of France is Paris.",  # a plain answer
    "",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',  # JSON without the tag
    "<tool_call>get_weather(Paris)</tool_call>",  # not JSON
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Par',  # cut off mid-call
    '<tool_call>["get_weather"]</tool_call>',  # JSON, but not an object
    '<tool_call>{"arguments": {"city": "Paris"}}</tool_call>',  # no name
    '<tool_call>{"name": "  ", "arguments": {}}</tool_call>',  # a blank name
    '<tool_call>{"name": "f", "arguments": "Paris"}</tool_call>',  # arguments not an object
    None,
])
def test_parse_tool_call_refuses_what_is_not_a_call(text):
    assert parse_tool_call(text) is None


def test_format_and_parse_round_trip():
    assert parse_tool_call(format_tool_call("f", {"x": [1, 2], "y": "z"})) == ToolCall("f", {"x": [1, 2], "y": "z"})


def test_system_prompt_names_every_tool_and_the_format():
    text = tool_system_prompt({"get_weather": "the weather", "add": "a sum"}, [("Q?", "add", {"a": 1})])
    assert "get_weather" in text and "add" in text and "<tool_call>" in text
    assert format_tool_call("add", {"a": 1}) in text


def test_run_tool_turns_failures_into_messages():
    tools = {"add": lambda a, b: a + b}
    assert run_tool(tools, ToolCall("add", {"a": 1, "b": 2})) == "3"
    assert run_tool(tools, ToolCall("mul", {})) == "error: unknown tool 'mul'"
    assert run_tool(tools, ToolCall("add", {"a": 1})).startswith("error: TypeError")


def scripted(replies):
    """A fake model: returns the scripted replies in turn and records what it was shown."""
    seen = []

    def generate(messages):
        seen.append([dict(m) for m in messages])
        return replies[len(seen) - 1]
    return generate, seen


def test_agent_calls_a_tool_then_answers():
    call = format_tool_call("get_weather", {"city": "Paris"})
    generate, seen = scripted([ModelReply(call, 20, 9), ModelReply("Rain in Paris.", 35, 4)])
    question = [{"role": "user", "content": "Weather in Paris?"}]
    result = run_agent(generate, {"get_weather": lambda city: f"{city}: rain"}, question)
    assert isinstance(result, AgentResult)
    assert (result.answer, result.passes, result.tool_calls) == ("Rain in Paris.", 2, 1)
    assert (result.prompt_tokens, result.output_tokens) == (55, 13)
    assert result.messages == question + [{"role": "assistant", "content": call},
                                          {"role": "tool", "content": "Paris: rain"},
                                          {"role": "assistant", "content": "Rain in Paris."}]
    assert seen[1] == result.messages[:3]  # the second pass read the tool's result
    assert question == [{"role": "user", "content": "Weather in Paris?"}]  # the caller's list is untouched


def test_agent_without_a_call_is_one_pass():
    generate, seen = scripted([ModelReply("Paris.", 12, 2)])
    result = run_agent(generate, {}, [{"role": "user", "content": "Capital of France?"}])
    assert (result.answer, result.passes, result.tool_calls, result.prompt_tokens) == ("Paris.", 1, 0, 12)


def test_agent_stops_after_max_passes_without_an_answer():
    call = format_tool_call("again", {})
    generate, seen = scripted([ModelReply(call, 10, 5)] * 5)
    result = run_agent(generate, {"again": lambda: "once more"}, [{"role": "user", "content": "?"}], max_passes=3)
    assert (result.answer, result.passes, result.tool_calls, len(seen)) == (None, 3, 3, 3)
    assert result.messages[-1] == {"role": "tool", "content": "once more"}


def test_agent_reports_an_unknown_tool_to_the_model():
    generate, seen = scripted([ModelReply(format_tool_call("nope", {}), 10, 5), ModelReply("Sorry.", 20, 2)])
    result = run_agent(generate, {}, [{"role": "user", "content": "?"}])
    assert result.answer == "Sorry." and seen[1][-1] == {"role": "tool", "content": "error: unknown tool 'nope'"}


def test_agent_on_the_real_model(llm):
    """Two worked examples in the conversation are enough for SmolLM2-135M to
    write a well-formed call; the second pass reads the result and answers."""
    shots = [{"role": "user", "content": "What is the weather in Tokyo today?"},
             {"role": "assistant", "content": format_tool_call("get_weather", {"city": "Tokyo"})},
             {"role": "tool", "content": "Tokyo: 24 °C, sunny"},
             {"role": "assistant", "content": "It is sunny in Tokyo today, 24 °C."},
             {"role": "user", "content": "How warm is it in Madrid?"},
             {"role": "assistant", "content": format_tool_call("get_weather", {"city": "Madrid"})},
             {"role": "tool", "content": "Madrid: 31 °C, clear sky"},
             {"role": "assistant", "content": "It is 31 °C in Madrid, with a clear sky."}]
    system = {"role": "system", "content": tool_system_prompt({"get_weather": 'the weather now. {"city": "..."}'})}

    def generate(messages):
        out = llm.chat(messages, SamplingParams(max_tokens=30, temperature=0, stop=["</tool_call>"]))[0]
        text = out.outputs[0].text + ("</tool_call>" if out.outputs[0].stop_reason == "</tool_call>" else "")
        return ModelReply(text, len(out.prompt_token_ids), len(out.outputs[0].token_ids))

    cities = []
    result = run_agent(generate, {"get_weather": lambda city: cities.append(city) or f"{city}: 18 °C, light rain"},
                       [system, *shots, {"role": "user", "content": "What is the weather in Paris today?"}])
    assert cities == ["Paris"] and result.passes == 2 and "18" in result.answer
    assert result.pass_log[1].prompt_tokens > result.pass_log[0].prompt_tokens  # the second pass re-reads it all
