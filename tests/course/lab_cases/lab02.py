"""Lab 2 (attention): wrong implementations each check must reject, a correct
implementation written here (independently of labcheck and the engine) that
each must accept, and the course's own answers each must refuse. Collected by
tests/course/test_labs.py."""
import math

import torch
import torch.nn.functional as F

from tinyinfer_course import labcheck
from tinyinfer.config import ModelConfig
from tinyinfer.kv_cache import KVCache
# the engine's tables and rotation, as a learner might call them
from tinyinfer_course.labcheck.attention import _engine_rope
from tinyinfer.kv_cache import AttentionMetadata
from tinyinfer.model import apply_rope


def _angles(positions, d, theta, exponent=2.0):
    inv_freq = 1.0 / theta ** (exponent * torch.arange(0, d // 2).float() / d)
    return positions.float()[:, None] * inv_freq[None, :]


def _rope(x, positions, theta, exponent=2.0, sign=1.0):
    a = _angles(positions, x.shape[-1], theta, exponent)
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    cos, sin = a.cos(), sign * a.sin()
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def _rope_by_complex_numbers(x, positions, theta):
    # Correct, and unlike the course's answer: each pair (a, b) is the complex
    # number a + ib, and a rotation by angle t is a product with e^(it).
    d = x.shape[-1] // 2
    pairs = torch.complex(x[..., :d].double(), x[..., d:].double())
    angles = _angles(positions, 2 * d, theta).double()
    turned = pairs * torch.polar(torch.ones_like(angles), angles)
    return torch.cat([turned.real, turned.imag], dim=-1).to(x.dtype)


def _rope_in_place(x, positions, theta):
    # The right numbers, written back into x: the caller's q or k is rotated too.
    a = _angles(positions, x.shape[-1], theta)
    d = x.shape[-1] // 2
    first, second = x[..., :d] * a.cos() - x[..., d:] * a.sin(), x[..., :d] * a.sin() + x[..., d:] * a.cos()
    x[..., :d], x[..., d:] = first, second
    return x


def _rope_in_place_mul(x, positions, theta):
    # x.mul_(cos).add_(...): in-place arithmetic, the old x kept only in a copy of one half
    a = torch.cat([_angles(positions, x.shape[-1], theta)] * 2, dim=-1)
    d = x.shape[-1] // 2
    rotated = torch.cat([-x[..., d:], x[..., :d]], dim=-1)
    return x.mul_(a.cos()).add_(rotated * a.sin())


def _rope_float64(x, positions, theta):
    # Angles in float64 "for precision": the result is float64, which the model's float32 layers refuse.
    d = x.shape[-1] // 2
    inv_freq = 1.0 / theta ** (torch.arange(0, d, dtype=torch.float64) * 2 / x.shape[-1])
    a = positions.double()[:, None] * inv_freq[None, :]
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()], dim=-1)


def _rope_interleaved(x, positions, theta):
    # GPT-J / original-paper layout: pairs (0, 1), (2, 3), ... instead of (i, i + D/2).
    a = _angles(positions, x.shape[-1], theta)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack([x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()], dim=-1)
    return out.flatten(-2)


def _attention(q, k, v, *, causal=True, scale=True, grouping="interleave", softmax_dim=-1, hide_self=False,
               align="bottom"):
    group = q.shape[1] // k.shape[1]
    if grouping == "interleave":
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    else:  # "tile": head h reads K/V head h % Hkv instead of h // group
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    scores = q @ k.transpose(-1, -2)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    Tq, Tk = q.shape[2], k.shape[2]
    if causal and (align != "square-only" or Tq == Tk):
        # "bottom": query i is at position Tk - Tq + i (right); "top": at position i,
        # as if the queries were the first Tq positions (wrong for a decode step)
        offset = Tk - Tq if align in ("bottom", "square-only") else 0
        hidden = torch.ones(Tq, Tk, dtype=torch.bool).triu(offset + (0 if hide_self else 1))
        scores = scores.masked_fill(hidden, float("-inf"))
    return scores.softmax(dim=softmax_dim) @ v


def _attention_one_query_at_a_time(q, k, v):
    # Correct, and unlike the course's answer: a loop over queries, each reading
    # the keys up to its own position, K/V heads picked by index arithmetic.
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    out = torch.empty_like(q)
    for h in range(H):
        kv = h * Hkv // H  # query head h belongs to K/V head h // (H / Hkv)
        for i in range(Tq):
            seen = Tk - Tq + i + 1  # keys 0 .. its position
            w = torch.einsum("bd,bsd->bs", q[:, h, i], k[:, kv, :seen]) / D ** 0.5
            out[:, h, i] = torch.einsum("bs,bsd->bd", w.softmax(-1), v[:, kv, :seen])
    return out


def _engine_attention(q, k, v):
    # The engine's own attention, reached through its KV cache.
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    config = ModelConfig(vocab_size=1, hidden_size=H * D, intermediate_size=1, num_hidden_layers=1,
                         num_attention_heads=H, num_key_value_heads=Hkv, head_dim=D, max_position_embeddings=Tk)
    cache = KVCache(config, B, Tk, q.dtype, q.device)
    cache.k[0, :, :, : Tk - Tq] = k[:, :, : Tk - Tq]
    cache.v[0, :, :, : Tk - Tq] = v[:, :, : Tk - Tq]
    positions = torch.arange(Tk - Tq, Tk).expand(B, Tq)
    meta = AttentionMetadata.general(positions, cache)
    new_k, new_v = k[:, :, Tk - Tq :].transpose(1, 2), v[:, :, Tk - Tq :].transpose(1, 2)
    out = cache.attend(0, q.transpose(1, 2), new_k, new_v, meta)
    return out.view(B, Tq, H, D).transpose(1, 2)


def _tiles(q, k, v, tile):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    Tq, Tk = q.shape[2], k.shape[2]
    for start in range(0, Tk, tile):
        scores = q @ k[:, :, start : start + tile].transpose(-1, -2) / math.sqrt(q.shape[-1])
        key_pos = torch.arange(start, start + scores.shape[-1])[None, :]
        yield scores.masked_fill(key_pos > torch.arange(Tk - Tq, Tk)[:, None], float("-inf")), \
            v[:, :, start : start + tile]


def _tiled(q, k, v, tile, *, rescale=True, subtract_max=True, last_tile=True, causal_tiles="mask"):
    m = torch.full((*q.shape[:-1], 1), float("-inf"))
    l, acc = torch.zeros_like(m), torch.zeros_like(q)
    tiles = list(_tiles(q, k, v, tile))
    if not last_tile and k.shape[2] % tile:
        tiles = tiles[:-1]  # range(0, Tk - tile + 1, tile): a short last tile is dropped
    for scores, vt in tiles:
        if causal_tiles == "none":  # the mask forgotten inside tiles
            scores = scores.nan_to_num(neginf=0.0)
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True)) if subtract_max else torch.zeros_like(m)
        p = (scores - m_new).exp()
        scale = (m - m_new).exp() if subtract_max else torch.ones_like(m)
        if not rescale:
            scale = torch.ones_like(m)  # the old sums kept as if the max had not moved
        l, acc, m = l * scale + p.sum(-1, keepdim=True), acc * scale + p @ vt, m_new
    return acc / l


def _tiled_whole_mask(q, k, v, tile, *, build="triu"):
    """Right numbers, one tile of scores at a time, but the causal mask made once for
    all keys and sliced per tile: a [Tq, Tk] tensor of one byte per score (issue 56)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    Tq, Tk = q.shape[2], k.shape[2]
    if build == "triu":
        hidden = torch.ones(Tq, Tk, dtype=torch.bool).triu(Tk - Tq + 1)
    elif build == "compare":
        hidden = torch.arange(Tk)[None, :] > torch.arange(Tk - Tq, Tk)[:, None]
    else:  # "uint8": a 0/1 table of the visible keys, in bytes
        hidden = 1 - torch.ones(Tq, Tk, dtype=torch.uint8).tril(Tk - Tq)
    m = torch.full((*q.shape[:-1], 1), float("-inf"))
    l, acc = torch.zeros_like(m), torch.zeros_like(q)
    for start in range(0, Tk, tile):
        scores = q @ k[:, :, start : start + tile].transpose(-1, -2) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(hidden[:, start : start + tile].bool(), float("-inf"))
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        p, scale = (scores - m_new).exp(), (m - m_new).exp()
        l, acc, m = l * scale + p.sum(-1, keepdim=True), acc * scale + p @ v[:, :, start : start + tile], m_new
    return acc / l


def _tiled_running_max(q, k, v, tile, *, start="-inf", which="row", before_mask=False):
    """Online softmax with the running maximum handled one wrong way at a time
    (none with the defaults). Each is exact in real arithmetic and right on
    scores of ordinary size: only exp's overflow or underflow exposes it."""
    m = torch.full((*q.shape[:-1], 1), float("-inf") if start == "-inf" else 0.0)
    l, acc = torch.zeros_like(m), torch.zeros_like(q)
    for (scores, vt), raw in zip(_tiles(q, k, v, tile), _raw_tiles(q, k, tile)):
        if which == "tile":  # each tile's own max, not the largest so far
            m_new = scores.amax(-1, keepdim=True)
            m_new = torch.where(m_new == float("-inf"), m, m_new)  # a row the mask hides here keeps its max
        elif which == "all":  # one max for the whole tile: every head and query together
            m_new = torch.maximum(m, scores.amax())
        else:
            m_new = torch.maximum(m, (raw if before_mask else scores).amax(-1, keepdim=True))
        p = (scores - m_new).exp()
        scale = (m - m_new).exp()
        l, acc, m = l * scale + p.sum(-1, keepdim=True), acc * scale + p @ vt, m_new
    return acc / l


def _raw_tiles(q, k, tile):
    """Each tile's scores before the causal mask (future keys still there)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    for start in range(0, k.shape[2], tile):
        yield q @ k[:, :, start : start + tile].transpose(-1, -2) / math.sqrt(q.shape[-1])


def _tiled_softmax_per_tile(q, k, v, tile):
    # Each tile normalized on its own, and the tiles' outputs averaged: not the softmax of the row.
    outs = [s.softmax(-1).nan_to_num() @ vt for s, vt in _tiles(q, k, v, tile)]
    return sum(outs) / len(outs)


def _tiled_two_passes(q, k, v, tile):
    # Correct, and unlike the course's answer: a first pass over the tiles finds
    # each row's max, a second sums exp(score - max) and the weighted values.
    tiles = list(_tiles(q, k, v, tile))
    m = torch.stack([s.amax(-1) for s, _ in tiles]).amax(0)[..., None]
    total = sum((s - m).exp().sum(-1, keepdim=True) for s, _ in tiles)
    return sum((s - m).exp() @ vt for s, vt in tiles) / total


WRONG = {
    "check_rope": [
        _rope_interleaved,
        lambda x, p, theta: _rope(x, p, theta, exponent=1.0),  # theta ** (-i/D): the slow pairs spin too fast
        lambda x, p, theta: _rope(x, p, theta, sign=-1.0),  # rotates by -angle
        lambda x, p, theta: _rope(x, torch.arange(x.shape[2]), theta),  # 0..T-1 whatever the positions
        _rope_in_place,  # issue 56: the input rotated in place
        _rope_in_place_mul,
        _rope_float64,  # issue 56: a float64 result for a float32 x
    ],
    "check_causal_gqa_attention": [
        lambda q, k, v: _attention(q, k, v, causal=False),  # sees the future
        lambda q, k, v: _attention(q, k, v, scale=False),  # forgets 1/sqrt(D)
        lambda q, k, v: _attention(q, k, v, grouping="tile"),  # wrong query-head -> K/V-head map
        lambda q, k, v: _attention(q, k, v, softmax_dim=-2),  # normalizes over queries
        lambda q, k, v: _attention(q, k, v, hide_self=True),  # a token may not see itself: NaN
        lambda q, k, v: _attention(q, k, v, align="top"),  # queries taken as the first Tq positions
        lambda q, k, v: _attention(q, k, v, align="square-only"),  # no mask unless Tq == Tk: right for Tq = 1 only
    ],
}
WRONG["check_tiled_attention"] = [
    _tiled_softmax_per_tile,  # a softmax per tile, averaged
    lambda q, k, v, t: _tiled(q, k, v, t, rescale=False),  # old sums not rescaled when the max grows
    lambda q, k, v, t: _tiled(q, k, v, t, subtract_max=False),  # exp of raw scores: overflows on large ones
    lambda q, k, v, t: _tiled(q, k, v, t, last_tile=False),  # a short last tile dropped
    lambda q, k, v, t: _tiled(q, k, v, t, causal_tiles="none"),  # no causal mask inside a tile
    lambda q, k, v, t: _attention(q, k, v),  # right numbers, but the whole score matrix at once
    # The running maximum mishandled: right on ordinary scores, NaN on large or far-apart ones.
    lambda q, k, v, t: _tiled_running_max(q, k, v, t, start="0"),  # starts at 0: all-negative rows underflow to 0/0
    lambda q, k, v, t: _tiled_running_max(q, k, v, t, which="all"),  # one max per tile for every head and row
    lambda q, k, v, t: _tiled_running_max(q, k, v, t, which="tile"),  # the tile's max: exp(old - new) overflows
    lambda q, k, v, t: _tiled_running_max(q, k, v, t, before_mask=True),  # a hidden future key sets the max
    # The whole [Tq, Tk] causal mask made once, then sliced per tile (issue 56): one byte per score.
    _tiled_whole_mask,
    lambda q, k, v, t: _tiled_whole_mask(q, k, v, t, build="compare"),
    lambda q, k, v, t: _tiled_whole_mask(q, k, v, t, build="uint8"),
]
REFERENCE = {
    "check_rope": lambda: _rope_by_complex_numbers,
    "check_causal_gqa_attention": lambda: _attention_one_query_at_a_time,
    "check_tiled_attention": lambda: _tiled_two_passes,
}
ANSWERS = {
    "check_rope": [labcheck.reference_rope, _engine_rope, apply_rope],
    "check_causal_gqa_attention": [labcheck.reference_causal_gqa_attention, F.scaled_dot_product_attention,
                                   _engine_attention],
    "check_tiled_attention": [labcheck.reference_tiled_attention,
                              lambda q, k, v, t: labcheck.reference_causal_gqa_attention(q, k, v),
                              lambda q, k, v, t: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)],
}
