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

import contextlib
import contextvars
import operator
from dataclasses import dataclass
from typing import Any, Callable

from . import my_engine
from .watch import Watch

MAX_SHOWN = 300  # characters of a value shown in a failure message
# Which of a check's cases run: None (all), "public" or "hidden" (only_cases).
_PART: contextvars.ContextVar[str | None] = contextvars.ContextVar("labcheck_cases", default=None)


@contextlib.contextmanager
def only_cases(part: str):
    """Run every check inside on part of its cases: "public", the first half
    (at least one), or "hidden", the rest (the last case, if there is one case).

    For the instructors' export (scripts/make_assignments.py): an otter-grader
    assignment grades the two halves as two tests, and the student copy holds
    only the public one, so a student cannot tune a function to cases never
    shown. The first cases are the small hand-made ones, the readable half.
    A pass inside keeps nothing for later labs: only a full run does that."""
    if part not in ("public", "hidden"):
        raise ValueError(f"part must be 'public' or 'hidden', not {part!r}")
    token = _PART.set(part)
    try:
        yield
    finally:
        _PART.reset(token)


def _part_of(cases: list, part: str | None) -> list:
    """The cases `part` runs: e.g. of 5, the first 2 are public, the last 3 hidden."""
    if part is None:
        return cases
    half = len(cases) // 2
    return cases[:max(1, half)] if part == "public" else cases[half:]


@dataclass
class Case:
    args: tuple  # what the learner's function is called with
    expected: Any
    show: str  # the input, described for a human (args may be too big to print)


def run_check(name: str, fn: Callable, make_cases: Callable[[], list[Case]], same=operator.eq,
              forbidden: tuple = (), keep: tuple[str, Any] | None = None,
              explain: Callable[[Any, Any], str | None] | None = None) -> bool:
    """Run `fn` on every case; print ✓ or the first failure; return a bool.

    forbidden: functions or classes `fn` must not call (see watch.py);
    keep: (piece, the learner's object) to keep for later labs on a pass;
    explain(got, expected): one more line for a failure, saying where the two
    first differ (the element, step, request or head), since "expected" and
    "got" often look alike on screen: both cut short, or equal in the digits shown."""
    try:
        cases = _part_of(make_cases(), _PART.get())
    except Exception as e:  # the course's fault, not the learner's; still never raise
        print(f"✗ {name}: could not build the test cases ({type(e).__name__}: {e})")
        return False
    failure = _first_failure(name, fn, cases, same, Watch(forbidden), explain)
    if failure:
        print(failure)
        return False
    print(f"✓ {name}: {len(cases)} cases passed")
    if keep is not None and _PART.get() is None:
        my_engine.keep(*keep)
    return True


def _first_failure(name: str, fn: Callable, cases: list[Case], same, watch: Watch, explain=None) -> str | None:
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
                where = _safe_explain(explain, got, case.expected) or _safe_explain(_default_where, got, case.expected)
                return (f"✗ {name}: {case.show}\n    expected {_short(case.expected)}\n    got      {_short(got)}"
                        + (f"\n    {where}" if where else ""))
        if watch.called:  # the forbidden call is the news, not what came of it
            return (f"✗ {name}: your code calls {watch.called}, the course's own answer to this exercise. "
                    "A check of the course against itself proves nothing: write this one yourself.")
    return None


def _safe_same(same, got, expected) -> bool:
    # A learner's odd return value (a numpy array, say) must not crash the comparison.
    try:
        return bool(same(got, expected))
    except Exception:
        return False


def _safe_explain(explain, got, expected) -> str | None:
    # Only a hint on top of the failure: a mistake in it must not hide the failure.
    if explain is None:
        return None
    try:
        return explain(got, expected) or None
    except Exception:
        return None


def _default_where(got, expected) -> str | None:
    """The reason line of a check with no `explain` of its own, or whose explain
    finds nothing: where got first differs from expected, for the common kinds
    of value (a tensor, a list or tuple, a dict, a number), or what it is instead."""
    if got is None:
        return "your function returned None: is a `return` missing?"
    if hasattr(got, "shape") and hasattr(expected, "shape"):
        return first_difference(got, expected)
    numeric = (int, float)
    if isinstance(got, numeric) and isinstance(expected, numeric) and not isinstance(got, bool):
        return f"off by {got - expected:+.6g}" if got != expected else None
    plain = (bool, int, float, str, list, tuple, dict, set, frozenset)  # a check's own record may differ in type
    if type(got) is not type(expected) and type(expected) in plain \
            and not (isinstance(got, (list, tuple)) and isinstance(expected, (list, tuple))):
        return f"a {type(got).__name__}, expected a {type(expected).__name__}"
    if isinstance(got, (list, tuple)):
        i = first_mismatch(got, expected)
        if i is None:
            return f"a {type(got).__name__}, expected a {type(expected).__name__}" if type(got) is not type(expected) \
                else None
        if i >= min(len(got), len(expected)):
            return f"{len(got)} items, expected {len(expected)}: the first {i} agree"
        return f"first difference at index {i}: expected {_short(expected[i])}, got {_short(got[i])}"
    if isinstance(got, dict):
        missing, extra = [k for k in expected if k not in got], [k for k in got if k not in expected]
        if missing or extra:
            return f"keys missing: {_short(missing)}; keys not expected: {_short(extra)}"
        key = next((k for k in expected if got[k] != expected[k]), None)
        return None if key is None else (f"first difference at key {key!r}: expected {_short(expected[key])}, "
                                         f"got {_short(got[key])}")
    fields = getattr(expected, "__dict__", None)
    if isinstance(fields, dict) and type(got) is type(expected):  # a record: its first attribute that differs
        for key, want in fields.items():
            have = getattr(got, key, None)
            if hasattr(want, "shape") and hasattr(have, "shape"):
                where = first_difference(have, want)
                if where:
                    return f"{key}: {where}"
            elif not _safe_same(operator.eq, have, want):
                return f"first difference in {key}: expected {_short(want)}, got {_short(have)}"
    return None


def first_difference(got, expected, names: tuple[str, ...] = (), atol: float = 1e-4, rtol: float = 1e-4) -> str | None:
    """Where two tensors of the same shape first differ beyond the tolerance
    (NaN counts as different), with both values in full: "first difference at
    [0, 1, 3, 5] (head 1, query 3, ...): expected 0.12345678, got nan". The
    names label the dimensions, from the last backwards when fewer are given."""
    import torch  # here: core stays importable without torch's start-up cost until a check runs

    if not (isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor)):
        return None
    if got.shape != expected.shape:
        return f"shape {list(got.shape)}, expected {list(expected.shape)}"
    g, e = got.detach().double().cpu(), expected.detach().double().cpu()
    bad = ~torch.isclose(g, e, atol=atol, rtol=rtol, equal_nan=False)  # a NaN is never close to anything
    if not bool(bad.any()):
        return None
    index = [int(i) for i in torch.nonzero(bad)[0]]
    labels = list(names)[-len(index):] if names else []
    labels = [None] * (len(index) - len(labels)) + labels
    named = ", ".join(f"{n} {i}" for n, i in zip(labels, index) if n)
    count = int(bad.sum())
    return (f"first difference at {index}{f' ({named})' if named else ''}: expected {float(e[tuple(index)])!r}, "
            f"got {float(g[tuple(index)])!r} ({count} of {bad.numel()} elements differ)")


def first_mismatch(got, expected) -> int | None:
    """The first index where two sequences differ, the shorter one's length when
    one is a prefix of the other, or None when they are equal."""
    got, expected = list(got), list(expected)
    if got == expected:
        return None
    return next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))


def _short(value) -> str:
    text = str(value) if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 5] + " ...]"

