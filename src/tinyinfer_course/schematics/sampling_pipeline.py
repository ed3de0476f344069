"""Chapter 3's picture: a row of logits goes through the engine's processors,
becomes probabilities, and one token is drawn. The numbers are the model's."""
from __future__ import annotations

import math

from .draw import COLORS, INK, arrow, box, canvas, label


def sampling_stages(llm, prompt: str, temperature: float = 0.8, top_k: int = 50, top_p: float = 0.9,
                    seed: int = 0, shown: int = 6) -> dict:
    """Run one row of `prompt`'s next-token logits through tinyinfer.sampling's
    own processors, in the engine's order, and keep what the picture needs: the
    `shown` highest-scoring tokens at every stage, how many candidates survive
    each one, and the token a seeded request draws (sampling.sample, as the
    engine calls it)."""
    import torch

    from ..notebook.inspect import next_token_logits
    from tinyinfer.sampling import SamplingParams, apply_top_k, apply_top_p, make_generator, sample

    logits = next_token_logits(llm, prompt).float()
    top = torch.topk(logits, shown).indices
    scaled = logits / temperature
    after_k = apply_top_k(scaled, top_k)
    after_p = apply_top_p(after_k, top_p)
    probs = after_p.softmax(-1)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    chosen = sample(logits, params, make_generator(seed, logits.device))

    def alive(row):
        return int(torch.isfinite(row).sum())

    return dict(
        prompt=prompt, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
        tokens=[llm.tokenizer.decode([i]) for i in top.tolist()],
        logits=logits[top].tolist(), scaled=scaled[top].tolist(),
        after_k=after_k[top].tolist(), after_p=after_p[top].tolist(), probs=probs[top].tolist(),
        counts=[logits.numel(), logits.numel(), alive(after_k), alive(after_p)],
        chosen=llm.tokenizer.decode([chosen]), chosen_prob=float(probs[chosen]),
        chosen_shown=chosen in top.tolist(),
    )


def _default_stages():
    from tinyinfer.llm import LLM

    return sampling_stages(LLM("smollm2-135m-instruct", dtype="float32"), "Once upon a time, there was a")


def draw_sampling_pipeline(stages: dict | None = None):
    """Six columns, left to right: the model's logits for the top few tokens,
    the same divided by the temperature, after top-k, after top-p (a dropped
    token shows minus infinity), the probabilities softmax gives the survivors,
    and the token a seeded draw picks. Under each column, how many of the
    vocabulary's tokens are still candidates."""
    s = stages or _default_stages()
    n = len(s["tokens"])
    height = 3.4 + 0.55 * n
    w, gap, x0 = 2.8, 0.3, 0.15  # a column fits 9 monospace characters and a number at 9 pt
    width = 2 * x0 + 6 * w + 5 * gap
    fig, ax = canvas(width, height)
    label(ax, width / 2, height - 0.35, f"next token after \u201c{s['prompt']}\u201d", fontsize=9.5)
    columns = [("logits", s["logits"], "{:.2f}", s["counts"][0]),
               (f"\u00f7 temperature {s['temperature']:g}", s["scaled"], "{:.2f}", s["counts"][1]),
               (f"top-k {s['top_k']}", s["after_k"], "{:.2f}", s["counts"][2]),
               (f"top-p {s['top_p']:g}", s["after_p"], "{:.2f}", s["counts"][3]),
               ("softmax", s["probs"], "{:.3f}", s["counts"][3])]
    top = height - 1.0
    names = [t.replace(" ", "\u2423").replace("\n", "\u21b5") for t in s["tokens"]]
    for c, (title, values, fmt, count) in enumerate(columns):
        x = x0 + c * (w + gap)
        box(ax, x, 0.9, w, top - 0.9, "", "blue" if c < 4 else "green")
        label(ax, x + w / 2, top - 0.35, title, fontsize=9)
        for r, (name, v) in enumerate(zip(names, values)):
            y = top - 0.95 - r * 0.55
            text = "\u2212\u221e" if v == -math.inf else fmt.format(v)
            ax.text(x + 0.15, y, name[:9], ha="left", va="center", fontsize=9, family="monospace", color=INK)
            ax.text(x + w - 0.15, y, text, ha="right", va="center", fontsize=9, family="monospace", color=INK)
        label(ax, x + w / 2, 1.25, f"{count:,} candidate{'s' if count != 1 else ''}", fontsize=9, italic=True)
        if c:
            arrow(ax, (x - gap + 0.02, top - 1.6), (x - 0.02, top - 1.6))
    # The draw: a seeded random number picks one token with these probabilities.
    x = x0 + 5 * (w + gap)
    box(ax, x, 0.9, w, top - 0.9, "", "orange")
    arrow(ax, (x - gap + 0.02, top - 1.6), (x - 0.02, top - 1.6))
    label(ax, x + w / 2, top - 0.35, f"draw (seed {s['seed']})", fontsize=9)
    ax.text(x + w / 2, top - 1.6, s["chosen"].replace(" ", "\u2423"), ha="center", va="center", fontsize=11,
            family="monospace", color=INK, fontweight="bold",
            bbox=dict(boxstyle="round,pad=0.3", facecolor="white", edgecolor=COLORS["orange"]))
    label(ax, x + w / 2, top - 2.5, f"its probability\n{s['chosen_prob']:.3f}", fontsize=9)
    label(ax, x + w / 2, 1.25, "1 token", fontsize=9, italic=True)
    label(ax, width / 2, 0.35, "the engine's order: (repetition penalty), temperature, top-k, top-p, then the draw;\n"
          "temperature 0 would take the highest logit instead", fontsize=9, italic=True)
    return fig
