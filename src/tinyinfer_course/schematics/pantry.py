"""Chapter 4's picture, after Inference 101's pantry door: the weights live in
memory (the pantry) and reach the arithmetic units (the chef) through a narrow
door (the memory bandwidth). Prefill carries them through once for a whole
prompt; decode carries them through again for every token."""
from __future__ import annotations

from .draw import arrow, blocks, box, canvas, label


def _packaged_config():
    from tinyinfer.weights import ensure_packaged_model, read_config

    return read_config(ensure_packaged_model())


def _panel(ax, x0, title, weights_mb, outputs, intensity, verdict):
    """One half of the picture: the pantry, its door, the chef, and below the
    chef what one or several trips through the door feed."""
    label(ax, x0 + 4.1, 8.7, title, fontsize=10)
    # The pantry, its right wall broken by a narrow door.
    box(ax, x0 + 0.2, 3.0, 2.7, 5.2, "", "grey")
    label(ax, x0 + 1.55, 7.55, "the pantry\n(memory)", fontsize=9)
    label(ax, x0 + 1.3, 4.2, f"all the\nweights\n{weights_mb:,.0f} MB", fontsize=9)
    ax.add_patch(_rect(x0 + 2.78, 5.4, 0.24, 1.0))
    label(ax, x0 + 3.95, 5.2, "the door\n(bandwidth)", fontsize=9, va="top")
    box(ax, x0 + 5.3, 4.9, 2.8, 2.0, "the chef\n(arithmetic units)", "orange", fontsize=9)
    arrow(ax, (x0 + 1.9, 5.9), (x0 + 5.25, 5.9), color="blue")
    label(ax, x0 + 4.1, 6.35, f"{weights_mb:,.0f} MB\nper trip", fontsize=9)
    arrow(ax, (x0 + 6.7, 4.85), (x0 + 6.7, 4.15), color="grey")
    outputs(ax, x0)
    label(ax, x0 + 4.1, 1.05, f"{intensity:,.1f} FLOP per byte moved", fontsize=9)
    label(ax, x0 + 4.1, 0.45, verdict, fontsize=9, italic=True)


def _verdict(intensity: float) -> str:
    """Where a step of this intensity sits against real chips' ridge points:
    a few FLOP/byte for CPUs, tens to a few hundred for GPUs (chapter 4)."""
    if intensity >= 100:
        return "above the ridge point of most chips: compute-bound"
    if intensity < 2:
        return "far below any chip's ridge point: memory-bound"
    return "near many chips' ridge points: it depends on the chip"


def _rect(x, y, w, h):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, h, facecolor="white", edgecolor="none")


def draw_prefill_decode(config=None, prompt_tokens: int = 512, bytes_per_param: float = 4):
    """Two kitchens side by side. Left, prefill: the weights come through the
    pantry door once and the chef uses them on every token of the prompt.
    Right, decode: every new token needs the weights carried through the door
    again, one token per trip. Under each, the step's arithmetic intensity for
    the course's model (tinyinfer_course.analysis.hardware.forward_cost), in FLOPs per byte."""
    from ..analysis.hardware import forward_cost

    c = config or _packaged_config()
    prefill = forward_cost(c, new_tokens=prompt_tokens, bytes_per_param=bytes_per_param)
    decode = forward_cost(c, context=prompt_tokens, bytes_per_param=bytes_per_param)
    weights_mb = c.num_parameters() * bytes_per_param / 1e6
    fig, ax = canvas(17.6, 9.2)

    def prompt_grid(ax, x0):  # one trip feeds every token of the prompt
        for row in range(3):
            blocks(ax, x0 + 5.0, 3.55 - row * 0.5, [""] * 6, "green", size=0.4, gap=0.1)
            label(ax, x0 + 8.15, 3.75 - row * 0.5, "\u2026", fontsize=10)
        label(ax, x0 + 6.2, 1.75, f"{prompt_tokens} prompt tokens from one trip", fontsize=9)

    def one_per_trip(ax, x0):  # every trip feeds one new token
        for i in range(3):
            blocks(ax, x0 + 4.75 + i * 1.3, 3.45, [""], "green", size=0.45)
            label(ax, x0 + 4.97 + i * 1.3, 3.1, f"trip {i + 1}", fontsize=9)
        label(ax, x0 + 8.3, 3.65, "\u2026", fontsize=10)
        label(ax, x0 + 6.2, 2.3, "one new token from each trip", fontsize=9)

    _panel(ax, 0.1, f"prefill: {prompt_tokens} prompt tokens", weights_mb, prompt_grid, prefill.intensity,
           _verdict(prefill.intensity))
    _panel(ax, 9.2, "decode: one token at a time", weights_mb, one_per_trip, decode.intensity,
           _verdict(decode.intensity))
    ax.plot([8.9, 8.9], [0.3, 9.0], color="#999999", linewidth=0.6)
    return fig
