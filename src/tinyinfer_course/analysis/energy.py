"""Energy per token: an estimate from a power figure, or a reading of the CPU's
own energy counters (RAPL) where the operating system lets us read them.

Energy is power times time: a machine drawing `watts` for the `seconds` it
took to produce `tokens` tokens spent watts * seconds / tokens joules on each.
Both ways below are estimates, and chapter 10 labels them so:

- a stated power figure (a datasheet's maximum, or what you measured at the
  wall) ignores that the chip rarely draws exactly that, and that other parts
  of the machine (memory, fans, power supply) draw power too;
- RAPL (Running Average Power Limit) counters, which Intel CPUs and recent AMD
  ones keep and Linux exposes under /sys/class/powercap, count the energy of
  a whole CPU package (all its cores, whoever runs on them) and, on some
  machines, its memory. Reading them usually needs root, and virtual machines
  rarely expose them at all.

    meter = RaplMeter()              # None-safe: meter.available says if it works
    meter.start(); run_something(); joules = meter.stop()   # None if unavailable
"""
from __future__ import annotations

import re
from pathlib import Path

POWERCAP = Path("/sys/class/powercap")
# Top-level zones only ("intel-rapl:0"), not their sub-zones ("intel-rapl:0:1",
# the cores or memory inside a package), which the top level already counts.
_PACKAGE_ZONE = re.compile(r"^(intel|amd)-rapl:\d+$")


def joules_per_token(watts: float, seconds: float, tokens: int) -> float:
    """Energy per token at a constant power draw: watts * seconds / tokens."""
    if not watts > 0:
        raise ValueError(f"watts={watts!r} is invalid: must be > 0")
    if not seconds >= 0:
        raise ValueError(f"seconds={seconds!r} is invalid: must be >= 0")
    if not (isinstance(tokens, int) and tokens >= 1):
        raise ValueError(f"tokens={tokens!r} is invalid: must be an integer >= 1")
    return watts * seconds / tokens


def rapl_zones(root: Path = POWERCAP) -> list[Path]:
    """The package-level RAPL zones whose counter this process can read."""
    if not root.is_dir():
        return []
    zones = []
    for zone in sorted(root.iterdir()):
        if _PACKAGE_ZONE.match(zone.name) and _read_int(zone / "energy_uj") is not None:
            zones.append(zone)
    return zones


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):  # missing, not permitted (root only), or garbage
        return None


class RaplMeter:
    """Joules spent by the CPU packages between start() and stop(), from RAPL."""

    def __init__(self, root: Path = POWERCAP):
        self.zones = rapl_zones(Path(root))
        self._start: dict[Path, int] = {}

    @property
    def available(self) -> bool:
        return bool(self.zones)

    def start(self) -> None:
        self._start = {z: _read_int(z / "energy_uj") for z in self.zones}

    def stop(self) -> float | None:
        """Joules since start(), summed over packages; None when there is no counter."""
        if not self.zones or not self._start:
            return None
        total_uj = 0
        for zone, before in self._start.items():
            after = _read_int(zone / "energy_uj")
            if before is None or after is None:
                return None
            if after < before:  # the counter wrapped around at max_energy_range_uj
                after += _read_int(zone / "max_energy_range_uj") or 0
            total_uj += after - before
        return total_uj / 1e6
