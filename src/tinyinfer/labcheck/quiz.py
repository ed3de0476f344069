"""The labs' "predict, then measure" prompts.

compare_prediction(predicted, measured, what): the reader's guess beside the
measurement, with their ratio. Nothing is graded: a prediction is for thinking
before measuring, and the measurement differs from machine to machine. It never
raises, so a lab runs top to bottom with its predictions still blank.
"""
from __future__ import annotations


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
