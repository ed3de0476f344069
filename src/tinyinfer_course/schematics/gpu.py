"""Chapter 4's picture of a GPU running a decode step: the CPU hands it work
through a launch queue, one kernel per operator, or one launch for a whole step
captured as a CUDA graph; inside, the streaming multiprocessors (SMs) with their
tensor cores, and the HBM that holds the weights, behind its bandwidth."""
from __future__ import annotations

from .draw import arrow, blocks, box, canvas, label


def _sm(ax, x, y):
    """One SM: a box with four tensor cores (orange squares) beside its other units."""
    box(ax, x, y, 1.3, 1.25, "", "blue")
    label(ax, x + 0.65, y + 0.9, "SM", fontsize=9)
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
    fig, ax = canvas(18.3, 9.4)
    # The CPU side.
    box(ax, 0.2, 4.3, 3.1, 2.2, "CPU\nPython and PyTorch:\nissue each operator", "grey", fontsize=9)
    label(ax, 6.3, 8.95, "eager: one launch per kernel", fontsize=9)
    blocks(ax, 3.7, 7.7, [""] * 9, "vermillion", size=0.45, gap=0.12)
    label(ax, 8.95, 7.92, "\u2026", fontsize=11)
    per_step = f"{launches:,} launches per step" if launches else "hundreds of small kernels per step"
    label(ax, 6.3, 7.25, per_step + ",\neach paid for on the CPU", fontsize=9, italic=True)
    label(ax, 6.3, 4.55, "CUDA graph: recorded once", fontsize=9)
    box(ax, 3.55, 3.3, 5.5, 0.8, "the whole step: one launch replays it", "green", fontsize=9)
    label(ax, 6.3, 2.75, "the same kernels, no per-kernel launch cost", fontsize=9, italic=True)
    arrow(ax, (3.35, 6.2), (3.65, 7.85), color="vermillion")
    arrow(ax, (3.35, 4.6), (3.5, 3.7), color="green")
    label(ax, 6.3, 1.6, "the launch queue (a CUDA stream):\nthe GPU runs its kernels in order", fontsize=9)

    # The GPU.
    gx, gw = 9.8, 8.3  # the GPU's box: left edge and width
    mid, sm0 = gx + gw / 2, gx + (gw - 5.95) / 2  # its centre, and the left edge of the SMs (4 x 1.55 units)
    box(ax, gx, 0.2, gw, 8.9, "", "grey", dashed=True)
    label(ax, mid, 8.75, f"GPU ({device})" if device != "a GPU" else "GPU", fontsize=9)
    for row in range(2):
        for col in range(4):
            _sm(ax, sm0 + col * 1.55, 6.4 - row * 1.5)
    label(ax, mid, 4.6, "\u2026 many SMs (132 on an H100 or H200, 40 on a T4)", fontsize=9)
    box(ax, mid - 2.6, 3.97, 0.24, 0.24, "", "orange")
    label(ax, mid - 2.2, 4.09, "tensor cores: matrix-multiply units", fontsize=9, ha="left")
    arrow(ax, (8.95, 7.9), (sm0 - 0.1, 7.1), color="vermillion")
    arrow(ax, (9.1, 3.7), (sm0 - 0.1, 5.6), color="green")
    box(ax, gx + 0.4, 2.95, gw - 0.8, 0.6, "L2 cache", "sky", fontsize=9)
    box(ax, gx + 0.4, 0.45, gw - 0.8, 1.35, "HBM: the weights and the KV cache", "purple", fontsize=9)
    bandwidth = f"{bandwidth_gbs:,.0f} GB/s" if bandwidth_gbs else "the memory bandwidth"
    arrow(ax, (mid, 1.85), (mid, 2.9), bandwidth, color="blue", both=True, fontsize=9)
    return fig
