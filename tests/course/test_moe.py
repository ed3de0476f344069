"""The mixture-of-experts layer and its formula (chapter 7)."""
import random

import pytest
import torch

from tinyinfer_course.analysis.moe import MoELayer, MoEShape, expected_experts_touched, swiglu_expert_params


def test_expected_experts_touched_matches_a_simulation_of_uniform_routing():
    rng = random.Random(0)
    for tokens, experts, k in [(1, 8, 2), (4, 16, 2), (16, 64, 6), (64, 256, 8)]:
        trials = [len({e for _ in range(tokens) for e in rng.sample(range(experts), k)}) for _ in range(4000)]
        assert sum(trials) / len(trials) == pytest.approx(expected_experts_touched(tokens, experts, k), rel=0.02)
    assert expected_experts_touched(1, 8, 2) == 2 and expected_experts_touched(0, 8, 2) == 0
    assert expected_experts_touched(10_000, 8, 2) == pytest.approx(8)


def test_bad_routing_is_refused_by_name():
    with pytest.raises(ValueError, match="top_k"):
        expected_experts_touched(4, 8, 9)
    with pytest.raises(ValueError, match="num_experts"):
        MoELayer(8, 16, 0, 1)
    with pytest.raises(ValueError, match="num_tokens"):
        expected_experts_touched(-1, 8, 2)


def test_layer_equals_the_token_by_token_loop():
    torch.manual_seed(0)
    layer = MoELayer(hidden_size=64, intermediate_size=96, num_experts=8, top_k=2)
    for tokens in (1, 3, 40):
        x = torch.randn(tokens, 64)
        out, touched = layer(x)
        torch.testing.assert_close(out, layer.forward_token_by_token(x), rtol=1e-5, atol=1e-5)
        _, experts = layer.route(x)
        assert touched == sorted(set(experts.flatten().tolist()))
        assert len(touched) <= min(8, 2 * tokens)


def test_one_expert_of_one_is_a_dense_swiglu_mlp():
    torch.manual_seed(0)
    layer = MoELayer(32, 48, num_experts=1, top_k=1)
    x = torch.randn(5, 32)
    gate, up = (x @ layer.gate_up[0].T).chunk(2, dim=-1)
    torch.testing.assert_close(layer(x)[0], (torch.nn.functional.silu(gate) * up) @ layer.down[0].T)


def test_moe_decode_reads_the_active_experts_at_batch_one_and_all_of_them_at_a_large_batch():
    mixtral = MoEShape("Mixtral 8x7B", 8, 2, swiglu_expert_params(32, 4096, 14336), 1.6e9)
    assert mixtral.decode_cost(1).nbytes == pytest.approx(mixtral.active_params * 2)
    assert mixtral.decode_cost(10_000).nbytes == pytest.approx(mixtral.total_params * 2)
    assert mixtral.decode_cost(1).flops == 2 * mixtral.active_params
