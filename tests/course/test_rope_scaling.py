"""tinyinfer_course.analysis.rope_scaling: wavelengths of the rotary pairs and the three ways
to stretch them, checked by hand and against transformers' own "llama3" rope."""
from __future__ import annotations

import math

import pytest

from tinyinfer_course.analysis import rope_scaling as rs


def test_wavelengths_by_hand():
    # theta 10,000, d = 4: pairs turn by p and by p / 100, so 2 pi and 200 pi positions per turn.
    lam = rs.wavelengths(10_000, 4)
    assert lam == pytest.approx([2 * math.pi, 200 * math.pi])


def test_wavelengths_match_the_engine_tables():
    import torch

    from tinyinfer.config import ModelConfig
    from tinyinfer.model import rope_tables

    c = ModelConfig(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=1, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=4, rope_theta=10_000.0)
    cos, _ = rope_tables(c)
    lam = rs.wavelengths(10_000, 16)
    # position 1's angle in pair i is 2 pi / wavelength_i
    assert torch.allclose(cos[1, :8].double(), torch.tensor([math.cos(2 * math.pi / x) for x in lam]).double(),
                          atol=1e-6)


def test_interpolation_stretches_every_wave():
    assert rs.interpolated([2.0, 10.0], 4) == [8.0, 40.0]


def test_ntk_stretches_the_slowest_pair_by_s_and_keeps_the_fastest():
    # Llama 3.1 8B: theta 500,000, head dim 128, factor 8. theta' = 500,000 x 8**(128/126) = 4.13 million.
    before, theta = rs.wavelengths(500_000, 128), rs.ntk_theta(500_000, 128, 8)
    after = rs.wavelengths(theta, 128)
    assert theta == pytest.approx(4_134_231, rel=1e-6)
    assert after[-1] / before[-1] == pytest.approx(8)
    assert after[0] == pytest.approx(before[0])


def test_by_parts_keeps_fast_waves_and_stretches_slow_ones():
    # window 100, s = 10, alpha 1, beta 4: r = 100 / wavelength.
    # wavelength 10 (r = 10 > 4) kept; 200 (r = 0.5 < 1) x 10; 40 (r = 2.5, halfway) -> frequency
    # 0.5 x (1/40)/10 + 0.5 x 1/40 = 0.01375, wavelength 72.73.
    assert rs.by_parts([10.0, 200.0, 40.0], 100, 10, 1, 4) == pytest.approx([10.0, 2000.0, 1 / 0.01375])


def test_by_parts_is_transformers_llama3_rope():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = transformers.LlamaConfig(hidden_size=4096, num_attention_heads=32, head_dim=128, rope_theta=500_000.0,
                                   max_position_embeddings=131072,
                                   rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                     high_freq_factor=4.0, original_max_position_embeddings=8192))
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    ref = (2 * math.pi / inv_freq.double()).tolist()
    ours = rs.by_parts(rs.wavelengths(500_000, 128), 8192, 8, alpha=1, beta=4)
    assert ours == pytest.approx(ref, rel=1e-5)
    assert torch.is_tensor(inv_freq)


def test_yarn_temperature():
    assert rs.yarn_attention_scale(1) == 1
    assert rs.yarn_attention_scale(8) == pytest.approx(1 + 0.1 * math.log(8))  # 1.208
    with pytest.raises(ValueError):
        rs.yarn_attention_scale(0.5)


@pytest.mark.parametrize("head_dim", [0, 3])
def test_bad_head_dim(head_dim):
    with pytest.raises(ValueError, match="head_dim"):
        rs.wavelengths(10_000, head_dim)
