"""The few shapes every schematic is made of: a canvas, boxes, arrows, labels
and rows of blocks, in one colour scheme.

Coordinates are in "units" on a canvas of a given width and height (the figure
is 0.5 inch per unit by default), with (0, 0) at the bottom left, so a drawing
reads like graph paper. matplotlib is imported here, not by the engine: only
the book and the labs need it.

No text is under 9 pt, the helpers' default (tests/book/test_schematics.py): at
100 dpi that is 12.5 px on the site, as long as the drawing is at most 960 px
wide (19 units), or the site shrinks it and its text with it. Make room for a
label rather than shrink it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

# Okabe and Ito's palette: distinguishable with every common colour-vision deficiency.
COLORS = {
    "blue": "#0072B2", "orange": "#E69F00", "green": "#009E73", "sky": "#56B4E9",
    "vermillion": "#D55E00", "purple": "#CC79A7", "yellow": "#F0E442", "grey": "#999999",
}
# Pale fills for boxes (the same hues, mixed with white), dark text on top.
FILLS = {name: _c for name, _c in {
    "blue": "#cce3f0", "orange": "#f8e6bf", "green": "#bfe6da", "sky": "#d5ecf9",
    "vermillion": "#f4d6bf", "purple": "#f2dde9", "yellow": "#fbf8cf", "grey": "#e6e6e6",
}.items()}
INK = "#222222"


def canvas(width: float, height: float, title: str | None = None, scale: float = 0.5):
    """A blank drawing area `width` x `height` units; returns (fig, ax)."""
    fig, ax = plt.subplots(figsize=(width * scale, height * scale), layout="constrained")
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=11, color=INK)
    return fig, ax


def box(ax, x: float, y: float, w: float, h: float, text: str = "", color: str = "blue",
        fontsize: float = 9, bold: bool = False, dashed: bool = False):
    """A rounded box with its bottom-left corner at (x, y) and `text` centred in it."""
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.15",
                                facecolor=FILLS[color], edgecolor=COLORS[color], linewidth=1.2,
                                linestyle="--" if dashed else "-"))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=INK,
                fontweight="bold" if bold else "normal", wrap=True)
    return (x, y, w, h)


def arrow(ax, start: tuple[float, float], end: tuple[float, float], text: str = "", color: str = "grey",
          both: bool = False, curve: float = 0.0, fontsize: float = 9):
    """An arrow from start to end, optionally labelled at its middle; `curve`
    bends it (positive: to the left of the direction of travel)."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="<|-|>" if both else "-|>", mutation_scale=10,
                                 color=COLORS[color], linewidth=1.2,
                                 connectionstyle=f"arc3,rad={curve}"))
    if text:
        mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
        ax.text(mx, my, text, ha="center", va="center", fontsize=fontsize, color=INK,
                bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none"))


def label(ax, x: float, y: float, text: str, fontsize: float = 9, ha: str = "center", va: str = "center",
          color: str | None = None, italic: bool = False):
    """Free text at (x, y)."""
    ax.text(x, y, text, ha=ha, va=va, fontsize=fontsize, color=COLORS.get(color, INK) if color else INK,
            style="italic" if italic else "normal")


def blocks(ax, x: float, y: float, texts: list[str], colors: list[str] | str = "grey", size: float = 0.8,
           gap: float = 0.1, fontsize: float = 9):
    """A row of square blocks (KV blocks, tokens, weights) starting at (x, y);
    returns the x of each block's centre, for arrows."""
    colors = [colors] * len(texts) if isinstance(colors, str) else colors
    centres = []
    for i, (text, color) in enumerate(zip(texts, colors)):
        bx = x + i * (size + gap)
        box(ax, bx, y, size, size, text, color, fontsize)
        centres.append(bx + size / 2)
    return centres
