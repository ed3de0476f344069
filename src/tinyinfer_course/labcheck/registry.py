"""The registry of labs: each labcheck module that holds a lab's checks says so
in one declaration, and everything that used to be a hand-kept list is read
from those declarations.

A lab module ends with

    LAB = Lab(2, "attention",
              exports=("check_rope", "reference_rope", ...),
              pieces={"rope": "reference_rope"},
              fallbacks={"check_rope": reference_rope})

and the package finds it by itself (every module of tinyinfer_course.labcheck that has
a LAB). From the declarations come:
- what `from tinyinfer import labcheck` offers: every name in `exports`
  (labcheck/__init__.py);
- the pieces a learner's engine is made of, and the reference each falls back
  to (my_engine.PIECES);
- the answers the labs fall back to, which the course's tests run through
  their checks with the refusal switched off (tests/course/test_labcheck_expected.py).

So a new lab is its own labcheck module, its tests/course/lab_cases/ file, its
solution notebook and its _toc.yml entry: nothing else to edit. A lab may span
two modules (lab 7: batching.py and scheduling.py); each declares its part.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class Lab:
    number: int  # the lab's number: "lab 7" in messages, labs/07-*.ipynb
    title: str
    exports: tuple[str, ...]  # names of this module the package re-exports: checks, references, given code
    pieces: dict[str, str | None] = field(default_factory=dict)  # piece kept for later labs -> exported reference
    fallbacks: dict[str, Any] = field(default_factory=dict)  # check name -> the answer the lab falls back to


def collect(package: ModuleType) -> list[tuple[ModuleType, Lab]]:
    """(module, its LAB) for every module of `package` that declares one, by lab number."""
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        if isinstance(getattr(module, "LAB", None), Lab):
            found.append((module, module.LAB))
    return sorted(found, key=lambda pair: (pair[1].number, pair[0].__name__))


@functools.lru_cache(maxsize=1)
def labs() -> tuple[tuple[ModuleType, Lab], ...]:
    """Every lab of tinyinfer_course.labcheck (imported once: modules are imported once anyway)."""
    return tuple(collect(importlib.import_module(__package__)))  # tinyinfer_course.labcheck


def exports(found=None) -> dict[str, Any]:
    """name -> object, for every name a lab exports; refuses a name two labs export."""
    names: dict[str, Any] = {}
    for module, lab in labs() if found is None else found:
        for name in lab.exports:
            if name in names and names[name] is not getattr(module, name):
                raise ValueError(f"lab {lab.number} ({module.__name__}) exports {name!r}, "
                                 "which another lab exports too")
            names[name] = getattr(module, name)
    return names


def pieces(found=None) -> dict[str, tuple[str, str | None]]:
    """piece -> ("lab N", the exported name of its reference, or None)."""
    return {piece: (f"lab {lab.number}", reference)
            for _, lab in (labs() if found is None else found) for piece, reference in lab.pieces.items()}


def fallbacks(found=None) -> list[tuple[str, Any]]:
    """(check name, the answer its lab falls back to), for every check that has one."""
    return [(check, answer) for _, lab in (labs() if found is None else found)
            for check, answer in lab.fallbacks.items()]
