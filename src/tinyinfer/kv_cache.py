"""A contiguous KV cache: one preallocated slab per layer.

For every layer and every position already processed we keep the key and value
vectors, so a decode step computes K and V for the one new token only and reads
the rest. Each sequence owns row b of the slab and writes position p to column p.
(Chapter 7 replaces this with paged blocks; the arithmetic stays the same.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .config import ModelConfig


@dataclass
class AttentionMetadata:
    """What every layer's attention needs to know about this step (vLLM's name),
    for the contiguous cache below. (The paged cache has its own,
    paged_kv_cache.PagedAttentionMetadata.)

    The general case is a boolean mask by absolute position. Two common cases
    need no mask tensor at all, which saves work in every layer:
      - a prefill from position 0: plain causal attention (is_causal);
      - all sequences at the same position: each query may see every visible key.
    When all sequences write the same positions, `start` lets the cache write a
    slice instead of scattering."""

    positions: torch.Tensor  # [B, T]
    num_keys: int  # S: cache columns visible to this step
    mask: torch.Tensor | None = None  # [B, 1, T, S] boolean, or None
    is_causal: bool = False
    start: int | None = None  # first position written, if the same for every sequence

    @classmethod
    def general(cls, positions: torch.Tensor, cache: "KVCache") -> "AttentionMetadata":
        num_keys = cache.visible_length(positions)
        return cls(positions, num_keys, mask=causal_mask(positions, num_keys))

    @classmethod
    def uniform(cls, positions: torch.Tensor, start: int) -> "AttentionMetadata":
        """Every sequence writes positions start..start+T-1."""
        T = positions.shape[1]
        return cls(positions, num_keys=start + T, is_causal=start == 0 and T > 1, start=start)


def causal_mask(positions: torch.Tensor, num_keys: int) -> torch.Tensor:
    """[B, 1, T, S] boolean: query at position p may see key positions 0..p only.

    Because every sequence's keys live at their absolute positions in the cache,
    "causal" is all the mask needs to say; slots past a sequence's end are never
    visible, since they lie in its future."""
    keys = torch.arange(num_keys, device=positions.device)
    return (keys[None, None, :] <= positions[:, :, None]).unsqueeze(1)


class KVCache:
    def __init__(self, config: ModelConfig, batch_size: int, max_len: int, dtype, device):
        shape = (config.num_hidden_layers, batch_size, config.num_key_value_heads, max_len, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self._rows = torch.arange(batch_size, device=device)[:, None]

    def visible_length(self, positions: torch.Tensor) -> int:
        """How many cache columns this step's attention must read."""
        n = int(positions.max()) + 1
        if n > self.max_len:
            raise ValueError(f"position {n - 1} is past the cache's {self.max_len} slots")
        return n

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata):
        """Write k, v [B, Hkv, T, D] at meta.positions [B, T]; return keys and
        values [B, Hkv, S, D] for the first S = meta.num_keys columns."""
        B, T = k.shape[0], k.shape[2]
        if meta.start is not None:  # every sequence writes the same columns: a slice copy
            self.k[layer, :B, :, meta.start : meta.start + T] = k
            self.v[layer, :B, :, meta.start : meta.start + T] = v
        else:  # advanced indexing [rows, :, positions] addresses a [B, T, Hkv, D] view
            rows = self._rows[:B]
            self.k[layer][rows, :, meta.positions] = k.transpose(1, 2)
            self.v[layer][rows, :, meta.positions] = v.transpose(1, 2)
        return self.k[layer, :B, :, : meta.num_keys], self.v[layer, :B, :, : meta.num_keys]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        """Store this step's k, v [B, T, Hkv, D], then attend q [B, T, H, D] over
        every visible key. Returns [B, T, H*D]. (The paged cache has the same
        method, so the model does not care which cache it is given.)"""
        # This slab keeps heads before positions, [B, Hkv, S, D], the layout SDPA reads.
        keys, values = self.update(layer, k.transpose(1, 2), v.transpose(1, 2), meta)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=meta.mask,
                                             is_causal=meta.is_causal, enable_gqa=True)  # [B, H, T, D]
        return out.transpose(1, 2).flatten(2)

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2
