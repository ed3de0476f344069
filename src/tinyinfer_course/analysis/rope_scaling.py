"""Stretching a rotary (RoPE) window: how a model trained on L positions is
made to read s times as many.

RoPE turns pair i of every query and key by position x theta**(-2i/d)
(chapter 2). Each pair has a wavelength, the positions it takes to turn once:

    wavelength_i = 2 pi theta**(2i/d),  i = 0 .. d/2 - 1

Pairs whose wavelength is longer than the training window never turned once in
training, so positions past the window give them angles the model never saw.
The three published recipes change the wavelengths so that s x L positions land
on angles like the trained ones:

    position interpolation (Chen et al. 2023)  position / s: every wavelength x s
    NTK-aware scaling (bloc97, 2023)            theta' = theta x s**(d / (d - 2))
    YaRN (Peng et al. 2023)                     per band: short waves kept, long
                                                waves x s, a ramp between, and
                                                attention logits scaled up a little

    lam = wavelengths(500_000, 128)             # Llama 3.1 8B's pairs
    max(lam) / 8192                             # its longest wave over its trained window
"""
from __future__ import annotations

import math


def wavelengths(theta: float, head_dim: int) -> list[float]:
    """Positions per full turn of each of the head_dim / 2 rotated pairs, as the
    engine builds them (tinyinfer.model.rope_tables: angle = position x
    theta**(-2i/d))."""
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be an even number >= 2, got {head_dim!r}")
    if not theta > 1:
        raise ValueError(f"theta must be > 1, got {theta!r}")
    return [2 * math.pi * theta ** (2 * i / head_dim) for i in range(head_dim // 2)]


def interpolated(lams: list[float], factor: float) -> list[float]:
    """Position interpolation: dividing every position by s stretches every
    wavelength by s. The window is reached, but neighbouring tokens now differ
    by 1/s of a step in the fast pairs too, which is why it needs fine-tuning."""
    return [lam * factor for lam in lams]


def ntk_theta(theta: float, head_dim: int, factor: float) -> float:
    """NTK-aware scaling: a larger base, theta x s**(d / (d - 2)). The exponent
    is chosen so that the slowest pair (i = d/2 - 1) is stretched by exactly s,
    like interpolation, while pair 0 (wavelength 2 pi) is untouched: the
    stretch grows smoothly from fast pairs to slow ones."""
    return theta * factor ** (head_dim / (head_dim - 2))


def by_parts(lams: list[float], original_window: int, factor: float, alpha: float = 1.0,
             beta: float = 32.0) -> list[float]:
    """YaRN's per-band interpolation ("NTK-by-parts"). r = window / wavelength
    counts the turns a pair made inside the trained window. Pairs with r > beta
    turned many times and are kept; pairs with r < alpha never turned once and
    are interpolated (x s); in between the frequency is blended linearly in r.
    YaRN's paper uses alpha = 1, beta = 32 for Llama; Llama 3.1's "llama3"
    rope type is the same rule with alpha = low_freq_factor = 1 and
    beta = high_freq_factor = 4."""
    out = []
    for lam in lams:
        r = original_window / lam
        keep = min(1.0, max(0.0, (r - alpha) / (beta - alpha)))  # 0: interpolate, 1: keep
        freq = 1 / lam
        out.append(1 / ((1 - keep) * freq / factor + keep * freq))
    return out


def yarn_attention_scale(factor: float) -> float:
    """YaRN's temperature: queries and keys are each multiplied by
    sqrt(1/t) = 0.1 ln(s) + 1, so attention logits grow by its square. Longer
    contexts spread attention over more tokens; the sharper softmax keeps the
    distribution as peaked as in training (Peng et al. 2023)."""
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor!r}")
    return 0.1 * math.log(factor) + 1
