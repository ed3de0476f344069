"""The mixture-of-experts layer and its formula (chapter 7)."""
import random

import pytest
import torch

from tinyinfer_course.analysis.hardware import Roofline, critical_batch
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


H100 = Roofline(989e12, 3.35e12)
MIXTRAL = MoEShape("Mixtral 8x7B", 8, 2, swiglu_expert_params(32, 4096, 14336),
                   32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096) + 2 * 32000 * 4096)
V3_EXPERT = swiglu_expert_params(58, 7168, 2048)
DEEPSEEK_V3 = MoEShape("DeepSeek-V3", 256, 8, V3_EXPERT, 671e9 - 256 * V3_EXPERT)


def test_each_expert_reaches_the_ridge_when_its_share_of_the_batch_does():
    """B x k / E tokens per expert against the ridge (295.22 FLOP/byte, 2 bytes per
    weight): Mixtral 295.22 x 8 / 2 = 1,180.9 -> 1,181; DeepSeek-V3 x 256 / 8 =
    9,447.2 -> 9,448 (the review's 9,447 rounds the ridge to 295.2 first)."""
    assert MIXTRAL.expert_critical_batch(H100) == 1181
    assert DEEPSEEK_V3.expert_critical_batch(H100) == 9448
    for shape in (MIXTRAL, DEEPSEEK_V3):
        b = shape.expert_critical_batch(H100)
        assert shape.decode_step_time(H100, b - 1).experts.bound == "memory"
        assert shape.decode_step_time(H100, b).experts.bound == "compute"
        # the whole step's aggregate reaches the ridge much sooner: only a loose lower bound
        assert critical_batch(shape.decode_cost, H100) < b
    assert critical_batch(MIXTRAL.decode_cost, H100) == 1071 and critical_batch(DEEPSEEK_V3.decode_cost, H100) == 5279


def test_deepseek_v3_at_the_aggregate_critical_batch_by_hand():
    """At B = 5,279 each expert sees 165 tokens: still memory-bound. Routed experts:
    256 x 2.554e9 x 2 B / 3.35e12 = 390.4 ms; shared weights (671e9 - 653.91e9 =
    17.09e9), compute-bound: 2 x 17.09e9 x 5,279 / 989e12 = 182.5 ms. Step 572.9 ms
    (the review's 572 ms, from 17.07e9), where the aggregate says 400 ms."""
    assert DEEPSEEK_V3.shared_params == pytest.approx(17.09e9, rel=1e-3)
    step = DEEPSEEK_V3.decode_step_time(H100, 5279)
    assert step.experts.bound == "memory" and step.weights.bound == "compute"
    assert step.experts.memory_s == pytest.approx(256 * V3_EXPERT * 2 / 3.35e12, rel=1e-6)
    assert step.experts.memory_s == pytest.approx(0.3904, rel=1e-3)
    assert step.weights.compute_s == pytest.approx(0.1825, rel=1e-3)
    assert step.total == pytest.approx(0.5729, rel=1e-3)
    assert DEEPSEEK_V3.decode_cost(5279).time(H100) == pytest.approx(0.4006, rel=1e-3)
    assert DEEPSEEK_V3.expert_cost(5279).intensity == pytest.approx(5279 * 8 / 256, rel=1e-6)  # 165 tokens each


def test_moe_step_time_at_batch_one_reads_the_active_weights():
    step = MIXTRAL.decode_step_time(H100, 1)
    assert step.weights.memory_s + step.experts.memory_s == pytest.approx(MIXTRAL.active_params * 2 / 3.35e12)
    assert step.total == pytest.approx(MIXTRAL.decode_cost(1).time(H100))  # all memory-bound: the two agree
    with pytest.raises(ValueError, match="batch"):
        MIXTRAL.decode_step_time(H100, 0)


# --- a skewed router: the busiest expert and the busiest device ------------------------

def test_zipf_popularity_expert_and_device_loads_by_hand():
    """Four experts, exponent 1: shares 1, 1/2, 1/3, 1/4 over 25/12, i.e. 12/25, 6/25,
    4/25, 3/25. 100 tokens at top-1: 48, 24, 16, 12 tokens. Dealt over 2 devices (ranks
    1 and 3 on one, 2 and 4 on the other): 64 and 36, so the busiest has 1.28 x the mean 50."""
    from tinyinfer_course.analysis.moe import device_loads, expert_loads, zipf_popularity
    share = zipf_popularity(4, 1.0)
    assert share == pytest.approx([0.48, 0.24, 0.16, 0.12])
    assert zipf_popularity(8, 0.0) == pytest.approx([1 / 8] * 8)  # exponent 0: the uniform router
    loads = expert_loads(100, 1, share)
    assert loads == pytest.approx([48, 24, 16, 12])
    assert device_loads(loads, 2) == pytest.approx([64, 36])
    assert expert_loads(100, 2, zipf_popularity(8, 0.5)).sum() == pytest.approx(200)  # every choice lands
    with pytest.raises(ValueError, match="choose one expert twice"):
        expert_loads(100, 4, share)  # 4 x 0.48 > 1
    with pytest.raises(ValueError, match="ep"):
        device_loads(loads, 3)
