"""Lab 2 (attention): wrong implementations each check must reject, and the
reference each must accept. Collected by tests/test_labs.py."""
import math

import torch

from tinyinfer import labcheck


def _angles(positions, d, theta, exponent=2.0):
    inv_freq = 1.0 / theta ** (exponent * torch.arange(0, d // 2).float() / d)
    return positions.float()[:, None] * inv_freq[None, :]


def _rope_interleaved(x, positions, theta):
    # GPT-J / original-paper layout: pairs (0, 1), (2, 3), ... instead of (i, i + D/2).
    a = _angles(positions, x.shape[-1], theta)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack([x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()], dim=-1)
    return out.flatten(-2)


def _rope_wrong_frequencies(x, positions, theta):
    # theta ** (-i / D) instead of theta ** (-2i / D): the slow pairs spin too fast.
    a = _angles(positions, x.shape[-1], theta, exponent=1.0)
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()], dim=-1)


def _rope_backwards(x, positions, theta):
    # Rotates by -angle: the sign of sin flipped.
    a = _angles(positions, x.shape[-1], theta)
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * a.cos() + x2 * a.sin(), -x1 * a.sin() + x2 * a.cos()], dim=-1)


def _rope_ignores_positions(x, positions, theta):
    # Uses 0..T-1 whatever the positions are: wrong for every decode step.
    return labcheck.reference_rope(x, torch.arange(x.shape[2]), theta)


def _attention(q, k, v, *, causal=True, scale=True, grouping="interleave", softmax_dim=-1, hide_self=False):
    group = q.shape[1] // k.shape[1]
    if grouping == "interleave":
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    else:  # "tile": head h reads K/V head h % Hkv instead of h // group
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    scores = q @ k.transpose(-1, -2)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    if causal:
        T = q.shape[2]
        hidden = torch.ones(T, T, dtype=torch.bool).triu(0 if hide_self else 1)
        scores = scores.masked_fill(hidden, float("-inf"))
    return scores.softmax(dim=softmax_dim) @ v


WRONG = {
    "check_rope": [_rope_interleaved, _rope_wrong_frequencies, _rope_backwards, _rope_ignores_positions],
    "check_causal_gqa_attention": [
        lambda q, k, v: _attention(q, k, v, causal=False),  # sees the future
        lambda q, k, v: _attention(q, k, v, scale=False),  # forgets 1/sqrt(D)
        lambda q, k, v: _attention(q, k, v, grouping="tile"),  # wrong query-head -> K/V-head map
        lambda q, k, v: _attention(q, k, v, softmax_dim=-2),  # normalizes over queries
        lambda q, k, v: _attention(q, k, v, hide_self=True),  # a token may not see itself: NaN
    ],
}
REFERENCE = {
    "check_rope": lambda: labcheck.reference_rope,
    "check_causal_gqa_attention": lambda: labcheck.reference_causal_gqa_attention,
}
