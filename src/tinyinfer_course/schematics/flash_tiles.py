"""Chapter 5's picture of FlashAttention: the score matrix cut into tiles, and
one block of queries walking along its row of key blocks with three running
values, so that only one tile of scores exists at a time."""
from __future__ import annotations

from .draw import COLORS, FILLS, arrow, box, canvas, label


def draw_flash_tiles(num_tokens: int = 1024, block: int = 128, row: int = 5):
    """Left, the T x T score matrix of one head cut into block x block tiles:
    tiles wholly in the future (above the diagonal) are never computed, tiles on
    the diagonal are partly masked, and the rest are computed once each. One row
    of tiles, a block of queries, is highlighted with an arrow along it. Right,
    the three things that block keeps while it walks: the largest score so far,
    the running sum of exponentials, and the running weighted sum of values,
    next to the bytes of one tile and of the whole matrix."""
    import matplotlib.pyplot as plt

    n = num_tokens // block
    fig, ax = canvas(17, 10.4)
    size = 8.0 / n
    x0, y0 = 1.2, 1.0
    label(ax, x0 + 4.0, 9.85, f"scores of one head: {num_tokens:,} queries \u00d7 {num_tokens:,} keys", fontsize=9)
    label(ax, x0 + 4.0, 9.35, "keys, in blocks \u2192", fontsize=9, italic=True)
    label(ax, 0.55, y0 + 4.0, "queries, in blocks \u2192", fontsize=9, italic=True)
    ax.texts[-1].set_rotation(-90)
    for i in range(n):  # query block i, drawn from the top down
        for j in range(n):  # key block j
            y = y0 + (n - 1 - i) * size
            if j > i:
                face, edge = "white", "#dddddd"  # wholly in the future: skipped
            elif j == i:
                face, edge = FILLS["yellow"], COLORS["orange"]  # on the diagonal: partly masked
            else:
                face, edge = FILLS["sky"], COLORS["blue"]
            if i == row and j <= i:
                face = FILLS["vermillion"] if j < i else FILLS["orange"]
            ax.add_patch(plt.Rectangle((x0 + j * size, y), size, size, facecolor=face, edgecolor=edge,
                                       linewidth=0.8))
    y_row = y0 + (n - 1 - row) * size + size / 2
    arrow(ax, (x0 + 0.1, y_row), (x0 + (row + 1) * size - 0.1, y_row), color="vermillion")
    # The legend and the running values.
    rx = 10.3
    box(ax, rx, 7.9, 0.5, 0.5, "", "sky")
    label(ax, rx + 0.7, 8.15, "computed once, then thrown away", fontsize=9, ha="left")
    box(ax, rx, 7.2, 0.5, 0.5, "", "yellow")
    label(ax, rx + 0.7, 7.45, "on the diagonal: partly masked", fontsize=9, ha="left")
    ax.add_patch(plt.Rectangle((rx, 6.5), 0.5, 0.5, facecolor="white", edgecolor="#bbbbbb"))
    label(ax, rx + 0.7, 6.75, "in the future: never computed", fontsize=9, ha="left")
    box(ax, rx - 0.2, 1.75, 6.6, 4.15, "", "vermillion")
    label(ax, rx + 3.1, 5.55, "one block of queries walks its row,", fontsize=9)
    label(ax, rx + 3.1, 5.1, "keeping per query only:", fontsize=9)
    for k, text in enumerate(["m: the largest score so far",
                              "\u2113: the sum of exp(score \u2212 m)",
                              "o: the sum of exp(score \u2212 m) \u00d7 value"]):
        label(ax, rx + 0.2, 4.5 - k * 0.5, text, fontsize=9, ha="left")
    label(ax, rx + 3.1, 2.6, "a larger m rescales \u2113 and o\nby exp(old m \u2212 new m);\n"
          "at the end, the output is o / \u2113", fontsize=9)
    tile_kib = block * block * 4 / 2**10
    label(ax, rx + 3.1, 1.2, f"one tile: {block}\u00b2 \u00d7 4 bytes = {tile_kib:,.0f} KiB", fontsize=9)
    label(ax, rx + 3.1, 0.7, f"the whole matrix: {num_tokens:,}\u00b2 \u00d7 4 bytes = "
          f"{num_tokens * num_tokens * 4 / 2**20:,.0f} MiB", fontsize=9)
    return fig
