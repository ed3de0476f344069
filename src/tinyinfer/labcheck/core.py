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
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

MAX_SHOWN = 300  # characters of a value shown in a failure message


@dataclass
class Case:
    args: tuple  # what the learner's function is called with
    expected: Any
    show: str  # the input, described for a human (args may be too big to print)


def _report(name: str, fn: Callable, make_cases: Callable[[], list[Case]], same=operator.eq) -> bool:
    """Run `fn` on every case; print ✓ or the first failure; return a bool."""
    try:
        cases = make_cases()
    except Exception as e:  # the course's fault, not the learner's; still never raise
        print(f"✗ {name}: could not build the test cases ({type(e).__name__}: {e})")
        return False
    for case in cases:
        try:
            got = fn(*case.args)
        except NotImplementedError as e:  # an untouched stub: no case worth showing
            print(f"✗ {name}: raised NotImplementedError: {_short(e)}")
            return False
        except Exception as e:
            print(f"✗ {name}: {case.show}\n    raised {type(e).__name__}: {_short(e)}")
            return False
        if not _safe_same(same, got, case.expected):
            print(f"✗ {name}: {case.show}\n    expected {_short(case.expected)}\n    got      {_short(got)}")
            return False
    print(f"✓ {name}: {len(cases)} cases passed")
    return True


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
