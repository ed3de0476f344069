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

from .cpu_linear import generation
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
    first rows, so a step of any size reads the same addresses.

    What the host decides (token ids, positions, context lengths, block
    tables) lives in one flat tensor, `inputs`, so that a step's metadata
    reaches a GPU in one copy: the host writes it into a page-locked twin,
    `staging`, and one non-blocking copy moves it (a copy from page-locked
    memory needs no extra host copy, and does not make the CPU wait). On a CPU
    the two are one tensor, and nothing is copied. What follows from those
    (each row's key slots, its new slot, its mask) is worked out on the
    device, by metadata(), into new tensors: inside a CUDA graph they come from
    the graph's own memory, at the same addresses at every replay, and a
    compiled step sees plain contiguous tensors whatever the step's size
    (cuda_graphs.py)."""

    def __init__(self, max_size: int, max_blocks_per_seq: int, block_size: int, pad_block: int, device,
                 dtype: torch.dtype = torch.float32):
        device = torch.device(device)
        self.block_size, self.pad_block = block_size, pad_block
        self.max_size, self.max_blocks = max_size, max_blocks_per_seq
        n = max_size * (3 + max_blocks_per_seq)  # ids, positions, context lengths, then the block tables
        self.inputs = torch.zeros(n, dtype=torch.long, device=device)
        on_gpu = device.type == "cuda"
        self.staging = torch.zeros(n, dtype=torch.long, pin_memory=True) if on_gpu else self.inputs
        self._copied = torch.cuda.Event() if on_gpu else None  # when the last copy has read the staging
        self.input_ids, self.positions, self.context_lens, self.block_tables = self._views(self.inputs)
        self._host = self._views(self.staging)
        # never changes: a step reads its first S
        self.key_positions = torch.arange(max_blocks_per_seq * block_size, device=device)
        # The mask is additive, in the model's dtype: 0 where a row may look, -inf
        # where it may not. SDPA adds it to the scores as it is; a True/False mask
        # it would turn into this in every layer (on a GPU, 2-3 kernels each time).
        self._zero = torch.zeros((), dtype=dtype, device=device)
        self._minus_inf = torch.full((), -float("inf"), dtype=dtype, device=device)

    def _views(self, flat: torch.Tensor):
        m = self.max_size
        return flat[:m], flat[m : 2 * m], flat[2 * m : 3 * m], flat[3 * m :].view(m, self.max_blocks)

    def fill(self, token_ids: list[int], context_lens: list[int], block_tables: list[list[int]],
             size: int) -> tuple[torch.Tensor, DecodeMetadata]:
        """Write one decode step into the buffers: row b adds token_ids[b] at
        position context_lens[b] - 1; rows past the batch, up to `size`, are padding.
        Returns the step's input ids [1, size] and its metadata.
        Every row reads as many keys as the longest context (S)."""
        longest = max(context_lens)
        self.write(token_ids, context_lens, block_tables, size, longest)
        return self.metadata(size, longest, masked=size > 1)  # batch 1 reads exactly its own context

    def write(self, token_ids: list[int], context_lens: list[int], block_tables: list[list[int]],
              size: int, num_keys: int) -> None:
        """The host's part of a step: its rows, padded to `size`, with block
        tables wide enough for num_keys positions, copied to the device at once."""
        width = -(-num_keys // self.block_size)  # the blocks that hold S positions
        pad = size - len(token_ids)
        positions = [c - 1 for c in context_lens] + [0] * pad
        tables = [(table + [self.pad_block] * width)[:width] for table in block_tables]
        tables += [[self.pad_block] * width] * pad
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's copy must have read the staging before it changes
        ids, pos, lens, host_tables = self._host
        ids[:size].copy_(torch.tensor(list(token_ids) + [0] * pad))
        pos[:size].copy_(torch.tensor(positions))
        lens[:size].copy_(torch.tensor(list(context_lens) + [1] * pad))
        host_tables[:size, :width].copy_(torch.tensor(tables))
        if self.staging is not self.inputs:
            end = 3 * self.max_size + size * self.max_blocks  # everything the step reads, in one copy
            self.inputs[:end].copy_(self.staging[:end], non_blocking=True)
            self._copied.record(torch.cuda.current_stream(self.inputs.device))  # the stream the copy ran on

    def metadata(self, size: int, num_keys: int, masked: bool = True) -> tuple[torch.Tensor, DecodeMetadata]:
        """The device's part of a step of `size` rows that read num_keys key
        positions each (S): where each row's keys lie, its new token's slot, and
        which keys it may see. Worked out once per step here, not once per layer
        inside the step (30 times); only device operations, so that a CUDA
        graph can record them with the model. masked=False: no mask (a batch of
        1 whose S is its own context sees every key)."""
        width = -(-num_keys // self.block_size)
        positions, key_positions = self.positions[:size], self.key_positions[:num_keys]
        key_slots = slot_ids(self.block_tables[:size, :width], key_positions, self.block_size)  # [size, S]
        # The new token's slot is the key slot at its own position (a pad row's: the pad block's first).
        slot_mapping = key_slots.gather(1, positions[:, None])[:, 0]
        mask = None
        if masked:  # every row sees at least key 0, so no row's scores are all -inf
            visible = key_positions[None, :] < self.context_lens[:size, None]
            mask = torch.where(visible, self._zero, self._minus_inf).view(size, 1, 1, num_keys)
        return self.input_ids[:size][None], DecodeMetadata(positions[None], slot_mapping, key_slots, mask)


def decode_forward(model, input_ids, positions, cache, meta):
    """What torch.compile traces for a decode step: the model's forward, plus
    one check on the model's generation. Dynamo guards on every value a traced
    function reads, so this read keeps a guard on the root of the model, where
    decode_step_guards keeps everything: a pass that changes the model, even in
    a layer whose guards are dropped, bumps the number and forces a new trace
    (cpu_linear's rule 5)."""
    torch._check(generation(model) >= 0)
    return model(input_ids, positions, cache, meta)[0]
