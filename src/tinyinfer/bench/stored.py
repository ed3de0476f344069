"""What every stored measurement that a page renders needs (the peers, router,
tensor-parallel and int8 KV reports): where this machine's own run of it lies,
and the name of the CPU that measured it.

A report's own module keeps its file names and its sentences; these two are the
same for all of them.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path


def find_saved(name: str, env_var: str, start: Path | None = None) -> Path | None:
    """$env_var, else _build/<name> in the current folder (or `start`) or one of its
    three parents: a run on this machine (`make peers`, `make fleet`) is shown
    instead of the stored copy. None when there is neither."""
    if os.environ.get(env_var):
        return Path(os.environ[env_var])
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents[:3]):
        if (folder / "_build" / name).exists():
            return folder / "_build" / name
    return None


def cpu_name(default: str | None = None) -> str:
    """'Intel(R) Xeon(R) ...' from /proc/cpuinfo; elsewhere `default`, or
    platform.processor() when no default is given."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return default if default is not None else platform.processor() or "unknown"
