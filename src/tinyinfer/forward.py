"""The model run directly on one sequence, outside the engine.

Chapters, labs, evaluation, inspection, speculative decoding and the fleet's
calibration all want the same thing: feed some tokens of one sequence at
positions start, start+1, ... on a contiguous KV cache, and read what comes
out. With no cache given, the pass is a prefill on a fresh cache made just big
enough, used once and forgotten. (The engine batches many sequences on paged
blocks instead: model_runner.py.)

    hidden = forward_hidden(llm.model, ids)        # [T, C]: one prefill
    logits = forward_tokens(model, ids, start, cache)  # [T, V] after a cached prefix
"""
from __future__ import annotations

import dataclasses

import torch

from .kv_cache import AttentionMetadata, KVCache, causal_mask


def new_cache(model, max_len: int, batch_size: int = 1, num_layers: int | None = None) -> KVCache:
    """An empty contiguous cache for `model`, in its dtype and on its device;
    with num_layers, only for the first num_layers layers (the early-exit draft's)."""
    config = model.config if num_layers is None else dataclasses.replace(model.config, num_hidden_layers=num_layers)
    weight = model.model.embed_tokens.weight  # never quantized, so always the model's dtype
    return KVCache(config, batch_size, max_len, weight.dtype, weight.device)


def step_metadata(positions: torch.Tensor, start: int) -> AttentionMetadata:
    """Attention metadata for tokens at positions start..start+T-1 of one sequence.

    AttentionMetadata.uniform covers a prefill from 0 (plain causal) and a single
    decode token (it may see every cached key). Several tokens after a cached
    prefix are neither: token j must see the prefix and tokens 0..j of this step,
    but not the tokens after it (in speculative decoding, the drafted tokens
    that follow), so we pass the causal-by-position mask explicitly. (SDPA's
    is_causal aligns the triangle to the top-left corner when T < S, which would
    hide most of the prefix: wrong here.)"""
    T = positions.shape[1]
    if start == 0 or T == 1:
        return AttentionMetadata.uniform(positions, start)
    num_keys = start + T
    return AttentionMetadata(positions, num_keys, mask=causal_mask(positions, num_keys), start=start)


@torch.no_grad()  # not inference_mode: inspection feeds these tensors back into modules later
def forward_hidden(model, token_ids: list[int], start: int = 0, cache: KVCache | None = None,
                   num_layers: int | None = None) -> torch.Tensor:
    """Hidden states [T, C] for token_ids placed at positions start, start+1, ...

    cache=None: a fresh cache of exactly len(token_ids) slots, so start must be 0.
    num_layers=None runs the whole model; a smaller number runs only the first
    num_layers decoder layers, then the final norm (the early-exit draft).

    The cache stores position p in column p. Columns at or after `start` may hold
    stale keys (of rejected draft tokens, say); this pass overwrites columns
    start..start+T-1, and the causal mask hides every column after a query's own
    position, so stale entries are never read."""
    if cache is None:
        if start != 0:
            raise ValueError(f"start={start}: a fresh cache holds no prefix, so start must be 0")
        cache = new_cache(model, len(token_ids))
    device = cache.k.device
    ids = torch.tensor([list(token_ids)], device=device)
    positions = torch.arange(start, start + len(token_ids), device=device)[None]
    return model(ids, positions, cache, step_metadata(positions, start), num_layers=num_layers)[0]


@torch.inference_mode()
def forward_tokens(model, token_ids: list[int], start: int = 0, cache: KVCache | None = None,
                   num_layers: int | None = None) -> torch.Tensor:
    """Logits [T, V] (fp32) for token_ids placed at positions start, start+1, ...
    (the arguments are forward_hidden's). Every row's logits: speculative
    decoding scores each drafted token."""
    return model.compute_logits(forward_hidden(model, token_ids, start, cache, num_layers))
