"""Chapter 4's picture of a GPU running a decode step: the CPU hands it work
through a launch queue, one kernel per operator, or one launch for a whole step
captured as a CUDA graph; inside, the streaming multiprocessors (SMs) with their
tensor cores, and the HBM that holds the weights, behind its bandwidth."""
from __future__ import annotations

from .draw import arrow, blocks, box, canvas, label


def _sm(ax, x, y):
    """One SM: a box with four tensor cores (orange squares) beside its other units."""
    box(ax, x, y, 1.3, 1.25, "", "blue")
    label(ax, x + 0.65, y + 0.9, "SM", fontsize=7.5)
    for i in range(4):
        box(ax, x + 0.1 + i * 0.28, y + 0.12, 0.24, 0.24, "", "orange")


def draw_gpu(launches: int | None = None, bandwidth_gbs: float | None = None, device: str = "a GPU"):
    """Left, the CPU (Python and PyTorch) hands the GPU its work through a launch
    queue: in an eager step one kernel per operator, each launch paid for on the
    CPU (`launches` of them per step, when given); with a CUDA graph, the step's
    kernels were recorded once and one launch replays them all. Right, the GPU:
    many streaming multiprocessors (SMs), each with tensor cores for matrix
    products, an L2 cache, and the HBM that holds the weights and the KV cache,
    read at the memory bandwidth (`bandwidth_gbs`, when given, for `device`)."""
    fig, ax = canvas(17.5, 9.4)
    # The CPU side.
    box(ax, 0.2, 4.3, 2.9, 2.2, "CPU\nPython and PyTorch:\nissue each operator", "grey", fontsize=8)
    label(ax, 6.3, 8.95, "eager: one launch per kernel", fontsize=8.5)
    blocks(ax, 3.7, 7.7, [""] * 9, "vermillion", size=0.45, gap=0.12)
    label(ax, 8.95, 7.92, "\u2026", fontsize=11)
    per_step = f"{launches:,} launches per step" if launches else "hundreds of small kernels per step"
    label(ax, 6.3, 7.25, per_step + ",\neach paid for on the CPU", fontsize=7.5, italic=True)
    label(ax, 6.3, 4.55, "CUDA graph: recorded once", fontsize=8.5)
    box(ax, 3.7, 3.3, 5.2, 0.8, "the whole step: one launch replays it", "green", fontsize=7.5)
    label(ax, 6.3, 2.75, "the same kernels, no per-kernel launch cost", fontsize=7.5, italic=True)
    arrow(ax, (3.15, 6.2), (3.65, 7.85), color="vermillion")
    arrow(ax, (3.15, 4.6), (3.65, 3.7), color="green")
    label(ax, 6.3, 1.6, "the launch queue (a CUDA stream):\nthe GPU runs its kernels in order", fontsize=7.5)

    # The GPU.
    gx = 9.6
    box(ax, gx, 0.2, 7.7, 8.9, "", "grey", dashed=True)
    label(ax, gx + 3.85, 8.75, f"GPU ({device})" if device != "a GPU" else "GPU", fontsize=9)
    for row in range(2):
        for col in range(4):
            _sm(ax, gx + 0.35 + col * 1.55, 6.0 - row * 1.5)
    label(ax, gx + 3.85, 4.25, "\u2026 many SMs (132 on an H100 or H200, 40 on a T4)", fontsize=7)
    box(ax, gx + 1.2, 3.82, 0.24, 0.24, "", "orange")
    label(ax, gx + 1.6, 3.94, "tensor cores: matrix-multiply units", fontsize=7, ha="left")
    arrow(ax, (8.95, 7.9), (gx + 0.3, 6.7), color="vermillion")
    arrow(ax, (8.95, 3.7), (gx + 0.3, 5.2), color="green")
    box(ax, gx + 0.35, 2.95, 7.0, 0.6, "L2 cache", "sky", fontsize=7.5)
    box(ax, gx + 0.35, 0.45, 7.0, 1.35, "HBM: the weights and the KV cache", "purple", fontsize=8)
    bandwidth = f"{bandwidth_gbs:,.0f} GB/s" if bandwidth_gbs else "the memory bandwidth"
    arrow(ax, (gx + 3.85, 1.85), (gx + 3.85, 2.9), bandwidth, color="blue", both=True, fontsize=7.5)
    return fig
