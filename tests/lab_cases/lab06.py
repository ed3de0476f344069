"""Lab 6 (quantization): wrong implementations each check must reject, the
reference each must accept, and the course answers each must refuse.
Collected by tests/test_labs.py."""
import torch

from tinyinfer import labcheck, quant


def _int8_range_128(w):  # divides by 128, as if the grid were -128..127
    scale = w.abs().amax(dim=1) / 128
    return torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8), scale


def _int8_per_tensor(w):  # one scale for the whole matrix: outlier rows crush the others
    scale = (w.abs().max() / 127).expand(w.shape[0]).clone()
    return torch.round(w / scale[:, None]).to(torch.int8), scale


def _int8_truncates(w):  # .to(int8) truncates toward zero instead of rounding
    scale = w.abs().amax(dim=1) / 127
    return (w / scale[:, None]).to(torch.int8), scale


def _pack_high_first(codes):
    codes = codes.to(torch.uint8)
    return (codes[:, 0::2] << 4) | codes[:, 1::2]


def _pack_halves(codes):  # pairs column j with column j + cols/2
    codes = codes.to(torch.uint8)
    half = codes.shape[1] // 2
    return codes[:, :half] | (codes[:, half:] << 4)


def _groups(w, group_size):
    rows, cols = w.shape
    return w.reshape(rows, cols // group_size, group_size)


def _int4_symmetric(w, group_size):  # ignores each group's offset
    g = _groups(w, group_size)
    scales = g.abs().amax(-1) / 7.5
    zeros = -8 * scales
    q = torch.round(g / scales[..., None] + 8).clamp(0, 15)
    return q.reshape(w.shape).to(torch.uint8), scales, zeros


def _int4_sixteen_steps(w, group_size):  # 16 levels have 15 steps between them, not 16
    g = _groups(w, group_size)
    zeros = g.amin(-1)
    scales = (g.amax(-1) - zeros) / 16
    q = torch.round((g - zeros[..., None]) / scales[..., None]).clamp(0, 15)
    return q.reshape(w.shape).to(torch.uint8), scales, zeros


def _int4_groups_down_columns(w, group_size):  # groups along the output dimension
    rows, cols = w.shape
    if rows % group_size:  # too few rows for one group down a column: the whole column is one
        group_size = rows
    g = w.T.reshape(cols, rows // group_size, group_size)
    zeros = g.amin(-1)
    scales = ((g.amax(-1) - zeros) / 15).clamp(min=1e-12)
    q = torch.round((g - zeros[..., None]) / scales[..., None]).clamp(0, 15)
    return q.reshape(cols, rows).T.contiguous().to(torch.uint8), scales, zeros


def _int4_zero_at_zero(w, group_size):  # the grid starts at 0, not at the group's minimum
    g = _groups(w, group_size)
    zeros = torch.zeros(g.shape[:-1])
    scales = g.amax(-1).clamp(min=1e-12) / 15
    q = torch.round(g / scales[..., None]).clamp(0, 15)
    return q.reshape(w.shape).to(torch.uint8), scales, zeros


WRONG = {
    "check_quantize_int8": [_int8_range_128, _int8_per_tensor, _int8_truncates],
    "check_pack_int4": [_pack_high_first, _pack_halves],
    "check_quantize_int4": [_int4_symmetric, _int4_sixteen_steps, _int4_groups_down_columns, _int4_zero_at_zero],
}


# --- correct implementations written here, independently of labcheck and tinyinfer.quant


def _int8(w):
    peak = w.abs().amax(dim=1)
    scale = peak / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: 0 / 1 = code 0
    return torch.round(w / safe[:, None]).clamp(-127, 127).to(torch.int8), scale


def _pack(codes):
    codes = codes.to(torch.int32)
    return (codes[:, 0::2] + 16 * codes[:, 1::2]).to(torch.uint8)


def _int4(w, group_size):
    g = _groups(w, group_size)
    lo, hi = g.amin(-1), g.amax(-1)
    scales = (hi - lo) / 15
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))  # a constant group: every code 0
    q = torch.round((g - lo[..., None]) / safe[..., None]).clamp(0, 15)
    return q.reshape(w.shape).to(torch.uint8), scales, lo


def _engine_int4(w, group_size):
    packed, scales, zeros = quant.quantize_int4(w, group_size)
    return quant.unpack_int4(packed), scales.float(), zeros.float()


REFERENCE = {
    "check_quantize_int8": lambda: _int8,
    "check_pack_int4": lambda: _pack,
    "check_quantize_int4": lambda: _int4,
}
ANSWERS = {
    "check_quantize_int8": [labcheck.reference_quantize_int8, quant.quantize_int8],
    "check_pack_int4": [labcheck.reference_pack_int4, quant.pack_int4],
    "check_quantize_int4": [labcheck.reference_quantize_int4, _engine_int4],
}
