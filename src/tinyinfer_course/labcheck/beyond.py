"""Lab 10 (beyond one reply): checks for reading a tool call, the agent loop,
a context selector, the cheaper way to serve a workload, from a step log, and
a prefix tree of the vocabulary that computes one row of a structured-output mask.

Every expected value here is written out by hand (or, for the agent loop,
assembled from each case's script), never computed by the function under test
or by the engine's own version of it. The one exception is the prefix tree's
rows on the model's real vocabulary of 49,152 tokens, too many to list by hand:
they come from scan_allowed_tokens, the plain scan, which the hand-worked rows
check (tests/course/test_labcheck_expected.py)."""
from __future__ import annotations

import functools
import json
import math
import numbers
import sys
from dataclasses import dataclass

from ..text import context
from ..analysis import cost
from tinyinfer import structured_output
from ..text import tools as agent_tools
from .core import Case, first_mismatch, run_check
from .registry import Lab

# ---------------------------------------------------------------- references (the engine's own)


def reference_parse_tool_call(text):
    """The course's answer to lab 10's parse_tool_call exercise."""
    return agent_tools.parse_tool_call(text)


def reference_run_agent(generate, tools, messages, max_passes=4):
    """The course's answer to lab 10's run_agent exercise."""
    return agent_tools.run_agent(generate, tools, messages, max_passes)


def reference_select_context(chunks, question, budget_tokens, count_tokens):
    """The course's answer to lab 10's select_context exercise."""
    return context.select_context(chunks, question, budget_tokens, count_tokens)


def reference_cheapest_option(options, input_tokens, output_tokens):
    """The course's answer to lab 10's cheapest_option exercise: each option's
    dollars for the workload (a machine's from its step log, through the
    engine's cost.token_costs; a price list's directly), and the cheapest."""
    costs = {}
    for name, option in options.items():
        prices = cost.token_costs(option["steps"], option["price_per_hour"]) if "steps" in option else option
        dollars = 0.0
        for tokens, price in ((input_tokens, prices["input_per_million"]),
                              (output_tokens, prices["output_per_million"])):
            if tokens and price is None:  # the log never timed this kind of token
                dollars = None
                break
            dollars += tokens / 1e6 * price if tokens else 0.0
        costs[name] = dollars
    priced = [name for name in costs if costs[name] is not None]
    return (min(priced, key=lambda name: costs[name]) if priced else None), costs  # min keeps the first of a tie


# ---------------------------------------------------------------- exercise 1: parse a tool call

_CALLS = [  # text, expected (name, arguments) or None, what it is
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
     ("get_weather", {"city": "Paris"}), "a complete call"),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}',
     ("get_weather", {"city": "Oslo"}), "generation stopped on </tool_call>, so the closing tag is missing"),
    ('Let me look.\n<tool_call>\n  {"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
     ("add", {"a": 2, "b": 3}), "prose before the call, line breaks around the JSON"),
    ('<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}} and then some words',
     ("get_time", {"zone": "UTC"}), "text after the JSON object"),
    ('<tool_call>{"name": "now"}</tool_call>', ("now", {}), "no arguments: an empty dict"),
    ('<tool_call>{"name": "first", "arguments": {}}</tool_call><tool_call>{"name": "second"}</tool_call>',
     ("first", {}), "two calls: the first one only"),
    ("The capital of France is Paris.", None, "a plain answer"),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', None, "JSON without the <tool_call> tag"),
    ("<tool_call>get_weather(city='Paris')</tool_call>", None, "not JSON"),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Par', None, "cut off in the middle of the JSON"),
    ('<tool_call>["get_weather", "Paris"]</tool_call>', None, "JSON, but not an object"),
    ('<tool_call>{"arguments": {"city": "Paris"}}</tool_call>', None, "no name"),
    ('<tool_call>{"name": "", "arguments": {}}</tool_call>', None, "an empty name"),
    ('<tool_call>{"name": "get_weather", "arguments": "Paris"}</tool_call>', None, "arguments that are not an object"),
]


def _as_call(got):
    """A ToolCall-like result as (name, arguments), or the value itself."""
    if got is None:
        return None
    name, arguments = getattr(got, "name", got), getattr(got, "arguments", None)
    return (name, arguments) if isinstance(name, str) else got


def check_parse_tool_call(fn) -> bool:
    """fn(text) -> ToolCall(name, arguments) for the first well-formed call, else None."""
    def cases():
        return [Case((text,), want, f"text={text!r}  ({note})") for text, want, note in _CALLS]
    return run_check("parse_tool_call", lambda text: _as_call(fn(text)), cases,
                     forbidden=(reference_parse_tool_call, agent_tools.parse_tool_call))


# ---------------------------------------------------------------- exercise 2: the agent loop


def _call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def _weather(city):
    return {"Paris": "Paris: 18 °C, light rain", "Oslo": "Oslo: -3 °C, snow"}.get(city, f"{city}: no data")


def _add(a, b):
    return a + b


def _now():
    return "12:00 UTC"


_RATES = {"EUR": 1.0, "USD": 1.1}


def _convert(amount, currency):
    if currency not in _RATES:
        raise ValueError(f"no rate for {currency!r}")
    return round(amount * _RATES[currency], 2)


def _population(city):
    return {"Paris": 2_100_000, "Oslo": 710_000}[city]  # KeyError for any other city


def _divide(a, b):
    return a / b


def _search(*, query, limit=2):  # keyword-only: tools[name](**arguments) is the only way to call it
    return f"{limit} results for {query!r}"


def _tool_error(fn, **arguments) -> str:
    """The message run_agent must append when a tool raises (computed by calling the tool here)."""
    try:
        fn(**arguments)
    except Exception as e:
        return f"error: {type(e).__name__}: {e}"
    raise AssertionError("the tool was expected to raise")


_TOOLS = {"get_weather": _weather, "add": _add, "now": _now, "convert": _convert, "get_population": _population,
          "divide": _divide, "search": _search}
_USER = {"role": "user", "content": "What is the weather in Paris?"}
_SYSTEM = {"role": "system", "content": "You can call get_weather and add."}

# question, [(reply text, prompt tokens, output tokens)], max_passes, the tool messages
# expected after each tool-calling pass, the expected answer, what the case is.
_AGENT_CASES = [
    ([_USER], [("It rains in Paris.", 30, 6)], 4, [], "It rains in Paris.",
     "the model answers at once: one pass, no tool"),
    ([_SYSTEM, _USER], [(_call("get_weather", city="Paris"), 41, 17), ("Light rain, 18 °C.", 70, 8)], 4,
     ["Paris: 18 °C, light rain"], "Light rain, 18 °C.", "one tool call, then the answer"),
    ([_USER], [(_call("get_weather", city="Paris"), 30, 17), (_call("get_weather", city="Oslo"), 60, 17),
               ("Paris is warmer.", 90, 5)], 4,
     ["Paris: 18 °C, light rain", "Oslo: -3 °C, snow"], "Paris is warmer.", "two calls, then the answer"),
    ([_USER], [("Checking. " + _call("add", a=2, b=40), 25, 20), ("42", 55, 2)], 4, ["42"], "42",
     "a call after some prose; the tool returns an int (the message holds str(result))"),
    ([_USER], [(_call("get_news", topic="rain"), 30, 15), ("I cannot look that up.", 50, 7)], 4,
     ["error: unknown tool 'get_news'"], "I cannot look that up.", "an unknown tool: tell the model, go on"),
    ([_USER], [(_call("add", a=1), 30, 12), ("Sorry.", 60, 3)], 4, [_tool_error(_add, a=1)], "Sorry.",
     "a tool that raises (a missing argument): its error becomes the tool message"),
    ([_USER], [(_call("get_weather", city="Paris"), 30, 17)] * 3, 3,
     ["Paris: 18 °C, light rain"] * 3, None, "max_passes=3 reached, still calling tools: no answer"),
    ([_USER], [('<tool_call>{"name": "get_weather", "arguments": {"city": ', 30, 14)], 4, [],
     '<tool_call>{"name": "get_weather", "arguments": {"city": ', "a malformed call is not a call: it is the answer"),
    # Replies only a real parser reads right: use parse_call, as the exercise says.
    ([_USER], [('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}', 30, 16), ("Snow.", 60, 2)], 4,
     ["Oslo: -3 °C, snow"], "Snow.", "generation stopped on </tool_call>, so the call has no closing tag"),
    ([_USER], [('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}} and I will wait', 30, 20), ("3", 60, 1)], 4,
     ["3"], "3", "words after the call's JSON, no closing tag"),
    ([_USER], [('<tool_call>{"name": "now"}</tool_call>', 30, 9), ("It is noon.", 45, 4)], 4,
     ["12:00 UTC"], "It is noon.", "a call without arguments: the tool is called with none"),
    ([_USER], [('<tool_call>{"arguments": {"city": "Paris"}}</tool_call>', 30, 12)], 4, [],
     '<tool_call>{"arguments": {"city": "Paris"}}</tool_call>',
     "a call without a name is not a call: it is the answer"),
    # Any exception a tool raises goes back to the model, not only a TypeError (issue 56):
    ([_USER], [(_call("convert", amount=10, currency="XYZ"), 30, 16), ("No rate for that.", 60, 5)], 4,
     [_tool_error(_convert, amount=10, currency="XYZ")], "No rate for that.",
     "a tool that raises ValueError (no rate for the currency): its error becomes the tool message"),
    ([_USER], [(_call("get_population", city="Atlantis"), 30, 14), ("Unknown city.", 60, 3)], 4,
     [_tool_error(_population, city="Atlantis")], "Unknown city.",
     "a tool that raises KeyError: its error becomes the tool message, str(e) and all"),
    ([_USER], [(_call("divide", a=1, b=0), 30, 12), (_call("divide", a=1, b=4), 50, 12), ("0.25", 70, 3)], 4,
     [_tool_error(_divide, a=1, b=0), "0.25"], "0.25", "a tool that raises ZeroDivisionError, then a call that works"),
    # Tools are called with the arguments as keywords, tools[name](**arguments):
    ([_USER], [(_call("divide", b=4, a=2), 30, 12), ("Half.", 50, 2)], 4, ["0.5"], "Half.",
     "arguments listed in another order than the parameters (b before a): by name, 2 / 4 = 0.5"),
    ([_USER], [(_call("search", query="trains to Lyon"), 30, 13), ("Two trains.", 50, 3)], 4,
     ["2 results for 'trains to Lyon'"], "Two trains.",
     "a tool whose parameters are keyword-only, search(*, query, limit=2): it takes no positional argument"),
]


@dataclass
class _AgentOutcome:
    answer: object
    passes: object
    tool_calls: object
    prompt_tokens: object
    output_tokens: object
    messages: object  # the transcript the result holds
    shown: list  # what the model was shown at each pass
    input_after: list  # the caller's messages after the call (must be unchanged)

    def __repr__(self) -> str:
        def roles(ms):  # compact: a failure line shows at most MAX_SHOWN characters
            try:
                return "[" + ", ".join(f"{m['role']}: {str(m['content'])[:14]!r}" for m in ms) + "]"
            except Exception:
                return repr(ms)[:80]
        shown = [len(ms) for ms in self.shown]
        answer = self.answer if self.answer is None else str(self.answer)[:24]
        return (f"answer={answer!r}, passes={self.passes}, tool_calls={self.tool_calls}, "
                f"tokens in/out={self.prompt_tokens}/{self.output_tokens}, caller's list after the call: "
                f"{len(self.input_after)} messages, model shown conversations of {shown} messages, "
                f"messages={roles(self.messages)}")


def _expected_agent(question, script, max_passes, tool_messages, answer) -> _AgentOutcome:
    """What the loop must produce, assembled from the case's script: each pass
    appends the model's reply and, if it called a tool, the tool's message."""
    transcript, shown = [dict(m) for m in question], []
    passes = min(len(script), max_passes)
    for n in range(passes):
        shown.append([dict(m) for m in transcript])
        transcript.append({"role": "assistant", "content": script[n][0]})
        if n < len(tool_messages):
            transcript.append({"role": "tool", "content": tool_messages[n]})
    return _AgentOutcome(answer, passes, len(tool_messages), sum(s[1] for s in script[:passes]),
                         sum(s[2] for s in script[:passes]), transcript, shown, [dict(m) for m in question])


def _run_agent_case(fn):
    def run(question, script, max_passes):
        shown = []

        def generate(messages):  # a scripted model that remembers what it was shown
            shown.append([dict(m) for m in messages])
            if len(shown) > len(script):  # a plain answer, so that any loop stops here
                return agent_tools.ModelReply(f"(no reply: this case scripts only {len(script)})", 0, 0)
            return agent_tools.ModelReply(*script[len(shown) - 1])

        caller = [dict(m) for m in question]
        try:
            result = fn(generate, dict(_TOOLS), caller, max_passes)
        except NotImplementedError:
            raise
        except Exception as e:  # shown against the expected outcome, with the tool that raised it if one did
            return _AgentRaised(e, _raising_tool(e), len(shown))
        fields = [getattr(result, f, "<missing>") for f in
                  ("answer", "passes", "tool_calls", "prompt_tokens", "output_tokens", "messages")]
        messages = fields[5]
        if isinstance(messages, list):
            messages = [dict(m) if isinstance(m, dict) else m for m in messages]
        return _AgentOutcome(*fields[:5], messages, shown, caller)
    return run


class _AgentRaised:
    """What the check reports when the loop raised instead of returning a result."""

    def __init__(self, error: Exception, tool: str | None, passes: int):
        self.error, self.tool, self.passes = error, tool, passes

    def __repr__(self):
        where = f" from inside the tool {self.tool!r}" if self.tool else ""
        return f"raised {type(self.error).__name__}: {str(self.error)[:120]}{where}, in pass {self.passes}"


def _raising_tool(error: Exception) -> str | None:
    """The name of the check's tool whose code raised `error` last, or None."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code if tb is not None else None
    return next((name for name, tool in _TOOLS.items() if tool.__code__ is code), None)


def _text(value, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + " ...'"


def _where_agent(got, expected) -> str | None:
    """The first field, or the first message, where the loop's result differs."""
    if isinstance(got, _AgentRaised):
        error = got.error
        if got.tool is None:
            return f"first difference in pass {got.passes}: your loop raised {type(error).__name__}"
        wanted = next((m["content"] for m in expected.messages if m["role"] == "tool"
                       and m["content"].startswith(f"error: {type(error).__name__}")), None)
        return (f"first difference in pass {got.passes}: the tool {got.tool!r} raised {type(error).__name__} and it "
                "left your loop" + (f"; the expected tool message is {wanted!r}" if wanted else ""))
    if not isinstance(got, _AgentOutcome):
        return None
    for field in ("answer", "passes", "tool_calls", "prompt_tokens", "output_tokens"):
        if getattr(got, field) != getattr(expected, field):
            return f"{field} differs: expected {_text(getattr(expected, field))}, got {_text(getattr(got, field))}"
    for name, mine, theirs in (("the caller's list after the call", got.input_after, expected.input_after),
                               ("messages", got.messages, expected.messages)):
        if mine == theirs:
            continue
        if not isinstance(mine, list):
            return f"{name} differs: got {_text(mine)}, not a list of messages"
        i = first_mismatch(mine, theirs)
        if i < min(len(mine), len(theirs)):
            return f"{name}[{i}] differs: expected {_text(theirs[i])}, got {_text(mine[i])}"
        return f"{name} differs: {len(mine)} messages, expected {len(theirs)}"
    for n, (a, b) in enumerate(zip(got.shown, expected.shown)):
        if a != b:
            return f"what the model was shown differs in pass {n}: {len(a)} messages, expected {len(b)}"
    return None


def check_run_agent(fn) -> bool:
    """fn(generate, tools, messages, max_passes) -> AgentResult: run the model,
    run every tool it calls, append the result, run it again, until an answer.
    (Calling tinyinfer_course.text.tools.parse_tool_call, exercise 1's twin, is allowed here.)"""
    def cases():
        return [Case((question, script, max_passes),
                     _expected_agent(question, script, max_passes, tool_messages, answer),
                     f"{note}: {len(script)} scripted replies, max_passes={max_passes}")
                for question, script, max_passes, tool_messages, answer, note in _AGENT_CASES]
    return run_check("run_agent", _run_agent_case(fn), cases,
                     forbidden=(reference_run_agent, agent_tools.run_agent, agent_tools.run_tool),
                     explain=_where_agent)


# ---------------------------------------------------------------- exercise 3: choose the context

_TIMETABLE = [  # with their lengths in words, the token count these cases use
    "The night train to Lyon leaves at 22:40 from platform 4.",  # 11 words
    "The train to Nice leaves at 10:15 from platform 2.",  # 10
    "Lunch is served in the dining car from noon.",  # 9
    "Tickets to Lyon cost 40 euros in second class.",  # 9
    "Bicycles travel free on every train.",  # 6
    "The Nice train has a quiet coach.",  # 7
]


def _words(text: str) -> int:
    return len(text.split())


_SELECT_CASES = [  # chunks, question, budget, expected (indices into chunks), what
    (_TIMETABLE, "When does the night train to Lyon leave?", 100, [0, 1, 3, 4, 5],
     "a large budget: every chunk sharing a word, in document order"),
    (_TIMETABLE, "When does the night train to Lyon leave?", 11, [0],
     "a budget of 11: chunk 0 ('night', 'train', 'lyon': 3 shared words) only"),
    (_TIMETABLE, "When does the night train to Lyon leave?", 17, [0, 4],
     "17: after chunk 0 (11), chunks 1 (10) and 3 (9) do not fit, chunk 4 (6) still does"),
    (_TIMETABLE, "How much do TICKETS to LYON cost?", 20, [0, 3],
     "upper case in the question; chunk 3 ranks first, chunk 0 ('lyon') still fits: document order"),
    (_TIMETABLE, "Which train goes to Nice?", 10, [1],
     "'train', 'nice': chunks 1 and 5 both share 2 words; the tie goes to the earlier chunk"),
    (_TIMETABLE, "Is there a quiet coach?", 5, [], "the only match (7 words) does not fit a budget of 5"),
    (_TIMETABLE, "Where can I buy a sandwich?", 100, [], "no chunk shares a word: send nothing"),
    (_TIMETABLE, "What is it?", 100, [], "a question made only of stopwords matches nothing"),
    (["Platform 9, platform 10 and platform 11 are new.", "Platform 4 is open today.", "Gate 4 is open."],
     "Is platform 4 open?", 9, [1, 2],
     "distinct words count, not occurrences: chunk 0 says 'platform' three times but shares one word"),
    (["alpha beta", "beta gamma delta", "gamma"], "gamma beta", 3, [1],
     "chunk 1 shares two words and its 3 tokens fill the budget of 3 exactly"),
]


def check_select_context(fn) -> bool:
    """fn(chunks, question, budget_tokens, count_tokens) -> the chosen chunks, in document order."""
    def cases():
        return [Case((list(chunks), question, budget, _words), [chunks[i] for i in want],
                     f"question={question!r}, budget_tokens={budget}, count_tokens = words per chunk, "
                     f"chunks={chunks if chunks is not _TIMETABLE else 'the six-line timetable'}  ({note})")
                for chunks, question, budget, want, note in _SELECT_CASES]
    return run_check("select_context", fn, cases, same=lambda got, want: isinstance(got, list) and got == want,
                     forbidden=(reference_select_context, context.select_context))


# ---------------------------------------------------------------- exercise 4: the cheaper way to serve


def _steps(*rows) -> list[dict]:
    return [{"num_prefill_tokens": p, "num_decode_tokens": d, "step_time_s": s} for p, d, s in rows]


def _machine(price_per_hour: float, *rows) -> dict:
    """A machine you rent by the hour and run yourself, with its engine's step log."""
    return {"steps": _steps(*rows), "price_per_hour": price_per_hour}


def _price_list(input_per_million: float, output_per_million: float) -> dict:
    """A provider's price list: dollars per million input and output tokens."""
    return {"input_per_million": input_per_million, "output_per_million": output_per_million}


# Worked by hand. A machine at P dollars an hour costs P / 3600 a second. Its
# step log times each kind of token on the steps that did only that kind (a mixed
# step's seconds cannot be split between its two kinds), weighing each step by
# its length: seconds per input token = the prefill steps' seconds / their tokens.
# A workload of I input and O output tokens then costs
# P / 3600 * (I * s_in + O * s_out); on a price list, I / 1e6 * in + O / 1e6 * out.
_CHIP = _machine(3.6, (1024, 0, 2.0), *[(0, 8, 0.25)] * 15)  # $0.001 a second; 2/1024 s per input, 1/32 s per output
_API = _price_list(2.5, 25.0)
_MIXED = _machine(1.8, (256, 0, 0.5), (200, 4, 0.6), (0, 4, 0.1), (0, 4, 0.1))  # 0.5/256 s and 0.2/8 s per token
_UNEVEN = _machine(36.0, (100, 0, 1.0), (300, 0, 0.5), (0, 1, 0.05), (0, 9, 0.15))  # 1.5/400 s and 0.2/10 s
_NO_PREFILL = _machine(7.2, (0, 0, 0.01), (0, 2, 0.1))  # no prefill step at all; 0.05 s per output token
_FREE = _machine(0.0, (50, 0, 0.1), (0, 1, 0.02))

# options, input tokens, output tokens, the expected (choice, {option: dollars or None}), what.
_CHOICE_CASES = [
    ({"machine": _CHIP, "api": _API}, 100_000, 1_000, ("machine", {"machine": 0.2265625, "api": 0.275}),
     "an input-heavy workload (a long document, a short summary): the machine's cheap prefill wins"),
    ({"machine": _CHIP, "api": _API}, 1_000, 10_000, ("api", {"machine": 0.314453125, "api": 0.2525}),
     "the same two options, an output-heavy workload: now the price list wins (the answer flips with the mix)"),
    ({"machine": _MIXED, "api": _price_list(1.0, 30.0)}, 2_560, 80, ("machine", {"machine": 0.0035, "api": 0.00496}),
     "the log holds a mixed step (200 prefill + 4 decode tokens in 0.6 s): it times neither kind"),
    ({"machine": _UNEVEN}, 400, 10, ("machine", {"machine": 0.017}),
     "steps of different lengths: 1.5 s for 400 input tokens, not the mean of the two steps' rates"),
    ({"no prefill": _NO_PREFILL, "api": _price_list(1.0, 100.0)}, 100, 10, ("api", {"no prefill": None, "api": 0.0011}),
     "a log with no prefill step cannot price input tokens: None, and never the choice"),
    ({"no prefill": _NO_PREFILL}, 0, 10, ("no prefill", {"no prefill": 0.001}),
     "the same log, a workload with no input tokens: it needs no input price (the empty step counts for nothing)"),
    ({"no prefill": _NO_PREFILL}, 5, 5, (None, {"no prefill": None}), "no option can price the workload: None"),
    ({"free": _FREE, "api": _price_list(0.1, 0.4)}, 1_000, 100, ("free", {"free": 0.0, "api": 0.00014}),
     "a machine that costs nothing an hour: every workload costs $0 on it"),
    ({"first": _price_list(1.0, 4.0), "second": _price_list(1.0, 4.0)}, 500, 500,
     ("first", {"first": 0.0025, "second": 0.0025}),
     "two identical price lists: a tie goes to the option listed first"),
]


def _same_choice(got, want) -> bool:
    try:
        name, costs = got
    except (TypeError, ValueError):
        return False
    if name != want[0] or not isinstance(costs, dict) or set(costs) != set(want[1]):
        return False
    for option, value in want[1].items():
        g = costs[option]
        if value is None:
            if g is not None:
                return False
        elif not (isinstance(g, numbers.Real) and not isinstance(g, bool)
                  and math.isclose(float(g), value, rel_tol=1e-9, abs_tol=1e-12)):
            return False
    return True


def _describe(options: dict) -> str:
    def one(o):
        if "steps" in o:
            rows = [(s["num_prefill_tokens"], s["num_decode_tokens"], s["step_time_s"]) for s in o["steps"]]
            shown = rows if len(rows) <= 4 else rows[:2] + [f"... {len(rows) - 2} more like the last"]
            return f"${o['price_per_hour']}/h, steps (prefill, decode, s) {shown}"
        return f"price list ${o['input_per_million']}/M in, ${o['output_per_million']}/M out"
    return "; ".join(f"{name!r}: {one(o)}" for name, o in options.items())


def check_cheapest_option(fn) -> bool:
    """fn(options, input_tokens, output_tokens) -> (name of the cheapest option or None,
    {option: dollars for the workload, or None where the option cannot price it})."""
    def cases():
        return [Case(({name: {k: ([dict(s) for s in v] if k == "steps" else v) for k, v in o.items()}
                       for name, o in options.items()}, i, o_), want,
                     f"input_tokens={i:,}, output_tokens={o_:,}, options: {_describe(options)}  ({note})")
                for options, i, o_, want, note in _CHOICE_CASES]
    return run_check("cheapest_option", fn, cases, same=_same_choice,
                     forbidden=(reference_cheapest_option, cost.token_costs))


# ---------------------------------------------------------------- exercise 5: a prefix tree of the vocabulary


def scan_allowed_tokens(prefix, choices, vocab, eos_token_id):
    """The scan that lab 10's TokenTrie must agree with: the tokens whose text
    keeps the reply the start of a choice, plus end-of-sequence once the reply is
    a whole choice. Tokens with no text (special tokens) never move the reply on,
    so they are never allowed. It tests every token of the vocabulary, for every
    row."""
    allowed = {i for i, text in enumerate(vocab) if text and any(c.startswith(prefix + text) for c in choices)}
    return allowed | ({eos_token_id} if prefix in choices else set())


class _Node:
    __slots__ = ("next", "ids")

    def __init__(self):
        self.next = {}  # character -> child node
        self.ids = []  # the tokens whose text spells the path from the root to this node


class ReferenceTokenTrie:
    """The course's answer to lab 10's TokenTrie exercise: a prefix tree over the
    token texts, built once; a row walks it along what remains of each choice."""

    def __init__(self, vocab):
        self.root = _Node()
        for token_id, text in enumerate(vocab):
            if not text:  # a special token: it never moves the reply on
                continue
            node = self.root
            for char in text:
                node = node.next.setdefault(char, _Node())
            node.ids.append(token_id)

    def allowed(self, prefix, choices, eos_token_id):
        allowed = {eos_token_id} if prefix in choices else set()
        for choice in choices:
            if not choice.startswith(prefix):
                continue
            node = self.root
            for char in choice[len(prefix):]:
                node = node.next.get(char)
                if node is None:
                    break
                allowed.update(node.ids)
        return allowed


def count_lines(fn, *args, **kwargs):
    """(fn(*args, **kwargs), the lines of Python it ran, in every function it
    called): work counted, not timed, by sys.settrace's "line" events. Code that
    runs in C (str.startswith, a set's update, a regular expression) counts
    nothing, so a loop over the vocabulary counts at least one line per token.
    Lab 10 compares the scan and your prefix tree by this count, and its check
    holds your tree to it."""
    lines = 0

    def trace(frame, event, arg):
        nonlocal lines
        if event == "line":
            lines += 1
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)  # from here on, each new frame is traced (this one is not)
    try:
        result = fn(*args, **kwargs)
    finally:
        sys.settrace(previous)
    return result, lines


# Token i's text; id 0 is the end-of-sequence token and id 21 another special token, both with no text.
_VOCAB = ["", "get", "_", "w", "weather", "e", "time", "t", "add", "a", "d", "dd", "x", "get_", "Get", "addx",
          "_time", "ime", " get", "ad", "time", "", "get_weather", "get_weathers"]
_TOOL_NAMES = ["get_weather", "get_time", "add"]
_MASK_CASES = [  # prefix, choices, the allowed ids (worked out by hand), what it shows
    ("", _TOOL_NAMES, {1, 8, 9, 13, 19, 22},
     "the start: 'a', 'ad', 'add', 'get', 'get_' and 'get_weather' (a whole choice in one token); not 'addx' "
     "or 'get_weathers' (past the end), 'Get', ' get' or the tokens with no text"),
    ("get", _TOOL_NAMES, {2, 16}, "'_' and '_time' continue; 'get' itself is not a choice, so no end yet"),
    ("get_", _TOOL_NAMES, {3, 4, 6, 7, 20}, "two choices still open: tokens towards either one; "
                                            "two tokens share the text 'time'"),
    ("get_w", _TOOL_NAMES, {5}, "only 'e' starts 'eather'; 'ime' would fit 'get_time' without the w"),
    ("get_weather", _TOOL_NAMES, {0}, "a whole choice and nothing longer: only end-of-sequence"),
    ("a", _TOOL_NAMES, {10, 11}, "'d' and 'dd': a token may finish the choice exactly"),
    ("ad", _TOOL_NAMES, {10}, "'d' finishes 'add'"),
    ("a", ["a", "add"], {0, 10, 11}, "'a' is a whole choice and the start of another: end or go on"),
    ("t", ["t", "time"], {0, 17}, "'t' is whole; 'ime' would make 'time'"),
    ("", ["x"], {12}, "one choice, one token"),
    ("", ["add", "addx"], {8, 9, 15, 19}, "'a', 'ad', 'add' and 'addx' each end where the next goes on"),
    ("get", ["get", "get_time"], {0, 2, 16}, "a choice that starts another: end, or '_' and '_time'"),
    ("", [" get"], {18}, "a choice that starts with a space: ' get', not 'get'"),
]
# A second vocabulary, where token 0 has text (a single space) and end-of-sequence is 6: the
# tokens of words that start with a space, as in SmolLM2's vocabulary, and tokens of spaces only.
_SPACE_VOCAB = [" ", " P", "Paris", " Paris", " Par", "is", "", "P", " Lima", "  ", " L", "ima", "aris", "ar"]
_SPACE_EOS = 6
_CITY_CHOICES = [" Paris", " Lima"]
_SPACE_CASES = [  # prefix, choices, the allowed ids (worked out by hand), what it shows
    ("", _CITY_CHOICES, {0, 1, 3, 4, 8, 10}, "the start: token 0 (a single space) and the tokens that start with a "
     "space; not 'Paris', 'P' or '  ' (two spaces)"),
    (" ", _CITY_CHOICES, {2, 7}, "after the space: 'Paris' and 'P', not ' P' or ' Paris'"),
    (" P", _CITY_CHOICES, {12, 13}, "'aris' and 'ar' continue ' Paris'"),
    (" Paris", _CITY_CHOICES, {_SPACE_EOS}, "a whole choice: only end-of-sequence, id 6 here"),
    ("", ["Paris", " Paris"], {0, 1, 2, 3, 4, 7}, "the same word with and without its space: both paths"),
    ("", ["  "], {0, 9}, "a choice of two spaces: one space, or both at once"),
    (" ", ["  ", " L"], {0}, "after one space: token 0 makes '  '; 'L' has no token of its own, and ' ' "
     "is not a whole choice, so no end"),
]
# The same rows again, with the vocabulary grown by tokens that follow every choice
# part of the way and then leave it (a digit, which no choice has): the answers stay
# the same, and a row that looks at every token now runs thousands of lines.
_GROWN_ROWS = [0, 2, 7, 10]
_FILLER_PER_BRANCH = 700


def _grown_vocab() -> list[str]:
    starts = sorted({c[:k] for _, choices, _, _ in _MASK_CASES for c in choices for k in range(len(c) + 1)})
    return _VOCAB + [start + str(n) for start in starts for n in range(_FILLER_PER_BRANCH)]


# Rows on the model's own vocabulary, checked against the scan: tool names, and
# city names whose tokens start with a space.
_CITIES = [" Paris", " Tokyo", " Lima"]
_REAL_ROWS = [("", _TOOL_NAMES), ("get_", _TOOL_NAMES), ("get_w", _TOOL_NAMES), ("get_weather", _TOOL_NAMES),
              ("get", ["get", "get_time"]), ("", _CITIES), (" ", _CITIES), (" Par", _CITIES)]
_REAL_MODEL = "smollm2-135m-instruct"


@functools.lru_cache(maxsize=1)
def _real_vocab() -> tuple[tuple[str, ...], int]:
    """(each token's text, "" for a special token; the end-of-sequence id) of the lab's model."""
    from tinyinfer.tokenizer import Tokenizer
    from tinyinfer.weights import resolve_model

    tok = Tokenizer(resolve_model(_REAL_MODEL))
    special = set(tok._plain.get_added_tokens_decoder())
    return tuple("" if i in special else tok.decode([i]) for i in range(tok.vocab_size)), tok.eos_token_id


def _ids_or_none(value):
    """value as a set of token ids, or None when it is not a set of ints."""
    ok = isinstance(value, (set, frozenset)) and all(type(t) is int for t in value)
    return set(value) if ok else None


@dataclass(frozen=True)
class _Row:
    """One row of the mask and the lines of Python that computed it. For the
    expected row: `most`, the check's limit on lines (None: not held to one),
    and the vocabulary and end-of-sequence id, to name a token in a message."""
    ids: object
    lines: int | None = None
    most: int | None = None
    vocab: tuple = ()
    eos: int | None = None

    def __repr__(self):
        ids = _ids_or_none(self.ids)
        shown = "{" + ", ".join(map(str, sorted(ids))) + "}" if ids else repr(self.ids)
        if self.lines is not None:
            return f"{shown} in {self.lines:,} lines of Python"
        return shown + (f" in at most {self.most:,} lines of Python" if self.most is not None else "")


def _same_row(got: _Row, want: _Row) -> bool:
    return _ids_or_none(got.ids) == want.ids and (want.most is None or got.lines <= want.most)


def _row_difference(got: _Row, want: _Row) -> str:
    ids = _ids_or_none(got.ids)
    if ids is None:
        held = " holding more than ints" if isinstance(got.ids, (set, frozenset)) else ""
        return (f"first difference: the type. allowed() returned a {type(got.ids).__name__}{held}: "
                "return a set of token ids (ints), as the exercise asks (a mask row is a set: no order, no repeats)")
    extra, missing = ids - want.ids, want.ids - ids
    if extra or missing:
        first = min(extra | missing)
        name = ("end-of-sequence" if first == want.eos else repr(want.vocab[first])
                if 0 <= first < len(want.vocab) else "no such token")
        return (f"first difference at token {first} ({name}): "
                + ("yours allows it, the scan does not" if first in extra else "the scan allows it, yours does not")
                + f" (yours: {len(extra)} extra, {len(missing)} missing)")
    return (f"first difference: the work. Your allowed() gave the scan's ids but ran {got.lines:,} lines of Python "
            f"for this one row; the limit is a tenth of the vocabulary's {len(want.vocab):,} tokens, {want.most:,}. "
            "It looks at far more tokens than can fit: walk the tree along the choices instead.")


def check_token_trie(cls) -> bool:
    """cls(vocab) -> a prefix tree of the token texts vocab[i]; its
    allowed(prefix, choices, eos_token_id) -> the set of token ids that one row
    of the choice mask lets through. The same ids as the scan
    (scan_allowed_tokens), on hand-made rows and on the model's own
    vocabulary; and, where the vocabulary has thousands of tokens, at most a
    tenth as many lines of Python per row as it has tokens (count_lines), where
    a scan runs at least one per token. Building the tree is not counted: an
    engine builds it once, when it loads the tokenizer."""
    vocabs, trees = {}, {}

    def row(which, prefix, choices, eos_token_id):
        if which not in trees:  # built once per vocabulary, inside the first row's watch
            trees[which] = cls(list(vocabs[which]))
        ids, lines = count_lines(trees[which].allowed, prefix, list(choices), eos_token_id)
        return _Row(ids, lines)

    def cases():
        vocabs["hand"], vocabs["grown"] = tuple(_VOCAB), tuple(_grown_vocab())
        vocabs["real"], eos = _real_vocab()
        grown, real = len(vocabs["grown"]), len(vocabs["real"])
        out = [Case(("hand", prefix, choices, 0), _Row(want, vocab=vocabs["hand"], eos=0),
                    f"TokenTrie({_VOCAB}).allowed({prefix!r}, {choices}, eos_token_id=0)  ({note})")
               for prefix, choices, want, note in _MASK_CASES]
        vocabs["spaces"] = tuple(_SPACE_VOCAB)
        out += [Case(("spaces", prefix, choices, _SPACE_EOS), _Row(want, vocab=vocabs["spaces"], eos=_SPACE_EOS),
                     f"TokenTrie({_SPACE_VOCAB}).allowed({prefix!r}, {choices}, eos_token_id={_SPACE_EOS})  ({note})")
                for prefix, choices, want, note in _SPACE_CASES]
        shown = ", ".join(repr(t) for t in vocabs["grown"][len(_VOCAB)::1997][:4])
        for k in _GROWN_ROWS:
            prefix, choices, want, note = _MASK_CASES[k]
            out.append(Case(("grown", prefix, choices, 0), _Row(want, most=grown // 10, vocab=vocabs["grown"], eos=0),
                            f"TokenTrie(the {len(_VOCAB)} tokens above and {grown - len(_VOCAB):,} more that leave "
                            f"every choice at a digit: {shown} ...).allowed({prefix!r}, {choices}, eos_token_id=0)"))
        for prefix, choices in _REAL_ROWS:
            want = scan_allowed_tokens(prefix, choices, vocabs["real"], eos)
            out.append(Case(("real", prefix, choices, eos), _Row(want, most=real // 10, vocab=vocabs["real"], eos=eos),
                            f"TokenTrie({_REAL_MODEL}'s {real:,} token texts).allowed({prefix!r}, {choices}, "
                            f"eos_token_id={eos})  (the scan's answer)"))
        return out

    return run_check("token_trie", row, cases, same=_same_row, explain=_row_difference,
                     forbidden=(scan_allowed_tokens, ReferenceTokenTrie, structured_output.allowed_token_ids))


LAB = Lab(10, "beyond one reply",
          exports=("check_parse_tool_call", "check_run_agent", "check_select_context", "check_cheapest_option",
                   "check_token_trie", "reference_parse_tool_call", "reference_run_agent",
                   "reference_select_context", "reference_cheapest_option", "scan_allowed_tokens",
                   "ReferenceTokenTrie", "count_lines"),
          fallbacks={"check_parse_tool_call": reference_parse_tool_call, "check_run_agent": reference_run_agent,
                     "check_select_context": reference_select_context,
                     "check_cheapest_option": reference_cheapest_option,
                     "check_token_trie": ReferenceTokenTrie})
