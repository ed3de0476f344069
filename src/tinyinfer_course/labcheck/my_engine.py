"""Your own engine: the pieces you write in the labs, kept for the labs after.

When an exercise's check passes, it saves the exercise cell that defined your
function or class into one folder, as `<piece>.py`: your rope and attention
from lab 2, your sampler from lab 3, your generation loop from lab 4, and so
on. A later lab asks for a piece by name,

    from tinyinfer_course.labcheck import my_engine
    sample = my_engine.load("sample")

and gets yours if it was kept, or else the course's reference for it, with a
line saying which. So every lab runs whatever you have or have not finished,
and the last lab (your engine) is built from as much of your own code as you
wrote. The files are plain Python: open them, read them, fix them in the lab
they came from and pass its check again.

Where the folder is:
- $TINYINFER_MY_ENGINE, if set (the course's tests set it to a temporary folder);
- in Google Colab with Google Drive mounted: MyDrive/tinyinfer-my-engine. Each
  Colab notebook runs on its own machine, so without Drive nothing survives
  from one lab to the next, and later labs use the references;
- otherwise ~/tinyinfer-my-engine, shared by every lab you open on this machine.
"""
from __future__ import annotations

import importlib.util
import linecache
import os
import sys
from pathlib import Path

from . import registry

COLAB_DRIVE = Path("/content/drive/MyDrive")


def __getattr__(name: str):
    # my_engine.PIECES: piece -> (the lab that keeps it, the labcheck name of its
    # reference), read from every lab's declaration (registry.py). Computed on
    # use, not at import: the lab modules import this one.
    if name == "PIECES":
        return registry.pieces()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def folder() -> Path:
    """Where your pieces are kept (see the module's docstring)."""
    if os.environ.get("TINYINFER_MY_ENGINE"):
        return Path(os.environ["TINYINFER_MY_ENGINE"]).expanduser()
    if "google.colab" in sys.modules and COLAB_DRIVE.is_dir():
        return COLAB_DRIVE / "tinyinfer-my-engine"
    return Path.home() / "tinyinfer-my-engine"


def cell_source(obj) -> str | None:
    """The source of the whole notebook cell that defined `obj` (a function or
    class), or None when it cannot be found (code not typed into a cell)."""
    code = getattr(obj, "__code__", None)
    if code is None and isinstance(obj, type):  # a class: any method's code knows the cell
        code = next((f.__code__ for f in vars(obj).values() if hasattr(f, "__code__")), None)
    if code is None or os.path.exists(code.co_filename):  # a cell has no file of its own on disk
        return None
    lines = linecache.getlines(code.co_filename)
    return "".join(lines) or None


def keep(piece: str, obj) -> bool:
    """Save the cell that defined `obj` as <folder>/<piece>.py. Called by a
    check once `obj` has passed it; prints where it went. Never raises."""
    source = cell_source(obj)
    if source is None:
        return False
    text = (f"# Your {piece}, kept by {registry.pieces().get(piece, ('a lab',))[0]}'s check: the exercise cell as you\n"
            f"# wrote it. Change it in that lab and pass the check again to keep a new version.\n\n"
            f"{source.rstrip()}\n\n\n__piece__ = {obj.__name__}\n")
    try:
        path = folder() / f"{piece}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)  # a lab running at the same time never reads half a file
    except OSError as e:
        print(f"  (could not keep it for later labs: {e})")
        return False
    print(f"  kept as {piece}.py in your engine folder, for later labs")
    return True


def load(piece: str, quiet: bool = False):
    """Your kept `piece`, or the course's reference when you have none (or it no
    longer imports). Prints which one you got unless quiet."""
    lab, reference_name = registry.pieces()[piece]
    path = folder() / f"{piece}.py"
    why = f"pass {lab}'s check to keep yours"
    if path.exists():
        try:
            spec = importlib.util.spec_from_file_location(f"my_engine_{piece}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            if not quiet:
                print(f"{piece}: yours (kept by {lab})")
            return module.__piece__
        except Exception as e:  # a kept file that no longer runs: say so, carry on
            why = f"yours in {path.name} failed to load: {type(e).__name__}: {e}"
    if reference_name is None:
        raise KeyError(f"{piece!r} has no reference; {why}")
    if not quiet:
        print(f"{piece}: the course's reference ({why})")
    return registry.exports()[reference_name]


def status() -> dict[str, str]:
    """piece -> 'yours' or 'reference', for every piece the labs can keep."""
    return {piece: "yours" if (folder() / f"{piece}.py").exists() else "reference" for piece in registry.pieces()}
