"""Keys and values in int8: how the paged pool stores them with
kv_cache_dtype="int8" (vLLM's option; its own values are "auto", "fp8", ...).

Each key (and each value) vector of one token in one KV head, head_dim numbers,
is stored as head_dim int8 numbers and one float32 scale, symmetric around 0:

    scale = max |x| / 127        q = round(x / scale), in [-127, 127]        x ~ q x scale

Why one scale per token and head, not per tensor or per head as vLLM's fp8
cache keeps them (k_scale, v_scale, set once from calibration data or left at
1.0):
- the pool is written one token at a time, so a token's scale is known when it
  is written, and it never has to change: no calibration, and no re-quantizing
  old tokens when a larger number arrives later;
- fp8 has a floating exponent, so one scale for the whole tensor still leaves
  small numbers precise; int8's steps are even, so a scale shared with the
  largest key in the pool would round a quiet token's numbers to a few steps.
  A scale per token and head gives every vector its own range;
- the cost is small: 4 bytes of scale beside head_dim bytes of int8 (6% for
  SmolLM2's 64), so the pool holds head_dim / (head_dim + 4) of twice the
  tokens of a bf16 one (1.88x for SmolLM2), and of four times an fp32 one's.
The scales are float32, not the model's dtype, and the product q x scale is
taken in float32 before it is rounded to the model's dtype: in bf16 a scale
would carry only 8 bits of precision, an error as large as the int8 rounding's.
"""
from __future__ import annotations

import torch

SCALE_DTYPE = torch.float32  # config.KV_SCALE_BYTES counts its 4 bytes (test_kv_quant pins the two)
QMAX = 127  # symmetric: -128 is never used, so -x quantizes to -q
TINY = 1e-12  # the scale of an all-zero vector: any positive number gives q = 0


def quantize_symmetric(x: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 along `dim`: (int8 like x, float32 scale with `dim` kept at
    size 1), scale = max |x| / 127 over dim. The one rounding rule of the engine's
    int8: the KV cache's vectors here, the weights' rows in quant.quantize_int8."""
    x = x.float()
    scale = (x.abs().amax(dim=dim, keepdim=True) / QMAX).clamp(min=TINY)
    q = torch.round(x / scale).clamp(-QMAX, QMAX).to(torch.int8)
    return q, scale


def quantize_per_head(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (int8 [..., head_dim], float32 scale [..., 1]), one
    scale per vector (per token and KV head, for the pool's [slots, Hkv, D])."""
    return quantize_symmetric(x, dim=-1)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The numbers q x scale in `dtype`: a new tensor as large as q in that
    dtype, the one copy a quantized cache costs at every read."""
    return (q * scale).to(dtype)  # int8 x float32 is float32: one rounding, at the end
