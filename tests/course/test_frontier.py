"""tinyinfer_course.analysis.frontier: the cost and speed of a serving point, the
tensor-parallel step with its cache, what fits, and the Pareto frontier (chapter 8)."""
import pytest

from tinyinfer.config import ModelConfig
from tinyinfer_course.analysis import frontier as fr
from tinyinfer_course.analysis import hardware as hw

LLAMA3_70B = ModelConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                         num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                         max_position_embeddings=8192, tie_word_embeddings=False)
H100 = hw.CHIPS["H100 SXM"]
NVLINK = hw.LINKS["nvlink"]


def test_serving_point_speed_and_cost_per_million_tokens():
    p = fr.ServingPoint(chips=8, batch=64, step_s=0.02, price_per_chip_hour=2.5)
    assert p.tokens_per_s_per_user == pytest.approx(50)
    assert p.tokens_per_s == pytest.approx(3200)
    # 8 chips x 0.02 s / 64 tokens = 2.5 ms of chip time a token, 2,500 s a million
    assert p.chip_seconds_per_million == pytest.approx(2500)
    # the formula: GPUs x price / (batch x tokens/s per user x 3,600) x 1e6
    # = 8 x 2.5 / (64 x 50 x 3,600) x 1e6 = 20 / 11,520,000 x 1e6 = $1.736
    assert p.cost_per_million == pytest.approx(1.7361, abs=1e-4)
    assert fr.ServingPoint(4, 64, 0.02, 2.5).cost_per_million == pytest.approx(p.cost_per_million / 2)


def test_tp_step_is_each_chips_share_plus_two_allreduces_per_layer():
    one = hw.decode_step_time(LLAMA3_70B, H100.roofline, 1, 0).total
    assert fr.tp_decode_step_time(LLAMA3_70B, H100.roofline, 1, NVLINK) == pytest.approx(one)  # no all-reduce
    two = fr.tp_decode_step_time(LLAMA3_70B, H100.roofline, 2, NVLINK)
    assert two == pytest.approx(one / 2 + 160 * hw.allreduce_time(8192 * 2, 2, NVLINK))
    # by hand: 69.50e9 weights read (the untied embedding is only looked up) x 2 bytes / 3.35e12 = 41.49 ms,
    # halved 20.75 ms; 160 all-reduces x 2 ring steps x (3 µs + 16,384 / 2 / 450e9 s) = 0.966 ms: 21.71 ms
    assert two == pytest.approx(21.71e-3, rel=2e-3)
    # the cache is split too: 64 sequences of 2,048 tokens add their reads / n
    cache = 64 * 2048 * 327_680 / H100.roofline.bandwidth
    assert fr.tp_decode_step_time(LLAMA3_70B, H100.roofline, 8, NVLINK, 64, 2048) - \
        fr.tp_decode_step_time(LLAMA3_70B, H100.roofline, 8, NVLINK, 64, 0) == pytest.approx(cache / 8, rel=1e-6)


def test_fits_keeps_a_tenth_back():
    assert not fr.fits(LLAMA3_70B, H100, 1, 1, 0)  # 141 GB of weights on one 80 GB chip
    # two chips: 0.9 x 160 GB - 141.1 GB = 2.89 GB; a 2,048-token cache is 2,048 x 327,680 B = 0.671 GB: 4 fit
    assert fr.fits(LLAMA3_70B, H100, 2, 4, 2048) and not fr.fits(LLAMA3_70B, H100, 2, 5, 2048)
    assert fr.fits(LLAMA3_70B, H100, 2, 5, 2048, reserve=0.0)


def test_serving_points_leave_out_what_does_not_fit():
    points = fr.serving_points(LLAMA3_70B, H100, NVLINK, (1, 2, 4, 8), (1, 4, 8, 64, 512), 2048, 2.5)
    degrees = {(p.chips, p.batch) for p in points}
    assert not any(n == 1 for n, _ in degrees)
    assert {b for n, b in degrees if n == 2} == {1, 4}
    assert (8, 512) in degrees and (4, 512) not in degrees  # 4 chips hold about 219 caches
    for p in points:
        assert p.step_s == pytest.approx(fr.tp_decode_step_time(LLAMA3_70B, H100.roofline, p.chips, NVLINK,
                                                                p.batch, 2048))
        assert p.price_per_chip_hour == 2.5


def test_pareto_frontier_keeps_only_the_points_nothing_beats():
    a = fr.ServingPoint(1, 1, 0.01)    # 100 tok/s, 10,000 chip-s per million
    b = fr.ServingPoint(1, 4, 0.02)    # 50 tok/s, 5,000
    c = fr.ServingPoint(2, 4, 0.02)    # 50 tok/s, 10,000: b is as fast and cheaper
    d = fr.ServingPoint(1, 8, 0.05)    # 20 tok/s, 6,250: b is faster and cheaper
    e = fr.ServingPoint(1, 16, 0.08)   # 12.5 tok/s, 5,000: b is as cheap and faster
    f = fr.ServingPoint(1, 32, 0.1)    # 10 tok/s, 3,125: the cheapest
    assert fr.pareto_frontier([c, e, a, d, f, b]) == [f, b, a]
    assert fr.pareto_frontier([]) == []
    # the same on other axes: total tokens/s is better the higher it is, so its negative is the cost
    assert fr.pareto_frontier([a, b, c, d, f], cost=lambda p: -p.tokens_per_s) == [f, b, a]


def test_cheapest_at_reads_the_frontier():
    a, b, f = fr.ServingPoint(1, 1, 0.01), fr.ServingPoint(1, 4, 0.02), fr.ServingPoint(1, 32, 0.1)
    assert fr.cheapest_at([a, b, f], 40) == b
    assert fr.cheapest_at([a, b, f], 0) == f
    assert fr.cheapest_at([a, b, f], 200) is None
    points = fr.serving_points(LLAMA3_70B, H100, NVLINK, (2, 4, 8), (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
                               2048, 2.5)
    front = fr.pareto_frontier(points)
    for target in (10, 30, 60):
        best = fr.cheapest_at(points, target)
        assert best in front and best.tokens_per_s_per_user >= target
        assert all(p.cost_per_million >= best.cost_per_million for p in points
                   if p.tokens_per_s_per_user >= target)


def test_a_bigger_batch_is_cheaper_and_slower_at_every_degree():
    points = fr.serving_points(LLAMA3_70B, H100, NVLINK, (2, 4, 8), (1, 2, 4, 8, 64, 256), 2048, 2.5)
    for n in (2, 4, 8):
        mine = sorted((p for p in points if p.chips == n), key=lambda p: p.batch)
        assert all(x.cost_per_million > y.cost_per_million for x, y in zip(mine, mine[1:]))
        assert all(x.tokens_per_s_per_user > y.tokens_per_s_per_user for x, y in zip(mine, mine[1:]))
