"""Chapter 9's picture of speculative decoding: a cheap draft guesses k
tokens, the target model scores all of them in one pass, and the greedy form
of the acceptance rule keeps the guesses up to the first disagreement, plus
one token of the target's own. Chapter 9 passes in a real draft (prompt
lookup) and the model's real greedy choices; the defaults are a made-up
example of the same shape."""
from __future__ import annotations

from .draw import arrow, box, canvas, label

EXAMPLE = dict(context=["the", " keeper", " climbed"], drafts=[" the", " spiral", " stairs", " at"],
               target=[" the", " spiral", " staircase", " and", " the"])


def accepted_prefix(drafts, target) -> int:
    """How many leading drafts the greedy rule keeps: those equal to the target's choice."""
    n = 0
    while n < len(drafts) and drafts[n] == target[n]:
        n += 1
    return n


def _show(token: str) -> str:
    """A token as it reads in a box: a leading space as '_', newlines as '\\n'."""
    text = token.replace("\n", "\\n")
    return ("_" + text[1:]) if text.startswith(" ") else text


def draw_speculative(context=EXAMPLE["context"], drafts=EXAMPLE["drafts"], target=EXAMPLE["target"]):
    """Three rows. Top: the last tokens of the context (grey) and the draft's k
    guesses (orange, dashed). Middle: one pass of the target model over the last
    context token and all k guesses, which gives its own choice at each of the
    k + 1 positions (blue). Bottom: the guesses that match the target are kept
    (green, ticked), the first mismatch is replaced by the target's choice, the
    guesses after it are thrown away, and if every guess matched the target's
    extra choice comes free; the pass yields kept + 1 tokens.
    `target` holds the target's greedy choice after the last context token and
    after each draft (len(drafts) + 1 tokens)."""
    k = len(drafts)
    kept = accepted_prefix(drafts, target)
    size, gap = 1.8, 0.12  # a box holds a 10-character token in bold at 9 pt
    step = size + gap
    nc = len(context)
    x0 = 2.6
    xs = [x0 + i * step for i in range(nc + k)]
    fig, ax = canvas(x0 + (nc + k + 1) * step + 0.3, 8.2)
    # Row 1: context and drafts.
    label(ax, 0.2, 7.0, "context,\ndraft's guesses", ha="left", fontsize=9)
    for i, t in enumerate(context):
        box(ax, xs[i], 6.6, size, 0.8, _show(t), "grey", fontsize=9)
    for i, t in enumerate(drafts):
        box(ax, xs[nc + i], 6.6, size, 0.8, _show(t), "orange", fontsize=9, dashed=True)
    # Row 2: one target pass over the last context token and the k drafts. Each
    # position's output is the target's choice for the NEXT position, so the
    # choices are drawn one place to the right, under the guesses they judge.
    start, end = xs[nc - 1], xs[-1] + step + size
    box(ax, start, 4.7, end - start, 0.8, f"target model: ONE forward pass over {k + 1} positions",
        "blue", fontsize=9)
    label(ax, 0.2, 5.1, "verify", ha="left", fontsize=9)
    for i in range(k + 1):
        arrow(ax, (xs[nc - 1 + i] + size / 2, 6.55), (xs[nc - 1 + i] + size / 2, 5.55))
        out_x = xs[nc - 1 + i] + step
        arrow(ax, (out_x + size / 2, 4.65), (out_x + size / 2, 4.05))
        box(ax, out_x, 3.1, size, 0.8, _show(target[i]), "blue", fontsize=9)
    label(ax, 0.2, 3.5, "target's\nchoice", ha="left", fontsize=9)
    # Row 3: the result, aligned under the positions the tokens fill.
    label(ax, 0.2, 1.6, "kept", ha="left", fontsize=9)
    for i in range(k):
        x = xs[nc + i]
        if i < kept:
            box(ax, x, 1.2, size, 0.8, _show(drafts[i]) + " \u2713", "green", fontsize=9)
        elif i == kept:
            box(ax, x, 1.2, size, 0.8, _show(target[i]), "blue", fontsize=9, bold=True)
        else:
            label(ax, x + size / 2, 1.6, "thrown\naway", fontsize=9, color="grey", italic=True)
    if kept == k:  # every guess kept: the target's choice after the last one is a bonus
        box(ax, xs[-1] + step, 1.2, size, 0.8, _show(target[k]), "blue", fontsize=9, bold=True)
    outcome = (f"{kept} of {k} guesses kept + 1 token of the target's own = {kept + 1} tokens from one pass"
               if kept < k else f"all {k} guesses kept + 1 bonus token = {k + 1} tokens from one pass")
    label(ax, x0, 0.45, outcome, ha="left", fontsize=9)
    return fig
