"""Chapter 2's picture: one decoder layer of a Llama-style model, with the
shapes of the tensors between its parts, read from the model's config."""
from __future__ import annotations

from .draw import COLORS, arrow, box, canvas, label


def _packaged_config():
    from tinyinfer.weights import ensure_packaged_model, read_config

    return read_config(ensure_packaged_model())


def draw_decoder_block(config=None):
    """The residual stream runs down the left edge. The attention half branches
    off it: RMSNorm, the stacked QKV projection, RoPE on queries and keys,
    causal grouped-query attention over the KV cache, the output projection,
    and an addition back into the stream. The feed-forward half does the same
    with RMSNorm and the SwiGLU MLP (gate and up projections, SiLU times up,
    down projection). Every shape is read from `config` (by default the
    course's model); T is the number of tokens in the step."""
    c = config or _packaged_config()
    C, H, Hkv, D, I = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size
    qkv = (H + 2 * Hkv) * D
    fig, ax = canvas(17, 11.0)
    sx = 1.3  # x of the residual stream
    X = "\u00d7"

    # The residual stream: in at the top, out at the bottom, two additions on the way.
    label(ax, sx + 0.2, 10.7, f"residual stream x  [T, {C}]   (from the embedding, or from the layer above)",
          fontsize=9, ha="left")
    add1, add2 = 5.55, 1.3
    arrow(ax, (sx, 10.4), (sx, add1 + 0.3), color="blue")
    arrow(ax, (sx, add1 - 0.3), (sx, add2 + 0.3), color="blue")
    arrow(ax, (sx, add2 - 0.3), (sx, 0.05), color="blue")
    for y in (add1, add2):
        ax.add_patch(_circle(sx, y))
        label(ax, sx, y, "+", fontsize=12)
    label(ax, sx + 0.2, 0.3, f"x  [T, {C}]  to the next layer ({c.num_hidden_layers} layers in all, "
          f"then a last RMSNorm and the LM head, {C} \u2192 {c.vocab_size:,})", fontsize=9, ha="left")

    # The attention half.
    ya, h = 8.3, 1.1
    label(ax, 2.4, 9.85, "attention: each token reads the tokens before it", fontsize=9, ha="left", italic=True)
    arrow(ax, (sx, ya + h / 2), (2.3, ya + h / 2), color="blue")
    parts = [(2.4, 1.9, "RMSNorm", "purple"),
             (4.8, 2.6, f"qkv_proj\n{C} \u2192 {qkv}", "orange"),
             (7.9, 1.9, "RoPE\non q and k", "green"),
             (10.3, 2.9, f"causal attention\n{H // Hkv} query heads\nper KV head", "blue"),
             (13.7, 2.6, f"o_proj\n{H * D} \u2192 {C}", "orange")]
    _row(ax, parts, ya, h)
    label(ax, 6.1, ya - 0.25, f"q [T, {H}, {D}]\nk [T, {Hkv}, {D}]   v [T, {Hkv}, {D}]", fontsize=9, va="top")
    label(ax, 14.4, ya - 0.25, f"in: [T, {H} {X} {D}]", fontsize=9, va="top")
    # The KV cache under attention: k and v written, every earlier key and value read.
    box(ax, 8.7, 6.05, 6.4, 1.1, f"KV cache of this layer\nk and v, each [{Hkv} heads, positions so far, {D}]",
        "sky", fontsize=9)
    arrow(ax, (11.1, ya), (11.1, 7.15), text="write k, v", color="grey", fontsize=9)
    arrow(ax, (12.5, 7.15), (12.5, ya), text="read all", color="grey", fontsize=9)
    arrow(ax, (15.9, ya), (15.9, add1), color="blue")
    arrow(ax, (15.9, add1), (sx + 0.3, add1), color="blue")
    label(ax, 5.0, add1 + 0.25, f"[T, {C}] added to the stream", fontsize=9)

    # The feed-forward half.
    ym = 2.85
    label(ax, 2.4, 4.4, "feed-forward (SwiGLU): each token on its own", fontsize=9, ha="left", italic=True)
    arrow(ax, (sx, ym + h / 2), (2.3, ym + h / 2), color="blue")
    parts = [(2.4, 1.9, "RMSNorm", "purple"),
             (4.8, 3.0, f"gate_up_proj\n{C} \u2192 2 {X} {I:,}", "orange"),
             (8.3, 3.0, f"SiLU(gate) {X} up\n[T, {I:,}]", "green"),
             (11.8, 3.0, f"down_proj\n{I:,} \u2192 {C}", "orange")]
    _row(ax, parts, ym, h)
    arrow(ax, (14.8, ym + h / 2), (15.9, ym + h / 2), color="blue")
    arrow(ax, (15.9, ym + h / 2), (15.9, add2), color="blue")
    arrow(ax, (15.9, add2), (sx + 0.3, add2), color="blue")
    label(ax, 5.0, add2 + 0.25, f"[T, {C}] added to the stream", fontsize=9)
    label(ax, 6.3, ym - 0.25, f"gate and up, each [T, {I:,}]", fontsize=9, va="top")
    return fig


def _row(ax, parts, y, h):
    """Boxes left to right at height y, each joined to the next by an arrow."""
    for i, (x, w, text, color) in enumerate(parts):
        box(ax, x, y, w, h, text, color, fontsize=9)
        if i + 1 < len(parts):
            arrow(ax, (x + w, y + h / 2), (parts[i + 1][0], y + h / 2))


def _circle(x, y):
    from matplotlib.patches import Circle

    return Circle((x, y), 0.3, facecolor="white", edgecolor=COLORS["blue"], linewidth=1.2)
