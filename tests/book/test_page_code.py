"""The code a reader sees on the site: lines that fit the column, no bookkeeping
in the cells meant to be studied, figures drawn for the page (issue 57).

These read the sources, so they fail at once, without a build; the browser test
(test_browser.py) measures the same things on the built pages.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tinyinfer_course.notebook.figures import MAX_WIDTH_IN, MIN_FONT_PT

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "chapters").glob("*.md")) + [ROOT / "misconceptions.md", ROOT / "intro.md"]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
# 100 characters of the site's code font fit the 960-px column at 1280 px (107 do, just).
MAX_LINE = 100
HIDDEN = {"hide-input", "remove-input", "remove-cell", "hide-cell"}

CODE_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(?P<body>.*?)^```", re.M | re.S)


def page_cells(page: Path) -> list[tuple[set[str], str]]:
    """(tags, source) of every {code-cell} on a MyST page, in either way of writing
    its options: `:tags: [...]` lines, or a `---` YAML block."""
    cells = []
    for m in CODE_CELL.finditer(page.read_text()):
        body = m["body"]
        options: dict = {}
        if body.startswith("---\n"):
            head, _, body = body[4:].partition("\n---\n")
            options = yaml.safe_load(head) or {}
        else:
            while body.startswith(":"):
                line, _, body = body.partition("\n")
                key, _, value = line[1:].partition(":")
                options[key.strip()] = yaml.safe_load(value)
        cells.append((set(options.get("tags") or []), body))
    return cells


def notebook_cells(path: Path) -> list[tuple[set[str], str]]:
    nb = json.loads(path.read_text())
    return [(set(c.get("metadata", {}).get("tags", [])), "".join(c["source"]))
            for c in nb["cells"] if c["cell_type"] == "code"]


def long_lines(cells) -> list[str]:
    return [line for _, source in cells for line in source.splitlines() if len(line) > MAX_LINE]


@pytest.mark.parametrize("path", PAGES + SOLUTIONS, ids=lambda p: p.name)
def test_code_lines_fit_the_column(path):
    cells = page_cells(path) if path.suffix == ".md" else notebook_cells(path)
    too_long = long_lines(cells)
    assert not too_long, (f"{path.name}: {len(too_long)} code lines longer than {MAX_LINE} characters "
                          f"run past the site's column; the first: {too_long[0]!r}")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_glue_calls_are_kept_out_of_the_code_readers_study(page):
    shown = [source for tags, source in page_cells(page) if not tags & HIDDEN and "glue(" in source]
    assert not shown, (f"{page.name}: a cell the reader sees calls glue(); move its glue lines into a "
                       f"following cell tagged remove-input:\n{shown[0]}")


FIGSIZE = re.compile(r"figsize=\(\s*([0-9.]+)\s*(?:\*\s*([0-9.]+))?")
FONTSIZE = re.compile(r"fontsize=([0-9.]+)")


@pytest.mark.parametrize("path", PAGES + SOLUTIONS, ids=lambda p: p.name)
def test_figures_are_drawn_for_the_page(path):
    """At most MAX_WIDTH_IN wide (shown at its own size, not shrunk) and no text
    under MIN_FONT_PT: together, no label under 12.5 px on the screen."""
    cells = page_cells(path) if path.suffix == ".md" else notebook_cells(path)
    source = "\n".join(s for _, s in cells)
    wide = [m[0] for m in FIGSIZE.finditer(source) if float(m[1]) * float(m[2] or 1) > MAX_WIDTH_IN]
    small = [m[0] for m in FONTSIZE.finditer(source) if float(m[1]) < MIN_FONT_PT]
    assert not wide, f"{path.name}: figures wider than {MAX_WIDTH_IN} in: {wide}"
    assert not small, f"{path.name}: text smaller than {MIN_FONT_PT} pt: {small}"
    if "plt.subplots" in source or "plt.figure" in source:
        assert "use_book_style()" in source, f"{path.name} draws figures without the book's style (use_book_style)"


def test_the_checks_can_fail():
    assert long_lines([(set(), "x" * (MAX_LINE + 1))]) and not long_lines([(set(), "x" * MAX_LINE)])
    page = ROOT / "_build" / "test_page_code_probe.md"
    page.parent.mkdir(exist_ok=True)
    page.write_text("```{code-cell}\n:tags: [hide-input]\nglue('a', 1)\n```\n\n"
                    "```{code-cell}\n---\ntags: [remove-input]\n---\nglue('b', 2)\n```\n\n"
                    "```{code-cell}\nprint(1)\nglue('c', 3)\n```\n")
    try:
        cells = page_cells(page)
    finally:
        page.unlink()
    assert [tags for tags, _ in cells] == [{"hide-input"}, {"remove-input"}, set()]
    assert cells[2][1] == "print(1)\nglue('c', 3)\n"
