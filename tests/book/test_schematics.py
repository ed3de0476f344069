"""The book's schematics (tinyinfer_course.schematics): each one draws, offline, and
every page that shows one gives it alt text for readers who cannot see it."""
from __future__ import annotations

import inspect
from pathlib import Path

import re

import matplotlib
import pytest
import yaml

matplotlib.use("Agg")

from tinyinfer_course import schematics  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "intro.md", *sorted((ROOT / "chapters").glob("*.md"))]
DRAWINGS = sorted(name for name, f in vars(schematics).items() if name.startswith("draw_") and callable(f))


def test_there_are_schematics():
    assert DRAWINGS, "tinyinfer_course.schematics exports no draw_* function"


@pytest.mark.parametrize("name", DRAWINGS)
def test_each_schematic_draws_and_explains_itself(name):
    import matplotlib.pyplot as plt

    fn = getattr(schematics, name)
    assert inspect.getdoc(fn), f"{name} needs a docstring saying what it shows"
    fig = fn()
    try:
        ax = fig.axes[0]
        assert len(ax.patches) + len(ax.texts) >= 3, f"{name} drew almost nothing"
    finally:
        plt.close(fig)


CODE_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(?:---\n(?P<meta>.*?)\n---\n)?(?P<source>.*?)^```", re.M | re.S)


def _schematic_cells(page: Path) -> list[tuple[dict, str]]:
    """(metadata, source) of each {code-cell} on a MyST page that draws a schematic."""
    cells = [(yaml.safe_load(m["meta"] or "") or {}, m["source"]) for m in CODE_CELL.finditer(page.read_text())]
    return [(meta, source) for meta, source in cells if "schematics" in source and "draw_" in source]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_every_schematic_in_the_book_has_alt_text(page):
    for meta, source in _schematic_cells(page):
        alt = meta.get("mystnb", {}).get("image", {}).get("alt", "")
        assert len(alt.split()) >= 8, f"{page.name}: a schematic cell needs mystnb.image.alt (a sentence):\n{source}"


def test_every_drawing_is_used_in_the_book():
    used = "\n".join(source for page in PAGES for _, source in _schematic_cells(page))
    assert not [n for n in DRAWINGS if n not in used], "a schematic no page shows"
