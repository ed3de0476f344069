"""Lab 2 (attention): checks for rotary position embeddings (against the
engine's rope tables) and causal grouped-query attention (against PyTorch's
fused kernel), on hand-sized and random inputs. Both refuse the course's own
answers, and keep a passing function for later labs (my_engine.py)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..kv_cache import KVCache
from ..model import LlamaForCausalLM, apply_rope, rope_tables
from ..paged_kv_cache import PagedKVCache
from .core import Case, run_check
from .registry import Lab

# Random inputs are N(0, 1); a correct fp32 answer lands within ~1e-6 of the
# engine's, a wrong one is off by O(0.1) or more. The slack covers correct code
# that computes the angles or the softmax in a different (equally valid) order.
ATOL = RTOL = 1e-4


def _close(got, expected, atol=ATOL) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == expected.shape
            and torch.allclose(got.float(), expected, atol=atol, rtol=RTOL))


def _randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ RoPE


def _engine_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """The engine's RoPE: its cos/sin tables for a config of this head size,
    read at `positions`, applied by model.apply_rope."""
    d = x.shape[-1]
    config = ModelConfig(vocab_size=1, hidden_size=d, intermediate_size=1, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=d,
                         max_position_embeddings=int(positions.max()) + 1, rope_theta=theta)
    cos, sin = rope_tables(config)
    return apply_rope(x, cos[positions], sin[positions])


def reference_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """The course's answer to lab 2's rope exercise."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device).float() / d)  # [D/2]: one speed per pair
    angles = positions.float()[:, None] * inv_freq[None, :]  # [T, D/2]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]  # dimension i is paired with i + D/2
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def _rope_cases() -> list[Case]:
    shapes = [  # (B, heads, D, positions, theta, what the case is for)
        (1, 1, 8, [0, 1, 2, 3], 1e4, "positions 0..3"),
        (2, 3, 16, [0, 1, 2, 3, 4, 5], 1e4, "a batch, several heads"),
        (1, 9, 64, list(range(100, 107)), 1e5, "SmolLM2's head size and theta, positions 100..106"),
        (2, 3, 64, [17], 1e5, "one token at position 17 (a decode step)"),
        (1, 2, 32, [0, 5, 9, 500], 1e4, "positions that are not consecutive"),
    ]
    # The first cases are small enough to read: x is all ones, so each output
    # pair is (cos a - sin a, sin a + cos a) for that pair's angle a.
    cases = []
    for positions in ([0, 1, 2], [7, 20]):
        ones, pos = torch.ones(1, 1, len(positions), 4), torch.tensor(positions)
        cases.append(Case((ones, pos, 100.0), _engine_rope(ones, pos, 100.0),
                          f"x=ones{tuple(ones.shape)}, positions=tensor({positions}), theta=100.0"))
    for seed, (b, h, d, positions, theta, why) in enumerate(shapes):
        x, pos = _randn(b, h, len(positions), d, seed=seed), torch.tensor(positions)
        show = f"x=randn{tuple(x.shape)}, positions={positions}, theta={theta:g}  ({why})"
        cases.append(Case((x, pos, theta), _engine_rope(x, pos, theta), show))
    return cases


def check_rope(rope) -> bool:
    """rope(x [B, heads, T, D], positions [T], theta) -> x rotated, [B, heads, T, D],
    against the engine's rope_tables + apply_rope."""
    forbidden = (reference_rope, apply_rope, rope_tables, LlamaForCausalLM.rope_at)
    return run_check("rope", rope, _rope_cases, same=_close, forbidden=forbidden, keep=("rope", rope))


# ------------------------------------------------------------------ attention


def reference_causal_gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The course's answer to lab 2's attention exercise."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # query head h reads key/value head h // group
    v = v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, H, Tq, Tk]
    Tq, Tk = q.shape[2], k.shape[2]
    # The queries are the last Tq positions: query i sits at position Tk - Tq + i
    # and may see keys 0 .. Tk - Tq + i, so the mask starts Tk - Tq + 1 columns right.
    future = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).triu(Tk - Tq + 1)
    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return weights @ v


def _sdpa_attention(q, k, v):
    """The expected answer, from PyTorch's fused kernel with an explicit mask:
    True where query i (at position Tk - Tq + i) may see key j."""
    Tq, Tk = q.shape[2], k.shape[2]
    allowed = torch.arange(Tk)[None, :] <= torch.arange(Tk - Tq, Tk)[:, None]  # [Tq, Tk]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)


# A worked example small enough to follow by hand: three tokens, D = 2, one head.
TINY_Q = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
TINY_K = [[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]]
TINY_V = [[1.0, 0.0], [0.0, 10.0], [5.0, 5.0]]


def _attention_cases() -> list[Case]:
    q, k, v = (torch.tensor(m)[None, None] for m in (TINY_Q, TINY_K, TINY_V))
    cases = [Case((q, k, v), _sdpa_attention(q, k, v), f"one head, T=3, D=2: q={TINY_Q}, k={TINY_K}, v={TINY_V}"),
             Case((q[:, :, 2:], k, v), _sdpa_attention(q[:, :, 2:], k, v),
                  f"the same, but only the last query (a decode step: Tq=1, Tk=3): q={TINY_Q[2:]}")]
    shapes = [  # (B, H, Hkv, Tq, Tk, D, name)
        (1, 4, 2, 2, 2, 2, "grouped-query, small: query heads 0, 1 share K/V head 0; heads 2, 3 share head 1"),
        (2, 4, 4, 5, 5, 8, "multi-head: every query head has its own K/V head"),
        (1, 9, 3, 6, 6, 64, "grouped-query, SmolLM2's shape: 9 query heads share 3 K/V heads"),
        (1, 6, 2, 7, 7, 16, "grouped-query: 6 query heads share 2 K/V heads"),
        (1, 4, 1, 5, 5, 16, "multi-query: all query heads share 1 K/V head"),
        (2, 6, 2, 1, 1, 8, "a single token (Tq = Tk = 1)"),
        (1, 9, 3, 1, 12, 64, "a decode step: one query at position 11 over 12 cached keys"),
        (2, 4, 2, 3, 8, 16, "a chunk of 3 new queries (positions 5, 6, 7) over 8 keys"),
        (1, 6, 3, 4, 5, 8, "4 queries over 5 keys: the first query sees keys 0 and 1"),
    ]
    for seed, (b, h, hkv, tq, tk, d, name) in enumerate(shapes):
        q, k, v = _randn(b, h, tq, d, seed=3 * seed), _randn(b, hkv, tk, d, seed=3 * seed + 1), \
            _randn(b, hkv, tk, d, seed=3 * seed + 2)
        show = f"q=randn{tuple(q.shape)}, k, v=randn{tuple(k.shape)}  ({name})"
        cases.append(Case((q, k, v), _sdpa_attention(q, k, v), show))
    return cases


def check_causal_gqa_attention(causal_gqa_attention) -> bool:
    """causal_gqa_attention(q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, D])
    -> [B, H, Tq, D], Tq <= Tk, the queries being the last Tq positions; against
    torch's scaled_dot_product_attention with an explicit mask. Writing it with
    that kernel, or with the course's own answer, is refused."""
    forbidden = (F.scaled_dot_product_attention, reference_causal_gqa_attention, KVCache.attend,
                 PagedKVCache.attend)
    return run_check("causal_gqa_attention", causal_gqa_attention, _attention_cases, same=_close,
                     forbidden=forbidden, keep=("attention", causal_gqa_attention))


LAB = Lab(2, "attention",
          exports=("check_rope", "check_causal_gqa_attention", "reference_rope", "reference_causal_gqa_attention"),
          pieces={"rope": "reference_rope", "attention": "reference_causal_gqa_attention"},
          fallbacks={"check_rope": reference_rope, "check_causal_gqa_attention": reference_causal_gqa_attention})
