"""Lab 2 (attention): checks for rotary position embeddings (against the
engine's rope tables), causal grouped-query attention and its tiled form with
an online softmax (both against PyTorch's fused kernel), on hand-sized and
random inputs. Each refuses the course's own answers; the tiled one also
refuses code that builds the whole score matrix. The first two keep a passing
function for later labs (my_engine.py)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from torch.overrides import TorchFunctionMode

from tinyinfer.config import ModelConfig
from tinyinfer.kv_cache import KVCache
from tinyinfer.model import LlamaForCausalLM, apply_rope, apply_rope_signed, rope_tables
from tinyinfer.paged_kv_cache import PagedKVCache
from .core import Case, first_difference, run_check
from .registry import Lab

# Random inputs are N(0, 1); a correct fp32 answer lands within ~1e-6 of the
# engine's, a wrong one is off by O(0.1) or more. The slack covers correct code
# that computes the angles or the softmax in a different (equally valid) order.
ATOL = RTOL = 1e-4


def _close(got, expected, atol=ATOL) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == expected.shape
            and torch.allclose(got.float(), expected, atol=atol, rtol=RTOL))


def _where(got, expected, row: str = "query") -> str | None:
    """The first [batch, head, row, element] where got and expected differ."""
    return first_difference(got, expected, ("batch", "head", row, "element"), ATOL, RTOL)


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


class _ChangedInput:
    """What the rope check reports when the learner's function wrote into its input
    (lab 2's next cells rotate the same q twice, and a layer's k is read again)."""

    def __init__(self, name: str, before: torch.Tensor, after: torch.Tensor):
        self.name, self.before, self.after = name, before, after

    def __repr__(self):
        return f"<{self.name} changed in place by the call: it is now {self.after!r}>"


def _rope_runner(rope):
    """Call rope on copies of x and positions; report a change to either instead of the result."""
    def run(x, positions, theta):
        mine, pos = x.clone(), positions.clone()
        out = rope(mine, pos, theta)
        for name, before, after in (("x", x, mine), ("positions", positions, pos)):
            if not torch.equal(before, after):
                return _ChangedInput(name, before, after)
        return out
    return run


def _same_rope(got, expected) -> bool:
    return isinstance(got, torch.Tensor) and got.dtype == expected.dtype and _close(got, expected)


def _where_rope(got, expected) -> str | None:
    if isinstance(got, _ChangedInput):
        diff = first_difference(got.after, got.before, ("batch", "head", "token", "element"), ATOL, RTOL)
        return (f"the input {got.name} differs after the call ({diff or 'exactly equal in value, not in bits'}): "
                "rope must return a new tensor and leave its input as it was")
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and got.dtype != expected.dtype:
        return (f"the dtype differs: x is {expected.dtype}, the result {got.dtype}; keep x's dtype "
                "(the model's next layers take only that one)")
    return _where(got, expected, "token")


def check_rope(rope) -> bool:
    """rope(x [B, heads, T, D], positions [T], theta) -> x rotated, [B, heads, T, D],
    in x's dtype, against the engine's rope_tables + apply_rope; x and positions
    must come back unchanged."""
    forbidden = (reference_rope, apply_rope, apply_rope_signed, rope_tables, LlamaForCausalLM.rope_at)
    return run_check("rope", _rope_runner(rope), _rope_cases, same=_same_rope, forbidden=forbidden,
                     keep=("rope", rope), explain=_where_rope)


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
                     forbidden=forbidden, keep=("attention", causal_gqa_attention), explain=_where)


# ------------------------------------------------------------------ tiled attention (online softmax)


def reference_tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: int) -> torch.Tensor:
    """The course's answer to lab 2's tiled-attention exercise: keys and values
    `tile` at a time, with a running max, a running sum and a running output per query."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    Tq, Tk = q.shape[2], k.shape[2]
    q = q / math.sqrt(q.shape[-1])
    query_pos = torch.arange(Tk - Tq, Tk, device=q.device)[:, None]  # [Tq, 1]
    m = torch.full((*q.shape[:-1], 1), float("-inf"), device=q.device)  # the largest score so far
    l = torch.zeros_like(m)  # the sum of exp(score - m) so far
    acc = torch.zeros_like(q)  # the sum of exp(score - m) * value so far
    for start in range(0, Tk, tile):
        kt, vt = k[:, :, start : start + tile], v[:, :, start : start + tile]
        scores = q @ kt.transpose(-1, -2)  # [B, H, Tq, tile]: one tile of the score matrix
        key_pos = torch.arange(start, start + kt.shape[2], device=q.device)[None, :]
        scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
        m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))  # finite: key 0 is in the first tile
        p = (scores - m_new).exp()
        rescale = (m - m_new).exp()  # what the old sums were measured against, now too small a max
        l = l * rescale + p.sum(dim=-1, keepdim=True)
        acc = acc * rescale + p @ vt
        m = m_new
    return acc / l


class _ScoreMatrixWatch(TorchFunctionMode):
    """Notes any tensor a computation makes whose last two dimensions are (Tq, Tk),
    floating-point or one byte per element: the whole score matrix (or its
    softmax), or a boolean mask as large as it, which tiling exists to avoid."""

    def __init__(self, tq: int, tk: int):
        super().__init__()
        self.shape, self.seen, self.dtype = (tq, tk), None, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (self.seen is None and isinstance(out, torch.Tensor) and tuple(out.shape[-2:]) == self.shape
                and (out.is_floating_point() or out.element_size() == 1)):
            self.seen, self.dtype = tuple(out.shape), out.dtype
        return out


class WholeScoreMatrix:
    """What the check reports instead of a result when the code built the whole matrix."""

    def __init__(self, shape, dtype=None):
        self.shape, self.dtype = shape, dtype

    def __repr__(self):
        if self.dtype is not None and not self.dtype.is_floating_point:
            return (f"a {str(self.dtype).removeprefix('torch.')} tensor of shape {list(self.shape)} along the way: "
                    "a mask the size of the whole score matrix, queries x keys. Tiled attention must only ever "
                    "hold one tile of it, [..., Tq, tile]: compare positions tile by tile")
        return (f"a tensor of shape {list(self.shape)} along the way: the whole score matrix, queries x keys. "
                "Tiled attention must only ever hold one tile of it, [..., Tq, tile]")


def _tiled_runner(tiled_attention):
    def run(q, k, v, tile):
        Tq, Tk = q.shape[2], k.shape[2]
        with _ScoreMatrixWatch(Tq, Tk) as spy:
            out = tiled_attention(q, k, v, tile)
        return WholeScoreMatrix(spy.seen, spy.dtype) if spy.seen and tile < Tk else out
    return run


def _tiled_cases() -> list[Case]:
    shapes = [  # (B, H, Hkv, Tq, Tk, D, tile, scale of q, what the case is for)
        (1, 1, 1, 3, 3, 2, 1, 1.0, "one head, T=3, tiles of 1 key"),
        (1, 2, 1, 5, 12, 8, 4, 1.0, "5 queries over 12 keys, tiles of 4: the mask cuts through a tile"),
        (2, 4, 2, 6, 6, 16, 4, 1.0, "grouped-query, a last tile of 2 keys"),
        (1, 9, 3, 7, 7, 64, 3, 1.0, "SmolLM2's heads, tiles of 3"),
        (1, 4, 1, 1, 13, 16, 5, 1.0, "a decode step: one query over 13 keys, tiles of 5"),
        (1, 2, 2, 5, 9, 16, 64, 1.0, "a tile larger than all the keys: one tile"),
        (1, 2, 1, 6, 10, 16, 2, 30.0, "large scores (q x 30): exp overflows without subtracting the max"),
        (1, 2, 1, 6, 10, 16, 3, 1.0, "the largest score of each row arrives in a late tile"),
    ]
    cases = []
    for seed, (b, h, hkv, tq, tk, d, tile, scale, name) in enumerate(shapes):
        q = _randn(b, h, tq, d, seed=40 + 3 * seed) * scale
        k, v = _randn(b, hkv, tk, d, seed=41 + 3 * seed), _randn(b, hkv, tk, d, seed=42 + 3 * seed)
        if name.startswith("the largest score"):  # the last key points where the last queries do
            k[:, :, -1] = 3.0 * q[:, :: h // hkv, -1]
        scaled = " x 30" if scale != 1 else ""
        show = f"q=randn{tuple(q.shape)}{scaled}, k, v=randn{tuple(k.shape)}, tile={tile}  ({name})"
        cases.append(Case((q, k, v, tile), _sdpa_attention(q, k, v), show))
    return cases + _extreme_tiled_cases()


def _signed_scores(signs: list[list[int]], tk: int, d: int, size: float, seed: int):
    """q [1, H, Tq, D] and k, v [1, 1, Tk, D] whose scores q·k/sqrt(D) sit near
    signs[h][i] * size, a few units apart within a row (so the softmax still has
    work to do): every key is ones(D) plus noise, every query a multiple of it."""
    g = torch.Generator().manual_seed(seed)
    h, tq = len(signs), len(signs[0])
    ones = torch.ones(d)
    k = ones + 0.3 * torch.randn(1, 1, tk, d, generator=g)
    sign = torch.tensor(signs, dtype=torch.float32)[None, :, :, None]  # [1, H, Tq, 1]
    q = sign * size / math.sqrt(d) * ones + torch.randn(1, h, tq, d, generator=g)
    return q, k, torch.randn(1, 1, tk, d, generator=g)


def _extreme_tiled_cases() -> list[Case]:
    """Scores as large, as negative and as far apart as real activations make
    them, where a running maximum handled wrongly overflows or underflows exp:
    each row's max must be its own, start at -inf and move with every tile."""
    cases = []
    q, k, v = _signed_scores([[-1] * 6] * 4, 12, 16, 120.0, seed=70)
    cases.append(Case((q, k, v, 4), _sdpa_attention(q, k, v),
                      f"q {tuple(q.shape)}, k, v {tuple(k.shape)}, tile=4  (every score near -120, so "
                      "exp(score) is 0 in float32)"))
    signs = [[1 if (h + i) % 2 == 0 else -1 for i in range(6)] for h in range(4)]
    q, k, v = _signed_scores(signs, 12, 16, 100.0, seed=71)
    cases.append(Case((q, k, v, 4), _sdpa_attention(q, k, v),
                      f"q {tuple(q.shape)}, k, v {tuple(k.shape)}, tile=4  (heads and rows far apart: scores near "
                      "+100 and -100 side by side, so each row needs a max of its own, not one per head or per tile)"))
    q, k, v = _signed_scores([[1] * 4] * 2, 10, 16, 10.0, seed=72)
    k[:, :, -1] = 25.0  # the last key: a score near 250 with every query, but only the last query may see it
    cases.append(Case((q, k, v, 4), _sdpa_attention(q, k, v),
                      f"q {tuple(q.shape)}, k, v {tuple(k.shape)}, tile=4  (scores near 10, but the last key scores "
                      "about 250 with every query and only the last query may see it: a max taken before the mask "
                      "is 240 too high for the others)"))
    return cases


def _where_tiled(got, expected) -> str | None:
    """Where the output is NaN or infinite (the rows: batch, head, query), then
    the first difference. Where, not why: the same NaN comes from a running max
    started at 0, an inf x 0 in a merge, a 0 / 0 in the last division."""
    where = _where(got, expected)
    if not (isinstance(got, torch.Tensor) and got.shape == expected.shape and got.is_floating_point()):
        return where
    bad = ~torch.isfinite(got.detach())
    if not bool(bad.any()):
        return where
    rows = [tuple(int(i) for i in r) for r in torch.nonzero(bad.any(-1))]
    what = "NaN" if bool(torch.isnan(got).any()) else "inf"
    shown = ", ".join(f"head {h} query {i}" + (f" (batch {b})" if got.shape[0] > 1 else "") for b, h, i in rows[:4])
    more = f" and {len(rows) - 4} more" if len(rows) > 4 else ""
    return (f"{what} in {int(bad.sum())} of {bad.numel()} output values, in {len(rows)} of {bad[..., 0].numel()} "
            f"rows: {shown}{more}\n    {where}")


def check_tiled_attention(tiled_attention) -> bool:
    """tiled_attention(q [B, H, Tq, D], k [B, Hkv, Tk, D], v, tile) -> [B, H, Tq, D],
    causal with the queries the last Tq positions, reading keys and values `tile`
    at a time with an online softmax; against torch's scaled_dot_product_attention.
    Building the whole [Tq, Tk] score matrix, calling that kernel, or the course's
    answers, is refused."""
    forbidden = (F.scaled_dot_product_attention, reference_tiled_attention, reference_causal_gqa_attention,
                 KVCache.attend, PagedKVCache.attend)
    return run_check("tiled_attention", _tiled_runner(tiled_attention), _tiled_cases, same=_close,
                     forbidden=forbidden, explain=_where_tiled)


LAB = Lab(2, "attention",
          exports=("check_rope", "check_causal_gqa_attention", "check_tiled_attention", "reference_rope",
                   "reference_causal_gqa_attention", "reference_tiled_attention"),
          pieces={"rope": "reference_rope", "attention": "reference_causal_gqa_attention"},
          fallbacks={"check_rope": reference_rope, "check_causal_gqa_attention": reference_causal_gqa_attention,
                     "check_tiled_attention": reference_tiled_attention})
