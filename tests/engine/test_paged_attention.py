"""Paged attention against plain attention, on random tensors (no model).

PagedKVCache.attend packs a step's tokens into one row and runs attention in
groups (decodes bucketed by context length, each prompt chunk alone, GQA heads
folded for decodes). Whatever the grouping, every token's output must equal
causal attention over its own sequence's keys and values."""
import math
import random

import pytest
import torch

from tinyinfer.config import ModelConfig
from tinyinfer.paged_kv_cache import PagedAttentionMetadata, PagedKVCache

H, HKV, D, BS = 6, 2, 8, 4


def small_config():
    return ModelConfig(vocab_size=16, hidden_size=H * D, intermediate_size=8, num_hidden_layers=1,
                       num_attention_heads=H, num_key_value_heads=HKV, head_dim=D,
                       max_position_embeddings=64)


def reference(q, k, v):
    """q [H, t, D] at the last t of S positions; k, v [HKV, S, D]. Returns [t, H*D]."""
    t, S = q.shape[1], k.shape[1]
    k, v = k.repeat_interleave(H // HKV, 0), v.repeat_interleave(H // HKV, 0)
    scores = q @ k.transpose(1, 2) / math.sqrt(D)  # [H, t, S]
    future = torch.arange(S)[None, :] > torch.arange(S - t, S)[:, None]
    out = scores.masked_fill(future, float("-inf")).softmax(-1) @ v  # [H, t, D]
    return out.transpose(0, 1).reshape(t, H * D)


def run_step(steps, seed=0):
    """steps: one (context_len, query_len) per sequence. Fills each sequence's
    earlier positions, then attends its query_len new tokens in one packed step."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    need = [-(-c // BS) for c, _ in steps]
    cache = PagedKVCache(small_config(), sum(need) + 3, BS, torch.float32, "cpu")
    free = list(range(cache.num_blocks))
    rng.shuffle(free)  # scattered blocks, as after a while of serving
    tables = [[free.pop() for _ in range(n)] for n in need]
    ks = [torch.randn(HKV, c, D) for c, _ in steps]
    vs = [torch.randn(HKV, c, D) for c, _ in steps]
    for (c, t), table, k, v in zip(steps, tables, ks, vs):  # earlier positions are cached already
        slots = cache._slots(table, c)[: c - t]
        cache.k[0][slots] = k[:, : c - t].transpose(0, 1)
        cache.v[0][slots] = v[:, : c - t].transpose(0, 1)
    meta = PagedAttentionMetadata.build([t for _, t in steps], [c for c, _ in steps], tables, BS, "cpu")
    qs = [torch.randn(H, t, D) for _, t in steps]
    # attend takes token-major tensors, [1, N, heads, D]
    new_k = torch.cat([k[:, c - t:] for (c, t), k in zip(steps, ks)], 1).transpose(0, 1)[None]
    new_v = torch.cat([v[:, c - t:] for (c, t), v in zip(steps, vs)], 1).transpose(0, 1)[None]
    out = cache.attend(0, torch.cat(qs, 1).transpose(0, 1)[None], new_k, new_v, meta)[0]
    want = torch.cat([reference(q, k, v) for q, k, v in zip(qs, ks, vs)])
    return out, want, meta


CASES = {
    "batch-1 decode": [(13, 1)],
    "one bucket, flat order not sorted by length": [(9, 1), (14, 1), (11, 1)],
    "decodes in several buckets": [(3, 1), (40, 1), (17, 1), (6, 1), (33, 1)],
    "prompt from position 0": [(10, 10)],
    "chunk after a cached prefix": [(12, 5)],
    "mixed step": [(30, 1), (7, 7), (5, 1), (21, 4), (18, 1)],
}


@pytest.mark.parametrize("steps", CASES.values(), ids=CASES.keys())
def test_paged_attention_equals_plain_attention(steps):
    out, want, _ = run_step(steps)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_decodes_are_bucketed_by_context_length():
    # Longest first: 40 and 33 share a group (33 >= 40 / 2); 17 starts one; 6 and 3 share one.
    _, _, meta = run_step([(3, 1), (40, 1), (17, 1), (6, 1), (33, 1)])
    assert sorted((g.num_keys, g.num_seqs) for g in meta.groups) == [(6, 2), (17, 1), (40, 2)]


def test_one_decode_and_fresh_prompts_need_no_mask():
    _, _, meta = run_step([(13, 1)])
    assert meta.groups[0].mask is None
    _, _, meta = run_step([(13, 1), (13, 1)])  # a batch keeps its mask, all True: one compiled kind
    assert meta.groups[0].mask is not None and bool(meta.groups[0].mask.all())
    _, _, meta = run_step([(10, 10)])
    assert meta.groups[0].mask is None and meta.groups[0].is_causal
    _, _, meta = run_step([(12, 5)])
    assert meta.groups[0].mask is not None and not meta.groups[0].is_causal


def test_an_engine_on_a_gpu_keeps_cudnn_attention_out(monkeypatch):
    """Hopper GPUs give bf16 attention to cuDNN first, which builds a plan for
    every new shape (each eager decode step's key length is new): the engine
    turns it off when it starts on a GPU, unless asked to keep it to measure it."""
    import torch

    from tinyinfer.paged_kv_cache import keep_cudnn_attention_out

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        monkeypatch.setenv("TINYINFER_CUDNN_ATTENTION", "1")
        keep_cudnn_attention_out()
        assert torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.delenv("TINYINFER_CUDNN_ATTENTION")
        keep_cudnn_attention_out()
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
