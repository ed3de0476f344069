"""Lab 6 (quantization): wrong implementations each check must reject, the
reference each must accept, and the course answers each must refuse.
Collected by tests/course/test_labs.py."""
import math

import torch

from tinyinfer_course import labcheck
from tinyinfer import quant


def _groups(w, group_size):
    rows, cols = w.shape
    return w.reshape(rows, cols // group_size, group_size)


# --- quantize_int4: wrong versions


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


# --- choose_format: an independent reference and plausible wrong versions, all
# built from quantizers and byte formulas written here (not labcheck's, not the engine's)


def _round_trip(w, method, group_size):
    """W' for one format, with fp32 metadata; a short last INT4 group is just shorter."""
    if method == "int8":
        scale = w.abs().amax(dim=1, keepdim=True) / 127
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        return torch.round(w / safe).clamp(-127, 127) * scale
    out = torch.empty_like(w)
    for start in range(0, w.shape[1], group_size):
        block = w[:, start:start + group_size]
        lo, hi = block.amin(1, keepdim=True), block.amax(1, keepdim=True)
        scale = (hi - lo) / 15
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        out[:, start:start + group_size] = torch.round((block - lo) / safe).clamp(0, 15) * scale + lo
    return out


def _rel_error(w, method, group_size):
    return float((_round_trip(w, method, group_size) - w).norm() / w.norm())


def _max_abs_error(w, method, group_size):
    return float((_round_trip(w, method, group_size) - w).abs().max())


def _mean_abs_error(w, method, group_size):
    return float((_round_trip(w, method, group_size) - w).abs().mean())  # L1: ranks some formats differently


def _mean_row_error(w, method, group_size):
    err = (_round_trip(w, method, group_size) - w).norm(dim=1) / w.norm(dim=1)
    return float(err.mean())  # each row's relative error, averaged: small rows weigh as much as large ones


def _bits(w, method, group_size, scale_bytes=None, groups=None):
    """Bits per weight of the stored format: codes + metadata, by formula."""
    rows, cols = w.shape
    if method == "int8":
        return 8 + 8 * rows * (4 if scale_bytes is None else scale_bytes) / (rows * cols)
    per_row = math.ceil(cols / group_size) if groups is None else groups(cols, group_size)
    meta = 2 if scale_bytes is None else scale_bytes  # bytes of the scale, and of the zero
    return 4 + 8 * rows * per_row * 2 * meta / (rows * cols)


def _chooser(bits=_bits, error=_rel_error, fits=lambda b, budget: b <= budget + 1e-12, tie="bytes",
             when_none=None):
    """A choose_format made of the given rules (the correct ones by default)."""
    def choose_format(w, budget_bits, candidates):
        scored = [(error(w, *c), bits(w, *c), i, tuple(c)) for i, c in enumerate(candidates)]
        fitting = [s for s in scored if fits(s[1], budget_bits)]
        if not fitting:
            return when_none(scored) if when_none else None
        if tie == "bytes":
            return min(fitting, key=lambda s: (s[0], s[1], s[2]))[3]
        if tie == "first":
            return min(fitting, key=lambda s: (s[0], s[2]))[3]
        if tie == "bytes, then last":  # a `<=` where `<` belongs: a full tie goes to the later candidate
            return min(fitting, key=lambda s: (s[0], s[1], -s[2]))[3]
        return min(fitting, key=lambda s: (s[0], -s[2]))[3]  # "last"
    return choose_format


def _choose_by_rule(rule):
    """A choose_format that never measures the error: it trusts a rule of thumb."""
    def choose_format(w, budget_bits, candidates):
        fitting = [(_bits(w, *c), tuple(c)) for c in candidates if _bits(w, *c) <= budget_bits]
        return rule(fitting)[1] if fitting else None
    return choose_format


WRONG = {
    "check_quantize_int4": [_int4_symmetric, _int4_sixteen_steps, _int4_groups_down_columns, _int4_zero_at_zero],
    "check_choose_format": [
        _chooser(bits=lambda w, m, g: 8 if m == "int8" else 4),  # the code bits alone, no metadata
        _chooser(bits=lambda w, m, g: _bits(w, m, g) if m == "int4" else 8),  # INT8's row scales forgotten
        _chooser(bits=lambda w, m, g: _bits(w, m, g, scale_bytes=2)),  # INT8 scales counted as fp16
        _chooser(bits=lambda w, m, g: _bits(w, m, g, scale_bytes=4 if m == "int4" else None)),  # INT4 meta as fp32
        _chooser(bits=lambda w, m, g: _bits(w, m, g, groups=lambda c, s: c / s)),  # fractional groups
        _chooser(bits=lambda w, m, g: _bits(w, m, g, groups=lambda c, s: c // s)),  # a short last group dropped
        _chooser(fits=lambda b, budget: b < budget),  # a budget exactly met does not fit
        _chooser(fits=lambda b, budget: b <= 8 * budget),  # the budget read as bytes per weight
        _chooser(fits=lambda b, budget: True),  # the budget ignored
        _chooser(tie="first"),  # equal errors: the first candidate, not the fewest bytes
        _chooser(tie="last"),
        _chooser(tie="bytes, then last"),  # fewer bytes right, but equal bytes too go to the later candidate
        _chooser(when_none=lambda scored: min(scored, key=lambda s: s[1])[3]),  # over budget: the cheapest anyway
        _chooser(error=_max_abs_error),  # the largest single error, not the relative error over the matrix
        _chooser(error=_mean_abs_error),  # issue 56: mean |error| (L1), not the relative L2 error the lab defines
        _chooser(error=_mean_row_error),  # the mean of the rows' relative errors
        _choose_by_rule(max),  # "more bits, less error"
        _choose_by_rule(min),  # "the smallest format that fits"
    ],
}


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


def _via_engine_costs(w, budget_bits, candidates):  # the course's cost function inside a loop of one's own
    fitting = []
    for c in candidates:
        nbytes, error = labcheck.engine_format_cost(w, *c)
        if 8 * nbytes <= budget_bits * w.numel():
            fitting.append((error, nbytes, tuple(c)))
    return min(fitting)[2] if fitting else None


REFERENCE = {
    "check_quantize_int4": lambda: _int4,
    "check_choose_format": lambda: _chooser(),
}
ANSWERS = {
    "check_quantize_int4": [labcheck.reference_quantize_int4, _engine_int4],
    "check_choose_format": [labcheck.reference_choose_format, _via_engine_costs],
}
