"""A contiguous KV cache: one preallocated slab per layer.

For every layer and every position already processed we keep the key and value
vectors, so a decode step computes K and V for the one new token only and reads
the rest. Each sequence owns row b of the slab and writes position p to column p.
(Chapter 7 replaces this with paged blocks; the arithmetic stays the same.)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import ModelConfig


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

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, meta):
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

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta) -> torch.Tensor:
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
