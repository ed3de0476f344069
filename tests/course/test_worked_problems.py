"""The helpers the chapters' worked problems compute with (issue 48): when a
decode step turns compute-bound, attention's own intensity, pipeline
parallelism, sliding-window and MLA caches, and a cost model from a datasheet."""
import math

import pytest

from tinyinfer_course.analysis import hardware, memory
from tinyinfer.config import ModelConfig
from tinyinfer_course.fleet.cost import roofline_cost_model

H100 = hardware.CHIPS["H100 SXM"].roofline
LLAMA_70B = ModelConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                        num_attention_heads=64, num_key_value_heads=8, head_dim=128, max_position_embeddings=8192)


def test_critical_batch_is_the_ridge_point_for_weights_alone():
    # 2 FLOPs per parameter per sequence over 2 bytes per parameter: intensity = batch
    b = hardware.critical_batch(lambda n: hardware.forward_cost(70e9, batch=n), H100)
    assert b == math.ceil(H100.ridge_point)
    assert hardware.forward_cost(70e9, batch=b - 1).intensity < H100.ridge_point <= \
        hardware.forward_cost(70e9, batch=b).intensity


def test_critical_batch_is_none_when_the_kv_cache_caps_the_intensity():
    short = hardware.critical_batch(lambda n: hardware.forward_cost(LLAMA_70B, batch=n, context=512), H100)
    assert short is not None and short > math.ceil(H100.ridge_point)  # the cache's bytes push it up
    assert hardware.critical_batch(lambda n: hardware.forward_cost(LLAMA_70B, batch=n, context=8192), H100) is None
    with pytest.raises(ValueError, match="max_batch"):
        hardware.critical_batch(lambda n: hardware.forward_cost(70e9, batch=n), H100, max_batch=0)


def test_decode_attention_intensity_is_twice_the_group_size_over_bytes_whatever_the_batch():
    for batch, context in [(1, 100), (64, 4096), (512, 32000)]:
        cost = hardware.decode_attention_cost(LLAMA_70B, batch, context, kv_bytes_per_value=2)
        assert cost.intensity == pytest.approx(2 * 8 / 2)
    mha = ModelConfig(**{**LLAMA_70B.__dict__, "num_key_value_heads": 64})
    assert hardware.decode_attention_cost(mha, 256, 8192).intensity == pytest.approx(1.0)


def test_decode_attention_cost_is_forward_costs_attention_part():
    full, none = (hardware.forward_cost(LLAMA_70B, batch=4, context=c) for c in (1000, 0))
    att, att0 = (hardware.decode_attention_cost(LLAMA_70B, 4, c) for c in (1000, 0))
    assert full.flops - none.flops == pytest.approx(att.flops - att0.flops)
    assert full.nbytes - none.nbytes == pytest.approx(att.nbytes - att0.nbytes)


def test_pipeline_step_saves_no_latency_and_sends_one_message_per_stage():
    link = hardware.LINKS["nvlink"]
    one = hardware.pipeline_parallel_step(70e9, 8192, 1, link, H100)
    four = hardware.pipeline_parallel_step(70e9, 8192, 4, link, H100, batch=8)
    assert one.hop == 0 and one.latency == pytest.approx(one.stage)
    assert four.stage == pytest.approx(hardware.forward_cost(70e9, batch=8).time(H100) / 4)
    assert four.hop == pytest.approx(link.latency + 8 * 8192 * 2 / link.bandwidth)
    assert four.latency == pytest.approx(4 * four.stage + 3 * four.hop)
    assert four.latency > hardware.forward_cost(70e9, batch=8).time(H100)
    with pytest.raises(ValueError, match="n=0"):
        hardware.pipeline_parallel_step(70e9, 8192, 0, link, H100)


def test_sliding_window_stops_the_cache_growing():
    full = memory.kv_cache_bytes(32768, 32, 8, 128)
    assert full == 32768 * memory.kv_bytes_per_token(32, 8, 128)
    assert memory.kv_cache_bytes(32768, 32, 8, 128, sliding_window=4096) == full / 8
    assert memory.kv_cache_bytes(1000, 32, 8, 128, sliding_window=4096) == memory.kv_cache_bytes(1000, 32, 8, 128)
    half = memory.kv_cache_bytes(32768, 32, 8, 128, sliding_window=4096, sliding_layers=16)
    assert half == (full + full / 8) / 2
    with pytest.raises(ValueError, match="sliding_layers"):
        memory.kv_cache_bytes(10, 32, 8, 128, sliding_window=4, sliding_layers=33)


def test_mla_caches_one_latent_and_one_rope_key_per_layer():
    assert memory.mla_kv_bytes_per_token(61, 512, 64, 2) == 61 * 576 * 2
    with pytest.raises(ValueError, match="kv_lora_rank"):
        memory.mla_kv_bytes_per_token(61, 0, 64)


def test_roofline_cost_model_reads_the_weights_once_per_step():
    kv = memory.kv_bytes_per_token(80, 8, 128)
    m = roofline_cost_model(70e9, H100, kv_bytes_per_token=kv)
    assert m.decode_base_s == pytest.approx(140e9 / H100.bandwidth)
    assert m.prefill_s_per_token == pytest.approx(140e9 / H100.peak_flops)
    assert m.step_time(decode_seqs=1, context_tokens=1000) == pytest.approx(
        (140e9 + 1000 * kv) / H100.bandwidth + 140e9 / H100.peak_flops)
    with pytest.raises(ValueError, match="params"):
        roofline_cost_model(0, H100)


def test_mla_decode_attention_is_near_the_ridge():
    """DeepSeek-V3 with absorbed projections: 128 heads share one cached vector of
    512 + 64 numbers. Per cached token and layer, 128 x (2 x 576 + 2 x 512) = 278,528
    FLOPs over 576 x 2 = 1,152 bytes: 241.8 FLOP/byte, whatever the batch or context."""
    for batch, context in [(1, 0), (1, 8192), (64, 32768)]:
        cost = hardware.mla_decode_attention_cost(128, 512, 64, 61, batch, context)
        assert cost.intensity == pytest.approx(278528 / 1152) == pytest.approx(241.78, abs=0.01)
        assert cost.nbytes == batch * (context + 1) * memory.mla_kv_bytes_per_token(61, 512, 64, 2)
    assert hardware.mla_decode_attention_cost(128, 512, 64, 61).intensity < H100.ridge_point
    assert hardware.decode_attention_cost(LLAMA_70B, 1, 8192).intensity == pytest.approx(8.0)


@pytest.mark.parametrize("p, m, flushed, steady", [(4, 1, 3 / 4, 3 / 4), (4, 4, 3 / 7, 0.0), (4, 32, 3 / 35, 0.0),
                                                  (4, 2, 3 / 5, 1 / 2), (1, 1, 0.0, 0.0), (8, 6, 7 / 13, 1 / 4)])
def test_pipeline_bubble_of_one_flushed_pass_and_of_steady_decode(p, m, flushed, steady):
    """Chapter 8's table: with 4 stages, one flushed pass of 1, 4 or 32 micro-batches
    idles 75%, 43% and 9%; continuous decode with that many in flight idles 75%, 0%, 0%."""
    assert hardware.pipeline_bubble(p, m) == pytest.approx(flushed)
    assert hardware.pipeline_bubble_steady(p, m) == pytest.approx(steady)
    with pytest.raises(ValueError, match="micro_batches"):
        hardware.pipeline_bubble_steady(p, 0)
