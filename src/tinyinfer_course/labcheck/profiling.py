"""Lab 4 (prefill and decode), section 10: where one decode step's time goes,
from a profiler trace grouped by module.

PyTorch's profiler records every operator the step calls (`cat` "cpu_op" in
its Chrome trace) with a start `ts` and a duration `dur`, in microseconds.
It knows nothing of the model's modules; `record_step_trace` (given code)
wraps each module's forward in a `record_function` range named
"module::<kind>" (`cat` "user_annotation"), so the trace also holds when each
module ran. The learner's `breakdown_by_module(trace)` turns that into
milliseconds per module kind:

- only top-level operators count (an operator not running inside another
  operator): aten::linear calls aten::addmm, and counting both would count the
  same microseconds twice;
- each goes to the innermost module range it starts in (a residual add runs in
  the decoder layer but in none of its sub-modules), or to "other" when it
  starts in none.

The check runs the learner's function on a trace recorded once on the course's
machine and stored with the course (data/lab04_decode_trace.json), and on
small traces written by hand (one of them shuffled, one of ties and boundaries:
the same start, an operator starting exactly as a range ends, ranges ending
together), never on a live timing: a busy machine cannot
make it fail.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from .core import Case, run_check
from .registry import Lab

TRACE_PATH = Path(__file__).resolve().parents[1] / "data" / "lab04_decode_trace.json"
PREFIX = "module::"
# The module classes of tinyinfer.model, and the kind each is grouped under.
KINDS = {"Embedding": "embedding", "DecoderLayer": "layer", "RMSNorm": "norm", "Attention": "attention",
         "MLP": "mlp"}


# ---------------------------------------------------------------- given: recording a trace


def _annotate(model) -> list:
    """Wrap the forward of every module of a kind in KINDS (and the LM head) in a
    record_function range; return what undoes it."""
    undo = []
    for name, module in model.named_modules():
        kind = "lm_head" if name == "lm_head" else KINDS.get(type(module).__name__)
        if kind is None:
            continue
        forward = module.forward

        def wrapped(*args, _forward=forward, _label=PREFIX + kind, **kwargs):
            with torch.profiler.record_function(_label):
                return _forward(*args, **kwargs)

        module.forward = wrapped
        undo.append(module)
    return undo


def record_step_trace(step, model) -> dict:
    """Run step() once under torch.profiler and torch.inference_mode, with model's modules marked, and
    return the Chrome trace of this thread as a dict: {"traceEvents": [...]},
    each event {"name", "cat", "ts", "dur"} (µs), operators ("cpu_op") and
    module ranges ("user_annotation"), plus one "step" range around it all."""
    import os
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    undo = _annotate(model)
    try:
        with torch.inference_mode():  # a profile of inference: no autograd bookkeeping
            step()  # warm-up: the wrapped forwards, caches, allocations
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                with torch.profiler.record_function("step"):
                    step()
    finally:
        for module in undo:
            del module.forward  # the instance attribute goes; the class's forward is back
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        raw = json.loads(Path(path).read_text())
    finally:
        os.unlink(path)
    return _compact(raw)


def _compact(raw: dict) -> dict:
    """Keep the complete events ("ph": "X") of the thread that ran the step, and
    only the four fields the exercise reads; times relative to the step's start."""
    events = [e for e in raw.get("traceEvents", []) if e.get("ph") == "X"
              and e.get("cat") in ("cpu_op", "user_annotation")]
    step = next(e for e in events if e["name"] == "step")
    start = float(step["ts"])
    kept = [{"name": e["name"], "cat": e["cat"], "ts": round(float(e["ts"]) - start, 3),
             "dur": round(float(e["dur"]), 3)}
            for e in events if e.get("tid") == step.get("tid") and e.get("pid") == step.get("pid")]
    kept.sort(key=lambda e: (e["ts"], -e["dur"]))
    return {"traceEvents": kept}


def step_total_ms(trace: dict) -> float:
    """The "step" range's duration: the step as the profiler saw it, in ms."""
    return next(e["dur"] for e in trace["traceEvents"] if e["name"] == "step") / 1e3


def load_recorded_trace() -> dict:
    """The trace stored with the course (one decode step of SmolLM2-135M), with its "meta"."""
    return json.loads(TRACE_PATH.read_text())


# ---------------------------------------------------------------- the course's answer


def reference_breakdown_by_module(trace: dict) -> dict[str, float]:
    """The course's answer to lab 4's breakdown_by_module exercise: ms of
    top-level operator time per innermost module kind ("other" outside any)."""
    events = sorted(trace["traceEvents"], key=lambda e: (e["ts"], -e["dur"]))  # a parent before its children
    open_ops: list[float] = []  # end times of the operators running now
    open_modules: list[tuple[float, str]] = []  # (end, kind) of the module ranges running now
    out: dict[str, float] = {}
    for e in events:
        start, end = e["ts"], e["ts"] + e["dur"]
        open_ops = [t for t in open_ops if t > start]
        open_modules = [(t, k) for t, k in open_modules if t > start]
        if e["cat"] == "user_annotation" and e["name"].startswith(PREFIX):
            open_modules.append((end, e["name"][len(PREFIX):]))
        elif e["cat"] == "cpu_op":
            if not open_ops:  # top level: not inside another operator
                kind = open_modules[-1][1] if open_modules else "other"
                out[kind] = out.get(kind, 0.0) + e["dur"] / 1e3
            open_ops.append(end)
    return out


# ---------------------------------------------------------------- the check


def _op(name, ts, dur):
    return {"name": name, "cat": "cpu_op", "ts": ts, "dur": dur}


def _module(kind, ts, dur):
    return {"name": PREFIX + kind, "cat": "user_annotation", "ts": ts, "dur": dur}


def _hand_trace() -> dict:
    """A small step whose answer is easy to work out by hand: a layer holding a
    norm and an MLP (nested operators inside), a residual add in the layer
    itself, and an operator outside every module."""
    events = [
        {"name": "step", "cat": "user_annotation", "ts": 0.0, "dur": 100.0},
        _op("aten::empty", 1.0, 2.0),  # outside every module: "other"
        _module("layer", 5.0, 80.0),
        _module("norm", 6.0, 10.0),
        _op("aten::rms_norm", 7.0, 8.0),
        _op("aten::pow", 7.5, 3.0),  # inside rms_norm: not counted again
        _module("mlp", 20.0, 50.0),
        _op("aten::linear", 21.0, 30.0),
        _op("aten::addmm", 22.0, 28.0),  # inside linear
        _op("aten::silu", 55.0, 4.0),
        _op("aten::add", 75.0, 5.0),  # after the MLP ended: the layer's own residual add
        _op("aten::argmax", 90.0, 6.0),  # after the layer: "other"
    ]
    return {"traceEvents": events}


def _shuffled(trace: dict, seed: int = 4) -> dict:
    """The same events in another order: a trace file need not list its events
    by start time (the profiler writes an event when it ends)."""
    import random

    events = list(trace["traceEvents"])
    random.Random(seed).shuffle(events)
    return {"traceEvents": events}


def _edge_trace() -> dict:
    """Ties and boundaries, as a real trace has them, each pair listed in the
    order that a walk which ignores the tie rule gets wrong:
    - a parent and its child with the same start, the child listed first (two
      module ranges, an operator and the innermost range, two operators); and
      two pairs listed parent first;
    - an operator that starts exactly where another ends, and one exactly where
      a module range ends ([ts, ts + dur) holds its start, not its end);
    - a linear whose two nested operators run one after the other;
    - two module ranges ending together, then an operator outside both."""
    events = [
        {"name": "step", "cat": "user_annotation", "ts": 0.0, "dur": 200.0},
        _op("aten::addmm", 10.0, 8.0),  # inside the linear below, which starts with it
        _op("aten::linear", 10.0, 10.0),  # starts with the attention range: in it, 10 µs
        _module("attention", 10.0, 30.0),  # inside the layer, which starts with it
        _module("layer", 10.0, 80.0),
        _op("aten::softmax", 20.0, 5.0),  # starts as the linear ends: top level, attention's
        _op("aten::add", 40.0, 3.0),  # starts as the attention range ends: the layer's
        _module("norm", 44.0, 4.0),  # listed parent first
        _op("aten::rms_norm", 44.0, 3.5),
        _module("mlp", 50.0, 40.0),  # ends with the layer, at 90
        _op("aten::linear", 55.0, 30.0),
        _op("aten::t", 56.0, 1.0),  # inside the linear
        _op("aten::mm", 60.0, 24.0),  # inside the linear too, after aten::t has ended
        _op("aten::argmax", 95.0, 5.0),  # after the layer and the MLP ended together: "other"
        _module("layer", 110.0, 40.0),  # a second layer and its attention, same start, listed parent first
        _module("attention", 110.0, 20.0),
        _op("aten::bmm", 112.0, 5.0),
    ]
    return {"traceEvents": events}


def _same(got, expected) -> bool:
    return (isinstance(got, dict) and set(got) == set(expected)
            and all(isinstance(got[k], (int, float)) and not isinstance(got[k], bool)
                    and math.isclose(got[k], expected[k], rel_tol=1e-6, abs_tol=1e-9) for k in expected))


def _explain(got, expected) -> str | None:
    if not isinstance(got, dict):
        return None
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    if missing or extra:
        return f"keys differ: missing {missing}, not expected {extra}"
    for k in expected:
        if not math.isclose(got[k], expected[k], rel_tol=1e-6, abs_tol=1e-9):
            return f"first difference at {k!r}: expected {expected[k]!r} ms, got {got[k]!r}"
    return None


def _cases() -> list[Case]:
    hand, recorded = _hand_trace(), load_recorded_trace()
    shuffled, edges = _shuffled(hand), _edge_trace()
    n_ops = sum(e["cat"] == "cpu_op" for e in recorded["traceEvents"])
    return [
        Case((hand,), reference_breakdown_by_module(hand),
             "a hand-made trace of one 100 µs step: a layer holding a norm and an MLP (with nested operators), "
             "a residual add in the layer itself, and two operators outside every module"),
        Case((shuffled,), reference_breakdown_by_module(shuffled),
             "the same hand-made trace with its events shuffled (a trace file need not list them by start time): "
             + ", ".join(f"{e['name']}@{e['ts']:g}" for e in shuffled["traceEvents"])),
        Case((edges,), reference_breakdown_by_module(edges),
             "ties and boundaries, by hand: a parent and its child with the same start, the child listed first "
             "(two module ranges at 10 µs, an operator and its range, aten::linear and its aten::addmm); "
             "aten::softmax starting exactly as aten::linear ends (20 µs) and aten::add exactly as the attention "
             "range ends (40 µs); a linear whose aten::t and aten::mm run one after the other; the layer and "
             "its MLP ending together at 90 µs, then aten::argmax at 95 µs, outside both. Events: "
             + ", ".join(f"{e['name']} [{e['ts']:g}, {e['ts'] + e['dur']:g})" for e in edges["traceEvents"])),
        Case((recorded,), reference_breakdown_by_module(recorded),
             f"the course's recorded trace of one SmolLM2-135M decode step ({n_ops:,} operator events; "
             "labcheck.load_recorded_trace())"),
    ]


def check_breakdown_by_module(breakdown_by_module) -> bool:
    """breakdown_by_module(trace) -> {kind: ms}: top-level operator time per
    innermost module kind, "other" for operators outside every module."""
    return run_check("breakdown_by_module", breakdown_by_module, _cases, same=_same,
                     forbidden=(reference_breakdown_by_module,), explain=_explain)


LAB = Lab(4, "prefill and decode: a profile by module",
          exports=("check_breakdown_by_module", "reference_breakdown_by_module", "record_step_trace",
                   "load_recorded_trace", "step_total_ms"),
          fallbacks={"check_breakdown_by_module": reference_breakdown_by_module})


def decode_step(model, context: int = 64):
    """step() for one batch-1 decode step of `model` at `context` cached
    positions (random token ids: the time does not depend on which), as lab 4's
    time_forward builds it, logits included."""
    from tinyinfer.kv_cache import AttentionMetadata, KVCache

    w = model.lm_head.weight
    cache = KVCache(model.config, 1, context + 1, w.dtype, w.device)
    ids = torch.randint(model.config.vocab_size, (1, 1), device=w.device)
    positions = torch.full((1, 1), context, device=w.device)
    meta = AttentionMetadata.uniform(positions, start=context)

    @torch.inference_mode()
    def step():
        return model.compute_logits(model(ids, positions, cache, meta)[:, -1])

    return step


def _record_course_trace() -> None:
    """Record the stored trace: SmolLM2-135M in float32 on the CPU, one decode step at context 64."""
    import datetime
    from tinyinfer import LLM

    from .. import machine

    torch.manual_seed(0)
    llm = LLM("smollm2-135m-instruct", dtype="float32", device="cpu")
    trace = record_step_trace(decode_step(llm.model), llm.model)
    trace["meta"] = {"what": "one batch-1 decode step of SmolLM2-135M-Instruct, float32, context 64, "
                             "recorded by python -m tinyinfer_course.labcheck.profiling",
                     "machine": machine.cpu_name(), "threads": torch.get_num_threads(),
                     "torch": torch.__version__, "date": datetime.date.today().isoformat()}
    TRACE_PATH.write_text(json.dumps(trace, separators=(",", ":")) + "\n")
    print(f"{TRACE_PATH}: {len(trace['traceEvents'])} events, step {step_total_ms(trace):.1f} ms")


if __name__ == "__main__":  # re-record the stored trace: python -m tinyinfer_course.labcheck.profiling
    _record_course_trace()
