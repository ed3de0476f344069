"""Lab 6 (quantization): checks for symmetric INT8, INT4 packing and
asymmetric group-wise INT4.

The lab's INT4 keeps scales and zeros in fp32 (the engine rounds them to fp16,
a detail that would only distract here), and its groups divide the row evenly."""
from __future__ import annotations

import torch

from .core import Case, _report


def reference_quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row INT8: scale = max|row| / 127, q = round(w / scale)."""
    scale = w.abs().amax(dim=1) / 127
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def reference_pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """[rows, cols] codes 0..15 -> uint8 [rows, cols/2]; column 2j low nibble, 2j+1 high."""
    codes = codes.to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def reference_quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric INT4 per group of `group_size` weights along each row:
    zero = min, scale = (max - min) / 15, q = round((w - zero) / scale) in 0..15."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // group_size, group_size)
    zeros = g.amin(-1)
    scales = (g.amax(-1) - zeros) / 15
    q = torch.round((g - zeros[..., None]) / scales[..., None]).clamp(0, 15)
    return reference_pack_int4(q.reshape(rows, cols)), scales, zeros


def _weights(rows, cols, seed, outlier_row=None):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 0.05
    if outlier_row is not None:
        w[outlier_row] *= 30  # one row with a wide range: a per-tensor scale would fail it
        w[0, : cols // 4] += 0.5  # a shifted block: symmetric INT4 would waste half its grid here
    return w


def _tensors_close(got, expected, max_code_mismatch=0.0) -> bool:
    """Tuples of tensors: same length, dtypes and shapes; floats close; integer
    codes equal except for a tiny fraction of rounding ties."""
    if not isinstance(got, tuple) or len(got) != len(expected):
        return False
    for g, e in zip(got, expected):
        if not isinstance(g, torch.Tensor) or g.dtype != e.dtype or g.shape != e.shape:
            return False
        if e.is_floating_point():
            if not torch.allclose(g, e, rtol=1e-4, atol=1e-7):
                return False
        elif (g != e).float().mean() > max_code_mismatch:
            return False
    return True


def _int8_cases():
    shapes = [((2, 4), None), ((6, 32), 3), ((16, 64), 5)]
    cases = []
    for seed, ((rows, cols), outlier) in enumerate(shapes):
        w = _weights(rows, cols, seed, outlier)
        cases.append(Case((w,), reference_quantize_int8(w), f"w = randn({rows}, {cols}) * 0.05 (seed {seed})"
                          + (f", row {outlier} x30" if outlier is not None else "")))
    w = torch.tensor([[0.5, -1.0, 0.25, 0.0], [2.0, 1.0, -0.5, 0.01]])
    cases.insert(0, Case((w,), reference_quantize_int8(w), f"w = {w.tolist()}"))
    return cases


def check_quantize_int8(quantize_int8) -> bool:
    """quantize_int8(w [rows, cols] float32) -> (q int8 [rows, cols], scale float32 [rows])."""
    return _report("quantize_int8", quantize_int8, _int8_cases,
                   same=lambda got, exp: _tensors_close(got, exp, max_code_mismatch=0.002))


def _pack_cases():
    codes = torch.tensor([[1, 2, 3, 4], [15, 0, 7, 8]], dtype=torch.uint8)
    cases = [Case((codes,), reference_pack_int4(codes), f"codes = {codes.tolist()}")]
    g = torch.Generator().manual_seed(7)
    for rows, cols in [(3, 8), (5, 64)]:
        c = torch.randint(0, 16, (rows, cols), generator=g, dtype=torch.uint8)
        cases.append(Case((c,), reference_pack_int4(c), f"codes = random 0..15, shape ({rows}, {cols})"))
    return cases


def check_pack_int4(pack_int4) -> bool:
    """pack_int4(codes uint8 [rows, cols]) -> uint8 [rows, cols/2]."""
    return _report("pack_int4", pack_int4, _pack_cases,
                   same=lambda got, exp: _tensors_close((got,), (exp,)))


def _int4_cases():
    w = torch.tensor([[0.0, 0.1, 0.2, 1.5, -1.0, -0.5, 0.0, 0.5]])
    cases = [Case((w, 4), reference_quantize_int4(w, 4), f"w = {w.tolist()}, group_size = 4")]
    for seed, (rows, cols, gs) in enumerate([(4, 64, 32), (8, 128, 32), (6, 256, 64), (3, 256, 128)]):
        w = _weights(rows, cols, 10 + seed, outlier_row=1)
        cases.append(Case((w, gs), reference_quantize_int4(w, gs),
                          f"w = randn({rows}, {cols}) * 0.05 (seed {10 + seed}, row 1 x30, a shifted block), "
                          f"group_size = {gs}"))
    return cases


def check_quantize_int4(quantize_int4) -> bool:
    """quantize_int4(w, group_size) -> (packed uint8 [rows, cols/2], scales, zeros float32 [rows, cols/group_size])."""
    return _report("quantize_int4", quantize_int4, _int4_cases,
                   same=lambda got, exp: _tensors_close(got, exp, max_code_mismatch=0.002))
