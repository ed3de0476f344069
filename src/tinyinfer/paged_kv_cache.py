"""The paged KV cache: one pool of slots per layer, addressed through block tables.

Slot s of the pool belongs to block s // block_size. The BlockManager decides
which blocks each sequence owns; this file stores the tensors and runs attention
through the tables ("PagedAttention" done with plain PyTorch indexing).

A step may mix sequences in different phases: one reading a 200-token chunk of
its prompt, fifteen others decoding one token each. All their new tokens are
packed into one flat row, [1, N], so the linear layers (almost all the work)
see no padding at all. Only attention needs to know which token belongs to
which sequence. It runs in groups, so that nobody pays for anybody else's
length: decoding sequences of similar context length together (one query
each, keys padded to the longest context in the group), and each prompt chunk
on its own (its queries against its own keys). Padding them all into one
[B, longest chunk, longest context] grid would cost a 500-token chunk's work
for every one-token decode.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .checks import check_choice
from .config import KV_CACHE_DTYPES, ModelConfig
from .kv_quant import SCALE_DTYPE, dequantize, quantize_per_head


def keep_cudnn_attention_out() -> None:
    """On a CUDA GPU, take cuDNN's kernel out of the ones SDPA may pick for
    attention, for the whole process (PyTorch keeps one set of such switches;
    the engine calls this when it starts on a GPU). Since torch 2.9, SDPA tries
    cuDNN first in bf16 and fp16 on Hopper GPUs (H100, H200), and cuDNN builds a
    plan on the host for every new shape: in eager steps, every decode step's
    key length is new. Flash and memory-efficient attention need no plan.
    TINYINFER_CUDNN_ATTENTION=1 leaves cuDNN in, to measure it
    (benchmarks/gpu_check.py does)."""
    if os.environ.get("TINYINFER_CUDNN_ATTENTION") != "1":
        torch.backends.cuda.enable_cudnn_sdp(False)


def slot_ids(tables: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Pool slot of each position: its block from the table, then its offset in
    the block. tables is one block table [W] or several [b, W]."""
    return tables[..., positions // block_size] * block_size + positions % block_size


@dataclass
class AttentionGroup:
    """Sequences whose attention runs as one call: b sequences of t queries each."""

    token_index: torch.Tensor  # [b * t] where the group's queries sit in the flat row
    key_slots: torch.Tensor  # [b * S] pool slots of each sequence's positions 0..S-1 (padded)
    mask: torch.Tensor | None  # [b, 1, t, S] key position <= query position; None if all True
    num_seqs: int
    query_len: int
    num_keys: int  # S
    is_causal: bool = False  # a chunk from position 0: plain causal attention, no mask tensor


@dataclass
class PagedAttentionMetadata:
    """Everything the layers need about one packed step; built once per step."""

    positions: torch.Tensor  # [1, N] absolute position of every new token
    slot_mapping: torch.Tensor  # [N] pool slot each new token's K/V is written to
    groups: list[AttentionGroup]

    @classmethod
    def build(cls, query_lens: list[int], context_lens: list[int], block_tables: list[list[int]],
              block_size: int, device) -> "PagedAttentionMetadata":
        """query_lens[b] new tokens of sequence b end at position context_lens[b] - 1."""
        starts = [c - q for q, c in zip(query_lens, context_lens)]
        offsets = [0]
        for q in query_lens:
            offsets.append(offsets[-1] + q)
        slots = []
        for s, c, table in zip(starts, context_lens, block_tables):
            pos = torch.arange(s, c)
            slots.append(slot_ids(torch.tensor(table), pos, block_size))
        decode = [b for b, q in enumerate(query_lens) if q == 1]
        chunks = [[b] for b, q in enumerate(query_lens) if q > 1]
        groups = [cls._group(members, query_lens, context_lens, block_tables, block_size, offsets, device)
                  for members in cls._decode_buckets(decode, context_lens) + chunks]
        positions = torch.cat([torch.arange(s, c) for s, c in zip(starts, context_lens)])
        return cls(positions[None].to(device), torch.cat(slots).to(device), groups)

    @staticmethod
    def _decode_buckets(decode: list[int], context_lens: list[int]) -> list[list[int]]:
        """Split the decoding sequences into groups of similar context length.

        A group's keys are padded to its longest context, and gathering them is
        most of attention's cost. With one group, a 40-token sequence decoding
        beside a 600-token one would copy 600 positions. Sorted longest first,
        a new group starts wherever a context is under half its group's longest:
        padding stays under half of each group, for a few more calls per layer."""
        buckets: list[list[int]] = []
        for b in sorted(decode, key=lambda b: -context_lens[b]):
            if buckets and 2 * context_lens[b] >= context_lens[buckets[-1][0]]:
                buckets[-1].append(b)
            else:
                buckets.append([b])
        return [sorted(bucket) for bucket in buckets]  # flat-row order within a group

    @staticmethod
    def _group(members, query_lens, context_lens, block_tables, block_size, offsets, device) -> AttentionGroup:
        t = query_lens[members[0]]
        S = max(context_lens[b] for b in members)
        width = -(-S // block_size)
        tables = torch.tensor([(block_tables[b] + [0] * width)[:width] for b in members], dtype=torch.long)
        pos = torch.arange(S)
        key_slots = slot_ids(tables, pos, block_size)  # [b, S]
        qpos = torch.stack([torch.arange(context_lens[b] - t, context_lens[b]) for b in members])  # [b, t]
        # Two common cases need no mask tensor, which saves work in every layer:
        # a prompt read from position 0 in one chunk (plain causal attention),
        # and one sequence's decode, which sees every key. A batch of decodes
        # keeps its mask even when all its contexts are equal: so a compiled
        # decode step comes in two kinds only, batch 1 and a batch (model_runner.py).
        is_causal = t > 1 and S == t
        alone = t == 1 and len(members) == 1
        mask = None if is_causal or alone else (pos[None, None, :] <= qpos[:, :, None]).unsqueeze(1)  # [b, 1, t, S]
        index = torch.cat([torch.arange(offsets[b], offsets[b] + t) for b in members])
        return AttentionGroup(index.to(device), key_slots.flatten().to(device),
                              None if mask is None else mask.to(device), len(members), t, S, is_causal)


@dataclass
class DecodeMetadata:
    """One decode step of a fixed batch size P, for compiled steps (model_runner.py).

    Every row adds one token, so attention needs no groups: each row's keys are
    read through its block table up to the longest context in the step, S, and
    a mask hides what lies past a row's own context. Both are worked out once
    per step, before the layers (decode_batch.py). The tensors are views of
    buffers the runner allocated once and fills in place (decode_batch.py): the
    shapes come from a short list and the addresses never move, which is what
    a compiled step, and later a CUDA graph, wants. Rows past the real batch
    are padding: they read and write a block no sequence owns, and nobody
    samples them."""

    positions: torch.Tensor  # [1, P] position of each row's new token
    slot_mapping: torch.Tensor  # [P] pool slot each row's new K/V is written to
    key_slots: torch.Tensor  # [P, S] pool slot of each row's positions 0..S-1, through its block table
    mask: torch.Tensor | None  # [P, 1, 1, S] position < the row's context; None for batch 1, which sees all S


class PagedKVCache:
    """The pool. kv_cache_dtype="auto" stores keys and values in the model's
    dtype; "int8" stores them as int8 with one scale per token and KV head
    (kv_quant.py), about half a bf16 pool's bytes and a quarter of an fp32 one's."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype, device,
                 kv_cache_dtype: str = "auto"):
        check_choice("kv_cache_dtype", kv_cache_dtype, KV_CACHE_DTYPES)
        shape = (config.num_hidden_layers, num_blocks * block_size, config.num_key_value_heads, config.head_dim)
        self.quantized = kv_cache_dtype == "int8"
        self.dtype = dtype  # what attention computes in: int8 values are turned back into it as they are read
        # Zeros, not empty: masked-out slots are still multiplied by 0 in attention,
        # and uninitialised memory could hold NaN bit patterns (NaN * 0 = NaN).
        store = torch.int8 if self.quantized else dtype
        self.k = torch.zeros(shape, dtype=store, device=device)
        self.v = torch.zeros(shape, dtype=store, device=device)
        # One [slots, Hkv, D] view per layer, made once: attention runs every step.
        self.k_layers, self.v_layers = self.k.unbind(0), self.v.unbind(0)
        self.tensors = [self.k, self.v]  # everything a block holds: copied and swapped together
        if self.quantized:  # one scale per slot and KV head: [layers, slots, Hkv, 1]
            self.k_scale = torch.zeros(shape[:3] + (1,), dtype=SCALE_DTYPE, device=device)
            self.v_scale = torch.zeros(shape[:3] + (1,), dtype=SCALE_DTYPE, device=device)
            self.k_scale_layers, self.v_scale_layers = self.k_scale.unbind(0), self.v_scale.unbind(0)
            self.tensors += [self.k_scale, self.v_scale]
        self.num_blocks, self.block_size = num_blocks, block_size

    def nbytes(self) -> int:
        """The pool's bytes, scales included."""
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate block src into block dst in every layer."""
        bs = self.block_size
        for src, dst in copies:
            for t in self.tensors:
                t[:, dst * bs : (dst + 1) * bs] = t[:, src * bs : (src + 1) * bs]

    def _slots(self, block_table: list[int], num_tokens: int) -> torch.Tensor:
        pos = torch.arange(num_tokens)
        table = torch.tensor(block_table, dtype=torch.long)
        return slot_ids(table, pos, self.block_size).to(self.k.device)

    def swap_out(self, block_table: list[int], num_tokens: int) -> tuple[torch.Tensor, ...]:
        """Copy a sequence's first num_tokens keys and values (and their scales,
        in int8) to host memory, as they are stored: no de-quantizing."""
        slots = self._slots(block_table, num_tokens)
        pin = self.k.device.type == "cuda"  # page-locked memory copies back faster
        return tuple(t[:, slots].to("cpu").pin_memory() if pin else t[:, slots].clone() for t in self.tensors)

    def swap_in(self, block_table: list[int], kv: tuple[torch.Tensor, ...]) -> None:
        """Write keys and values saved by swap_out into a sequence's new blocks."""
        slots = self._slots(block_table, kv[0].shape[1])
        for t, saved in zip(self.tensors, kv, strict=True):
            t[:, slots] = saved.to(t.device, non_blocking=True)

    def _write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the new tokens' keys and values, k and v [N, Hkv, D], in their
        slots (int8: quantized on the way in). index_copy_ and index_select do
        what `pool[slots] = x` and `pool[slots]` do, with one fast row copy per
        slot instead of general advanced indexing: 3-4x faster on CPU."""
        if self.quantized:
            k, k_scale = quantize_per_head(k)
            v, v_scale = quantize_per_head(v)
            self.k_scale_layers[layer].index_copy_(0, slots, k_scale)
            self.v_scale_layers[layer].index_copy_(0, slots, v_scale)
        self.k_layers[layer].index_copy_(0, slots, k)
        self.v_layers[layer].index_copy_(0, slots, v)

    def _read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of these slots, [len(slots), Hkv, D], in the
        model's dtype. Attention reads the pool through the block tables and
        takes the stored numbers as they are, with one exception: an int8 pool
        must be de-quantized before attention can use it, so its rows become a
        new tensor in the model's dtype (int8 x scale), made in every layer at
        every step and dropped after it. (This PyTorch version copies the rows
        out of the pool in any case, index_select; a fused kernel such as
        vLLM's would de-quantize in registers, never writing that copy out.)"""
        keys = self.k_layers[layer].index_select(0, slots)
        values = self.v_layers[layer].index_select(0, slots)
        if not self.quantized:
            return keys, values
        return (dequantize(keys, self.k_scale_layers[layer].index_select(0, slots), self.dtype),
                dequantize(values, self.v_scale_layers[layer].index_select(0, slots), self.dtype))

    def visible_length(self, positions: torch.Tensor) -> int:
        """model.KVCacheLike asks for it when a caller passes no metadata; a paged
        step cannot be described by positions alone."""
        raise ValueError("meta is required with a PagedKVCache: pass PagedAttentionMetadata.build(...) "
                         "(its block tables say where each sequence's keys live)")

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               meta: PagedAttentionMetadata) -> torch.Tensor:
        """q [1, N, H, D], k and v [1, N, Hkv, D] for the N packed tokens.
        Returns [1, N, H*D]."""
        if isinstance(meta, DecodeMetadata):
            return self._attend_decode(layer, q, k, v, meta)
        # 1. write the new keys and values into their slots (the gathers of
        # step 2 are most of attention's cost here)
        self._write(layer, meta.slot_mapping, k[0], v[0])
        N, H, D = q.shape[1], q.shape[2], q.shape[3]
        Hkv = k.shape[2]
        single = len(meta.groups) == 1  # one group covers all N tokens, in flat-row order
        out = None if single else q.new_empty(N, H * D)
        for g in meta.groups:
            b, t, S = g.num_seqs, g.query_len, g.num_keys
            # 2. read the group's keys and values through the block tables
            keys, values = self._read(layer, g.key_slots)
            keys = keys.view(b, S, Hkv, D).transpose(1, 2)  # [b, Hkv, S, D]
            values = values.view(b, S, Hkv, D).transpose(1, 2)
            # 3. the group's queries, [b, t, H, D]
            queries = (q[0] if single else q[0].index_select(0, g.token_index)).view(b, t, H, D)
            if t == 1:
                # Decodes: fold each K/V head's group of query heads into rows of
                # queries, [b, Hkv, H/Hkv, D]. SDPA then reads every key once per
                # K/V head rather than once per query head (about 1.6x faster here
                # than enable_gqa). Rows of one sequence share its mask.
                o = F.scaled_dot_product_attention(queries.view(b, Hkv, H // Hkv, D), keys, values,
                                                   attn_mask=g.mask)
            else:
                o = F.scaled_dot_product_attention(queries.transpose(1, 2), keys, values, attn_mask=g.mask,
                                                   is_causal=g.is_causal, enable_gqa=True).transpose(1, 2)
            o = o.reshape(b * t, H * D)  # flat order within the group
            if single:
                return o[None]
            out.index_copy_(0, g.token_index, o)
        return out[None]

    def _attend_decode(self, layer: int, q, k, v, meta: DecodeMetadata) -> torch.Tensor:
        """attend() for a fixed-size decode step: one query per row, one call
        for the whole batch whatever its contexts. (The groups above save the
        gather of a short context beside a long one; a compiled step wants one
        shape instead, and pays for reading every row up to the longest.)"""
        P, H, D = q.shape[1], q.shape[2], q.shape[3]
        Hkv, S = k.shape[2], meta.key_slots.shape[1]
        self._write(layer, meta.slot_mapping, k[0], v[0])
        keys, values = self._read(layer, meta.key_slots.flatten())
        keys = keys.view(P, S, Hkv, D).transpose(1, 2)  # [P, Hkv, S, D]
        values = values.view(P, S, Hkv, D).transpose(1, 2)
        o = F.scaled_dot_product_attention(q[0].view(P, Hkv, H // Hkv, D), keys, values, attn_mask=meta.mask)
        return o.reshape(P, H * D)[None]
