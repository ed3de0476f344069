"""One look for every figure the book draws, sized for the page it lands on.

The site's text column is 960 px wide on a 1280-px laptop screen, and the book
draws at 100 dpi. A figure drawn wider than the column is shrunk to fit, and its
labels with it: an 11-inch, two-panel figure with 10-pt labels ended up with
text about 6 px high in the old 688-px column. So every figure is drawn at most
MAX_WIDTH_IN wide (it is then shown at its own size) with 11-pt text, and no
label smaller than MIN_FONT_PT: 9 pt at 100 dpi is 12.5 px on the screen.

    from tinyinfer_course.notebook.figures import use_book_style
    use_book_style()          # once, in a chapter's or lab's set-up cell

tests/book/test_figures.py holds the chapters to these numbers. smallest_text(fig)
measures a drawn figure against them: its smallest font, and that text's height
in px as the site shows it (tests/book/test_schematics.py holds every schematic to
MIN_FONT_PT and MIN_SHOWN_PX).
"""
from __future__ import annotations

MAX_WIDTH_IN = 6.9  # inches: 690 px at 100 dpi, inside the 960-px column with room for a tight bounding box
MIN_FONT_PT = 9  # the smallest label, tick or annotation
DPI = 100
COLUMN_PX = 960  # the site's text column at 1280 px: a wider image is shrunk to it
MIN_SHOWN_PX = 12  # the smallest text height, in CSS px, a figure may show on the site

BOOK_STYLE = {
    "figure.figsize": (MAX_WIDTH_IN, 3.6),
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
}


def use_book_style() -> None:
    """Set matplotlib's defaults to the book's figure size and fonts (BOOK_STYLE)."""
    import matplotlib as mpl  # here, not at import: the engine never needs matplotlib

    mpl.rcParams.update(BOOK_STYLE)


def figure_texts(fig) -> list:
    """Every visible, non-empty text of a figure: its own texts, and each axes'
    texts, titles, axis labels, tick labels and legend entries."""
    found = list(fig.texts)
    for ax in fig.axes:
        found += [*ax.texts, ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label,
                  *ax.get_xticklabels(), *ax.get_yticklabels()]
        if ax.get_legend() is not None:
            found += [*ax.get_legend().get_texts(), ax.get_legend().get_title()]
    return [t for t in found if t.get_visible() and t.get_text().strip()]


def shown_width_px(fig) -> int:
    """The figure's width in px as the book saves it: at DPI, cropped to a tight
    bounding box (what Jupyter's inline backend does)."""
    import io
    import struct

    buf = io.BytesIO()
    fig.canvas.print_figure(buf, format="png", dpi=DPI, bbox_inches="tight")
    return struct.unpack(">I", buf.getvalue()[16:20])[0]  # the PNG's IHDR: width, then height


def smallest_text(fig) -> tuple[float, int, float]:
    """(smallest font size in pt, width in px, that text's height in CSS px as the
    site shows it): pt * DPI / 72, times COLUMN_PX / width when the image is
    wider than the column and so shrunk to it."""
    pt = min((t.get_fontsize() for t in figure_texts(fig)), default=float("inf"))
    width = shown_width_px(fig)
    return pt, width, pt * DPI / 72 * min(1.0, COLUMN_PX / width)
