"""The checks that lab notebooks call after each exercise.

Every check has the same shape: `check_<name>(student_fn) -> bool`. It runs the
learner's function on a list of cases, prints one line,

    ✓ <name>: N cases passed
    ✗ <name>: <the first failing case: input, expected, got>

and returns True or False. A check never raises: a stub's NotImplementedError,
or any other exception from the learner's code, is reported as a failure. That
way a lab notebook runs top to bottom in its unsolved state.

To add a check, write a function that builds `Case`s (each with the arguments,
the expected answer, and a short description of the input for the failure
message) and pass them to `run_check`; declare the lab in its module's `LAB`
(registry.py). Two more things `run_check` does, both so that a ✓ means the
learner wrote it:
- `forbidden`: the course's own answers to this exercise (the labcheck
  reference, the engine's function, PyTorch's fused kernel). The learner's
  code runs under a watch (watch.py), and a call to any of them is a ✗ that
  says so;
- `keep=(piece, obj)`: on a pass, the cell that defined `obj` (the learner's
  function or class, not the runner the check built around it) is saved into
  their own engine folder as `piece`, for later labs to use (my_engine.py).
"""
from __future__ import annotations

import operator
import os
from dataclasses import dataclass
from typing import Any, Callable

from . import my_engine
from .watch import Watch

MAX_SHOWN = 300  # characters of a value shown in a failure message


@dataclass
class Case:
    args: tuple  # what the learner's function is called with
    expected: Any
    show: str  # the input, described for a human (args may be too big to print)


def run_check(name: str, fn: Callable, make_cases: Callable[[], list[Case]], same=operator.eq,
              forbidden: tuple = (), keep: tuple[str, Any] | None = None) -> bool:
    """Run `fn` on every case; print ✓ or the first failure; return a bool.

    forbidden: functions or classes `fn` must not call (see watch.py);
    keep: (piece, the learner's object) to keep for later labs on a pass."""
    try:
        cases = make_cases()
    except Exception as e:  # the course's fault, not the learner's; still never raise
        print(f"✗ {name}: could not build the test cases ({type(e).__name__}: {e})")
        return False
    failure = _first_failure(name, fn, cases, same, Watch(forbidden))
    if failure:
        print(failure)
        return False
    print(f"✓ {name}: {len(cases)} cases passed")
    if keep is not None:
        my_engine.keep(*keep)
    return True


def _first_failure(name: str, fn: Callable, cases: list[Case], same, watch: Watch) -> str | None:
    """What to print for the first case that fails, or None when all pass."""
    for case in cases:
        try:
            with watch:
                got = fn(*case.args)
        except NotImplementedError as e:  # an untouched stub: no case worth showing
            return f"✗ {name}: raised NotImplementedError: {_short(e)}"
        except Exception as e:
            if not watch.called:
                return f"✗ {name}: {case.show}\n    raised {type(e).__name__}: {_short(e)}"
        else:
            if not watch.called and not _safe_same(same, got, case.expected):
                return f"✗ {name}: {case.show}\n    expected {_short(case.expected)}\n    got      {_short(got)}"
        if watch.called:  # the forbidden call is the news, not what came of it
            return (f"✗ {name}: your code calls {watch.called}, the course's own answer to this exercise. "
                    "A check of the course against itself proves nothing: write this one yourself.")
    return None


def _report(name: str, fn: Callable, make_cases: Callable[[], list[Case]], same=operator.eq,
            forbidden: tuple = (), keep: str | tuple | None = None) -> bool:
    """run_check's former name, kept for notebooks and tests that use it; here
    keep may also be just the piece name, which keeps `fn` itself."""
    return run_check(name, fn, make_cases, same, forbidden, (keep, fn) if isinstance(keep, str) else keep)


def _safe_same(same, got, expected) -> bool:
    # A learner's odd return value (a numpy array, say) must not crash the comparison.
    try:
        return bool(same(got, expected))
    except Exception:
        return False


def _short(value) -> str:
    text = str(value) if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 5] + " ...]"


# ------------------------------------------------ the machine a lab's timings come from


def busy_note(*repeats, spread: float = 0.3) -> str:
    """A one-line warning to print beside a timing when the machine looks too
    busy for it to mean much, else "". Busy: the load average over the last
    minute is above the number of cores (other programs want the same cores,
    and OpenMP threads then wait for each other), or the repeats of one timing
    (each argument: a list of seconds for one measurement) differ by more than
    `spread` (30%) from their fastest."""
    reasons = []
    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
        if load > cores:
            reasons.append(f"load average {load:.1f} on {cores} cores")
    except (AttributeError, OSError):  # no load average on this system (Windows)
        pass
    worst = max((max(r) / min(r) - 1 for r in repeats if len(r) > 1 and min(r) > 0), default=0.0)
    if worst > spread:
        reasons.append(f"repeats differ by up to {worst:.0%}")
    if not reasons:
        return ""
    return (f"⚠ busy machine ({'; '.join(reasons)}): other programs are sharing the cores, so these timings "
            "and their ratios may be far off. Close them and run the cell again.")


def bf16_units() -> bool | None:
    """Does this CPU compute bf16 in hardware (AVX-512 BF16 or AMX), as torch
    will use it? False where it has none, or where ONEDNN_MAX_CPU_ISA caps oneDNN
    below them (the course's way of imitating an older CPU); None where the CPU's
    flags cannot be read (not Linux). Without them a bf16 matmul is computed in
    fp32 arithmetic with conversions on the way in and out: it saves bytes, not work."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if cap and not any(word in cap for word in ("BF16", "AMX", "FP16", "AVX10", "ALL", "DEFAULT")):
        return False
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), None)
    except OSError:
        return None
    return None if flags is None else bool({"avx512_bf16", "amx_bf16"} & set(flags))
