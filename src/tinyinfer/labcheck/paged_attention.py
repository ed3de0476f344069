"""Lab 11 (your engine): the check of paged attention (capstone.py has the
check of the assembled engine).

Paged attention is the one piece lab 11 adds: the step's new keys and values
go into a shared pool of slots, at the slots that each sequence's block table
gives, and each sequence's queries then attend over its own keys, gathered
from the pool through the same table. The check compares it with tinyinfer's
PagedKVCache.attend on the same packed step (decodes and prompt chunks mixed,
blocks scattered through the pool): the outputs, and the pool afterwards.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..paged_kv_cache import PagedAttentionMetadata, PagedKVCache
from .attention import reference_causal_gqa_attention
from .core import Case, run_check
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
                     keep=("paged_attention", paged_attention))


LAB = Lab(11, "your engine", exports=("check_paged_attention", "reference_paged_attention"),
          pieces={"paged_attention": "reference_paged_attention"},
          fallbacks={"check_paged_attention": reference_paged_attention})
