"""Lab 6 (quantization): checks for symmetric INT8, INT4 packing and
asymmetric group-wise INT4, each compared with the engine's own quantizer
(tinyinfer.quant) or with values worked out by hand.

Two documented differences from the engine are allowed:
- the lab's INT4 keeps scales and zeros in fp32, while the engine rounds them
  to fp16 (the scale up, the zero down, so the range still covers the group).
  So INT4 scales match the engine's to 0.2%, zeros to 1% of a step, and a few
  codes in a thousand (where w sits near a rounding boundary) differ by one;
- a row or group whose weights are all equal has max = min, a scale of 0, and
  w / scale would be 0 / 0. The right answer there is code 0 for every weight
  (with zero = that value for INT4), whatever tiny scale stands in for 0: the
  engine clamps INT8's max|row| to 1e-12 and INT4's scale to 2**-24.
"""
from __future__ import annotations

import torch

from .. import quant
from .core import Case, run_check
from .registry import Lab

INT4_SCALE_RTOL = 2e-3  # the engine's fp16 scales, rounded up: within about one fp16 step (2**-10)
INT4_ZERO_ATOL = 0.01  # zeros: the engine's fp16 minimum, rounded down, within 1% of a step
INT4_MAX_CODE_MISMATCH = 0.01  # codes off by one (never more) in at most 1% of the weights


def reference_quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row INT8: scale = max|row| / 127, q = round(w / scale).
    An all-zero row gets codes 0 (its max is clamped, so nothing divides by 0)."""
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def reference_pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """[rows, cols] codes 0..15 -> uint8 [rows, cols/2]; column 2j low nibble, 2j+1 high."""
    codes = codes.to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def reference_quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric INT4 per group of `group_size` weights along each row:
    zero = min, scale = (max - min) / 15, q = round((w - zero) / scale) in 0..15.
    Returns the codes unpacked (uint8 [rows, cols]); pack_int4 packs them.
    A constant group gets codes 0: its scale is clamped to 2**-24, as the engine's."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // group_size, group_size)
    zeros = g.amin(-1)
    scales = ((g.amax(-1) - zeros) / 15).clamp(min=2**-24)
    q = torch.round((g - zeros[..., None]) / scales[..., None]).clamp(0, 15)
    return q.reshape(rows, cols).to(torch.uint8), scales, zeros


def _weights(rows, cols, seed, outlier_row=None):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 0.05
    if outlier_row is not None:
        w[outlier_row] *= 30  # one row with a wide range: a per-tensor scale would fail it
        w[0, : cols // 4] += 0.5  # a shifted block: symmetric INT4 would waste half its grid here
    return w


def _int8_close(got, expected) -> bool:
    """(q, scale): q int8 and equal to the engine's except for a tiny fraction
    of rounding ties; scale float32 and close (a 0 or tiny scale on a zero row)."""
    if not isinstance(got, tuple) or len(got) != 2:
        return False
    (q, scale), (eq, escale) = got, expected
    if not all(isinstance(t, torch.Tensor) for t in got):
        return False
    if q.dtype != torch.int8 or q.shape != eq.shape or scale.dtype != torch.float32 or scale.shape != escale.shape:
        return False
    return bool((q != eq).float().mean() <= 0.002) and torch.allclose(scale, escale, rtol=1e-5, atol=1e-7)


def _engine_int8(w):
    return quant.quantize_int8(w)


def _int8_cases():
    shapes = [((2, 4), None), ((6, 32), 3), ((16, 64), 5)]
    cases = []
    for seed, ((rows, cols), outlier) in enumerate(shapes):
        w = _weights(rows, cols, seed, outlier)
        cases.append(Case((w,), _engine_int8(w), f"w = randn({rows}, {cols}) * 0.05 (seed {seed})"
                          + (f", row {outlier} x30" if outlier is not None else "")))
    # Worked by hand: row 0's max|w| is 1.0, so one step is 1/127; row 1's is 2.0.
    w = torch.tensor([[0.5, -1.0, 0.25, 0.0], [2.0, 1.0, -0.5, 0.01]])
    by_hand = (torch.tensor([[64, -127, 32, 0], [127, 64, -32, 1]], dtype=torch.int8), torch.tensor([1 / 127, 2 / 127]))
    cases.insert(0, Case((w,), by_hand, f"w = {w.tolist()}"))
    w = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.5, -0.25, 0.0, 0.125]])
    cases.insert(1, Case((w,), (torch.tensor([[0, 0, 0, 0], [127, 127, 127, 127], [127, -64, 0, 32]], dtype=torch.int8),
                                torch.tensor([0.0, 0.25 / 127, 0.5 / 127])),
                         f"w = {w.tolist()}  (an all-zero row: max 0, scale 0, so every code is 0)"))
    return cases


def check_quantize_int8(quantize_int8) -> bool:
    """quantize_int8(w [rows, cols] float32) -> (q int8 [rows, cols], scale float32 [rows]),
    against tinyinfer.quant.quantize_int8 and two cases worked by hand."""
    return run_check("quantize_int8", quantize_int8, _int8_cases, same=_int8_close,
                     forbidden=(reference_quantize_int8, quant.quantize_int8, quant.Int8Linear))


def _pack_cases():
    codes = torch.tensor([[1, 2, 3, 4], [15, 0, 7, 8]], dtype=torch.uint8)
    # By hand: 1 | 2 << 4 = 33, 3 | 4 << 4 = 67, 15 | 0 = 15, 7 | 8 << 4 = 135.
    cases = [Case((codes,), torch.tensor([[33, 67], [15, 135]], dtype=torch.uint8), f"codes = {codes.tolist()}")]
    g = torch.Generator().manual_seed(7)
    for rows, cols in [(3, 8), (5, 64)]:
        c = torch.randint(0, 16, (rows, cols), generator=g, dtype=torch.uint8)
        cases.append(Case((c,), quant.pack_int4(c), f"codes = random 0..15, shape ({rows}, {cols})"))
    return cases


def _same_bytes(got, expected) -> bool:
    return isinstance(got, torch.Tensor) and got.dtype == torch.uint8 and torch.equal(got, expected)


def check_pack_int4(pack_int4) -> bool:
    """pack_int4(codes uint8 [rows, cols]) -> uint8 [rows, cols/2], against
    tinyinfer.quant.pack_int4 and a case packed by hand."""
    return run_check("pack_int4", pack_int4, _pack_cases, same=_same_bytes,
                     forbidden=(reference_pack_int4, quant.pack_int4))


def _engine_int4(w, group_size):
    """The engine's INT4, codes unpacked and metadata in fp32, as the lab returns them."""
    packed, scales, zeros = quant.quantize_int4(w, group_size)
    return quant.unpack_int4(packed), scales.float(), zeros.float()


def _int4_close(got, expected) -> bool:
    """(codes, scales, zeros) within the documented differences from the engine."""
    if not isinstance(got, tuple) or len(got) != 3 or not all(isinstance(t, torch.Tensor) for t in got):
        return False
    (q, scales, zeros), (eq, escales, ezeros) = got, expected
    if q.dtype != torch.uint8 or q.shape != eq.shape:
        return False
    if any(t.dtype != torch.float32 or t.shape != escales.shape for t in (scales, zeros)):
        return False
    off = (q.int() - eq.int()).abs()
    if off.numel() and int(off.max()) > 1 or float((off > 0).float().mean()) > INT4_MAX_CODE_MISMATCH:
        return False
    # A constant group's scale stands for 0: the engine's 2**-24, or 0, or anything as tiny.
    if not torch.allclose(scales, escales, rtol=INT4_SCALE_RTOL, atol=1e-7):
        return False
    return bool(((zeros - ezeros).abs() <= INT4_ZERO_ATOL * escales + 1e-7).all())


def _int4_cases():
    # By hand: group 0 spans 0..1.5 (one step 0.1), group 1 spans -1..0.5 (also 0.1).
    w = torch.tensor([[0.0, 0.1, 0.2, 1.5, -1.0, -0.5, 0.0, 0.5]])
    by_hand = (torch.tensor([[0, 1, 2, 15, 0, 5, 10, 15]], dtype=torch.uint8), torch.tensor([[0.1, 0.1]]),
               torch.tensor([[0.0, -1.0]]))
    cases = [Case((w, 4), by_hand, f"w = {w.tolist()}, group_size = 4")]
    # Constant groups (values exact in fp16, so the engine's fp16 metadata is exact too).
    w = torch.tensor([[0.5] * 4 + [0.0] * 4, [-0.25] * 4 + [0.0, 0.625, 1.5, 0.375]])
    cases.append(Case((w, 4), _engine_int4(w, 4),
                      f"w = {w.tolist()}, group_size = 4  (three constant groups: max = min, scale 0, every code 0)"))
    for seed, (rows, cols, gs) in enumerate([(4, 64, 32), (8, 128, 32), (6, 256, 64), (3, 256, 128)]):
        w = _weights(rows, cols, 10 + seed, outlier_row=1)
        if seed == 1:
            w[2, 32:64] = 0.125  # one constant group among ordinary ones
        cases.append(Case((w, gs), _engine_int4(w, gs),
                          f"w = randn({rows}, {cols}) * 0.05 (seed {10 + seed}, row 1 x30, a shifted block"
                          + (", row 2's second group all 0.125" if seed == 1 else "") + f"), group_size = {gs}"))
    return cases


def check_quantize_int4(quantize_int4) -> bool:
    """quantize_int4(w, group_size) -> (codes uint8 [rows, cols], scales, zeros
    float32 [rows, cols/group_size]), against tinyinfer.quant.quantize_int4 (see
    the module's docstring for the fp16 differences allowed)."""
    return run_check("quantize_int4", quantize_int4, _int4_cases, same=_int4_close,
                     forbidden=(reference_quantize_int4, quant.quantize_int4, quant.Int4Linear))


LAB = Lab(6, "quantization",
          exports=("check_quantize_int8", "check_pack_int4", "check_quantize_int4", "reference_quantize_int8",
                   "reference_pack_int4", "reference_quantize_int4"),
          fallbacks={"check_quantize_int8": reference_quantize_int8, "check_pack_int4": reference_pack_int4,
                     "check_quantize_int4": reference_quantize_int4})
