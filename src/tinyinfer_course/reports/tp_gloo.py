"""The stored tensor-parallel report (benchmarks/tp_gloo.py): two processes on one
CPU, joined by torch.distributed's gloo backend, measured once and rendered by
chapter 8 as sentences computed from its numbers.

    from tinyinfer_course.reports import tp_gloo as tp_report
    report = tp_report.load()           # _build/tp-gloo.json if this machine ran it, else the stored copy
    print(tp_report.explain(report))    # the fit, the split's step beside the model, when two are slower

A report is JSON:
    meta       date, cpu, cores, torch version, and engine_stamp: the fingerprint of the
               modules that ran (tensor_parallel and what it imports), which
               engine_note (REPORT.note) compares with today's code
    model      the model's name, dtype and shape
    allreduce  nbytes, seconds (the slower rank's median), per_rank_seconds, and
               fit {alpha_s, bandwidth_bytes_per_s}: the ring model's link
    max_abs_difference  between two processes' hidden states and one process's
    steps      per token count T, the fastest of several runs (tensor_parallel.step_times):
               one process with 2 threads, with 1 thread, the MLPs' share at 1 thread,
               two processes, and the cost model's prediction
"""
from __future__ import annotations

from pathlib import Path

from .stored import Age, StoredReport, closure_of
from ..analysis.hardware import Link

DATA = Path(__file__).resolve().parent / "data"  # beside the peers reports: measurements, not engine code
STORED = DATA / "tp-gloo-2026-12-05-xeon.json"
ROOTS = ("tinyinfer_course.fleet.tensor_parallel", "tinyinfer.forward")  # what the benchmark's processes run


def _note(report: dict, age: Age) -> str:
    """The note in chapter 8's words: the code that measured these rows is today's, or older."""
    meta = report["meta"]
    head = (f"Measured on {age.when} on {meta.get('cpu', 'an unknown CPU')} ({meta.get('cores', '?')} cores) "
            f"by {age.named('fingerprint')}")
    if age.same:
        return head + ", the same code as today's."
    return (head + f". The code it ran has changed since ({', '.join(age.changed[:4]) or 'unknown modules'}), so "
            "these numbers show an older engine: `python benchmarks/tp_gloo.py` measures today's.")


# _build/tp-gloo.json is where `python benchmarks/tp_gloo.py --save _build/tp-gloo.json` puts this machine's run
REPORT = StoredReport("a tensor-parallel report", STORED, closure_of(*ROOTS), saved_name="tp-gloo.json",
                      env_var="TINYINFER_TP_JSON", keys=("meta", "allreduce", "steps"),
                      made_by="make one with benchmarks/tp_gloo.py", words=_note)
load, engine_note = REPORT.load, REPORT.note  # chapter 8 calls them


def link(report: dict) -> Link:
    fit = report["allreduce"]["fit"]
    return Link("fitted", fit["bandwidth_bytes_per_s"], fit["alpha_s"])


def table(report: dict) -> str:
    """One row per token count: the three setups, the prediction, and the all-reduces."""
    lines = [f"{'tokens':>6}{'1 process':>11}{'1 process':>11}{'2 processes':>15}{'predicted':>11}"
             f"{'all-reduces':>13}{'predicted':>11}",
             f"{'':>6}{'1 thread':>11}{'2 threads':>11}{'1 thread each':>15}{'(model)':>11}"
             f"{'(measured)':>13}{'(ring)':>11}   (ms)"]
    for r in report["steps"]:
        lines.append(f"{r['tokens']:6d}{r['one_process_1_thread_s'] * 1e3:11.1f}"
                     f"{r['one_process_2_threads_s'] * 1e3:11.1f}{r['two_processes_s'] * 1e3:15.1f}"
                     f"{r['predicted_two_processes_s'] * 1e3:11.1f}"
                     f"{r.get('two_processes_allreduce_s', float('nan')) * 1e3:13.1f}"
                     f"{r['predicted_communication_s'] * 1e3:11.1f}")
    return "\n".join(lines)


def slower_than(report: dict, key: str) -> list[int]:
    """Token counts at which two processes took longer than the setup `key`
    ('one_process_2_threads_s': one process on both cores; 'one_process_1_thread_s': on one)."""
    return [r["tokens"] for r in report["steps"] if r["two_processes_s"] > r[key]]


def where(tokens: list[int], report: dict) -> str:
    """'at every size measured', 'at 1 and 8 tokens per step', or 'at no size measured'."""
    if not tokens:
        return "at no size measured"
    if len(tokens) == len(report["steps"]):
        return "at every size measured"
    return f"at {_listed(tokens)} token{'' if tokens == [1] else 's'} per step"


def explain(report: dict) -> str:
    """Sentences from the numbers: the fit, where two processes lose to one, and
    how far the cost model's prediction was off."""
    fit, steps, model = link(report), report["steps"], report["model"]
    one_token = model["hidden_size"] * 4  # one token's activations, float32
    t_one = 2 * (fit.latency + one_token / 2 / fit.bandwidth)  # allreduce_time for n = 2
    first = steps[0]
    both, one = "one_process_2_threads_s", "one_process_1_thread_s"
    ratios = [r["two_processes_s"] / r[both] for r in steps]
    text = [
        f"Fitted to the measured all-reduces, the ring's link between two processes on this CPU has "
        f"alpha = {fit.latency * 1e6:.0f} µs per step and beta = {1e9 / fit.bandwidth:.2f} ns per byte "
        f"({fit.bandwidth / 1e9:.1f} GB/s): one token's "
        f"activations ({one_token:,} bytes) take {t_one * 1e6:.0f} µs to sum, "
        f"{2 * fit.latency / t_one:.0%} of it latency.",
        f"For {first['tokens']} token{'s' if first['tokens'] > 1 else ''} per step, two processes took "
        f"{first['two_processes_s'] * 1e3:.1f} ms, one process on both cores {first[both] * 1e3:.1f} ms, and one "
        f"process on one core {first[one] * 1e3:.1f} ms.",
        f"Two processes were slower than one process on both cores {where(slower_than(report, both), report)} "
        f"({min(ratios):.1f} to {max(ratios):.1f} times as long), and slower than one core "
        f"{where(slower_than(report, one), report)}.",
    ]
    if "two_processes_allreduce_s" in first:
        text.append(f"At {first['tokens']} token{'s' if first['tokens'] > 1 else ''} the split step spent "
                    f"{first['two_processes_allreduce_s'] * 1e3:.1f} ms in its {model['layers']} all-reduces, where "
                    "the ring model, with the fitted link, predicts "
                    f"{first['predicted_communication_s'] * 1e3:.1f} ms.")
    shares = sorted(r["predicted_two_processes_s"] / r["two_processes_s"] for r in steps)  # predicted / measured
    text.append(f"The cost model's step (one core's step with its MLP time halved, plus the ring's all-reduces) "
                f"came to {shares[0]:.0%} to {shares[-1]:.0%} of the time two processes took.")
    return " ".join(text)


def load_sentence(report: dict) -> str:
    """The machine's load during the run, from the stored load averages."""
    meta = report["meta"]
    if "load_average_before" not in meta:
        return "The machine's load during the run was not recorded."
    before, after = meta["load_average_before"][0], meta["load_average_after"][0]
    return (f"The machine's one-minute load average was {before:.1f} when the run started and {after:.1f} "
            f"when it ended, on {meta.get('cores', '?')} cores: other programs were running too.")


def last_ms(row: dict, key: str) -> str:
    return f"{row[key] * 1e3:.1f}"


def _listed(xs) -> str:
    xs = [str(x) for x in xs]
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]
