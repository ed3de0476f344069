"""The machine a lab's timings come from: is it busy, and can it compute bf16?

With other programs on the CPUs, the engine's OpenMP threads wait for each
other, and a decode step can take ten times as long as on a quiet machine.
Nothing in a timing says so, and a ratio of two timings taken a few seconds
apart can come out upside down. So a lab that shows a timing prints
warn_if_busy() beside it. Two signs, either one enough:

- the load average over the last minute is above the number of cores this
  process may use: other programs want the CPUs too;
- the repeats of one measurement disagree: the slowest is more than `spread`
  times the fastest.

On a quiet machine it prints nothing, so cells that call it are tagged
nbval-ignore-output, like every timing.

Whether the CPU multiplies bf16 in hardware is the course's machine facts'
(tinyinfer_course.machine.bf16_units; labcheck.bf16_units for the labs).
"""
from __future__ import annotations

import os



def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may run on (a container's share)
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows has no load average
        return None


def busy_note(*repeats, spread: float = 1.5, load: float | None = None, cores: int | None = None) -> str:
    """'' when the machine looks quiet, else one line saying why a timing may be off.
    repeats: one list per measurement, of the times (any unit) of its repeats;
    load and cores are read from the machine unless given."""
    load = _load() if load is None else load
    cores = _cores() if cores is None else cores
    signs = []
    if load is not None and load > cores:
        signs.append(f"the load average is {load:.1f} on {cores} core{'s' * (cores != 1)}")
    worst = 1.0
    for times in repeats:
        times = [float(t) for t in (times or []) if t is not None and float(t) > 0]
        if len(times) >= 2:
            worst = max(worst, max(times) / min(times))
    if worst > spread:
        signs.append(f"repeats of one measurement differ {worst:.1f}-fold")
    if not signs:
        return ""
    return ("⚠ busy machine: " + " and ".join(signs) + ". Other programs are sharing the CPUs, so these timings "
            "and their ratios may be far off; close them and run the cell again.")


def warn_if_busy(*repeats, spread: float = 1.5) -> None:
    """Print busy_note() if the machine looks busy. Never raises.

    It returns None, not whether the machine is busy: labs call it as a cell's
    last line, where Jupyter would print a returned False under every quiet
    timing. Code that needs the answer calls busy_note() and tests its text."""
    try:
        note = busy_note(*repeats, spread=spread)
    except Exception:  # a warning must never stop a lab
        return
    if note:
        print(note)
