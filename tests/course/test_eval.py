"""tinyinfer_course.analysis.eval: sliding-window perplexity, checked against transformers."""
import math

import pytest
import torch

from tinyinfer_course.analysis.eval import eval_text, perplexity, token_nlls


def hf_strided_perplexity(hf, ids, window, stride):
    """Hugging Face's documented recipe ("Perplexity of fixed-length models"):
    each window's labels are -100 except for the tokens new to that window."""
    ids = torch.tensor([ids])
    nll_sum, n_tokens, prev_end = 0.0, 0, 0
    for begin in range(0, ids.shape[1], stride):
        end = min(begin + window, ids.shape[1])
        trg_len = end - prev_end
        x = ids[:, begin:end]
        labels = x.clone()
        labels[:, :-trg_len] = -100
        with torch.no_grad():
            loss = hf(x, labels=labels).loss
        n = (labels != -100).sum().item() - 1  # the model shifts labels left by one
        nll_sum += loss.item() * n
        n_tokens += n
        prev_end = end
        if end == ids.shape[1]:
            break
    return math.exp(nll_sum / n_tokens)


def test_eval_text_is_long_enough(llm):
    text = eval_text()
    assert not text.startswith("Evaluation text")  # the header is removed
    assert len(llm.tokenizer.encode(text)) >= 5000


@pytest.mark.slow
@pytest.mark.parametrize("window,stride", [(400, 400), (128, 64), (100, 100)])
def test_perplexity_matches_transformers(llm, hf_model, window, stride):
    ids = llm.tokenizer.encode(eval_text())[:300]
    ours = perplexity(llm, ids, window=window, stride=stride)
    theirs = hf_strided_perplexity(hf_model, ids, window, stride)
    assert ours == pytest.approx(theirs, rel=1e-3)


def test_every_token_but_the_first_is_scored_once(llm):
    ids = llm.tokenizer.encode(eval_text())[:90]
    assert token_nlls(llm, ids, window=40, stride=15).shape == (89,)
    assert token_nlls(llm, ids, window=30, stride=30).shape == (89 - 2,)  # windows' first tokens: no context


def test_plain_english_beats_shuffled_tokens(llm):
    ids = llm.tokenizer.encode(eval_text())[:256]
    shuffled = [ids[i] for i in torch.randperm(len(ids), generator=torch.Generator().manual_seed(0))]
    assert perplexity(llm, ids, 256, 256) * 10 < perplexity(llm, shuffled, 256, 256)


def test_bad_arguments_are_rejected(llm):
    with pytest.raises(ValueError, match="stride"):
        perplexity(llm, "Some text here.", window=8, stride=16)
    with pytest.raises(ValueError, match="2 tokens"):
        perplexity(llm, [5])
