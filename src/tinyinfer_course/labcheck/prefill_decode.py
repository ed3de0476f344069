"""Lab 4 (prefill and decode): the check of the timing harness. (The
generation loop's check is in generation.py.)

A timing harness has three jobs: a warm-up call first (the first call pays for
memory allocation, kernel selection and cold caches); the best of several timed
calls (noise only ever makes a run slower); and, on a GPU, waiting for the work
to finish before reading the clock, since a CUDA call returns as soon as the
work is queued. The check times scripted steps whose durations it knows, on the
CPU and on a pretend CUDA device whose synchronize() it watches.
"""
from __future__ import annotations

import math
import time

import torch

from ..analysis.hardware import best_time
from .core import Case, run_check
from .registry import Lab


def reference_time_step(step, device="cpu", repeats: int = 3) -> float:
    """The course's answer to lab 4's time_step exercise."""
    on_gpu = torch.device(device).type == "cuda"

    def finish():  # wait until the device has done all the work queued so far
        if on_gpu:
            torch.cuda.synchronize()

    step()  # warm-up
    finish()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        finish()
        best = min(best, time.perf_counter() - start)
    return best


# A timed call may take a little longer than the step itself measured (the call,
# the clock reads, a busy machine pausing the process), never less; 5 ms covers
# that, and every wrong answer to the cases below is off by 10 ms or more.
SLACK = 0.005


class _Script:
    """A step whose i-th call sleeps durations[i], noting how long it really took
    and, in `events`, each call and each synchronize() between them."""

    def __init__(self, durations):
        self.durations, self.taken, self.events = list(durations), [], []

    def __call__(self):
        i = len(self.taken)
        start = time.perf_counter()
        time.sleep(self.durations[i] if i < len(self.durations) else self.durations[-1])
        self.taken.append(time.perf_counter() - start)
        self.events.append("step")

    def synchronize(self, *args, **kwargs):
        self.events.append("sync")


class _Timing:
    """What a harness did: how often it called the step, what it returned, the
    fastest timed call (as the step measured itself), and on a GPU whether every
    call was followed by a synchronize()."""

    def __init__(self, calls, seconds, fastest, synced):
        self.calls, self.seconds, self.fastest, self.synced = calls, seconds, fastest, synced

    def __repr__(self):
        sync = "" if self.synced is None else f"; every call followed by a synchronize(): {self.synced}"
        secs = f"{self.seconds:.4f}" if isinstance(self.seconds, float) else repr(self.seconds)
        return f"{self.calls} calls of step, returned {secs} (the fastest timed call took {self.fastest:.4f} s){sync}"


class _Expected:
    def __init__(self, calls, synced):
        self.calls, self.synced = calls, synced

    def __repr__(self):
        sync = "" if self.synced is None else "; every call followed by a synchronize(): True"
        return (f"{self.calls} calls of step (1 warm-up + {self.calls - 1} timed), returned the fastest timed "
                f"call's time in seconds{sync}")


def _same(got, expected) -> bool:
    return (isinstance(got, _Timing) and got.calls == expected.calls and got.synced == expected.synced
            and isinstance(got.seconds, (int, float)) and not isinstance(got.seconds, bool)
            and got.fastest <= got.seconds <= got.fastest + SLACK)


def _run(time_step):
    def run(durations, device, repeats):
        # A busy machine can pause this process between the harness's clock read
        # and the step's own, pushing a right answer past SLACK. So a run that is
        # right in everything but that is tried again, three times at most: a
        # wrong harness is off by 10 ms or more on every try.
        for _ in range(3):
            timing = _run_once(time_step, durations, device, repeats)
            if not (isinstance(timing.seconds, float) and timing.seconds > timing.fastest + SLACK):
                return timing
        return timing
    return run


def _run_once(time_step, durations, device, repeats):
    """One run of the harness on a scripted step: what it did (a _Timing)."""
    script = _Script(durations)
    on_gpu = torch.device(device).type == "cuda"
    real = torch.cuda.synchronize
    if on_gpu:  # a pretend GPU: the check watches synchronize() instead of calling it
        torch.cuda.synchronize = script.synchronize
    try:
        seconds = time_step(script, device, repeats)
    finally:
        torch.cuda.synchronize = real
    timed = script.taken[1:] or [math.nan]
    synced = None
    if on_gpu:
        ev = script.events
        synced = all(i + 1 < len(ev) and ev[i + 1] == "sync" for i, e in enumerate(ev) if e == "step")
    return _Timing(len(script.taken), float(seconds) if isinstance(seconds, (int, float)) else seconds,
                   min(timed), synced)


def _cases() -> list[Case]:
    rows = [  # durations of the calls (the first is the warm-up), device, repeats, what
        ([0.002, 0.03, 0.015, 0.04], "cpu", 3, "the warm-up is the fastest call; timed calls of 30, 15, 40 ms"),
        ([0.04, 0.025, 0.03, 0.012, 0.02, 0.03], torch.device("cpu"), 5, "a slow first call, then 5 timed calls"),
        ([0.002, 0.03, 0.01], "cuda", 2, "on a GPU (pretend: the check watches torch.cuda.synchronize)"),
        ([0.002, 0.01, 0.03, 0.025], torch.device("cuda"), 3, "on a GPU, device given as a torch.device"),
    ]
    cases = []
    for durations, device, repeats, what in rows:
        synced = True if torch.device(device).type == "cuda" else None
        cases.append(Case((durations, device, repeats), _Expected(repeats + 1, synced),
                          f"a step whose calls take {[round(d * 1e3) for d in durations]} ms, device={device!r}, "
                          f"repeats={repeats}  ({what})"))
    return cases


def check_time_step(time_step) -> bool:
    """time_step(step, device="cpu", repeats=3) -> seconds: one warm-up call,
    then the fastest of `repeats` timed calls, synchronizing on a GPU."""
    return run_check("time_step", _run(time_step), _cases, same=_same, forbidden=(reference_time_step, best_time))


LAB = Lab(4, "prefill and decode", exports=("check_time_step", "reference_time_step"),
          fallbacks={"check_time_step": reference_time_step})
