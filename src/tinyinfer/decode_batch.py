"""Fixed-size decode batches: the few batch sizes a compiled decode step is
made for, and the buffers its inputs live in.

A compiled decode step (enforce_eager=False) is traced once and then replayed.
Replaying is cheap only if the step looks the same every time, so the runner
pads each decode batch up to the next size in a short list, 1, 2, 4, 8, 16,
24, 32, ... (vLLM's cudagraph_capture_sizes follow the same rule), and copies
the step's inputs into buffers allocated once, at the largest size, so that
their addresses never move. A CUDA graph needs both: it records the addresses
of its inputs, and one graph is recorded per batch size.

Padded rows are real rows of the step, with harmless inputs: token 0 at
position 0, whose key and value go to a block that the BlockManager never hands
out (the runner reserves it), and which attends to that block alone. They cost
a little arithmetic (at most 7 rows past 8) and are never sampled.
"""
from __future__ import annotations

import torch

from .paged_kv_cache import DecodeMetadata, slot_ids

# Past 8, sizes go up by 8, as vLLM's do: a batch of 17 pads to 24, not to 32,
# so no step computes more than 7 rows of padding.
SIZE_STEP = 8


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The decode batch sizes that get a compiled step: 1, 2, 4, then every
    multiple of 8, up to the first size that holds max_num_seqs sequences."""
    sizes = [1, 2, 4] + list(range(SIZE_STEP, max_num_seqs + SIZE_STEP, SIZE_STEP))
    return [n for n in sizes if n < max_num_seqs] + [min(n for n in sizes if n >= max_num_seqs)]


def padded_size(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest size that holds num_seqs rows; None past the largest."""
    return next((n for n in sizes if n >= num_seqs), None)


class DecodeBuffers:
    """The inputs of a fixed-size decode step, allocated once at the largest
    size and filled in place at every step. Each step runs on views of their
    first rows, so a step of any size reads the same addresses."""

    def __init__(self, max_size: int, max_blocks_per_seq: int, block_size: int, pad_block: int, device):
        self.block_size, self.pad_block = block_size, pad_block
        max_len = max_blocks_per_seq * block_size
        self.input_ids = torch.zeros(1, max_size, dtype=torch.long, device=device)
        self.positions = torch.zeros(1, max_size, dtype=torch.long, device=device)
        self.slot_mapping = torch.zeros(max_size, dtype=torch.long, device=device)
        self.context_lens = torch.zeros(max_size, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(max_size, max_blocks_per_seq, dtype=torch.long, device=device)
        self.key_positions = torch.arange(max_len, device=device)  # never changes: a step reads its first S
        self.key_slots = torch.zeros(max_size * max_len, dtype=torch.long, device=device)
        self.mask = torch.zeros(max_size, max_len, dtype=torch.bool, device=device)

    def fill(self, token_ids: list[int], context_lens: list[int], block_tables: list[list[int]],
             size: int) -> tuple[torch.Tensor, DecodeMetadata]:
        """Write one decode step into the buffers: row b adds token_ids[b] at
        position context_lens[b] - 1; rows past the batch, up to `size`, are padding.
        Returns the step's input ids [1, size] and its metadata, views of the buffers."""
        bs = self.block_size
        longest = max(context_lens)  # S: every row reads this many positions
        width = -(-longest // bs)  # the blocks that hold them
        pad = size - len(token_ids)
        positions = [c - 1 for c in context_lens] + [0] * pad
        tables = [(table + [self.pad_block] * width)[:width] for table in block_tables] + [[self.pad_block] * width] * pad
        # One host-to-device copy per buffer, of the step's rows only.
        self.input_ids[0, :size].copy_(torch.tensor(list(token_ids) + [0] * pad))
        self.positions[0, :size].copy_(torch.tensor(positions))
        self.context_lens[:size].copy_(torch.tensor(list(context_lens) + [1] * pad))
        self.block_tables[:size, :width].copy_(torch.tensor(tables))
        # Where each row's keys lie, and which of them it may see: worked out
        # once per step here, not once per layer inside the step (30 times).
        key_positions = self.key_positions[:longest]
        key_slots = self.key_slots[: size * longest].view(size, longest)
        key_slots.copy_(slot_ids(self.block_tables[:size, :width], key_positions, bs))
        # The new token's slot is the key slot at its own position (a pad row's: the pad block's first).
        torch.gather(key_slots, 1, self.positions[0, :size, None], out=self.slot_mapping[:size, None])
        mask = None
        if size > 1:  # batch 1 reads exactly its own context: nothing to hide
            mask = self.mask[:size, :longest]
            torch.lt(key_positions[None, :], self.context_lens[:size, None], out=mask)
            mask = mask.view(size, 1, 1, longest)
        meta = DecodeMetadata(self.positions[:, :size], self.slot_mapping[:size], key_slots, mask)
        return self.input_ids[:, :size], meta
