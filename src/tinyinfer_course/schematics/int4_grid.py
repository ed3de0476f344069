"""Chapter 6's picture: the 16 levels of 4-bit codes laid over one group of
weights, once centred on zero (symmetric) and once stretched from the group's
minimum to its maximum (asymmetric, as tinyinfer's INT4 and llama.cpp's Q4_1)."""
from __future__ import annotations

import torch

from tinyinfer import quant
from .draw import COLORS, INK, canvas, label

# Chapter 6's example group: eight weights, all of them positive.
EXAMPLE_WEIGHTS = (0.10, 0.15, 0.22, 0.31, 0.38, 0.47, 0.52, 0.60)
LEVELS = 16  # 4 bits


def symmetric_grid(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(level values, rounded weights) of a zero-centred 4-bit grid, codes -8..7,
    with the scale chapter 6 uses: max|w| / 7.5."""
    scale = w.abs().max() / 7.5
    levels = torch.arange(-8, 8) * scale
    return levels, torch.round(w / scale).clamp(-8, 7) * scale


def asymmetric_grid(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(level values, rounded weights) of the engine's INT4: quant.quantize_int4 on
    one group, so code 0 is the group's minimum and code 15 its maximum."""
    packed, scales, zeros = quant.quantize_int4(w[None], group_size=len(w))
    levels = zeros[0, 0].float() + torch.arange(LEVELS) * scales[0, 0].float()
    return levels, quant.dequantize_int4(packed, scales, zeros, len(w))[0]


def _panel(ax, y, x_of, levels, rounded, weights, title, codes):
    """One number line at height y: grey ticks for levels no weight uses, blue
    for the used ones, the weights as dots above with a line down to their level."""
    used = {int(torch.argmin((levels - r).abs())) for r in rounded}
    lo, hi = x_of(min(float(levels[0]), 0.0)), x_of(float(levels[-1]))
    ax.plot([lo - 0.3, hi + 0.3], [y, y], color=INK, linewidth=0.8)
    for i, v in enumerate(levels.tolist()):
        color = COLORS["blue"] if i in used else COLORS["grey"]
        ax.plot([x_of(v), x_of(v)], [y - 0.25, y + 0.25], color=color, linewidth=2.2 if i in used else 1.0)
    for i, text in codes.items():  # a few codes under their ticks
        label(ax, x_of(float(levels[i])), y - 0.55, text, fontsize=9)
    for wv, r in zip(weights.tolist(), rounded.tolist()):
        ax.plot([x_of(wv), x_of(r)], [y + 0.75, y + 0.28], color=COLORS["orange"], linewidth=0.8)
        ax.plot(x_of(wv), y + 0.8, "o", color=COLORS["orange"], markersize=4)
    step = float(levels[1] - levels[0])
    error = float((rounded - weights).abs().max())
    label(ax, 0.4, y + 1.45, f"{title}: step {step:.3f}, {len(used)} of {len(levels)} levels used, "
          f"largest rounding error {error:.3f}", ha="left", fontsize=9)


def draw_int4_grid(weights=EXAMPLE_WEIGHTS):
    """Two number lines over the same group of weights (orange dots). Top: a
    symmetric 4-bit grid, codes -8 to 7 centred on zero, so the levels below zero
    (grey) are never used and the step is wide. Bottom: the engine's asymmetric
    INT4, codes 0 to 15 from the group's minimum (the zero point) to its maximum,
    so every step falls inside the weights' range and the rounding error shrinks.
    Steps, levels used and errors are computed from the weights given."""
    w = torch.tensor(weights, dtype=torch.float32)
    sym_levels, sym = symmetric_grid(w)
    asym_levels, asym = asymmetric_grid(w)
    fig, ax = canvas(15, 7.0)
    left, right = min(float(sym_levels[0]), 0.0), max(float(sym_levels[-1]), float(w.max()))
    x_of = lambda v: 1.0 + (v - left) / (right - left) * 13.0  # noqa: E731  value -> canvas units
    _panel(ax, 5.0, x_of, sym_levels, sym, w, "Symmetric (zero point 0)",
           {0: "-8", 8: "0", 15: "7"})
    _panel(ax, 1.6, x_of, asym_levels, asym, w, "Asymmetric (zero point = the minimum)",
           {0: f"0 = {float(asym_levels[0]):.2f}", 15: f"15 = {float(asym_levels[-1]):.2f}"})
    unused_below = int((sym_levels < float(w.min()) - float(sym_levels[1] - sym_levels[0]) / 2).sum())
    if unused_below:  # name the wasted half
        label(ax, (x_of(float(sym_levels[0])) + x_of(0.0)) / 2, 3.85,
              f"{unused_below} levels below the smallest weight: never used", fontsize=9, color="grey", italic=True)
    label(ax, 0.4, 0.3, "orange: the weights;  blue tick: a level some weight rounds to;  grey: an unused level",
          ha="left", fontsize=9)
    for y in (5.0, 1.6):  # where zero lies on each line
        label(ax, x_of(0.0), y + 0.45, "0.0", fontsize=9, color="grey")
    return fig
