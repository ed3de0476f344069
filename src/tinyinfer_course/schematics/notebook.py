"""Chapter 5's picture, after Inference 101's notebook: the KV cache keeps one
line of notes (a key and a value in every layer) for each token already seen.
A decode step writes one new line and reads all the others."""
from __future__ import annotations

from .draw import COLORS, arrow, box, canvas, label

PIECES = ["The", " lighthouse", " keeper", " climbed", " the", " spiral"]


def _packaged_config():
    from tinyinfer.weights import ensure_packaged_model, read_config

    return read_config(ensure_packaged_model())


def draw_kv_notebook(config=None, pieces: list[str] = PIECES, new_piece: str = " stairs",
                     bytes_per_value: int = 2):
    """Left, the notebook: one ruled line per token already seen, each holding
    that token's key and value for every layer and KV head. Right, the new
    token: the step computes its query, key and value, writes its key and value
    as the next line (dashed), and its query reads every line. Underneath, the
    size of one line and of a full context window, from `config` (by default
    the course's model)."""
    from tinyinfer.config import kv_bytes_per_token

    c = config or _packaged_config()
    n = len(pieces)
    height = 3.6 + 0.75 * (n + 1)
    fig, ax = canvas(18, height)
    top = height - 0.9
    left, width = 0.5, 10.5
    box(ax, left, 2.25, width, top - 2.25 + 0.45, "", "sky")
    label(ax, left + width / 2, top + 0.1, "the notebook: the KV cache, one line per token already seen",
          fontsize=9)
    for i, piece in enumerate(pieces + [new_piece]):
        y = top - 0.55 - i * 0.75
        new = i == n
        ax.plot([left + 0.2, left + width - 0.2], [y - 0.33, y - 0.33], color=COLORS["sky"], linewidth=0.6)
        label(ax, left + 0.35, y, f"{i}", fontsize=9, ha="left", color="grey")
        ax.text(left + 0.85, y, piece.replace(" ", "\u2423"), ha="left", va="center", fontsize=9,
                family="monospace")
        heads = f"{c.num_hidden_layers} layers \u00d7 {c.num_key_value_heads} heads"
        box(ax, left + 3.3, y - 0.27, 3.3, 0.54, f"k: {heads}", "vermillion" if new else "blue", fontsize=9,
            dashed=new)
        box(ax, left + 6.8, y - 0.27, 3.3, 0.54, f"v: {heads}", "vermillion" if new else "green", fontsize=9,
            dashed=new)
    y_new = top - 0.55 - n * 0.75
    # The new token and what its step does.
    box(ax, 12.5, y_new - 0.6, 5.0, 1.2, f"new token {n}: \u201c{new_piece.strip()}\u201d\ncompute its q, k, v only",
        "vermillion", fontsize=9)
    arrow(ax, (12.45, y_new), (left + width + 0.05, y_new), color="vermillion")
    label(ax, 11.75, y_new - 0.45, "write\none line", fontsize=9)
    arrow(ax, (15.0, y_new + 0.65), (left + width + 0.05, top - 0.55 - (n - 1) / 2 * 0.75),
          text="its query reads every\nline, its own too", color="blue", fontsize=9, curve=0.2)
    per_token = kv_bytes_per_token(c, bytes_per_value)
    window = c.max_position_embeddings
    label(ax, 0.5, 1.5, f"one line = 2 (k and v) \u00d7 {c.num_hidden_layers} layers \u00d7 "
          f"{c.num_key_value_heads} KV heads \u00d7 {c.head_dim} numbers \u00d7 {bytes_per_value} bytes = "
          f"{per_token:,.0f} bytes", fontsize=9, ha="left")
    label(ax, 0.5, 0.85, f"a full {window:,}-token window: {per_token * window / 2**20:,.0f} MiB per conversation, "
          "kept for as long as it runs", fontsize=9, ha="left")
    label(ax, 0.5, 0.25, "without the notebook, every step would work out all of these lines again",
          fontsize=9, ha="left", italic=True)
    return fig
