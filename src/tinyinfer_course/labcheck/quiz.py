"""The labs' "predict, then measure" prompts and their graded quiz questions.

- compare_prediction(predicted, measured, what): the reader's guess beside the
  measurement, with their ratio. Nothing is graded: a prediction is for
  thinking before measuring, and the measurement differs from machine to machine.
- grade_answer(what, answer, expected, ...): a quiz question the reader works
  out from the numbers the lab just printed (a fraction of the bandwidth bound,
  a memory total, which of two configurations won), graded ✓ or ✗ on the
  first answer: a ✗ says why without the expected value, and the first answer
  is recorded for an instructor (record_path()).

Both never raise, so a lab runs top to bottom with its answers still blank.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import re
from pathlib import Path


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
    computes both from its own run prints the same line on every machine.

    ✗ says why, never the expected value: too high or too low, by how many
    orders of magnitude, about twice or half, MB against MiB; then `explain`,
    which says what the quantity counts, without the answer's numbers (a note
    that states a number graded right is withheld). So only the first answer
    is graded: it is recorded (see record_path()), and a right answer after a
    wrong one shows ✓ with "not on the first attempt"."""
    try:
        kind, verdict = _verdict(answer, expected, rel_tol, abs_tol, options)
    except Exception as e:  # the course's fault (an odd expected value): say so, never raise
        kind, verdict = "invalid", f"could not be graded ({type(e).__name__}: {e})"
    if kind is None:
        print(f"{what}: no answer yet. (Write it in the cell above, then run both cells again.)")
        return False
    first = _record(what, answer, kind == "right") if kind in ("right", "wrong") else None
    if kind == "right":
        late = ""
        if first is not None and first.get("first_right") is False:
            late = (f", but not on the first attempt: your first answer, {_shown(first.get('first_answer'))}, "
                    "is the one recorded")
        print(f"✓ {what}: right{_tolerance(expected, rel_tol, abs_tol)}{late}")
        return True
    because = f"\n    {_note(explain, expected, rel_tol, abs_tol)}" if explain else ""
    if kind == "wrong" and first is not None and first.get("attempts") == 1:
        because += ("\n    Only your first answer is recorded: a right answer now shows ✓, marked as not the "
                    "first attempt.")
    print(f"✗ {what}: {verdict}{because}")
    return False


def _verdict(answer, expected, rel_tol: float, abs_tol: float, options) -> tuple[str | None, str]:
    """(kind, text): kind None (no answer yet), "right", "wrong" (a well-formed
    answer, recorded) or "invalid" (not an answer to this question: a string
    for a number, a choice not offered; not recorded)."""
    if answer is None:
        return None, ""
    answer = _scalar(answer)
    if isinstance(expected, str):  # a choice among options
        choices = [str(o) for o in options] if options else None
        if not isinstance(answer, str):
            return "invalid", (f"answer with one of {choices} (a string), not {type(answer).__name__} {answer!r}"
                               if choices else f"answer with a string, not {type(answer).__name__} {answer!r}")
        if choices and _norm(answer) not in map(_norm, choices):
            return "invalid", f"{answer!r} is not one of the options {choices}"
        if _norm(answer) == _norm(expected):
            return "right", ""
        return "wrong", f"you chose {answer!r}, which is not the right option"
    if not _is_number(expected) or not math.isfinite(expected):
        raise ValueError(f"the expected value {expected!r} is not a finite number")
    if not _is_number(answer):
        return "invalid", f"answer with a number, not {type(answer).__name__} {answer!r}"
    if not math.isfinite(answer):
        return "invalid", f"answer with a finite number, not {answer!r}"
    if math.isclose(float(answer), float(expected), rel_tol=rel_tol, abs_tol=abs_tol):
        return "right", ""
    right = _tolerance(expected, rel_tol, abs_tol).strip()[1:-1]  # "within 5%", "exactly"
    why = _why_wrong(float(answer), float(expected))
    return "wrong", (f"you answered {_number(float(answer))}: {why}{' ' if why.endswith('?') else '. '}"
                     f"(Right is {right}{'' if right == 'exactly' else ' of'} the answer.)")


# Two units the quizzes mix up that differ by only a few percent: 2**20 bytes against 10**6, 2**30 against 10**9.
_BINARY_UNITS = {2 ** 20 / 1e6: "a MiB (a power of two) to a MB (a power of ten)",
                 2 ** 30 / 1e9: "a GiB (a power of two) to a GB (a power of ten)"}
# Counts in words: a ✗ line holds no digits but the reader's own answer and the tolerance.
_WORDS = dict(enumerate("one two three four five six seven eight nine ten eleven twelve".split(), start=1))


def _why_wrong(answer: float, expected: float) -> str:
    """How a wrong number is wrong, in words that do not give the expected value:
    its sign, its order of magnitude, a factor of 2, a binary unit, or only the
    direction. (Each says something a second answer could use; only the first
    answer is graded.)"""
    high = answer > expected
    direction = "too high" if high else "too low"
    if expected == 0 or answer == 0:
        return direction
    if (answer > 0) != (expected > 0):
        return "the sign is wrong"
    ratio = abs(answer / expected)
    if answer.is_integer() and expected.is_integer() and abs(answer - expected) <= 2:  # a count
        return f"{direction}, by a count of one or two: a boundary counted or left out (an off-by-one)?"
    if ratio >= 5 or ratio <= 0.2:
        n = max(1, round(abs(math.log10(ratio))))
        orders = f"{_WORDS.get(n, 'many')} order{'s' if n > 1 else ''}"
        return (f"{direction} by about {orders} of magnitude: check the unit (bytes, kB, MB; seconds, "
                "milliseconds) and whether the question counts thousands or millions of something")
    if 1.8 <= ratio <= 2.2:
        return f"{direction}, about twice the answer: is something counted twice?"
    if 0.45 <= ratio <= 0.55:
        return f"{direction}, about half the answer: is something that comes in twos counted once?"
    for factor, units in _BINARY_UNITS.items():
        if abs(ratio - factor) <= 0.005 * factor or abs(ratio - 1 / factor) <= 0.005 / factor:
            return f"{direction} by the ratio of {units}: check which unit the question asks for"
    if 1 / 1.5 < ratio < 1.5:
        return f"{direction}, but not far off: check each term of your formula"
    return f"{direction}, by less than an order of magnitude: check what the quantity counts"


def _note(explain: str, expected, rel_tol: float, abs_tol: float) -> str:
    """The course's explanation, unless it states the answer (then a line saying it is withheld)."""
    try:
        states = _states_answer(str(explain), expected, rel_tol, abs_tol)
    except Exception:  # an odd expected value: nothing to compare the note with
        states = False
    return "(The course's note on this question is withheld: it would state the answer.)" if states else str(explain)


def _states_answer(text: str, expected, rel_tol: float, abs_tol: float) -> bool:
    """Whether `text` states the expected value: the chosen option's name, or a
    number (1,234.5, 3.1e-05, 31%) that would be graded right."""
    if isinstance(expected, str):
        return re.search(rf"(?<!\w){re.escape(expected.strip())}(?!\w)", text, re.I) is not None
    for match in _NUMBER.finditer(text):
        value = float(match.group(1).replace(",", ""))
        values = (value, value / 100) if match.group(2) else (value,)
        if any(math.isclose(v, abs(float(expected)), rel_tol=max(rel_tol, 0.005), abs_tol=abs_tol) for v in values):
            return True
    return False


_NUMBER = re.compile(r"(?<![\w.])((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?)(\s?%)?")


def _shown(answer) -> str:
    return _number(float(answer)) if _is_number(answer) else repr(answer)


# ------------------------------------------------------------- the record of first attempts

RECORD_NAME = "quiz-attempts.json"


def record_path() -> Path:
    """Where the first attempts are kept: quiz-attempts.json in the learner's
    engine folder (my_engine.folder(): $TINYINFER_MY_ENGINE, Google Drive in
    Colab, or ~/tinyinfer-my-engine), beside the pieces the labs keep. It
    survives a kernel restart and holds every lab's questions, keyed by the
    question's text (unique across the course). A plain JSON file, for an
    instructor's grader to read:

        {"format": "tinyinfer quiz attempts 1",
         "questions": {"<question>": {"first_answer": 340.0, "first_right": false,
                                      "attempts": 2, "right_on_attempt": 2}}}

    It is on the learner's machine, so a learner can delete or edit it: a
    record of honest work, not an exam's proof."""
    from . import my_engine  # here: my_engine imports the registry, which imports the labs

    return my_engine.folder() / RECORD_NAME


def _record(what: str, answer, right: bool) -> dict | None:
    """Count one well-formed attempt at `what` and return the question's entry
    (None if the file cannot be read or written: grading goes on unrecorded)."""
    try:
        path = record_path()
        try:
            record = json.loads(path.read_text())
            if not isinstance(record.get("questions"), dict):
                raise ValueError("no questions")
        except (OSError, ValueError, AttributeError):
            record = {"format": "tinyinfer quiz attempts 1", "questions": {}}
        entry = record["questions"].setdefault(what, {})
        if "first_right" not in entry:
            answer = _scalar(answer)
            entry.update(first_answer=float(answer) if _is_number(answer) else str(answer), first_right=right,
                         attempts=0, right_on_attempt=None)
        entry["attempts"] = int(entry.get("attempts", 0)) + 1
        if right and entry.get("right_on_attempt") is None:
            entry["right_on_attempt"] = entry["attempts"]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
        os.replace(tmp, path)  # atomic: a reader never sees half a file
        return entry
    except Exception:
        return None


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
