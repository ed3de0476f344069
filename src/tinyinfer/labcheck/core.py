"""The checks that lab notebooks call after each exercise.

Every check has the same shape: `check_<name>(student_fn) -> bool`. It runs the
learner's function on a list of cases, prints one line,

    ✓ <name>: N cases passed
    ✗ <name>: <the first failing case: input, expected, got>

and returns True or False. A check never raises: a stub's NotImplementedError,
or any other exception from the learner's code, is reported as a failure. That
way a lab notebook runs top to bottom in its unsolved state.

Each lab has its own module here (tokens.py for lab 1, ...); this package
re-exports every public check, so a notebook only needs `from tinyinfer import
labcheck`. To add a check for a new lab, write a function that builds `Case`s
(each with the arguments, the expected answer, and a short description of the
input for the failure message) and pass them to `_report`.

Two more things `_report` does, both so that a ✓ means the learner wrote it:
- `forbidden`: the course's own answers to this exercise (the labcheck
  reference, the engine's function, PyTorch's fused kernel for attention). The
  learner's code runs under a profiler, and a call to any of them, however it
  was imported or wrapped, is a ✗ that says so.
- `keep`: on a pass, the learner's exercise cell is saved into their own
  engine folder under this name, for later labs to use (see my_engine.py).
"""
from __future__ import annotations

import inspect
import operator
import sys
from dataclasses import dataclass
from typing import Any, Callable

MAX_SHOWN = 300  # characters of a value shown in a failure message


@dataclass
class Case:
    args: tuple  # what the learner's function is called with
    expected: Any
    show: str  # the input, described for a human (args may be too big to print)


def _report(name: str, fn: Callable, make_cases: Callable[[], list[Case]], same=operator.eq,
            forbidden: tuple = (), keep: str | None = None) -> bool:
    """Run `fn` on every case; print ✓ or the first failure; return a bool.

    forbidden: functions or classes `fn` must not call (see the module doc);
    keep: the piece name under which a passing `fn` is kept for later labs, or
    (piece, the learner's object) when `fn` is a wrapper the check built around it."""
    try:
        cases = make_cases()
    except Exception as e:  # the course's fault, not the learner's; still never raise
        print(f"✗ {name}: could not build the test cases ({type(e).__name__}: {e})")
        return False
    watch = _Watch(forbidden)
    for case in cases:
        try:
            with watch:
                got = fn(*case.args)
        except NotImplementedError as e:  # an untouched stub: no case worth showing
            print(f"✗ {name}: raised NotImplementedError: {_short(e)}")
            return False
        except Exception as e:
            if watch.called:
                break  # the forbidden call is the news, not what came after it
            print(f"✗ {name}: {case.show}\n    raised {type(e).__name__}: {_short(e)}")
            return False
        if watch.called:
            break
        if not _safe_same(same, got, case.expected):
            print(f"✗ {name}: {case.show}\n    expected {_short(case.expected)}\n    got      {_short(got)}")
            return False
    if watch.called:
        print(f"✗ {name}: your code calls {watch.called}, the course's own answer to this exercise. "
              "A check of the course against itself proves nothing: write this one yourself.")
        return False
    print(f"✓ {name}: {len(cases)} cases passed")
    if keep is not None:
        from . import my_engine  # here, not at the top: my_engine imports this module

        piece, obj = (keep, fn) if isinstance(keep, str) else keep
        my_engine.keep(piece, obj)
    return True


class _Watch:
    """A context manager that notes the first call, during the block, to any of
    `forbidden`: Python functions (matched by code object, so a wrapper, an alias
    or a `from ... import` cannot hide them), every method of a forbidden class,
    and C builtins such as torch's fused attention (matched by identity)."""

    def __init__(self, forbidden: tuple):
        self.codes, self.builtins = {}, {}
        for obj in forbidden:
            for label, f in _functions_of(obj):
                if hasattr(f, "__code__"):
                    self.codes[f.__code__] = label
                else:
                    self.builtins[id(f)] = label
        self.called = None

    def _profile(self, frame, event, arg):
        if event == "call" and frame.f_code in self.codes:
            self.called = self.called or self.codes[frame.f_code]
        elif event == "c_call" and id(arg) in self.builtins:
            self.called = self.called or self.builtins[id(arg)]

    def __enter__(self):
        self._previous = sys.getprofile()
        if self.codes or self.builtins:
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._previous)
        return False


def _functions_of(obj) -> list[tuple[str, Callable]]:
    """(label, function) for a function or builtin, or for each method of a class."""
    label = f"{getattr(obj, '__module__', None) or 'torch'}.{getattr(obj, '__qualname__', getattr(obj, '__name__', obj))}"
    if label.startswith("tinyinfer.labcheck."):  # labcheck.reference_rope, whichever module defines it
        label = "labcheck." + label.split(".", 3)[-1]
    label = label.replace("torch._C._nn.", "torch.nn.functional.")
    if isinstance(obj, type):
        found = []
        for klass in obj.__mro__:  # its own and its course-written bases' methods, not nn.Module's
            if not klass.__module__.startswith("tinyinfer"):
                continue
            for attr, value in vars(klass).items():
                value = inspect.unwrap(getattr(value, "__func__", value))  # staticmethod/classmethod
                if hasattr(value, "__code__"):
                    found.append((f"{label}.{attr}", value))
        return found
    # inspect.unwrap: a function behind a decorator (functools.wraps) is watched
    # by its own code, not by the decorator's wrapper, which many functions share.
    return [(label, inspect.unwrap(getattr(obj, "__func__", obj)))]


def _safe_same(same, got, expected) -> bool:
    # A learner's odd return value (a numpy array, say) must not crash the comparison.
    try:
        return bool(same(got, expected))
    except Exception:
        return False


def _short(value) -> str:
    text = str(value) if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 5] + " ...]"




def _number(x: float) -> str:
    """3 significant digits, but whole numbers with thousands separators (46,080)."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def compare_prediction(predicted, measured: float, what: str, unit: str = "") -> None:
    """Print the reader's prediction beside the measurement, for the labs'
    "predict, then measure" prompts, with their ratio. Never raises: a missing
    or odd prediction just gets a reminder."""
    unit = f" {unit}" if unit else ""
    try:
        predicted = float(predicted)
    except (TypeError, ValueError):
        print(f"{what}: measured {_number(measured)}{unit}. (Write your prediction as a number in the cell "
              "before the measurement, then run both again.)")
        return
    ratio = f"{measured / predicted:.2f}" if predicted else "-"
    print(f"{what}: you predicted {_number(predicted)}{unit}, measured {_number(measured)}{unit} "
          f"(measured / predicted = {ratio})")
