"""Perplexity: how surprised a model is by a text, on average, per token.

    perplexity = exp(mean over tokens of -log p(token | the tokens before it))

A perplexity of 14 means the model was, on average, as unsure as if it were
choosing uniformly among 14 tokens. It is the standard quick check that a
change to the weights (quantization, say) did not damage the model: same text,
same tokens, compare the numbers.

Long texts do not fit one forward pass, so we slide a window over them
(Hugging Face's "strided" method): each window of `window` tokens scores only
the tokens that the previous window did not, and the tokens before them serve
as context. A smaller stride gives each scored token more context (a lower,
fairer perplexity) at the price of more passes.
"""
from __future__ import annotations

import math
from importlib import resources

import torch

from tinyinfer.forward import forward_hidden


def eval_text() -> str:
    """The course's evaluation text (src/tinyinfer_course/data/eval_text.txt), header removed."""
    raw = resources.files("tinyinfer_course").joinpath("data/eval_text.txt").read_text(encoding="utf-8")
    return raw.split("\n---\n", 1)[1]  # the header above the first '---' line says where it comes from


@torch.inference_mode()
def token_nlls(llm, ids: list[int], window: int = 1024, stride: int = 512) -> torch.Tensor:
    """-log p(ids[t] | ids[:t]) for t = 1..len(ids)-1 (fp32), scored window by window."""
    if not (1 <= stride <= window):
        raise ValueError(f"stride={stride} must be in [1, window={window}]")
    model = llm.model
    ids_t = torch.tensor(ids, device=llm.device)
    nlls, scored_to = [], 1  # the first token has no context, so nothing predicts it
    for begin in range(0, len(ids) - 1, stride):
        end = min(begin + window, len(ids))
        hidden = forward_hidden(model, ids[begin:end])  # a fresh cache: each window is its own prompt
        # Score targets first..end-1, each predicted by the hidden state one position
        # earlier. A window's first token has no context inside it, so it is never
        # a target (only possible when stride == window, as in Hugging Face's recipe).
        first = max(scored_to, begin + 1)
        logits = model.compute_logits(hidden[first - 1 - begin : end - 1 - begin])
        targets = ids_t[first:end]
        nlls.append(-torch.log_softmax(logits.float(), -1).gather(1, targets[:, None])[:, 0])
        scored_to = end
        if end == len(ids):
            break
    return torch.cat(nlls)


def perplexity(llm, text: str | list[int], window: int = 1024, stride: int = 512) -> float:
    """Sliding-window perplexity of `text` (a string, or token ids) under `llm`."""
    ids = llm.tokenizer.encode(text) if isinstance(text, str) else list(text)
    if len(ids) < 2:
        raise ValueError("perplexity needs at least 2 tokens")
    return math.exp(token_nlls(llm, ids, window, stride).mean().item())
