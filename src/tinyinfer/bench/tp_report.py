"""The stored tensor-parallel report (benchmarks/tp_gloo.py): two processes on one
CPU, joined by torch.distributed's gloo backend, measured once and rendered by
chapter 8 as sentences computed from its numbers.

    from tinyinfer.bench import tp_report
    report = tp_report.load()           # the stored copy (or $TINYINFER_TP_JSON)
    print(tp_report.explain(report))    # the fit, the split's step beside the model, when two are slower

A report is JSON:
    meta       date, cpu, cores, torch version, and engine_stamp: the fingerprint of the
               modules that ran (tensor_parallel and what it imports), which
               engine_note compares with today's code
    model      the model's name, dtype and shape
    allreduce  nbytes, seconds (the slower rank's median), per_rank_seconds, and
               fit {alpha_s, bandwidth_bytes_per_s}: the ring model's link
    max_abs_difference  between two processes' hidden states and one process's
    steps      per token count T, the fastest of several runs (tensor_parallel.step_times):
               one process with 2 threads, with 1 thread, the MLPs' share at 1 thread,
               two processes, and the cost model's prediction
"""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from .. import fingerprint
from ..hardware import Link

DATA = Path(__file__).resolve().parent / "data"  # beside the peers reports: measurements, not engine code
STORED = DATA / "tp-gloo-2026-12-05-xeon.json"
ROOTS = ("tinyinfer.tensor_parallel", "tinyinfer.forward")  # what the benchmark's processes run


def engine_stamp() -> dict:
    return fingerprint.stamp(fingerprint.module_hashes(fingerprint.closure(list(ROOTS))))


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine_meta() -> dict:
    import torch

    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_name(), "cores": os.cpu_count(),
            "torch": torch.__version__, "backend": "gloo", "engine_stamp": engine_stamp()}


def load(path: str | Path | None = None) -> dict:
    path = Path(path or os.environ.get("TINYINFER_TP_JSON") or STORED)
    report = json.loads(path.read_text())
    for key in ("meta", "allreduce", "steps"):
        if key not in report:
            raise ValueError(f"{path}: not a tensor-parallel report (no {key!r}); make one with benchmarks/tp_gloo.py")
    report["source"] = str(path)
    return report


def link(report: dict) -> Link:
    fit = report["allreduce"]["fit"]
    return Link("fitted", fit["bandwidth_bytes_per_s"], fit["alpha_s"])


def engine_note(report: dict, today: dict | None = None) -> str:
    """One sentence: the code that measured these rows is today's, or older, or unknown."""
    meta = report["meta"]
    stamp = meta.get("engine_stamp") or {}
    theirs = stamp.get("engine_fingerprint", "unknown")
    named = f"tinyinfer at commit {stamp.get('engine_commit', 'unknown')} (fingerprint {theirs})"
    head = f"Measured on {meta.get('date', 'an unknown date')} on a {meta.get('cpu', 'unknown CPU')} " \
           f"({meta.get('cores', '?')} cores) by {named}"
    today = today or engine_stamp()
    if theirs == today["engine_fingerprint"]:
        return head + ", the same code as today's."
    changed = [line.split(" (")[0] for line in fingerprint.changed(stamp.get("engine_modules") or {},
                                                                     today["engine_modules"])]
    return (head + f". The code it ran has changed since ({', '.join(changed[:4]) or 'unknown modules'}), so "
            "these numbers show an older engine: `python benchmarks/tp_gloo.py` measures today's.")


def _slower(row: dict) -> float:
    return row["two_processes_s"] / row["one_process_2_threads_s"]


def explain(report: dict) -> str:
    """Sentences from the numbers: the fit, the prediction's error, and where two
    processes lose to one."""
    fit, steps = link(report), report["steps"]
    first, last = steps[0], steps[-1]
    slower = [r["tokens"] for r in steps if _slower(r) > 1]
    errors = [abs(r["predicted_two_processes_s"] / r["two_processes_s"] - 1) for r in steps]
    text = [
        f"Between two processes on this CPU one ring step costs alpha = {fit.latency * 1e6:.0f} µs, and the "
        f"link moves {fit.bandwidth / 1e9:.1f} GB/s: an all-reduce of one token's activations "
        f"({report['model']['hidden_size'] * 4:,} bytes) is all latency.",
        f"For one token (a decode step at batch 1), two processes took {last_ms(first, 'two_processes_s')} ms "
        f"against {last_ms(first, 'one_process_2_threads_s')} ms for one process with both threads: "
        f"{_slower(first):.2f} times as long.",
        f"At {last['tokens']} tokens (a prefill) the ratio was {_slower(last):.2f}.",
    ]
    if slower:
        text.append(f"Two processes were slower than one at {_listed(slower)} tokens per step.")
    else:
        text.append("Two processes were never slower than one here.")
    text.append(f"The cost model's prediction was off by {min(errors):.0%} to {max(errors):.0%}.")
    return " ".join(text)


def last_ms(row: dict, key: str) -> str:
    return f"{row[key] * 1e3:.1f}"


def _listed(xs) -> str:
    xs = [str(x) for x in xs]
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]
