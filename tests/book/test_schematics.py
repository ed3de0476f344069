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
from tinyinfer_course.notebook.figures import BOOK_STYLE, MIN_FONT_PT, MIN_SHOWN_PX, smallest_text  # noqa: E402

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


def legibility_problem(fig) -> str | None:
    """Why a drawing's smallest text is too small to read on the site, or None.
    The site shows an image at its own size up to the 960-px column and shrinks a
    wider one to fit; the book draws at 100 dpi, so 9 pt is 12.5 px when not shrunk."""
    pt, width, px = smallest_text(fig)
    if pt < MIN_FONT_PT or px < MIN_SHOWN_PX:
        return (f"smallest text {pt:g} pt, shown {px:.1f} px high in an image {width} px wide "
                f"(at least {MIN_FONT_PT} pt and {MIN_SHOWN_PX} px)")
    return None


@pytest.mark.parametrize("name", DRAWINGS)
def test_each_schematic_is_legible_at_the_size_shown(name):
    """Drawn as a chapter draws it (the book's style set), every text is at least
    MIN_FONT_PT and at least MIN_SHOWN_PX high as the 1280-px site shows it."""
    import matplotlib.pyplot as plt

    with matplotlib.rc_context(BOOK_STYLE):
        fig = getattr(schematics, name)()
        try:
            pt, width, px = smallest_text(fig)
            print(f"{name}: smallest text {pt:g} pt, {width} px wide, shown {px:.1f} px")
            problem = legibility_problem(fig)
        finally:
            plt.close(fig)
    assert problem is None, f"{name}: {problem}"


def test_the_legibility_check_catches_small_and_shrunk_text():
    """It fails a drawing with 7-pt text, and one with 9-pt text so wide that the
    site shrinks it (12 in at 100 dpi: 1,200 px, shown at 960, text 10 px)."""
    import matplotlib.pyplot as plt

    from tinyinfer_course.schematics.draw import canvas, label

    def drawing(width_units: float, fontsize: float):
        fig, ax = canvas(width_units, 2)
        label(ax, 0.2, 1, "x" * 10, ha="left", fontsize=fontsize)
        label(ax, width_units - 0.2, 1, "end", ha="right", fontsize=MIN_FONT_PT)
        return fig

    for width_units, fontsize, bad in ((8, 7, True), (24, MIN_FONT_PT, True), (8, MIN_FONT_PT, False)):
        fig = drawing(width_units, fontsize)
        try:
            problem = legibility_problem(fig)
        finally:
            plt.close(fig)
        assert (problem is not None) == bad, (width_units, fontsize, problem)


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
