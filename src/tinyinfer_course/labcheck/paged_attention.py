"""Lab 11 (your engine): the checks of paged attention, per request and with the
decodes grouped (capstone.py has the checks of the forward pass and of the
assembled engine).

Paged attention is the one piece lab 11 adds: the step's new keys and values
go into a shared pool of slots, at the slots that each sequence's block table
gives, and each sequence's queries then attend over its own keys, gathered
from the pool through the same table. The check compares it with tinyinfer's
PagedKVCache.attend on the same packed step (decodes and prompt chunks mixed,
blocks scattered through the pool): the outputs, and the pool afterwards.
"""
from __future__ import annotations

import math
from itertools import accumulate

import torch
import torch.nn.functional as F

from tinyinfer.config import ModelConfig
from tinyinfer.paged_kv_cache import PagedAttentionMetadata, PagedKVCache
from .attention import reference_causal_gqa_attention
from .core import Case, first_difference, run_check
from .registry import Lab


def reference_paged_attention(q, k, v, k_pool, v_pool, batch, block_size, attention):
    """The course's answer to lab 11's paged_attention exercise."""
    out, start = [], 0
    for num_new, context_len, block_table in batch:
        positions = torch.arange(context_len)
        slots = torch.tensor(block_table)[positions // block_size] * block_size + positions % block_size
        new = slots[context_len - num_new :]  # this step's tokens are the sequence's last ones
        k_pool[new], v_pool[new] = k[start : start + num_new], v[start : start + num_new]
        keys = k_pool[slots].transpose(0, 1)[None]  # [1, Hkv, context_len, D]
        values = v_pool[slots].transpose(0, 1)[None]
        queries = q[start : start + num_new].transpose(0, 1)[None]  # [1, H, num_new, D]
        out.append(attention(queries, keys, values)[0].transpose(0, 1))  # [num_new, H, D]
        start += num_new
    return torch.cat(out)


# (num_new, context_len) per sequence, block size, blocks in the pool, what the case is for
_STEPS = [
    ([(1, 5)], 4, 8, "one decode step: the 5th token of a sequence whose first 4 are cached"),
    ([(6, 6)], 4, 8, "one prompt read whole from position 0"),
    ([(1, 9), (1, 3), (1, 4)], 4, 12, "three decodes of different lengths (one at a block's first slot)"),
    ([(3, 7), (1, 12)], 4, 12, "a prompt chunk that continues a cached start, beside a decode"),
    ([(1, 2), (5, 5), (1, 17), (2, 10)], 2, 32, "decodes and chunks mixed, blocks of 2"),
]


def _step(rows, block_size, num_blocks, seed):
    """Random q/k/v for the new tokens, a pool already holding every earlier
    position, and block tables scattered through the pool (seeded)."""
    g = torch.Generator().manual_seed(seed)
    H, Hkv, D = 4, 2, 8
    order = torch.randperm(num_blocks, generator=g).tolist()  # blocks handed out in a scrambled order
    batch = []
    for num_new, context_len in rows:
        need = -(-context_len // block_size)
        batch.append((num_new, context_len, [order.pop() for _ in range(need)]))
    n = sum(r[0] for r in rows)
    q, k, v = (torch.randn(n, h, D, generator=g) for h in (H, Hkv, Hkv))
    pools = [torch.randn(num_blocks * block_size, Hkv, D, generator=g) for _ in range(2)]
    return q, k, v, pools[0], pools[1], batch


def _engine(q, k, v, k_pool, v_pool, batch, block_size):
    """tinyinfer's PagedKVCache.attend on the same step: [N, H, D] and the pools."""
    H, Hkv, D = q.shape[1], k.shape[1], q.shape[2]
    config = ModelConfig(vocab_size=8, hidden_size=H * D, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=H, num_key_value_heads=Hkv, head_dim=D, max_position_embeddings=64)
    cache = PagedKVCache(config, k_pool.shape[0] // block_size, block_size, torch.float32, "cpu")
    cache.k[0].copy_(k_pool)
    cache.v[0].copy_(v_pool)
    meta = PagedAttentionMetadata.build([b[0] for b in batch], [b[1] for b in batch], [b[2] for b in batch],
                                        block_size, "cpu")
    out = cache.attend(0, q[None], k[None], v[None], meta)[0].view(q.shape)
    return out, cache.k[0].clone(), cache.v[0].clone()


class _Result:
    def __init__(self, out, k_pool, v_pool):
        self.out, self.k_pool, self.v_pool = out, k_pool, v_pool

    def __repr__(self):
        if not isinstance(self.out, torch.Tensor):
            return f"a {type(self.out).__name__}, not a tensor"
        first = [round(x, 3) for x in self.out.flatten()[:3].tolist()]
        return (f"output {tuple(self.out.shape)} starting {first}; after the call the pools sum to "
                f"k {self.k_pool.sum():.3f}, v {self.v_pool.sum():.3f} (the new keys and values written?)")


def _where(got, expected) -> str | None:
    """The first request, token and head whose output differs (requests in the
    batch's order), else the first pool slot: what a human needs to find the bug."""
    if not isinstance(got, _Result) or not isinstance(got.out, torch.Tensor) or got.out.shape != expected.out.shape:
        return None
    bad = ~torch.isclose(got.out.double(), expected.out.double(), atol=1e-5, rtol=0) | got.out.isnan()
    rows = torch.nonzero(bad.any(-1))  # [token row, head] pairs, in order
    if len(rows):
        row, head = (int(x) for x in rows[0])
        batch = getattr(expected, "batch", None) or [(expected.out.shape[0], None, None)]
        start = 0
        for b, (num_new, context_len, _) in enumerate(batch):
            if row < start + num_new:
                break
            start += num_new
        d = int(torch.nonzero(bad[row, head])[0])
        which = f"request {b} (num_new={num_new}, context_len={context_len}), its new token {row - start}"
        return (f"first difference in the output at {which}, head {head}, element {d}: expected "
                f"{float(expected.out[row, head, d])!r}, got {float(got.out[row, head, d])!r} "
                f"({int(bad.any(-1).sum())} of {bad.shape[0] * bad.shape[1]} (token, head) pairs differ)")
    for name, mine, theirs in (("k_pool", got.k_pool, expected.k_pool), ("v_pool", got.v_pool, expected.v_pool)):
        diff = first_difference(mine, theirs, ("slot", "K/V head", "element"), atol=1e-8, rtol=1e-5)
        if diff:
            return f"the output is right, but {name}: {diff}"
    attention_calls = getattr(expected, "attention_calls", None)
    if attention_calls is not None and getattr(got, "attention_calls", None) != attention_calls:
        return f"{got.attention_calls} call(s) to attention, expected {attention_calls} (one per prompt chunk)"
    return None


def _same(got, expected) -> bool:
    return (isinstance(got, _Result) and isinstance(got.out, torch.Tensor)
            and got.out.shape == expected.out.shape
            and torch.allclose(got.out, expected.out, atol=1e-5)
            and torch.allclose(got.k_pool, expected.k_pool) and torch.allclose(got.v_pool, expected.v_pool))


def _cases() -> list[Case]:
    cases = []
    for seed, (rows, block_size, num_blocks, why) in enumerate(_STEPS):
        q, k, v, k_pool, v_pool, batch = _step(rows, block_size, num_blocks, seed)
        expected = _Result(*_engine(q, k, v, k_pool, v_pool, batch, block_size))
        expected.batch = batch
        show = (f"{why}: batch (num_new, context_len, block_table) = {batch}, block_size={block_size}; "
                f"q {tuple(q.shape)}, k/v {tuple(k.shape)}, pools {tuple(k_pool.shape)}")
        cases.append(Case((q, k, v, k_pool, v_pool, batch, block_size), expected, show))
    return cases


def check_paged_attention(paged_attention) -> bool:
    """paged_attention(q, k, v, k_pool, v_pool, batch, block_size, attention) ->
    [N, H, D], writing the new keys and values into the pools, against
    tinyinfer's PagedKVCache.attend; the pools must match afterwards too."""
    def run(q, k, v, k_pool, v_pool, batch, block_size):
        k_pool, v_pool = k_pool.clone(), v_pool.clone()  # the case's own copies stay untouched
        # The course's attention, not the learner's lab-2 one: a lab-2 mistake must not fail lab 11.
        out = paged_attention(q.clone(), k.clone(), v.clone(), k_pool, v_pool,
                              [(n, c, list(t)) for n, c, t in batch], block_size, reference_causal_gqa_attention)
        return _Result(out, k_pool, v_pool)

    return run_check("paged_attention", run, _cases, same=_same,
                     forbidden=(reference_paged_attention, PagedKVCache, F.scaled_dot_product_attention),
                     keep=("paged_attention", paged_attention), explain=_where)


# ---------------------------------------------------------------- grouped decodes


def reference_grouped_paged_attention(q, k, v, k_pool, v_pool, batch, block_size, attention):
    """The course's answer to lab 11's grouped paged attention exercise."""
    H, Hkv, D = q.shape[1], k.shape[1], q.shape[2]
    starts = [0, *accumulate(n for n, _, _ in batch)]  # each request's first row
    decodes = [b for b, (n, _, _) in enumerate(batch) if n == 1]
    new = torch.empty(q.shape[0], dtype=torch.long)  # the slot of every new token, in the row's order
    if decodes:  # one block table for all decodes, the shorter ones padded with their last block
        widest = max(len(batch[b][2]) for b in decodes)
        tables = torch.tensor([batch[b][2] + batch[b][2][-1:] * (widest - len(batch[b][2])) for b in decodes])
        lens = torch.tensor([batch[b][1] for b in decodes])  # [B]
        pos = torch.arange(int(lens.max()))  # [L]
        slots = tables[:, pos // block_size] * block_size + pos % block_size  # [B, L]
        rows = torch.tensor([starts[b] for b in decodes])
        new[rows] = slots[torch.arange(len(decodes)), lens - 1]  # a decode's new token is its last position
    for b, (n, ctx, table) in enumerate(batch):
        if n > 1:
            p = torch.arange(ctx - n, ctx)
            new[starts[b] : starts[b] + n] = torch.tensor(table)[p // block_size] * block_size + p % block_size
    k_pool.index_copy_(0, new, k)  # every new key and value into its slot: one copy per pool
    v_pool.index_copy_(0, new, v)
    out = torch.empty_like(q)
    for b, (n, ctx, table) in enumerate(batch):  # prompt chunks: one attention call each
        if n > 1:
            p = torch.arange(ctx)
            s = torch.tensor(table)[p // block_size] * block_size + p % block_size
            keys, values = (pool.index_select(0, s).transpose(0, 1)[None] for pool in (k_pool, v_pool))
            out[starts[b] : starts[b] + n] = attention(q[starts[b] : starts[b] + n].transpose(0, 1)[None],
                                                       keys, values)[0].transpose(0, 1)
    if decodes:  # every decode at once
        B, flat = len(decodes), slots.flatten()
        keys = k_pool.index_select(0, flat).view(B, -1, Hkv, D).transpose(1, 2)  # [B, Hkv, L, D]
        values = v_pool.index_select(0, flat).view(B, -1, Hkv, D).transpose(1, 2)
        queries = q[rows].view(B, Hkv, H // Hkv, D)  # query head h reads K/V head h // group
        scores = queries @ keys.transpose(-1, -2) / math.sqrt(D)  # [B, Hkv, group, L]
        scores = scores.masked_fill((pos >= lens[:, None])[:, None, None], float("-inf"))  # the padding
        out[rows] = (scores.softmax(-1) @ values).view(B, H, D)
    return out


# (num_new, context_len) per sequence, block size, blocks in the pool, what the case is for
_GROUPED_STEPS = _STEPS + [
    ([(1, 3), (1, 17), (1, 8), (1, 1), (1, 12)], 4, 24, "five decodes of very different lengths (one its first token)"),
    ([(4, 4), (1, 6), (2, 9), (1, 16), (3, 3)], 4, 24, "three prompt chunks among two decodes"),
]


class _Counted:
    """The attention a check hands the learner, counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, q, k, v):
        self.calls += 1
        return reference_causal_gqa_attention(q, k, v)


class _GroupedResult(_Result):
    def __init__(self, out, k_pool, v_pool, attention_calls):
        super().__init__(out, k_pool, v_pool)
        self.attention_calls = attention_calls

    def __repr__(self):
        return f"{super().__repr__()}; {self.attention_calls} call(s) to attention"


def _grouped_cases() -> list[Case]:
    cases = []
    for seed, (rows, block_size, num_blocks, why) in enumerate(_GROUPED_STEPS):
        q, k, v, k_pool, v_pool, batch = _step(rows, block_size, num_blocks, seed)
        chunks = sum(n > 1 for n, _ in rows)
        expected = _GroupedResult(*_engine(q, k, v, k_pool, v_pool, batch, block_size), chunks)
        expected.batch = batch
        show = (f"{why}: batch (num_new, context_len, block_table) = {batch}, block_size={block_size}; "
                f"q {tuple(q.shape)}, k/v {tuple(k.shape)}, pools {tuple(k_pool.shape)}; attention is for the "
                f"{chunks} prompt chunk(s) only, the decodes are one computation of yours")
        cases.append(Case((q, k, v, k_pool, v_pool, batch, block_size), expected, show))
    return cases


def _same_grouped(got, expected) -> bool:
    return _same(got, expected) and got.attention_calls == expected.attention_calls


def check_grouped_paged_attention(grouped_paged_attention) -> bool:
    """grouped_paged_attention(q, k, v, k_pool, v_pool, batch, block_size,
    attention): paged_attention's contract, against PagedKVCache.attend, with
    `attention` called once per prompt chunk and never for a decode (the decodes
    are one padded, masked computation)."""
    def run(q, k, v, k_pool, v_pool, batch, block_size):
        k_pool, v_pool = k_pool.clone(), v_pool.clone()
        attention = _Counted()
        out = grouped_paged_attention(q.clone(), k.clone(), v.clone(), k_pool, v_pool,
                                      [(n, c, list(t)) for n, c, t in batch], block_size, attention)
        return _GroupedResult(out, k_pool, v_pool, attention.calls)

    return run_check("grouped_paged_attention", run, _grouped_cases, same=_same_grouped,
                     forbidden=(reference_grouped_paged_attention, reference_paged_attention, PagedKVCache,
                                F.scaled_dot_product_attention),
                     keep=("grouped_paged_attention", grouped_paged_attention), explain=_where)


LAB = Lab(11, "your engine",
          exports=("check_paged_attention", "reference_paged_attention", "check_grouped_paged_attention",
                   "reference_grouped_paged_attention"),
          pieces={"paged_attention": "reference_paged_attention",
                  "grouped_paged_attention": "reference_grouped_paged_attention"},
          fallbacks={"check_paged_attention": reference_paged_attention,
                     "check_grouped_paged_attention": reference_grouped_paged_attention})
