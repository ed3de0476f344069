"""How many of a small model's tool calls parse, free and under a grammar mask.

Lab 10 asks SmolLM2-135M tool-call questions with no worked example, greedily,
twice: free, and constrained by structured_output.tool_call_grammar. It counts
the replies tools.parse_tool_call can read. The lab computes the counts live;
the copy stored with the course (data/, beside this file, so that storing a run
changes no engine fingerprint) says what they were on a named machine and date,
stamped with the fingerprint of the modules that produced them.

    python -m tinyinfer.bench.tool_calls --save src/tinyinfer/bench/data/tool-calls-2026-12-05-xeon.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
from pathlib import Path

from .. import fingerprint
from ..sampling import SamplingParams
from ..structured_output import StructuredOutputsParams, tool_call_grammar
from ..tools import parse_tool_call

STORED = Path(__file__).resolve().parent / "data" / "tool-calls-2026-12-05-xeon.json"
TOOL_NAMES = ["get_weather", "get_time", "add"]
SYSTEM = {"role": "system", "content": (
    "You can call the tools get_weather (argument: city), get_time (argument: city) and add (arguments: a, b). "
    'To call one, reply with only <tool_call>{"name": ..., "arguments": {...}}</tool_call>.')}
QUESTIONS = ["What is the weather in Paris?", "What time is it in Tokyo?", "What is 17 plus 25?",
             "Is it snowing in Oslo?", "Add 3 and 4.", "What's the time in Lima right now?"]
MAX_TOKENS = 48


def count_parsed(llm) -> dict:
    """{"free": {...}, "constrained": {...}}, each with how many of the replies
    parse, out of how many, and the replies themselves. One batch per condition."""
    chats = [[SYSTEM, {"role": "user", "content": q}] for q in QUESTIONS]
    grammar = StructuredOutputsParams(grammar=tool_call_grammar(TOOL_NAMES))
    result = {}
    for label, so in (("free", None), ("constrained", grammar)):
        outs = llm.chat(chats, SamplingParams(max_tokens=MAX_TOKENS, temperature=0, structured_outputs=so))
        replies = [o.outputs[0].text for o in outs]
        result[label] = {"parsed": sum(parse_tool_call(r) is not None for r in replies), "total": len(replies),
                         "replies": replies}
    return result


def modules() -> list[str]:
    """The modules behind the counts: the offline API and this file."""
    # Named, not __name__: run with -m this file is "__main__", and the stamp must match the imported module's.
    return fingerprint.closure([f"{fingerprint.PACKAGE}.llm", f"{fingerprint.PACKAGE}.bench.tool_calls"])


def engine_stamp() -> dict:
    return fingerprint.stamp(fingerprint.module_hashes(modules()))


def note(report: dict, today: dict | None = None) -> str:
    """One sentence: when, on what, and whether today's engine is the one that counted."""
    meta = report["meta"]
    theirs = meta["engine_stamp"]["engine_fingerprint"]
    today = today or engine_stamp()
    where = f"{meta['date']} on {meta['machine']}, model {meta['model']} ({meta['dtype']})"
    if theirs == today["engine_fingerprint"]:
        return f"Stored counts: measured {where}, by the same engine code as today's."
    changed = [m.split(" (")[0] for m in fingerprint.changed(meta["engine_stamp"]["engine_modules"],
                                                              today["engine_modules"])]
    named = f": {', '.join(changed[:3])}" + (" and more" if len(changed) > 3 else "") if changed else ""
    return (f"Stored counts: measured {where}, by an older engine (fingerprint {theirs}; "
            f"{len(changed)} of its modules have changed since{named}), so today's counts may differ.")


def load(path: Path = STORED) -> dict:
    return json.loads(Path(path).read_text())


def main(argv=None) -> None:
    from ..llm import LLM

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--save", type=Path, help="write the report here")
    ap.add_argument("--machine", default=platform.processor() or platform.machine())
    args = ap.parse_args(argv)
    llm = LLM("smollm2-135m-instruct", device="cpu")
    counts = count_parsed(llm)
    report = {"meta": {"date": datetime.date.today().isoformat(), "machine": args.machine,
                       "model": "smollm2-135m-instruct", "dtype": str(llm.dtype).removeprefix("torch."),
                       "max_tokens": MAX_TOKENS, "engine_stamp": engine_stamp()}, "counts": counts}
    for label, c in counts.items():
        print(f"{label}: {c['parsed']} of {c['total']} parse")
        for r in c["replies"]:
            print("   ", repr(r))
    if args.save:
        args.save.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
