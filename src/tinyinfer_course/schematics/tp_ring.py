"""Chapter 8's picture of tensor parallelism: N GPUs in a ring, each holding
a slice of every weight matrix, summing their partial results twice per layer.
The counts come from the course's cost model (hardware.tensor_parallel_step
and allreduce_time), for the model shape passed in."""
from __future__ import annotations

import math

from .draw import arrow, box, canvas, label

# The 70B shape that chapters 8 and 9 use (Llama 3 70B): layers and hidden size.
LLAMA_70B_LAYERS, LLAMA_70B_HIDDEN = 80, 8192


def _kib(nbytes: float) -> str:
    return f"{nbytes / 1024:.0f} KiB" if nbytes >= 1024 else f"{nbytes:.0f} B"


def draw_tp_ring(n: int = 4, num_layers: int = LLAMA_70B_LAYERS, hidden_size: int = LLAMA_70B_HIDDEN,
                 activation_bytes: int = 2):
    """Left: n GPUs on a ring, each holding 1/n of every weight matrix; arrows
    run from each GPU to the next. In an all-reduce every GPU sends 1/n of the
    message to its neighbour at each of 2(n - 1) steps, paying the link's latency
    every step. Right: one decoder layer, whose attention block and MLP each end
    with such an all-reduce, so a decode step pays 2 x layers of them. The counts
    and the message size are computed from the arguments."""
    fig, ax = canvas(16.2, 8)
    cx, cy, rx, ry = 4.6, 4.0, 3.3, 2.6  # an oval ring: room inside for four lines of 9-pt text
    places = [(cx + rx * math.sin(2 * math.pi * i / n), cy + ry * math.cos(2 * math.pi * i / n)) for i in range(n)]
    for i, (x, y) in enumerate(places):
        box(ax, x - 1.1, y - 0.45, 2.2, 0.9, f"GPU {i}\n1/{n} of each W", "green", fontsize=9)
    for i in range(n):  # ring arrows between the boxes' edges, bent outwards
        (x0, y0), (x1, y1) = places[i], places[(i + 1) % n]
        shrink = lambda a, b: (a + (b - a) * 0.3)  # noqa: E731  leave the boxes clear
        arrow(ax, (shrink(x0, x1), shrink(y0, y1)), (shrink(x1, x0), shrink(y1, y0)), color="blue", curve=-0.25)
    message = hidden_size * activation_bytes  # one token's activation vector
    steps = 2 * (n - 1)
    label(ax, cx, cy + 0.35, "ring all-reduce", fontsize=9)
    label(ax, cx, cy - 0.1, f"{steps} steps; in each, every GPU", fontsize=9)
    label(ax, cx, cy - 0.45, f"sends {_kib(message / n)} to the next", fontsize=9)
    label(ax, cx, cy - 0.85, f"(message: {_kib(message)} per token)", fontsize=9, italic=True)

    x = 9.8  # one layer, top to bottom
    label(ax, x + 3.0, 7.5, "one decoder layer, on every GPU", fontsize=9)
    parts = [(f"attention: its 1/{n} of the heads", "blue"), ("all-reduce: sum the partial outputs", "vermillion"),
             (f"MLP: its 1/{n} of the hidden columns", "blue"), ("all-reduce: sum the partial outputs", "vermillion")]
    for i, (text, color) in enumerate(parts):
        y = 6.3 - i * 1.25
        box(ax, x, y, 6.0, 0.8, text, color, fontsize=9)
        if i:
            arrow(ax, (x + 3.0, y + 1.25), (x + 3.0, y + 0.8))
    total = 2 * num_layers
    label(ax, x + 3.0, 0.95, f"x {num_layers} layers = {total} all-reduces per decode step,", fontsize=9)
    label(ax, x + 3.0, 0.5, f"{total * steps:,} latency-bound ring steps on {n} GPUs", fontsize=9)
    return fig
