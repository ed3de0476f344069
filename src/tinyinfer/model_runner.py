"""ModelRunner: turns a batch of sequences into tensors, runs the model, and
returns logits. It owns the device, the dtype and the KV cache of a batch.

A batch is right-padded: sequence b's prompt sits at positions 0..len_b-1 and
each later token at the next position. Padding slots are never attended to,
because a query only sees keys at positions <= its own (see model.causal_mask).
"""
from __future__ import annotations

import torch

from .kv_cache import KVCache
from .model import AttentionMetadata, causal_mask
from .sequence import Sequence


class ModelRunner:
    def __init__(self, model, device: torch.device, dtype: torch.dtype, pad_token_id: int = 0):
        self.model = model
        self.config = model.config
        self.device = device
        self.dtype = dtype
        self.pad_token_id = pad_token_id
        self.cache: KVCache | None = None

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence], all_positions: bool = False):
        """Process every prompt in one forward pass and allocate this batch's cache.

        Returns the last position's logits [B, V] and, when all_positions is set,
        hidden states for every prompt position (for prompt logprobs)."""
        lens = [len(s.prompt_token_ids) for s in seqs]
        max_len = max(len(s.prompt_token_ids) + s.params.max_tokens for s in seqs)
        self.cache = KVCache(self.config, len(seqs), max_len, self.dtype, self.device)
        ids = torch.full((len(seqs), max(lens)), self.pad_token_id, dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, : lens[b]] = torch.tensor(s.prompt_token_ids)
        ids = ids.to(self.device)
        positions = torch.arange(ids.shape[1], device=self.device).expand_as(ids)
        hidden = self.model(ids, positions, self.cache, AttentionMetadata.uniform(positions, 0))
        last = hidden[torch.arange(len(seqs)), torch.tensor(lens) - 1]
        return self.model.compute_logits(last), (hidden if all_positions else None)

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One new token per sequence, attending to its cache. Returns logits [B, V].

        Finished sequences ride along (static batching) with their position
        frozen, so they never write past their own cache row."""
        ids, pos = [], []
        for s in seqs:
            n = len(s.prompt_token_ids) + len(s.output_token_ids)
            ids.append(s.output_token_ids[-1])
            pos.append(min(n - 1, self.cache.max_len - 1))
        ids = torch.tensor(ids, device=self.device)[:, None]
        positions = torch.tensor(pos, device=self.device)[:, None]
        if len(set(pos)) == 1:  # e.g. batch 1: no mask needed, slice writes
            meta = AttentionMetadata.uniform(positions, pos[0])
        else:
            meta = AttentionMetadata(positions, max(pos) + 1, mask=causal_mask(positions, max(pos) + 1))
        hidden = self.model(ids, positions, self.cache, meta)
        return self.model.compute_logits(hidden[:, -1])

    @torch.inference_mode()
    def logits_for(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)

    def release(self) -> None:
        self.cache = None
