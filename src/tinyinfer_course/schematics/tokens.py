"""Chapter 1's picture: a text becomes pieces, the pieces become ids, and each
id picks one row of the embedding table (where chapter 2 begins)."""
from __future__ import annotations

from .draw import COLORS, arrow, box, canvas, label

PROMPT = "The capital of France is"


def token_lookup_data(text: str = PROMPT, folder=None, shown: int = 24):
    """What the picture shows, read from the packaged model: the pieces and ids
    its tokenizer gives `text`, the first `shown` numbers of each id's embedding
    row, and the table's shape (vocabulary x hidden size)."""
    from safetensors import safe_open

    from tinyinfer.tokenizer import Tokenizer
    from tinyinfer.weights import ensure_packaged_model

    folder = folder or ensure_packaged_model()
    tok = Tokenizer(folder)
    ids = tok.encode(text)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        table = f.get_slice("model.embed_tokens.weight")  # read only the rows we need
        vocab, hidden = table.get_shape()
        rows = [table[i : i + 1, :shown][0] for i in ids]
    return dict(text=text, pieces=[tok.decode([i]) for i in ids], ids=ids, rows=rows,
                vocab_size=vocab, hidden_size=hidden)


def draw_token_lookup(data: dict | None = None):
    """The text at the top; below it, one line per token: the piece the
    tokenizer cut (a space drawn as a small open box), its id in the vocabulary,
    and the row of the embedding table that id selects, drawn as a strip of
    coloured cells (its first numbers, blue below zero and orange above)."""
    import matplotlib.pyplot as plt

    d = data or token_lookup_data()
    n = len(d["ids"])
    height = 2.6 + n * 1.0
    fig, ax = canvas(16, height)
    top = height - 0.5
    label(ax, 8, top, f"text: \u201c{d['text']}\u201d", fontsize=10)
    headings = [(2.0, "1. pieces (the tokenizer)"), (5.6, "2. token ids"),
                (11.4, f"3. rows of the embedding table ({d['vocab_size']:,} rows \u00d7 {d['hidden_size']} numbers)")]
    for x, text in headings:
        label(ax, x, top - 0.9, text, fontsize=9, italic=True)
    scale = max(float(abs(r).max()) for r in d["rows"])
    cmap = plt.get_cmap("PuOr_r")  # orange-purple: readable with common colour-vision deficiencies
    for i, (piece, tid, row) in enumerate(zip(d["pieces"], d["ids"], d["rows"])):
        y = top - 2.0 - i * 1.0
        box(ax, 0.6, y - 0.35, 2.8, 0.7, piece.replace(" ", "\u2423"), "orange", fontsize=9)
        arrow(ax, (3.5, y), (4.6, y))
        box(ax, 4.7, y - 0.35, 1.8, 0.7, f"{tid}", "blue", fontsize=9)
        arrow(ax, (6.6, y), (7.5, y))
        cells = len(row)
        width = 6.6 / cells
        for j, v in enumerate(row.tolist()):
            ax.add_patch(plt.Rectangle((7.6 + j * width, y - 0.3), width, 0.6,
                                       facecolor=cmap(0.5 + 0.5 * v / scale), edgecolor="white", linewidth=0.3))
        label(ax, 14.35, y, f"\u2026 {d['hidden_size'] - cells} more", fontsize=9, color="grey", ha="left")
    ax.plot([0.6, 15.4], [0.75, 0.75], color=COLORS["grey"], linewidth=0.6)
    label(ax, 8, 0.35, f"{n} pieces, {n} ids, {n} vectors of {d['hidden_size']} numbers: "
          "the model never sees the letters", fontsize=9, italic=True)
    return fig
