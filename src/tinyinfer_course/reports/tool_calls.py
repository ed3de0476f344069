"""How many of a small model's tool calls parse, free and under a grammar mask.

Lab 10 asks SmolLM2-135M tool-call questions with no worked example, greedily,
twice: free, and constrained by structured_output.tool_call_grammar. It counts
the replies tools.parse_tool_call can read. The lab computes the counts live;
the copy stored with the course (data/, beside this file, so that storing a run
changes no engine fingerprint) says what they were on a named machine and date,
stamped with the fingerprint of the modules that produced them.

    python -m tinyinfer_course.reports.tool_calls --save src/tinyinfer_course/reports/data/tool-calls-DATE.json
"""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from .. import machine
from .stored import Age, StoredReport, closure_of
from tinyinfer.sampling import SamplingParams
from tinyinfer.structured_output import StructuredOutputsParams, tool_call_grammar
from ..text.tools import parse_tool_call

STORED = Path(__file__).resolve().parent / "data" / "tool-calls-2026-12-05-xeon.json"
TOOL_NAMES = ["get_weather", "get_time", "add"]
SYSTEM = {"role": "system", "content": (
    "You can call the tools get_weather (argument: city), get_time (argument: city) and add (arguments: a, b). "
    'To call one, reply with only <tool_call>{"name": ..., "arguments": {...}}</tool_call>.')}
QUESTIONS = ["What is the weather in Paris?", "What time is it in Tokyo?", "What is 17 plus 25?",
             "Is it snowing in Oslo?", "Add 3 and 4.", "What's the time in Lima right now?"]
RIGHT_TOOLS = ["get_weather", "get_time", "add", "get_weather", "add", "get_time"]  # one per question
TOOL_ARGUMENTS = {"get_weather": {"city"}, "get_time": {"city"}, "add": {"a", "b"}}  # as SYSTEM names them
MAX_TOKENS = 48


def is_right_call(reply: str, tool: str) -> bool:
    """The reply calls `tool` with exactly that tool's argument names. The values are
    not judged: parsing says the form is right, this says the choice of tool and names is."""
    call = parse_tool_call(reply)
    return call is not None and call.name == tool and set(call.arguments) == TOOL_ARGUMENTS[tool]


def count_right(replies: list[str]) -> int:
    """How many replies, one per question in QUESTIONS, call the question's tool with its own argument names."""
    return sum(is_right_call(r, tool) for r, tool in zip(replies, RIGHT_TOOLS, strict=True))


def count_parsed(llm) -> dict:
    """{"free": {...}, "constrained": {...}}, each with how many of the replies
    parse, how many are the right call (count_right), out of how many, and the
    replies themselves. One batch per condition."""
    chats = [[SYSTEM, {"role": "user", "content": q}] for q in QUESTIONS]
    grammar = StructuredOutputsParams(grammar=tool_call_grammar(TOOL_NAMES))
    result = {}
    for label, so in (("free", None), ("constrained", grammar)):
        outs = llm.chat(chats, SamplingParams(max_tokens=MAX_TOKENS, temperature=0, structured_outputs=so))
        replies = [o.outputs[0].text for o in outs]
        result[label] = {"parsed": sum(parse_tool_call(r) is not None for r in replies),
                         "right": count_right(replies), "total": len(replies), "replies": replies}
    return result


def _note(report: dict, age: Age) -> str:
    """The note in lab 10's words: when, on what, and whether today's engine is the one that counted."""
    meta = report["meta"]
    where = f"{age.when} on {meta['machine']}, model {meta['model']} ({meta['dtype']})"
    if age.same:
        return f"Stored counts: measured {where}, by the same engine code as today's."
    named = f": {', '.join(age.changed[:3])}" + (" and more" if len(age.changed) > 3 else "") if age.changed else ""
    return (f"Stored counts: measured {where}, by an older engine (fingerprint {age.fingerprint}; "
            f"{len(age.changed)} of its modules have changed since{named}), so today's counts may differ.")


# The modules behind the counts: the offline API and the tool-call parser (this
# file, which stamps do not count, only renders and drives them).
REPORT = StoredReport("a tool-call report", STORED, closure_of("tinyinfer.llm", "tinyinfer_course.text.tools"),
                      keys=("meta", "counts"),
                      made_by="`python -m tinyinfer_course.reports.tool_calls --save` makes one",
                      words=_note)
load, note, engine_stamp = REPORT.load, REPORT.note, REPORT.stamp  # lab 10 calls the first two, its tests all three


def main(argv=None) -> None:
    from tinyinfer.llm import LLM

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--save", type=Path, help="write the report here")
    ap.add_argument("--machine", default=machine.cpu_name())
    args = ap.parse_args(argv)
    llm = LLM("smollm2-135m-instruct", device="cpu")
    counts = count_parsed(llm)
    report = {"meta": {"date": datetime.date.today().isoformat(), "machine": args.machine,
                       "model": "smollm2-135m-instruct", "dtype": str(llm.dtype).removeprefix("torch."),
                       "max_tokens": MAX_TOKENS, "engine_stamp": REPORT.stamp()}, "counts": counts}
    for label, c in counts.items():
        print(f"{label}: {c['parsed']} of {c['total']} parse, {c['right']} are the right call")
        for r in c["replies"]:
            print("   ", repr(r))
    if args.save:
        args.save.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
