"""Lab 6 (quantization): checks for asymmetric group-wise INT4 and for
choosing a format under a byte budget, each compared with the engine's own
quantizer and byte counts (tinyinfer.quant) or with values worked out by hand.

Two documented differences from the engine are allowed in INT4:
- the lab's INT4 keeps scales and zeros in fp32, while the engine rounds them
  to fp16 (the scale up, the zero down, so the range still covers the group).
  So INT4 scales match the engine's to 0.2%, zeros to 1% of a step, and a few
  codes in a thousand (where w sits near a rounding boundary) differ by one;
- a group whose weights are all equal has max = min, a scale of 0, and
  w / scale would be 0 / 0. The right answer there is code 0 for every weight
  (with zero = that value), whatever tiny scale stands in for 0: the engine
  clamps the scale to 2**-24.

Choosing a format: `choose_format(w, budget_bits, candidates)` returns the
candidate with the lowest relative error ||W' - W|| / ||W|| among those whose
stored bytes fit `budget_bits` per weight, as the engine stores them:
- INT8: 1 byte per weight + one fp32 scale (4 bytes) per row;
- INT4 with groups of g: half a byte per weight + an fp16 scale and an fp16
  zero (4 bytes) per group, and a row whose width is not a multiple of g still
  stores its short last group whole (ceil(cols / g) groups per row).
A format fits when 8 x bytes <= budget_bits x weights; equal errors go to the
one with fewer bytes (then to the earlier candidate); None when nothing fits.
The cases are built so that each of those rules changes the answer somewhere,
and so that the errors being compared differ by far more than the fp16/fp32
difference above: a learner who measures with their own fp32 INT4 gets the
engine's answers too.
"""
from __future__ import annotations

import torch

from tinyinfer import quant
from .core import Case, first_difference, run_check
from .registry import Lab

INT4_SCALE_RTOL = 2e-3  # the engine's fp16 scales, rounded up: within about one fp16 step (2**-10)
INT4_ZERO_ATOL = 0.01  # zeros: the engine's fp16 minimum, rounded down, within 1% of a step
INT4_MAX_CODE_MISMATCH = 0.01  # codes off by one (never more) in at most 1% of the weights


def reference_quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric INT4 per group of `group_size` weights along each row:
    zero = min, scale = (max - min) / 15, q = round((w - zero) / scale) in 0..15.
    Returns the codes unpacked (uint8 [rows, cols]); quant.pack_int4 packs them.
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


def _where_int4(got, expected) -> str | None:
    """The first of codes, scales and zeros that differs, and where."""
    if not (isinstance(got, tuple) and len(got) == 3):
        return None
    for name, mine, theirs in zip(("codes", "scales", "zeros"), got, expected):
        if not isinstance(mine, torch.Tensor):
            return f"{name}: a {type(mine).__name__}, not a tensor"
        if mine.dtype != theirs.dtype:
            return f"{name}: dtype {mine.dtype}, expected {theirs.dtype}"
        if name == "codes":
            if where := _where_codes(mine, theirs):
                return where
            continue
        diff = first_difference(mine.float(), theirs.float(), ("row", "group"), atol=1e-7, rtol=INT4_SCALE_RTOL)
        if diff:
            return f"{name}: {diff}"
    return None


def _where_codes(mine: torch.Tensor, theirs: torch.Tensor) -> str | None:
    """The first code that differs, when the codes are outside what the check
    allows: any code off by more than one, or more than INT4_MAX_CODE_MISMATCH
    of them off by one. A cause only where every differing code says the same."""
    if mine.shape != theirs.shape:
        return f"codes: shape {list(mine.shape)}, expected {list(theirs.shape)}"
    off = mine.int() - theirs.int()
    wrong = off != 0
    if not bool(wrong.any()):
        return None
    diff = first_difference(mine.float(), theirs.float(), ("row", "column"), atol=0.5, rtol=0)
    if bool((off.abs() > 1).any()):
        return f"codes: {diff}"
    if float(wrong.float().mean()) <= INT4_MAX_CODE_MISMATCH:
        return None
    lower, higher = bool((off[wrong] < 0).all()), bool((off[wrong] > 0).all())
    cause = (" Every one of them is one lower: rounded down (floor, or a cast that truncates) rather than to the "
             "nearest code?" if lower else " Every one of them is one higher: rounded up rather than to the nearest "
             "code?" if higher else "")
    return (f"codes: {int(wrong.sum())} of {off.numel()} codes are off by one, more than the "
            f"{INT4_MAX_CODE_MISMATCH:.0%} the check allows (the engine's fp16 scale can move a code that sits on a "
            f"rounding tie); {diff}.{cause}")


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
                     forbidden=(reference_quantize_int4, quant.quantize_int4, quant.Int4Linear), explain=_where_int4)


# ------------------------------------------------- choosing a format under a byte budget


def _layer(w: torch.Tensor, method: str, group_size):
    """The engine's quantized layer for w: what it stores is what we count."""
    w = w.float()
    return quant.Int8Linear.from_weight(w) if method == "int8" else quant.Int4Linear.from_weight(w, group_size)


def engine_format_cost(w: torch.Tensor, method: str, group_size=None) -> tuple[int, float]:
    """(bytes the engine stores for w in this format, relative error ||W' - W|| / ||W||),
    from the engine's own layer: quant.model_bytes counts its codes, scales and zeros,
    and the error is that of the weights the layer reads back."""
    layer = _layer(w, method, group_size)
    b = quant.model_bytes(layer)
    if method == "int8":
        w_hat = quant.dequantize_int8(layer.weight, layer.scales)
    else:
        w_hat = quant.dequantize_int4(layer.weight, layer.scales, layer.zeros, group_size)
    w = w.float()
    return b["packed_weights"] + b["scales"] + b["zeros"], float((w_hat - w).norm() / w.norm())


def reference_choose_format(w: torch.Tensor, budget_bits: float, candidates):
    """The candidate (method, group_size) with the lowest error whose stored bytes fit
    budget_bits per weight (8 * bytes <= budget_bits * weights); equal errors go to fewer
    bytes, then to the earlier candidate; None when none fits."""
    best = None  # (error, bytes, candidate)
    for candidate in candidates:
        nbytes, error = engine_format_cost(w, *candidate)
        if 8 * nbytes <= budget_bits * w.numel() and (best is None or (error, nbytes) < best[:2]):
            best = (error, nbytes, candidate)
    return None if best is None else best[2]


def _name(candidate) -> str:
    method, group_size = candidate
    return "int8" if method == "int8" else f"int4 g{group_size}"


def _on_grids(rows: int, cols: int, block: int, seed: int, narrow_first_half: bool) -> torch.Tensor:
    """Weights that sit exactly on a 16-level grid per `block` weights of a row, as
    llama.cpp's Q4_1 blocks do: zero + scale * q with q in 0..15, scales and zeros
    multiples of 1/1024 (exact in fp16 and fp32, so the engine finds the grid exactly).
    narrow_first_half: the first half of each block uses only codes 2..13 (0 and 15
    sit in the second half), so a group of half the block sees another grid.
    Otherwise every 32 weights hold codes 0 and 15: any group of 32, 64, ... weights
    within a block spans the same grid."""
    g = torch.Generator().manual_seed(seed)
    n = cols // block
    q = torch.randint(0, 16, (rows, n, block), generator=g)
    if narrow_first_half:
        q[..., : block // 2] = torch.randint(2, 14, (rows, n, block // 2), generator=g)
        q[..., block // 2], q[..., block // 2 + 1] = 0, 15
    else:
        runs = q.view(rows, n, block // 32, 32)
        runs[..., 0], runs[..., 1] = 0, 15
    scale = torch.randint(8, 64, (rows, n, 1), generator=g) / 1024
    zero = -torch.randint(256, 768, (rows, n, 1), generator=g) / 1024
    return (zero + scale * q).reshape(rows, cols)


def _one_group_off_grid(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Every 32 weights of a row on their own grid (Q4_1's blocks, as in the course's
    model), except the first 32 of row 0: random values over the same range. INT4 g32
    then errs in that one group only, INT8 a little everywhere."""
    w = _on_grids(rows, cols, block=32, seed=seed, narrow_first_half=False)
    lo, hi = float(w[0, :32].min()), float(w[0, :32].max())
    w[0, :32] = lo + (hi - lo) * torch.rand(32, generator=torch.Generator().manual_seed(seed))
    return w



def _groups_off_grid(seed: int, groups: int, row0_scale: float = 1.0) -> torch.Tensor:
    """[16, 128] on Q4_1 grids of 32 (as _one_group_off_grid), with `groups` groups of 32
    spread over the rows replaced by random values over their own range, and row 0 then
    scaled by row0_scale. Built so that measures other than the lab's rank INT8 and
    INT4 g32 the other way round (issue 56): many small errors against a few large ones."""
    w = _on_grids(16, 128, block=32, seed=seed, narrow_first_half=False)
    g = torch.Generator().manual_seed(seed)
    for j in range(groups):
        row, col = divmod(j * 7 % 64, 4)
        lo, hi = float(w[row, col * 32 : col * 32 + 32].min()), float(w[row, col * 32 : col * 32 + 32].max())
        w[row, col * 32 : col * 32 + 32] = lo + (hi - lo) * torch.rand(32, generator=g)
    w[0] *= row0_scale
    return w

ALL = (("int8", None), ("int4", 32), ("int4", 64), ("int4", 128))


def _choose_cases() -> list[Case]:
    gaussian = _weights(8, 128, seed=40)
    smol_width = _weights(4, 576, seed=41)  # SmolLM2's hidden size: 4.5 groups of 128
    short = _weights(4, 96, seed=42)  # 96 = 1.5 groups of 64, 0.75 of 128
    q4_64 = _on_grids(4, 256, block=64, seed=43, narrow_first_half=True)
    one_grid = _on_grids(4, 128, block=128, seed=44, narrow_first_half=False)
    one_off = _one_group_off_grid(16, 128, seed=60)
    six_off = _groups_off_grid(seed=60, groups=6)
    large_row_off = _groups_off_grid(seed=60, groups=1, row0_scale=30.0)
    plan = [  # (w, what it is, budget, candidates, why this case)
        (gaussian, "randn(8, 128) * 0.05", 16.0, ALL,
         "a generous budget: every format fits, and INT8's 255 levels give the lowest error"),
        (gaussian, "randn(8, 128) * 0.05", 8.0, ALL,
         "INT8 costs 8 bits + one fp32 scale per 128-weight row = 8.25 bits: it does not fit in 8"),
        (gaussian, "randn(8, 128) * 0.05", 8.2, ALL,
         "INT8's row scales are fp32: 4 bytes per row of 128 weights, 8.25 bits in all, over 8.2"),
        (gaussian, "randn(8, 128) * 0.05", 8.25, ALL, "exactly INT8's 8.25 bits: a budget that is met fits"),
        (gaussian, "randn(8, 128) * 0.05", 5.0, ALL,
         "INT4 g32 costs 4 bits + 2 fp16 numbers per 32 weights = 5.0 bits: exactly the budget, so it fits"),
        (gaussian, "randn(8, 128) * 0.05", 4.9, ALL, "g32's 5.0 bits are over; g64 costs 4.5"),
        (gaussian, "randn(8, 128) * 0.05", 4.4, ALL, "only g128 (4.25 bits) fits"),
        (gaussian, "randn(8, 128) * 0.05", 4.2, ALL, "nothing fits: every INT4 group pays for its scale and zero"),
        (gaussian, "randn(8, 128) * 0.05", 16.0, tuple(reversed(ALL)),
         "the same question with the candidates in another order: the answer must not change"),
        (smol_width, "randn(4, 576) * 0.05", 4.3, ALL,
         "576 columns are 4.5 groups of 128: the engine stores 5 per row, 4.28 bits, which fits 4.3"),
        (smol_width, "randn(4, 576) * 0.05", 4.26, ALL,
         "the same 5 groups of 128 per row do not fit 4.26 bits (4.5 groups would: 4.25 bits)"),
        (short, "randn(4, 96) * 0.05", 4.5, (("int4", 32), ("int4", 64), ("int4", 128)),
         "96 columns: 2 groups of 64 per row (4.67 bits, over) and 1 short group of 128 (4.33 bits)"),
        (q4_64, "every 64 weights of a row on their own 16-level grid (like Q4_1, with blocks of 64)", 16.0, ALL,
         "groups of 64 find the weights' own grid and lose nothing: less error than INT8, with fewer bits"),
        (q4_64, "every 64 weights of a row on their own 16-level grid (like Q4_1, with blocks of 64)", 5.0, ALL,
         "groups of 32 cost more bytes than groups of 64 here and fit worse: half a block sees another grid"),
        (one_off, "every 32 weights of a row on their own grid (Q4_1), except row 0's first 32", 16.0, ALL,
         "the error that counts is over the whole matrix: g32 misses in one group only, INT8 a little "
         "everywhere (INT8's worst single weight is closer, but that is not the measure)"),
        (six_off, "the same Q4_1 grids, with 6 groups of 32 off their grid", 16.0, ALL,
         "INT8 errs a little on every weight, g32 a lot in 6 groups: the relative error ||W' - W|| / ||W|| (the "
         "lab's measure) is lower for INT8, the mean |error| for g32"),
        (large_row_off, "the same grids, row 0's first group off its grid and row 0 x 30", 16.0, ALL,
         "INT8 has the lower relative error over the matrix; g32 errs only in the large row, so its mean |error| "
         "and the mean of the rows' own relative errors are lower: neither is the lab's measure"),
        (one_grid, "every row on one 16-level grid, every 32 weights spanning it", 5.0,
         (("int4", 32), ("int4", 64), ("int4", 128)),
         "every group size finds the same grid, error 0 for all three: a tie goes to the fewest bytes"),
        (one_grid, "every row on one 16-level grid, every 32 weights spanning it", 5.0,
         (("int4", 128), ("int4", 64), ("int4", 32)),
         "the same tie with the candidates in the other order: still the fewest bytes"),
        (gaussian, "randn(8, 128) * 0.05", 4.3, (("int4", 256), ("int4", 128)),
         "128 columns hold one group of 128, and one short group of 256, stored whole: the same bytes and the "
         "same error, so the earlier candidate wins"),
        (gaussian, "randn(8, 128) * 0.05", 4.3, (("int4", 128), ("int4", 256)),
         "the same two in the other order: equal errors and equal bytes go to the earlier candidate"),
    ]
    cases = []
    for w, what, budget, candidates, why in plan:
        costs = [(c, *engine_format_cost(w, *c)) for c in candidates]
        table = ", ".join(f"{_name(c)} {8 * b / w.numel():.3f} bits error {e:.4f}" for c, b, e in costs)
        show = (f"w = {what}, budget_bits = {budget}, candidates = {list(candidates)}\n"
                f"    (why this case: {why})\n    the engine stores: {table}")
        cases.append(Case((w, budget, list(candidates)), reference_choose_format(w, budget, candidates), show))
    return cases


def _same_choice(got, expected) -> bool:
    """The same candidate (a tuple or a list with the same two items), or both None."""
    if expected is None or got is None:
        return got is None and expected is None
    return isinstance(got, (tuple, list)) and len(got) == 2 and tuple(got) == tuple(expected)


def check_choose_format(choose_format) -> bool:
    """choose_format(w, budget_bits, candidates) -> the (method, group_size) with the lowest
    relative error whose bytes, as the engine stores them, fit budget_bits per weight
    (ties to fewer bytes, None when nothing fits); against the engine's layers and byte
    counts (tinyinfer.quant.model_bytes) on cases where the answer flips with the budget."""
    return run_check("choose_format", choose_format, _choose_cases, same=_same_choice,
                     forbidden=(reference_choose_format, engine_format_cost))


LAB = Lab(6, "quantization",
          exports=("check_quantize_int4", "check_choose_format", "reference_quantize_int4",
                   "reference_choose_format", "engine_format_cost"),
          fallbacks={"check_quantize_int4": reference_quantize_int4, "check_choose_format": reference_choose_format})
