"""tinyinfer_course.analysis.hardware: micro-benchmarks return sane units, the roofline and the
cost model obey their definitions, and the source's back-of-envelope numbers
come out. No test asserts a speed: machines differ and are shared."""
import math

import numpy as np
import pytest
import torch

from tinyinfer_course.analysis import hardware as hw
from tinyinfer.config import ModelConfig

SMOL = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                   num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                   tie_word_embeddings=True)
LLAMA3_70B = ModelConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                         num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                         max_position_embeddings=8192, tie_word_embeddings=False)
H100 = hw.Roofline(peak_flops=989e12, bandwidth=3.35e12, name="H100")


# --- micro-benchmarks: positive, finite, in the right unit (small sizes: fast) ----

def test_measure_bandwidth_returns_bytes_per_second():
    bw = hw.measure_bandwidth("cpu", nbytes=4 * 2**20, repeats=2)
    assert math.isfinite(bw) and 1e7 < bw < 1e13  # between 10 MB/s and 10 TB/s


def test_measure_matmul_flops_returns_flop_per_second():
    for dtype in (torch.float32, torch.bfloat16):
        flops = hw.measure_matmul_flops("cpu", dtype, n=128, repeats=2)
        assert math.isfinite(flops) and 1e6 < flops < 1e15


def test_best_time_takes_the_minimum(monkeypatch):
    clock = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])  # runs of 3, 1 and 2 seconds
    monkeypatch.setattr(hw.time, "perf_counter", lambda: next(clock))
    assert hw.best_time(lambda: None, torch.device("cpu"), repeats=3) == 1.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_measurements_on_cuda():
    assert hw.measure_bandwidth("cuda", nbytes=64 * 2**20, repeats=2) > 1e9
    assert hw.measure_matmul_flops("cuda", torch.bfloat16, n=1024, repeats=2) > 1e10


def test_roofline_measure_builds_a_named_roofline(monkeypatch):
    monkeypatch.setattr(hw, "measure_matmul_flops", lambda device, dtype: 100e9)
    monkeypatch.setattr(hw, "measure_bandwidth", lambda device: 25e9)
    roof = hw.Roofline.measure("cpu", torch.bfloat16)
    assert (roof.peak_flops, roof.bandwidth, roof.name) == (100e9, 25e9, "cpu bfloat16")


# --- the roofline ---------------------------------------------------------------

def test_ridge_point_and_attainable():
    roof = hw.Roofline(peak_flops=100e9, bandwidth=20e9)
    assert roof.ridge_point == 5.0
    assert roof.attainable(1.0) == 20e9  # on the slope: intensity x bandwidth
    assert type(roof.attainable(1.0)) is float
    assert roof.attainable(5.0) == 100e9  # the ridge: both limits meet
    assert roof.attainable(50.0) == 100e9  # under the flat roof
    curve = roof.attainable(np.logspace(-2, 3, 50))
    assert curve.shape == (50,) and np.all(np.diff(curve) >= 0) and curve.max() == 100e9
    assert roof.bound(1.0) == "memory" and roof.bound(50.0) == "compute"


def test_roofline_time_is_the_larger_of_the_two_limits():
    roof = hw.Roofline(peak_flops=100e9, bandwidth=20e9)
    assert roof.time(flops=100e9, nbytes=1e9) == 1.0  # compute-bound
    assert roof.time(flops=1e9, nbytes=40e9) == 2.0  # memory-bound


def test_print_friendly():
    text = str(H100)
    assert "989 TFLOP/s" in text and "3.35 TB/s" in text and "295.2 FLOP/byte" in text and repr(H100) == text
    assert hw.format_bandwidth(33.1e9) == "33.1 GB/s"
    assert hw.format_flops(250e9) == "250 GFLOP/s"
    assert hw.format_flops(2.25e15) == "2,250 TFLOP/s"
    assert "GFLOP" in str(hw.forward_cost(1e9))


# --- the source's back-of-envelope (Inference 101) --------------------------------

def test_70b_on_h100_is_42_ms_per_token_and_8_bit_halves_it():
    fp16 = hw.forward_cost(70e9, bytes_per_param=2)
    assert fp16.nbytes == 140e9 and fp16.flops == 140e9
    assert fp16.time(H100) == pytest.approx(0.0418, abs=5e-4)  # 140 GB / 3.35 TB/s
    assert 1 / fp16.time(H100) == pytest.approx(24, abs=0.5)  # tokens per second
    assert fp16.flops / H100.peak_flops == pytest.approx(1.4e-4, rel=0.02)  # "a tenth of a millisecond" of maths
    int8 = hw.forward_cost(70e9, bytes_per_param=1)
    assert int8.time(H100) == pytest.approx(fp16.time(H100) / 2)


def test_70b_kv_cache_is_320_kib_per_token():
    assert hw.kv_bytes_per_token(LLAMA3_70B, 2) == 320 * 1024
    assert LLAMA3_70B.num_parameters() == pytest.approx(70.6e9, rel=0.01)


# --- the cost model --------------------------------------------------------------

def test_plain_numbers_cost():
    cost = hw.forward_cost(1e9, batch=4, new_tokens=1, context=100, bytes_per_param=2, kv_token_bytes=1000)
    assert cost.flops == 2 * 1e9 * 4
    assert cost.nbytes == 2e9 + 4 * 101 * 1000  # weights once, then every sequence's cache
    assert cost.intensity == cost.flops / cost.nbytes


def test_config_cost_counts_weights_once_and_the_cache_per_sequence():
    one = hw.forward_cost(SMOL, batch=1, context=0, bytes_per_param=4)
    eight = hw.forward_cost(SMOL, batch=8, context=0, bytes_per_param=4)
    weight_bytes = SMOL.num_parameters() * 4  # tied: the embedding is the LM head, read once
    kv = hw.kv_bytes_per_token(SMOL, 4)
    assert kv == 2 * 30 * 3 * 64 * 4
    assert one.nbytes == weight_bytes + kv
    assert eight.nbytes == weight_bytes + 8 * kv
    assert eight.flops == pytest.approx(8 * one.flops)
    assert eight.intensity > 7 * one.intensity  # batching shares the weights


def test_decode_flops_are_about_two_per_parameter():
    cost = hw.forward_cost(LLAMA3_70B, batch=1, context=0)
    assert cost.flops == pytest.approx(2 * LLAMA3_70B.num_parameters(), rel=0.03)
    # untied: the input embedding is only looked up, so its bytes are not all read
    head = LLAMA3_70B.vocab_size * LLAMA3_70B.hidden_size
    written = hw.kv_bytes_per_token(LLAMA3_70B, 2)  # the new token's key and value
    assert cost.nbytes == (LLAMA3_70B.num_parameters() - head) * 2 + written


def test_cost_grows_with_context_batch_and_prompt():
    costs = [hw.forward_cost(SMOL, batch=1, context=c) for c in (0, 512, 4096)]
    assert costs[0].nbytes < costs[1].nbytes < costs[2].nbytes
    assert costs[0].flops < costs[1].flops < costs[2].flops  # attention reads more keys
    prefill = [hw.forward_cost(SMOL, new_tokens=t) for t in (1, 16, 256)]
    intensities = [c.intensity for c in prefill]
    assert intensities == sorted(intensities) and intensities[-1] > 100 * intensities[0] / 2


def test_prefill_attention_is_causal():
    # T new tokens on an empty cache see 1 + 2 + ... + T keys, not T * T
    c = SMOL
    per_pair = 4 * c.head_dim * c.num_attention_heads * c.num_hidden_layers
    t = 10
    with_attn = hw.forward_cost(c, new_tokens=t).flops
    body = c.num_parameters() - c.vocab_size * c.hidden_size
    no_attn = 2 * body * t + 2 * c.vocab_size * c.hidden_size
    assert with_attn - no_attn == pytest.approx(per_pair * t * (t + 1) / 2)


def test_decode_step_time_takes_each_operation_on_its_own_roofline():
    roof = hw.Roofline(peak_flops=200e9, bandwidth=30e9)
    # batch-1 decode of SmolLM2 in fp32: the products wait for the weights, attention for the cache
    step = hw.decode_step_time(SMOL, roof, batch=1, context=256, bytes_per_param=4)
    weight_bytes = SMOL.num_parameters() * 4  # tied: the embedding is the LM head
    assert step.weights.memory_s == weight_bytes / 30e9 and step.weights.bound == "memory"
    assert step.weights.compute_s == pytest.approx(2 * SMOL.num_parameters() / 200e9)
    assert step.attention.memory_s == pytest.approx(257 * hw.kv_bytes_per_token(SMOL, 4) / 30e9)
    assert step.attention.bound == "memory" and step.experts.seconds == 0
    assert step.total == step.weights.seconds + step.attention.seconds
    # the two operations together hold the whole step's FLOPs and bytes, as forward_cost counts them
    cost = hw.forward_cost(SMOL, 1, 1, 256, bytes_per_param=4)
    assert (step.weights.compute_s + step.attention.compute_s) * 200e9 == pytest.approx(cost.flops)
    assert (step.weights.memory_s + step.attention.memory_s) * 30e9 == pytest.approx(cost.nbytes)
    # time per step never falls as the batch grows
    times = [hw.decode_step_time(SMOL, roof, batch=b, context=512, bytes_per_param=4).total for b in (1, 2, 4, 8, 64)]
    assert times == sorted(times)
    assert "weights" in str(step) and "attention" in str(step) and repr(step) == str(step)


def test_decode_step_time_70b_at_batch_965_by_hand():
    """The review's example: Llama 3 70B's shape on one H100, batch 965, context 1,024.
    Products: 2 x 69.50e9 x 965 / 989e12 = 135.63 ms, compute-bound (the weights
    take 41.50 ms to read). Attention: 965 x 1,025 x 327,680 B / 3.35e12 = 96.75 ms
    of reads; its 2.62 ms of arithmetic hide under them. Step: 232.4 ms, where the
    aggregate max(FLOPs, bytes) says 138.3 ms. (The review's 235 ms adds the 2.62 ms
    of attention arithmetic on top of its reads.)"""
    step = hw.decode_step_time(LLAMA3_70B, H100, batch=965, context=1024)
    read = LLAMA3_70B.num_parameters() - LLAMA3_70B.vocab_size * LLAMA3_70B.hidden_size  # untied embedding
    assert read == pytest.approx(69.50e9, rel=1e-3)
    assert step.weights.compute_s == pytest.approx(2 * read * 965 / 989e12) == pytest.approx(0.13563, rel=1e-4)
    assert step.weights.bound == "compute" and step.weights.memory_s == pytest.approx(0.04150, rel=1e-3)
    assert step.attention.memory_s == pytest.approx(965 * 1025 * 327680 / 3.35e12) == pytest.approx(0.09675, rel=1e-4)
    assert step.attention.compute_s == pytest.approx(0.002622, rel=1e-3) and step.attention.bound == "memory"
    assert step.total == pytest.approx(0.2324, rel=1e-3)
    assert step.total + step.attention.compute_s == pytest.approx(0.2350, rel=1e-3)
    assert hw.forward_cost(LLAMA3_70B, 965, context=1024).time(H100) == pytest.approx(0.1383, rel=1e-3)


def test_decode_step_time_eight_h100s_at_batch_324_by_hand():
    """Chapter 7's problem 1: 8 H100s as one chip, batch 324, context 4,096. Products
    5.69 ms of arithmetic against 5.19 ms of reads: compute-bound. Cache 16.23 ms.
    Step 21.9 ms (the aggregate said 21.4 ms, memory-bound)."""
    server = hw.Roofline(8 * 989e12, 8 * 3.35e12)
    step = hw.decode_step_time(LLAMA3_70B, server, batch=324, context=4096)
    assert step.weights.bound == "compute"
    assert step.weights.compute_s == pytest.approx(5.69e-3, abs=5e-6)
    assert step.weights.memory_s == pytest.approx(5.19e-3, abs=5e-6)
    assert step.attention.memory_s == pytest.approx(16.23e-3, abs=5e-6)
    assert step.total == pytest.approx(21.92e-3, abs=5e-6)
    assert hw.forward_cost(LLAMA3_70B, 324, context=4096).time(server) == pytest.approx(21.4e-3, abs=5e-5)


def test_the_products_critical_batch_does_not_move_with_the_context():
    closed = hw.weights_critical_batch(H100, bytes_per_param=2)
    assert closed == 296 == math.ceil(989 / 3.35)  # ridge x 2 bytes / 2
    for context in (0, 1024, 8192, 32768):
        bound = [hw.decode_step_time(LLAMA3_70B, H100, b, context).weights.bound for b in (closed - 1, closed)]
        assert bound == ["memory", "compute"], context
    # 8-bit weights with 16-bit arithmetic (W8A16) halve it; FP8 arithmetic doubles the peak too
    assert hw.weights_critical_batch(H100, bytes_per_param=1) == 148
    fp8 = hw.Roofline(1979e12, 3.35e12)
    assert hw.weights_critical_batch(fp8, bytes_per_param=1) == 296
    assert fp8.ridge_point / 2 == pytest.approx(295.4, abs=0.05)


def test_decode_step_time_of_a_parameter_count_is_the_weights_roofline():
    for batch, new_tokens in [(1, 1), (8, 1), (1000, 1), (1, 2000)]:
        step = hw.decode_step_time(70e9, H100, batch, new_tokens=new_tokens)
        assert step.total == pytest.approx(hw.forward_cost(70e9, batch, new_tokens).time(H100))
    # with a cache given per token, the cache is its own memory-bound term
    step = hw.decode_step_time(70e9, H100, 500, 1000, kv_token_bytes=327680)
    assert step.total == pytest.approx(2 * 70e9 * 500 / 989e12 + 500 * 1001 * 327680 / 3.35e12)
    for bad in ({"batch": 0}, {"context": -1}, {"new_tokens": 0}, {"batch": 2.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            hw.decode_step_time(70e9, H100, **bad)


def test_largest_batch_within_a_step_target_is_one_division():
    server = hw.Roofline(8 * 989e12, 8 * 3.35e12)

    def search(target, context):
        b = 0
        while hw.decode_step_time(LLAMA3_70B, server, b + 1, context).total <= target:
            b += 1
        return b

    for target, context in [(0.015, 2048), (0.008, 2048), (0.040, 512), (0.0052, 100)]:
        assert hw.largest_batch_within(target, LLAMA3_70B, server, context) == search(target, context)
    # 15 ms at 2,048 tokens: past B* = 296, each sequence adds its cache and its arithmetic
    one = hw.decode_step_time(LLAMA3_70B, server, 1, 2048)
    assert hw.largest_batch_within(0.015, LLAMA3_70B, server, 2048) == \
        math.floor(0.015 / (one.attention.seconds + one.weights.compute_s)) == 351
    assert hw.largest_batch_within(0.001, LLAMA3_70B, server, 2048) == 0  # the weights alone take 5.2 ms


# --- a single matrix product -------------------------------------------------------

def test_matmul_intensity():
    assert hw.matmul_flops(2, 3, 4) == 48
    assert hw.matmul_bytes(2, 3, 4, 2) == (8 + 12 + 6) * 2
    # matrix-vector: about 2 / bytes_per_value, whatever the size
    for b in (1, 2, 4):
        assert hw.arithmetic_intensity(1, 4096, 4096, b) == pytest.approx(2 / b, rel=1e-3)
    # square matrix-matrix: 2n / (3 * bytes_per_value)
    assert hw.arithmetic_intensity(4096, 4096, 4096, 2) == pytest.approx(2 * 4096 / 6)


# --- tensor parallelism: the one cost model the book uses (hand-computed values) ----

NVLINK = hw.Link("test link", bandwidth=450e9, latency=3e-6)


def test_allreduce_time_is_a_ring_by_hand():
    assert hw.allreduce_time(16384, 1, NVLINK) == 0.0
    # 2 GPUs: 2 steps of (3 us + 8192 B / 450 GB/s) = 2 * (3e-6 + 18.204e-9)
    assert hw.allreduce_time(16384, 2, NVLINK) == pytest.approx(6.03641e-6, rel=1e-5)
    # 8 GPUs: 14 steps of (3 us + 2048 B / 450 GB/s) = 14 * 3.0045511e-6
    assert hw.allreduce_time(16384, 8, NVLINK) == pytest.approx(42.06372e-6, rel=1e-5)
    with pytest.raises(ValueError, match="n=0"):
        hw.allreduce_time(16384, 0, NVLINK)


def test_tensor_parallel_step_70b_on_eight_h100s_by_hand():
    """The 70B example of chapters 8 and 9 and the misconceptions page: 140 GB of
    weights over 8 GPUs at 3.35 TB/s is 41.791 ms / 8 = 5.2239 ms of reading; 160
    all-reduces of one 16-bit 8192-vector, 42.0637 us each, add 6.7302 ms."""
    step = hw.tensor_parallel_step(70e9, 80, 8192, 8, NVLINK, H100)
    assert step.compute == pytest.approx(5.22388e-3, rel=1e-5)
    assert step.communication == pytest.approx(6.73020e-3, rel=1e-5)
    assert step.total == pytest.approx(11.95408e-3, rel=1e-5)
    one = hw.tensor_parallel_step(70e9, 80, 8192, 1, NVLINK, H100)
    assert one.communication == 0 and one.total == pytest.approx(41.791e-3, rel=1e-4)


def test_tensor_parallel_step_prefill_is_compute_bound_and_messages_grow():
    """A 2,000-token prefill: 2 x 70e9 x 2000 FLOPs / 989 TFLOP/s = 283.12 ms on
    one GPU, 70.78 ms each on 4; each all-reduce sums 2000 x 8192 x 2 bytes."""
    step = hw.tensor_parallel_step(70e9, 80, 8192, 4, NVLINK, H100, new_tokens=2000)
    assert step.compute == pytest.approx(2 * 70e9 * 2000 / 989e12 / 4, rel=1e-9)
    ring = 6 * (3e-6 + 2000 * 8192 * 2 / 4 / 450e9)
    assert step.communication == pytest.approx(160 * ring, rel=1e-9)


def test_datasheet_chips_run_through_the_roofline():
    """Decode of 140 GB at batch 1 is bandwidth-bound on every chip listed."""
    for chip in hw.CHIPS.values():
        assert chip.name in hw.CHIP_SOURCES
        t = hw.forward_cost(70e9, bytes_per_param=2).time(chip.roofline)
        assert t == pytest.approx(140e9 / chip.roofline.bandwidth, rel=1e-9)
    assert hw.CHIPS["H200 SXM"].roofline.bandwidth == 4.8e12


# --- MFU and MBU: how close a measured step came to the chip's peaks -----------------

def test_mfu_and_mbu_by_hand():
    """A 7B model in 16 bits, batch-1 decode in 20 ms on an H100: 2 x 7e9 = 1.4e10 FLOPs
    in 0.02 s is 7e11 FLOP/s, 7e11 / 989e12 = 0.070779% of the peak; the 1.4e10 bytes of
    weights in 0.02 s are 7e11 B/s, 7e11 / 3.35e12 = 20.896% of the bandwidth."""
    assert hw.mfu(2 * 7e9, 0.02, 989e12) == pytest.approx(7.0779e-4, rel=1e-4)
    assert hw.mbu(2 * 7e9, 0.02, 3.35e12) == pytest.approx(0.208955, rel=1e-5)
    both = hw.utilisation(hw.forward_cost(7e9), 0.02, H100)
    assert (both.mfu, both.mbu) == (pytest.approx(7.0779e-4, rel=1e-4), pytest.approx(0.208955, rel=1e-5))
    assert str(both) == "MFU 0.07%, MBU 20.9%"
    with pytest.raises(ValueError, match="seconds"):
        hw.mbu(1e9, 0.0, 3.35e12)


def test_a_step_on_the_roofline_has_its_bound_utilisation_at_one():
    """On the roofline the binding resource is used in full, and MFU / MBU is the
    intensity over the ridge: 140 GB at batch 1 takes 41.791 ms, MBU 1, MFU
    1.4e11 / 0.041791 / 989e12 = 0.33873% (= 1 FLOP/byte x 3.35 / 989)."""
    decode = hw.forward_cost(70e9)
    u = hw.utilisation(decode, decode.time(H100), H100)
    assert u.mbu == pytest.approx(1.0) and u.mfu == pytest.approx(3.3873e-3, rel=1e-4)
    prefill = hw.forward_cost(70e9, new_tokens=2000)
    u = hw.utilisation(prefill, prefill.time(H100), H100)
    assert u.mfu == pytest.approx(1.0) and u.mbu == pytest.approx(H100.ridge_point / prefill.intensity)  # 0.148
    slower = hw.utilisation(decode, 2 * decode.time(H100), H100)  # half the speed: half of both
    assert slower.mbu == pytest.approx(0.5)
    assert slower.mfu / slower.mbu == pytest.approx(decode.intensity / H100.ridge_point)


# --- expert parallelism: the all-to-all ----------------------------------------------

def test_all_to_all_bytes_and_time_by_hand():
    """8 tokens on a device, top-8, hidden 7,168, 16-bit, EP = 32: 8 x 8 x 7168 x 2 =
    917,504 bytes of copies, 31/32 of them leave the device: 888,832 bytes. Across the
    network between 8-GPU servers only 24/32 do: 688,128 bytes, 55.05 us at 12.5 GB/s;
    with 20 us of latency, dispatch and combine take 2 x 75.05 = 150.10 us."""
    assert hw.all_to_all_bytes(8, 8, 7168, 32) == pytest.approx(888_832)
    assert hw.all_to_all_bytes(8, 8, 7168, 32, local=8) == pytest.approx(688_128)
    network = hw.Link("test network", bandwidth=12.5e9, latency=20e-6)
    assert hw.all_to_all_time(8, 8, 7168, 32, network, local=8) == pytest.approx(150.1005e-6, rel=1e-6)
    assert hw.all_to_all_time(8, 8, 7168, 32, NVLINK) == pytest.approx(2 * (3e-6 + 888_832 / 450e9), rel=1e-9)
    assert hw.all_to_all_time(8, 8, 7168, 1, NVLINK) == 0.0  # one device: no exchange
    with pytest.raises(ValueError, match="local"):
        hw.all_to_all_bytes(8, 8, 7168, 4, local=8)
