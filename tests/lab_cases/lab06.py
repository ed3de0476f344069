"""Lab 6 (quantization): wrong implementations each check must reject, and the
reference each must accept. Collected by tests/test_labs.py."""
import torch

from tinyinfer import labcheck


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


def _int4_symmetric(w, group_size):  # ignores each group's offset
    rows, cols = w.shape
    g = w.reshape(rows, -1, group_size)
    scales = g.abs().amax(-1) / 7.5
    zeros = -8 * scales
    q = torch.round(g / scales[..., None] + 8).clamp(0, 15)
    return labcheck.reference_pack_int4(q.reshape(rows, cols)), scales, zeros


def _int4_sixteen_steps(w, group_size):  # 16 levels have 15 steps between them, not 16
    rows, cols = w.shape
    g = w.reshape(rows, -1, group_size)
    zeros = g.amin(-1)
    scales = (g.amax(-1) - zeros) / 16
    q = torch.round((g - zeros[..., None]) / scales[..., None]).clamp(0, 15)
    return labcheck.reference_pack_int4(q.reshape(rows, cols)), scales, zeros


def _int4_groups_down_columns(w, group_size):  # groups along the output dimension
    packed, scales, zeros = labcheck.reference_quantize_int4(w.T.contiguous(), group_size) \
        if w.shape[0] % group_size == 0 else labcheck.reference_quantize_int4(w, w.shape[1])
    return packed, scales, zeros


WRONG = {
    "check_quantize_int8": [_int8_range_128, _int8_per_tensor, _int8_truncates],
    "check_pack_int4": [_pack_high_first, _pack_halves],
    "check_quantize_int4": [_int4_symmetric, _int4_sixteen_steps, _int4_groups_down_columns],
}
REFERENCE = {
    "check_quantize_int8": lambda: labcheck.reference_quantize_int8,
    "check_pack_int4": lambda: labcheck.reference_pack_int4,
    "check_quantize_int4": lambda: labcheck.reference_quantize_int4,
}
