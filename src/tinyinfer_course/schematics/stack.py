"""The eight layers a request passes through, from the chat window to the chip
(the introduction's map)."""
from __future__ import annotations

from .draw import arrow, box, canvas, label

LAYERS = [  # (name, what happens there, colour): top of the stack first
    ("1  Application", "keeps the conversation, shows the stream", "purple"),
    ("2  API and front end", "checks, limits, streams tokens back", "purple"),
    ("3  Scheduler and batching", "who runs this step, memory admission", "orange"),
    ("4  Text side of the engine", "tokenize, sample, detokenize, stop", "orange"),
    ("5  The model", "embeddings, transformer layers, logits", "blue"),
    ("6  Runtime and kernels", "PyTorch, matmul and attention kernels", "green"),
    ("7  The host", "CPU, RAM, OS, driver", "grey"),
    ("8  Accelerator and its memory", "weights, KV cache, working memory", "grey"),
]


def draw_stack(layers=LAYERS):
    """Eight stacked boxes, application at the top and accelerator memory at the
    bottom; an arrow down the left side carries the request, and an arrow up the
    right side carries each chosen token back up to the screen."""
    n = len(layers)
    fig, ax = canvas(15, n * 1.1 + 1.6)
    top = n * 1.1 + 1.0
    for i, (name, what, color) in enumerate(layers):
        y = top - (i + 1) * 1.1
        box(ax, 2.5, y, 10, 0.9, "", color)
        label(ax, 2.8, y + 0.45, name, ha="left", fontsize=9)
        label(ax, 12.2, y + 0.45, what, ha="right", fontsize=9, italic=True)
    arrow(ax, (1.95, top - 0.2), (1.95, top - n * 1.1 + 0.2), color="blue")
    label(ax, 0.85, top - n * 0.55, "request\ngoes down", fontsize=9)
    arrow(ax, (13.4, top - n * 1.1 + 0.2), (13.4, top - 0.2), color="vermillion")
    label(ax, 14.2, top - n * 0.55, "a token\ncomes up", fontsize=9)
    label(ax, 7.5, 0.35, "one pass per token: down with the context, up with the chosen token", fontsize=9,
          italic=True)
    return fig
