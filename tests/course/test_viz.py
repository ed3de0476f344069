"""tinyinfer_course.notebook.viz: the figures and the slider widget show the distribution the
sampler really draws from. Hand-made logits and a stand-in tokenizer: no model."""
import math

import matplotlib

matplotlib.use("Agg")
import pytest
import torch

from tinyinfer import SamplingParams
from tinyinfer_course.notebook.viz import (describe, distribution_html, distribution_widget, plot_distributions,
                                          processed_probs, visible)

LOGITS = torch.tensor([3.0, 1.0, 2.0, 0.0, -1.0, 0.5])


class Letters:
    """Token i is the letter 'a' + i, with a leading space."""

    def decode(self, ids):
        return "".join(" " + chr(ord("a") + i) for i in ids)


def test_processed_probs_match_the_processors():
    probs = processed_probs(LOGITS, SamplingParams(temperature=0.5, top_k=3))
    expected = torch.softmax(torch.tensor([6.0, 2.0, 4.0, -math.inf, -math.inf, -math.inf]), -1)
    torch.testing.assert_close(probs, expected)
    greedy = processed_probs(LOGITS, SamplingParams(temperature=0))
    assert greedy.tolist() == [1.0, 0, 0, 0, 0, 0]


def test_labels():
    assert visible(" a\nb\t") == "␣a↵b⇥" and visible("") == "∅"
    assert describe(SamplingParams(temperature=0)) == "greedy (T=0)"
    assert describe(SamplingParams(temperature=0.7, top_p=0.9, top_k=5)) == "T=0.7, top_k=5, top_p=0.9"


def test_plot_has_one_panel_per_setting():
    settings = [dict(temperature=0.5), dict(temperature=1.0), SamplingParams(top_p=0.5)]
    fig = plot_distributions(LOGITS, Letters(), settings, top=4, title="t")
    visible_axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible_axes) == 3
    assert [t.get_text() for t in visible_axes[0].get_yticklabels()] == ["␣a", "␣c", "␣b", "␣f"]
    assert visible_axes[2].get_title().endswith("\n1 candidate")  # top_p=0.5: "a" alone holds 0.63
    assert visible_axes[0].get_title().endswith("6 candidates")
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_html_lists_only_candidates():
    text = distribution_html(LOGITS, Letters(), SamplingParams(top_k=2), top=5)
    assert "2 of 6 tokens can be drawn" in text
    assert "␣a" in text and "␣c" in text and "␣b" not in text


def test_widget_redraws_when_a_slider_moves():
    pytest.importorskip("ipywidgets")
    box = distribution_widget(LOGITS, Letters(), top=6)
    temperature, top_k, top_p, view = box.children
    assert "6 of 6 tokens" in view.value
    top_k.value = 1
    assert "1 of 6 tokens" in view.value
    top_k.value = 0  # off again
    temperature.value = 0.0
    assert "greedy" in view.value and "1 of 6 tokens" in view.value
