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
from ..analysis.hardware import LINKS, Link

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


# Measured and predicted all-reduce times "agree" within this factor of each other.
AGREE = 1.2


def _tokens(n: int) -> str:
    return f"{n} token{'' if n == 1 else 's'}"


def _times(a: float, b: float) -> str:
    """a against b in words: '1.8 times as long as', 'as long as' (within 5%), '0.84 times as long as'."""
    ratio = a / b
    return "about as long as" if abs(ratio - 1) < 0.05 else f"{ratio:.2f} times as long as" if ratio < 1 \
        else f"{ratio:.1f} times as long as"


def link_sentence(report: dict) -> str:
    """The fitted link beside the assumed NVLink-class one, and what one token's all-reduce is made of."""
    fit, model = link(report), report["model"]
    nvlink = LINKS["nvlink"]
    one_token = model["hidden_size"] * 4  # one token's activations, float32
    t_one = 2 * (fit.latency + one_token / 2 / fit.bandwidth)  # allreduce_time for n = 2
    share = 2 * fit.latency / t_one
    ratio = fit.latency / nvlink.latency
    text = (f"The assumed NVLink-class link of `hardware.LINKS` starts a step {ratio:.0f} times faster: two processes "
            "on one CPU talk through the operating system's loopback network." if ratio >= 1.5 else
            f"The assumed NVLink-class link of `hardware.LINKS` starts a step in about the same time "
            f"({ratio:.1f} times this link's alpha).")
    if share >= 0.5:
        return text + (f" For one token's activations the all-reduce is {share:.0%} latency, as the ring model says "
                       "of decode on GPUs.")
    return text + (f" For one token's activations latency is only {share:.0%} of the all-reduce here: the bytes, "
                   "not the steps, set its time.")


def step_sentences(report: dict, pair_over_one: float) -> dict[str, str]:
    """Chapter 8's sentences about the split's steps, each worded from the report's numbers
    (pair_over_one: the split's total work against one process's, tensor_parallel.split_work):
    'step' the first and last token counts against one process on two cores and on one;
    'verdict' where the split lost and what that says; 'allreduce' the all-reduces against
    the fitted ring, and the cost model's step against the measured one."""
    steps, layers = report["steps"], report["model"]["layers"]
    first, last = steps[0], steps[-1]
    both, one = "one_process_2_threads_s", "one_process_1_thread_s"
    opening = ("For one token (a decode step at batch 1)" if first["tokens"] == 1
               else f"For {_tokens(first['tokens'])} per step")
    step = (f"{opening}, the two processes took {first['two_processes_s'] * 1e3:.1f} ms, against "
            f"{first[both] * 1e3:.1f} ms for one process using both cores and {first[one] * 1e3:.1f} ms for one "
            f"process on one core: {_times(first['two_processes_s'], first[both])} the process on both cores and "
            f"{_times(first['two_processes_s'], first[one])} the one on one core.")
    if len(steps) > 1:
        split = last["two_processes_s"]
        step += (f" At {_tokens(last['tokens'])} (a prefill) the split took {_times(split, last[both])} one process "
                 f"on both cores and {_times(split, last[one])} one process on one core.")
    lost, lost_one = slower_than(report, both), slower_than(report, one)
    won = [r["tokens"] for r in steps if r["tokens"] not in lost]
    if not won:
        verdict = (f"Two processes were slower than one process on both cores at every size measured. This is the "
                   f"section's lesson measured: a small model's step is too short to hide {layers} synchronizations, "
                   f"and each process still runs attention whole, so together the two multiply {pair_over_one:.2f} "
                   "times the weights one process does, on the same cores.")
    elif not lost:
        verdict = (f"Two processes were faster than one process on both cores at every size measured: the time they "
                   f"saved on the MLPs outweighed their {layers} synchronizations.")
    else:
        verdict = (f"Two processes were slower than one process on both cores {where(lost, report)}, and faster "
                   f"{where(won, report)}")
        verdict += (f": the {layers} synchronizations weigh most where the step is shortest." if max(lost) < min(won)
                    else ".")
    won_one = [r["tokens"] for r in steps if r["tokens"] not in lost_one]
    verdict += (" Against one process on one core they were slower at every size measured." if not won_one else
                " Against one process on one core they were faster at every size measured." if not lost_one else
                f" Against one process on one core they were slower {where(lost_one, report)} and faster "
                f"{where(won_one, report)}.")
    comm, predicted = first.get("two_processes_allreduce_s"), first["predicted_communication_s"]
    gap = first["two_processes_s"] - first["predicted_two_processes_s"]
    at = f"At {_tokens(first['tokens'])}"
    if comm is None:
        allreduce = f"{at} the split step's time in its all-reduces was not recorded."
    else:
        allreduce = (f"{at} the split step spent {comm * 1e3:.1f} ms in its {layers} all-reduces, where the fitted "
                     f"ring predicts {predicted * 1e3:.1f} ms")
        if comm > AGREE * predicted:
            allreduce = ("The ring model explains only part of the cost. " + allreduce +
                         ": inside a real step each all-reduce also waits for the slower of the two processes, and a "
                         "process that another program has pushed off its core holds the other one up.")
        elif comm * AGREE < predicted:
            allreduce += ", less than the ring predicts."
        else:
            allreduce += ", close to what the ring predicts: the two processes arrived together."
    model_step = (f" The cost model (one core's step with its MLP time halved, plus the ring's all-reduces) "
                  f"assumes both processes arrive together: {at.lower()} its step came out "
                  f"{abs(gap) * 1e3:.1f} ms {'short of' if gap > 0 else 'longer than'} the measured one")
    wait = None if comm is None else comm - predicted
    if gap > 0 and wait is not None and wait > 0:
        model_step += (f", and the all-reduces' extra wait accounts for {wait * 1e3:.1f} ms of that." if wait < gap
                       else f", and the all-reduces' extra wait ({wait * 1e3:.1f} ms) accounts for all of it.")
    else:
        model_step += "."
    return {"step": step, "verdict": verdict, "allreduce": allreduce + model_step}


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
