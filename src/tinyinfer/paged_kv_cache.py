"""The paged KV cache: one pool of slots per layer, addressed through block tables.

Slot s of the pool belongs to block s // block_size. The BlockManager decides
which blocks each sequence owns; this file stores the tensors and runs attention
through the tables ("PagedAttention" done with plain PyTorch indexing).

A step may mix sequences in different phases: one reading a 200-token chunk of
its prompt, fifteen others decoding one token each. All their new tokens are
packed into one flat row, [1, N], so the linear layers (almost all the work)
see no padding at all. Only attention needs to know which token belongs to
which sequence; for it we gather each sequence's queries into a padded
[B, Tq] grid and its keys into a padded [B, S] grid, with a causal mask by
absolute position, then put the outputs back in flat order.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .config import ModelConfig


@dataclass
class PagedAttentionMetadata:
    """Everything the layers need about one packed step; built once per step."""

    positions: torch.Tensor  # [1, N] absolute position of every new token
    slot_mapping: torch.Tensor  # [N] pool slot each new token's K/V is written to
    key_slots: torch.Tensor  # [B, S] pool slots of each sequence's positions 0..S-1 (padded)
    query_index: torch.Tensor | None  # [B, Tq] flat index of each sequence's queries; None if Tq == 1
    output_index: torch.Tensor | None  # [N] where each flat token sits in the [B*Tq] grid
    mask: torch.Tensor  # [B, 1, Tq, S] key position <= query position

    @classmethod
    def build(cls, query_lens: list[int], context_lens: list[int], block_tables: list[list[int]],
              block_size: int, device) -> "PagedAttentionMetadata":
        """query_lens[b] new tokens of sequence b end at position context_lens[b] - 1."""
        B, tq, S = len(query_lens), max(query_lens), max(context_lens)
        width = max(map(len, block_tables))
        tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.long)
        pos = torch.arange(S)
        key_slots = tables[:, pos // block_size] * block_size + pos % block_size  # [B, S]
        starts = [c - q for q, c in zip(query_lens, context_lens)]
        positions = torch.cat([torch.arange(s, c) for s, c in zip(starts, context_lens)])  # [N]
        seq_of = torch.repeat_interleave(torch.arange(B), torch.tensor(query_lens))
        slot_mapping = key_slots[seq_of, positions]
        # Query position grid [B, Tq]; padding rows sit at position 0 so that each
        # row sees at least one key (a row with no visible key would give NaN).
        qpos = torch.zeros(B, tq, dtype=torch.long)
        query_index = output_index = None
        if tq > 1:
            offsets = torch.tensor([0] + query_lens[:-1]).cumsum(0)
            col = torch.arange(tq)
            valid = col[None, :] < torch.tensor(query_lens)[:, None]
            query_index = torch.where(valid, offsets[:, None] + col[None, :], 0)
            qpos[valid] = positions
            output_index = (seq_of * tq + (torch.arange(len(positions)) - offsets[seq_of]))
        else:
            qpos[:, 0] = positions
        mask = (pos[None, None, :] <= qpos[:, :, None]).unsqueeze(1)  # [B, 1, Tq, S]
        to = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return cls(to(positions[None]), to(slot_mapping), to(key_slots), to(query_index), to(output_index), to(mask))


class PagedKVCache:
    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype, device):
        shape = (config.num_hidden_layers, num_blocks * block_size, config.num_key_value_heads, config.head_dim)
        # Zeros, not empty: masked-out slots are still multiplied by 0 in attention,
        # and uninitialised memory could hold NaN bit patterns (NaN * 0 = NaN).
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_blocks, self.block_size = num_blocks, block_size

    def bytes_per_block(self) -> int:
        return 2 * self.k[:, : self.block_size].numel() * self.k.element_size()

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate block src into block dst in every layer."""
        bs = self.block_size
        for src, dst in copies:
            self.k[:, dst * bs : (dst + 1) * bs] = self.k[:, src * bs : (src + 1) * bs]
            self.v[:, dst * bs : (dst + 1) * bs] = self.v[:, src * bs : (src + 1) * bs]

    def _slots(self, block_table: list[int], num_tokens: int) -> torch.Tensor:
        pos = torch.arange(num_tokens)
        table = torch.tensor(block_table, dtype=torch.long)
        return (table[pos // self.block_size] * self.block_size + pos % self.block_size).to(self.k.device)

    def swap_out(self, block_table: list[int], num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy a sequence's first num_tokens keys and values to host memory."""
        slots = self._slots(block_table, num_tokens)
        pin = self.k.device.type == "cuda"  # page-locked memory copies back faster
        return self.k[:, slots].to("cpu").pin_memory() if pin else self.k[:, slots].clone(), \
            self.v[:, slots].to("cpu").pin_memory() if pin else self.v[:, slots].clone()

    def swap_in(self, block_table: list[int], kv: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Write keys and values saved by swap_out into a sequence's new blocks."""
        k, v = kv
        slots = self._slots(block_table, k.shape[1])
        self.k[:, slots] = k.to(self.k.device, non_blocking=True)
        self.v[:, slots] = v.to(self.v.device, non_blocking=True)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               meta: PagedAttentionMetadata) -> torch.Tensor:
        """q [1, H, N, D], k and v [1, Hkv, N, D] for the N packed tokens.
        Returns [1, N, H*D]."""
        # 1. write the new keys and values into their slots
        self.k[layer][meta.slot_mapping] = k[0].transpose(0, 1)  # [N, Hkv, D]
        self.v[layer][meta.slot_mapping] = v[0].transpose(0, 1)
        # 2. read each sequence's keys and values through its block table
        keys = self.k[layer][meta.key_slots].transpose(1, 2)  # [B, Hkv, S, D]
        values = self.v[layer][meta.key_slots].transpose(1, 2)
        # 3. each sequence's queries as a padded [B, H, Tq, D] grid
        H, N, D = q.shape[1], q.shape[2], q.shape[3]
        if meta.query_index is None:  # one query per sequence (all decoding)
            queries = q[0].transpose(0, 1).unsqueeze(2)  # [N=B, H, 1, D]
        else:
            queries = q[0].transpose(0, 1)[meta.query_index].transpose(1, 2)  # [B, H, Tq, D]
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=meta.mask, enable_gqa=True)
        out = out.transpose(1, 2).flatten(2)  # [B, Tq, H*D]
        if meta.output_index is not None:  # back to flat order, dropping padding
            out = out.flatten(0, 1)[meta.output_index]
        return out.reshape(1, N, H * D)
