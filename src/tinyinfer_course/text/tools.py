"""Tool calls: the text a model writes to ask for a tool, and the loop that answers it.

A language model cannot run code or look anything up. All it can do is write
tokens. "Calling a tool" therefore means writing a request in a format the
application and the model agreed on, here the one most open chat templates
use (Hermes, Qwen):

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>

The application parses that text, runs the tool itself, appends the result to
the conversation as a message with the role "tool", and runs the model again
on the longer conversation. One question can therefore cost several inference
passes, each one re-reading everything before it (chapter 10).

SmolLM2's chat template has no section for tools, so tool_system_prompt()
describes the tools and the format in the system message instead.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class ModelReply:
    """What one inference pass returned: its text and the tokens it cost."""

    text: str
    prompt_tokens: int  # tokens the pass had to read (the whole conversation so far)
    output_tokens: int  # tokens it wrote


@dataclass
class AgentResult:
    answer: str | None  # the final reply, or None if max_passes ran out first
    messages: list[dict]  # the whole conversation, the model's and the tools' turns included
    passes: int  # inference passes (model runs)
    tool_calls: int
    prompt_tokens: int  # summed over the passes
    output_tokens: int
    pass_log: list[ModelReply] = field(default_factory=list)


def parse_tool_call(text: str) -> ToolCall | None:
    """The first tool call in a reply, or None when the reply is a plain answer
    or the call is malformed. The closing tag may be missing: generation often
    stops on it, and a stop string is not part of the returned text."""
    if not isinstance(text, str) or OPEN not in text:
        return None
    body = text.split(OPEN, 1)[1].lstrip()
    try:  # raw_decode reads one JSON value and ignores what follows it
        obj, _ = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"].strip():
        return None
    arguments = obj.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    return ToolCall(obj["name"].strip(), arguments)


def format_tool_call(name: str, arguments: dict) -> str:
    """The text of a call, as the model should write it (for examples in prompts)."""
    return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments})}{CLOSE}"


def tool_system_prompt(tools: dict[str, str], examples: list[tuple[str, str, dict]] = ()) -> str:
    """A system message that tells the model its tools and the call format.
    tools: name -> one-line description (with its arguments). examples:
    (question, tool name, arguments) shown as worked calls; small models follow
    an example far better than a rule."""
    lines = ["You can call tools. To call one, reply with only a tool call, like this:",
             f'{OPEN}{{"name": "TOOL", "arguments": {{...}}}}{CLOSE}',
             "The result comes back in a message from the tool; then answer the user.", "Tools:"]
    lines += [f"- {name}: {description}" for name, description in tools.items()]
    for question, name, arguments in examples:
        lines.append(f"Example. User: {question}\nAssistant: {format_tool_call(name, arguments)}")
    return "\n".join(lines)


def run_tool(tools: dict[str, Callable], call: ToolCall) -> str:
    """Run one call. A wrong call becomes an error message for the model to
    read, never an exception: the conversation, and the server, go on."""
    if call.name not in tools:
        return f"error: unknown tool {call.name!r}"
    try:
        return str(tools[call.name](**call.arguments))
    except Exception as e:  # bad arguments, or the tool itself failed
        return f"error: {type(e).__name__}: {e}"


def run_agent(generate: Callable[[list[dict]], ModelReply], tools: dict[str, Callable], messages: list[dict],
              max_passes: int = 4) -> AgentResult:
    """The agent loop: run the model; if it asked for a tool, run the tool,
    append its result, and run the model again; stop at the first reply that
    asks for nothing (the answer) or after max_passes passes."""
    transcript = list(messages)  # the caller's list stays as it was
    result = AgentResult(None, transcript, 0, 0, 0, 0)
    while result.passes < max_passes:
        reply = generate(list(transcript))
        result.passes += 1
        result.prompt_tokens += reply.prompt_tokens
        result.output_tokens += reply.output_tokens
        result.pass_log.append(reply)
        transcript.append({"role": "assistant", "content": reply.text})
        call = parse_tool_call(reply.text)
        if call is None:
            result.answer = reply.text
            break
        result.tool_calls += 1
        transcript.append({"role": "tool", "content": run_tool(tools, call)})
    return result
