"""Pictures for chapters and labs: next-token distributions as bar charts, and
an interactive view with sliders for the sampling settings.

Both start from one row of raw logits (see tinyinfer_course.notebook.inspect.next_token_logits)
and pass it through the engine's own processors, so what they show is exactly
the distribution the sampler would draw from. matplotlib and ipywidgets are
imported inside the functions: the engine itself never needs them.

    logits = next_token_logits(llm, "The capital of France is")
    plot_distributions(logits, llm.tokenizer, [dict(temperature=0.5), dict(temperature=1.5)])
    distribution_widget(logits, llm.tokenizer)   # in a notebook
"""
from __future__ import annotations

import html

import torch

from tinyinfer.sampling import SamplingParams, processed_probs


def visible(text: str) -> str:
    """A token's text with its whitespace made visible: ␣ for a space, ↵ for a newline."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") or "∅"


def describe(params: SamplingParams) -> str:
    """A short label such as 'T=0.7, top_p=0.9' (only the settings that are on)."""
    parts = ["greedy (T=0)" if params.greedy else f"T={params.temperature:g}"]
    if params.top_k > 0:
        parts.append(f"top_k={params.top_k}")
    if params.min_p > 0:
        parts.append(f"min_p={params.min_p:g}")
    if params.top_p < 1:
        parts.append(f"top_p={params.top_p:g}")
    if params.repetition_penalty != 1:
        parts.append(f"penalty={params.repetition_penalty:g}")
    return ", ".join(parts)


def _as_params(setting) -> SamplingParams:
    return setting if isinstance(setting, SamplingParams) else SamplingParams(**setting)


def plot_distributions(logits: torch.Tensor, tokenizer, settings, top: int = 8, seen=None,
                       title: str | None = None, cols: int = 2):
    """One bar chart per setting (a SamplingParams or a dict of its fields) of the
    `top` most likely next tokens after every processor. Every panel uses the
    same tokens (the most likely under the raw distribution), so the panels can
    be compared bar by bar. `cols` panels to a row, the figure at most the book's
    MAX_WIDTH_IN wide (two columns of 3.45 in): more settings make more rows, not
    narrower panels. Returns the matplotlib figure."""
    import matplotlib.pyplot as plt

    from tinyinfer_course.notebook.figures import MAX_WIDTH_IN

    settings = [_as_params(s) for s in settings]
    order = torch.topk(logits, top).indices.tolist()
    labels = [visible(tokenizer.decode([i])) for i in order]
    cols = min(len(settings), cols)
    rows = -(-len(settings) // cols)
    width = min(MAX_WIDTH_IN, MAX_WIDTH_IN / 2 * cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width, 0.32 * top * rows + 1.2),
                             sharey=True, squeeze=False, layout="constrained")
    for ax, params in zip(axes.flat, settings):
        probs = processed_probs(logits, params, seen)
        values = [float(probs[i]) for i in order]
        bars = ax.barh(range(top), values, color=["C0" if v > 0 else "0.8" for v in values])
        ax.bar_label(bars, [f"{v:.2f}" if v > 0 else "cut" for v in values], padding=2, fontsize=9)
        ax.set_xlim(0, 1.18)
        kept = int((probs > 0).sum())
        ax.set_title(f"{describe(params)}\n{kept:,} candidate{'s' if kept > 1 else ''}", fontsize=10)
        ax.set_xlabel("probability")
    for ax in axes.flat[len(settings):]:
        ax.set_visible(False)
    axes[0, 0].set_yticks(range(top), labels)
    axes[0, 0].invert_yaxis()
    if title:
        fig.suptitle(title)
    return fig


def distribution_html(logits: torch.Tensor, tokenizer, params: SamplingParams, top: int = 12, seen=None) -> str:
    """An HTML table of the `top` most likely next tokens under `params`, with a
    bar per token: a picture that needs no plotting library, so it also shows in
    a static page."""
    probs = processed_probs(logits, params, seen)
    values, order = torch.topk(probs, top)
    rows = []
    for v, i in zip(values.tolist(), order.tolist()):
        if v <= 0:
            break  # the rest were cut: they cannot be drawn
        token = html.escape(visible(tokenizer.decode([i])))
        bar = f'<div style="background:#1f77b4;height:0.9em;width:{300 * v:.1f}px"></div>'
        rows.append(f"<tr><td style='text-align:left;font-family:monospace'>{token}</td>"
                    f"<td style='text-align:left;width:310px'>{bar}</td><td>{v:.3f}</td></tr>")
    kept = int((probs > 0).sum())
    head = (f"<b>{describe(params)}</b>: {kept:,} of {probs.numel():,} tokens can be drawn; "
            f"the {len(rows)} most likely hold {float(values[:len(rows)].sum()):.1%} of the probability")
    return f"<div>{head}<table>{''.join(rows)}</table></div>"


def distribution_widget(logits: torch.Tensor, tokenizer, top: int = 12, temperature: float = 1.0,
                        top_p: float = 1.0, top_k: int = 0, seen=None):
    """Sliders for temperature, top-k and top-p over one row of logits, and the
    resulting next-token distribution. Nothing is re-run through the model when
    a slider moves: only the processors and the softmax, which take microseconds.
    top_k = 0 on the slider means off, as in SamplingParams and vLLM."""
    import ipywidgets as widgets

    style = {"description_width": "110px"}
    layout = widgets.Layout(width="420px")
    t = widgets.FloatSlider(value=temperature, min=0.0, max=2.0, step=0.05, description="temperature",
                            style=style, layout=layout, continuous_update=True)
    k = widgets.IntSlider(value=top_k, min=0, max=50, description="top_k (0 = off)", style=style, layout=layout)
    p = widgets.FloatSlider(value=top_p, min=0.05, max=1.0, step=0.05, description="top_p",
                            style=style, layout=layout)
    view = widgets.HTML()

    def update(_=None):
        params = SamplingParams(temperature=round(t.value, 4), top_k=k.value, top_p=round(p.value, 4))
        view.value = distribution_html(logits, tokenizer, params, top, seen)

    for slider in (t, k, p):
        slider.observe(update, names="value")
    update()
    return widgets.VBox([t, k, p, view])
