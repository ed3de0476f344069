"""A one-line warning beside a timing taken on a busy machine.

With other programs on every core, OpenMP threads wait for each other and a
timing can come out several times (once, fifty times) slower than on an idle
machine, with nothing on the page to say so. A lab that shows a timing calls
busy_warning(repeats) after printing it: it looks at the load average (more
runnable processes than cores) and at the spread of the lab's own repeats
(the slowest far above the fastest), and prints one line when either says the
figure is not to be trusted. It never raises and prints nothing on a quiet
machine.
"""
from __future__ import annotations

import os

SPREAD_LIMIT = 1.5  # slowest repeat / fastest above this: something else was running


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use (a container's share)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_reasons(repeats=None, load: float | None = None, cores: int | None = None) -> list[str]:
    """Why the machine looks busy, as short phrases; [] when it looks quiet.
    repeats: the times of one measurement taken several times (any unit)."""
    reasons = []
    cores = cores or _cores()
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # not on every OS
            load = None
    if load is not None and load > cores:
        reasons.append(f"the load average is {load:.1f} on {cores} core{'s' if cores > 1 else ''}")
    times = [float(t) for t in (repeats or []) if t and t > 0]
    if len(times) >= 3 and max(times) / min(times) > SPREAD_LIMIT:
        reasons.append(f"the slowest of {len(times)} repeats took {max(times) / min(times):.1f}x the fastest")
    return reasons


def busy_warning(repeats=None, load: float | None = None, cores: int | None = None) -> bool:
    """Print one warning line if the machine looks busy; return whether it did."""
    try:
        reasons = busy_reasons(repeats, load, cores)
    except Exception:  # a warning must never stop a lab
        return False
    if reasons:
        print(f"⚠ busy machine: {' and '.join(reasons)}. The timings above may be several times slower than "
              "on an idle machine; rerun this cell when it is quiet.")
    return bool(reasons)
