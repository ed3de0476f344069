"""One forward pass over T new tokens that follow a cached prefix, for batch 1.

Both the target (verifying k drafted tokens) and the layer draft (re-reading the
tokens it has not cached yet) feed several tokens at positions start..start+T-1
on top of a cache that already holds positions 0..start-1.
"""
from __future__ import annotations

import torch

from ..kv_cache import KVCache
from ..model import AttentionMetadata, causal_mask


def step_metadata(positions: torch.Tensor, start: int) -> AttentionMetadata:
    """Attention metadata for tokens at positions start..start+T-1 of one sequence.

    AttentionMetadata.uniform covers a prefill from 0 (plain causal) and a single
    decode token (it may see every cached key). Several tokens after a cached
    prefix are neither: token j must see the prefix and tokens 0..j of this step,
    but not the drafted tokens after it, or the target would score a draft token
    while peeking at the ones that follow it. So we pass the causal-by-position
    mask explicitly. (SDPA's is_causal aligns the triangle to the top-left corner
    when T < S, which would hide most of the prefix: wrong here.)"""
    T = positions.shape[1]
    if start == 0 or T == 1:
        return AttentionMetadata.uniform(positions, start)
    num_keys = start + T
    return AttentionMetadata(positions, num_keys, mask=causal_mask(positions, num_keys), start=start)


@torch.inference_mode()
def forward_tokens(model, token_ids: list[int], start: int, cache: KVCache,
                   num_layers: int | None = None) -> torch.Tensor:
    """Logits [T, V] (fp32) for token_ids placed at positions start, start+1, ...

    num_layers=None runs the whole model (the target). A smaller number runs only
    the first num_layers decoder layers and then the model's own final norm and LM
    head: the "early exit" self-draft, which shares every weight with the target.

    The cache stores position p in column p. Columns at or after `start` may hold
    keys of rejected draft tokens from an earlier step; this pass overwrites
    columns start..start+T-1, and the causal mask hides every column after a
    query's own position, so stale entries are never read."""
    device = model.lm_head.weight.device
    ids = torch.tensor([token_ids], device=device)
    positions = torch.arange(start, start + len(token_ids), device=device)[None]
    hidden = model(ids, positions, cache, step_metadata(positions, start), num_layers=num_layers)
    return model.compute_logits(hidden[0])
