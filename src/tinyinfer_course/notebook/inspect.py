"""Look inside the model while it reads a text: the scores and the sampling
distribution for the next token, the hidden state entering each layer, the
final hidden states, and every head's attention probabilities.

The engine never calls this file; chapters and labs do. It only watches: hooks
copy what passes through a module, and the attention probabilities are
recomputed from what the hooks saw, because the engine's fused attention kernel
(torch's scaled_dot_product_attention) never writes them down.

    from tinyinfer_course.notebook.inspect import attention_weights, next_token_logits
    logits = next_token_logits(llm, "The capital of France is")  # [V]
    probs = attention_weights(llm, "const user = getUser();", layer=3)  # [H, T, T]
"""
from __future__ import annotations

import math

import torch

from tinyinfer.forward import forward_hidden
from tinyinfer.model import apply_rope
from tinyinfer.sampling import SamplingParams, processed_probs


def token_ids(llm, text) -> list[int]:
    """A text's token ids, exactly as llm.generate would see them (no BOS is added).
    A list of ids is passed through unchanged."""
    return llm.tokenizer.encode(text) if isinstance(text, str) else list(text)


@torch.no_grad()  # not inference_mode: its tensors refuse in-place edits later, which would puzzle a learner
def next_token_logits(llm, prompt) -> torch.Tensor:
    """The raw scores the model gives every vocabulary entry as the token after
    `prompt` (a string, or a list of token ids): one forward pass, no sampling.
    Returned as a 1-D fp32 tensor on the CPU, so it can be examined anywhere."""
    hidden = forward_hidden(llm.model, token_ids(llm, prompt))  # one prefill on a fresh cache
    return llm.model.compute_logits(hidden[-1]).float().cpu()  # only the last position predicts the next


def next_token_distribution(llm, prompt, params: SamplingParams, top: int = 10):
    """The distribution the sampler would draw the next token from, returned for
    inspection: (probs over the whole vocabulary after every processor in
    `params`, the `top` most likely entries as (token_id, text, probability)).

    As in the engine, the repetition penalty counts the prompt's tokens as seen.
    At temperature 0 the draw is greedy, so all the probability sits on one token."""
    ids = token_ids(llm, prompt)
    probs = processed_probs(next_token_logits(llm, ids), params, torch.tensor(sorted(set(ids))))
    values, order = torch.topk(probs, top)
    pairs = [(int(i), float(v)) for v, i in zip(values, order) if v > 0]  # cut tokens are not candidates
    return probs, [(i, llm.tokenizer.decode([i]), v) for i, v in pairs]


def hidden_states(llm, text) -> torch.Tensor:
    """The model's output for every position, [T, C]: what the LM head turns into logits."""
    return forward_hidden(llm.model, token_ids(llm, text))


def layer_inputs(llm, text) -> list[torch.Tensor]:
    """The residual stream at every depth, L + 1 tensors of shape [T, C]:
    entry i is what enters layer i, and the last entry is what leaves the last
    layer (before the final RMSNorm). On the model's device, in its dtype, so a
    layer can be recomputed from its input: layers[i](entry i) gives entry i + 1."""
    stack = llm.model.model
    seen: list[torch.Tensor] = []

    def keep(module, args):
        seen.append(args[0][0].detach().clone())  # args[0] is x [B=1, T, C]

    hooks = [layer.register_forward_pre_hook(keep) for layer in stack.layers]
    hooks.append(stack.norm.register_forward_pre_hook(keep))
    try:
        forward_hidden(llm.model, token_ids(llm, text))
    finally:
        for hook in hooks:  # never leave a hook behind: it would slow every later call
            hook.remove()
    return seen


@torch.no_grad()
def attention_weights(llm, text, layer: int | None = None) -> torch.Tensor:
    """Every query head's attention probabilities: [H, T, T] for one layer, or
    [L, H, T, T] for all of them when layer is None (one forward pass either way).
    fp32, on the CPU.

    Row t of head h says how much position t's output draws on each position
    0..T-1; every row sums to 1 and is exactly 0 right of the diagonal (the future)."""
    blocks = llm.model.model.layers
    chosen = range(len(blocks)) if layer is None else [layer]
    seen = {}
    hooks = [blocks[i].input_layernorm.register_forward_hook(
        lambda mod, args, out, i=i: seen.__setitem__(i, out[0].float())) for i in chosen]
    try:
        forward_hidden(llm.model, token_ids(llm, text))
    finally:
        for hook in hooks:
            hook.remove()
    probs = torch.stack([_attention_probs(llm.model, blocks[i].self_attn, seen[i]) for i in chosen])
    return probs if layer is None else probs[0]


def _attention_probs(model, attn, x: torch.Tensor) -> torch.Tensor:
    """softmax(mask(q k^T / sqrt(D))) for one layer, from the normalized input x
    [T, C] that its attention block projects; returns [H, T, T]."""
    T, H, Hkv, D = x.shape[0], attn.num_heads, attn.num_kv_heads, attn.head_dim
    q, k, _ = (x @ attn.qkv_proj.weight.float().T).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    q = q.view(T, H, D).transpose(0, 1)  # [H, T, D]
    k = k.view(T, Hkv, D).transpose(0, 1)  # [Hkv, T, D]
    cos, sin = model.rope_cos[:T].float(), model.rope_sin[:T].float()
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k = k.repeat_interleave(H // Hkv, dim=0)  # query head h reads key head h // group size
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)  # [H, T, T]
    future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(dim=-1).cpu()
