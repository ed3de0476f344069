"""The labs' "predict, then measure" prompts and their graded quiz questions.

- compare_prediction(predicted, measured, what): the reader's guess beside the
  measurement, with their ratio. Nothing is graded: a prediction is for
  thinking before measuring, and the measurement differs from machine to machine.
- grade_answer(what, answer, expected, ...): a quiz question the reader works
  out from the numbers the lab just printed (a fraction of the bandwidth bound,
  a memory total, which of two configurations won), graded ✓ or ✗.

Both never raise, so a lab runs top to bottom with its answers still blank.
"""
from __future__ import annotations

import math
import numbers


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


def grade_answer(what: str, answer, expected, rel_tol: float = 0.05, abs_tol: float = 0.0,
                 options=None, explain: str = "") -> bool:
    """✓ or ✗ for a quiz answer; returns a bool and never raises.

    A number is right within rel_tol (a fraction: 0.05 is 5 %) or abs_tol of
    `expected`. A choice is a string, compared without regard to case or
    surrounding spaces; `options` lists what may be chosen. The ✓ line names
    only the question and the tolerance, never a value, so a solution that
    computes both from its own run prints the same line on every machine. On ✗
    the expected value and `explain` (why it is that) are shown."""
    try:
        verdict = _verdict(answer, expected, rel_tol, abs_tol, options)
    except Exception as e:  # the course's fault (an odd expected value): say so, never raise
        verdict = f"could not be graded ({type(e).__name__}: {e})"
    if verdict is None:
        print(f"{what}: no answer yet. (Write it in the cell above, then run both cells again.)")
        return False
    if verdict is True:
        print(f"✓ {what}: right{_tolerance(expected, rel_tol, abs_tol)}")
        return True
    because = f"\n    {explain}" if explain else ""
    print(f"✗ {what}: {verdict}{because}")
    return False


def _verdict(answer, expected, rel_tol: float, abs_tol: float, options) -> bool | str | None:
    """True, None (no answer yet) or what is wrong, as text."""
    if answer is None:
        return None
    answer = _scalar(answer)
    if isinstance(expected, str):  # a choice among options
        choices = [str(o) for o in options] if options else None
        if not isinstance(answer, str):
            return f"answer with one of {choices} (a string), not {type(answer).__name__} {answer!r}" if choices \
                else f"answer with a string, not {type(answer).__name__} {answer!r}"
        if choices and _norm(answer) not in map(_norm, choices):
            return f"{answer!r} is not one of the options {choices}"
        return True if _norm(answer) == _norm(expected) else f"you chose {answer!r}; the answer is {expected!r}"
    if not _is_number(expected) or not math.isfinite(expected):
        raise ValueError(f"the expected value {expected!r} is not a finite number")
    if not _is_number(answer):
        return f"answer with a number, not {type(answer).__name__} {answer!r}"
    if math.isclose(float(answer), float(expected), rel_tol=rel_tol, abs_tol=abs_tol):
        return True
    return f"you answered {_number(float(answer))}, expected {_number(float(expected))}" \
           f"{_tolerance(expected, rel_tol, abs_tol)}"


def _scalar(x):
    """A one-element tensor or numpy array as its number; anything else as it is."""
    if isinstance(x, (str, numbers.Real)) or not hasattr(x, "item"):
        return x
    size = x.numel() if callable(getattr(x, "numel", None)) else getattr(x, "size", None)
    return x.item() if size == 1 else x


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _norm(text: str) -> str:
    return text.strip().casefold()


def _tolerance(expected, rel_tol: float, abs_tol: float) -> str:
    """' (within 5 %)': the same text whatever the expected value."""
    if isinstance(expected, str):
        return ""
    parts = ([f"{rel_tol * 100:g}%"] if rel_tol else []) + ([f"±{abs_tol:g}"] if abs_tol else [])
    return f" (within {' or '.join(parts)})" if parts else " (exactly)"
