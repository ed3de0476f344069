"""Is the machine busy? One line for a lab to print beside a timing.

With other programs on the CPUs, the engine's OpenMP threads wait for each
other, and a decode step can take ten times as long as on a quiet machine.
Nothing in a timing says so, and a ratio of two timings taken a few seconds
apart can come out upside down. So a lab that shows a timing ratio prints
warn_if_busy() beside it. Two signs, either one enough:

- the load average over the last minute is above the number of cores this
  process may use: other programs want the CPUs too;
- repeats of one measurement disagree: the slowest is more than `spread`
  times the fastest.

On a quiet machine it prints nothing, so cells that call it are tagged
nbval-ignore-output, like every timing.
"""
from __future__ import annotations

import os


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may run on
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows has no load average
        return None


def busy_note(times=None, spread: float = 1.5, load: float | None = None, cores: int | None = None) -> str:
    """'' when the machine looks quiet, else one line saying why a timing may be off.
    times: repeats of one measurement (seconds, any unit); load and cores are
    read from the machine unless given."""
    load = _load() if load is None else load
    cores = _cores() if cores is None else cores
    signs = []
    if load is not None and load > cores:
        signs.append(f"the load average is {load:.1f} on {cores} core{'s' * (cores != 1)}")
    times = [float(t) for t in (times or []) if t is not None and float(t) > 0]
    if len(times) >= 2 and max(times) > spread * min(times):
        signs.append(f"repeats of one measurement differ {max(times) / min(times):.1f}-fold")
    if not signs:
        return ""
    return ("⚠ busy machine: " + " and ".join(signs) + ". Other programs are sharing the CPUs, so these timings "
            "and their ratios may be far off; close them and run the cell again.")


def warn_if_busy(times=None, spread: float = 1.5) -> bool:
    """Print busy_note() if the machine looks busy; return whether it does. Never raises."""
    try:
        note = busy_note(times, spread)
    except Exception:  # a warning must never stop a lab
        return False
    if note:
        print(note)
    return bool(note)
