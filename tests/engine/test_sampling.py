"""tinyinfer.sampling's one-row pipeline: draw() (one index by inverting the running sum),
min-p and top_k = 0 with vLLM's semantics."""
import math
import pytest
import torch
from tinyinfer import SamplingParams
from tinyinfer_course.notebook.inspect import next_token_distribution


def test_draw_follows_the_weights_and_never_picks_a_zero():
    from tinyinfer.sampling import draw

    weights = torch.tensor([0.0, 1.0, 0.0, 3.0, 0.5, 0.0])  # unnormalised, zeros at both ends
    g = torch.Generator().manual_seed(0)
    n = 20_000
    counts = torch.bincount(torch.tensor([draw(weights, g) for _ in range(n)]), minlength=6).double()
    assert counts[weights == 0].sum() == 0
    p = weights[weights > 0].double() / weights.sum()
    expected = p * n
    chi2 = float(((counts[weights > 0] - expected) ** 2 / expected).sum())
    assert chi2 < 13.8, (counts, chi2)  # 99.9% quantile, 2 degrees of freedom


def test_draw_is_reproducible_per_generator_and_leaves_the_global_stream_alone():
    from tinyinfer.sampling import draw

    weights = torch.rand(1000)
    first = [draw(weights, torch.Generator().manual_seed(7)) for _ in range(3)]
    assert len(set(first)) == 1
    torch.manual_seed(1)
    before = torch.rand(1)
    torch.manual_seed(1)
    draw(weights, torch.Generator().manual_seed(7))
    assert torch.equal(torch.rand(1), before)


def test_draw_at_the_very_top_of_the_range_picks_the_last_weighted_entry(monkeypatch):
    from tinyinfer import sampling

    # u == total can happen only by rounding (about 1 in 2**53); force it.
    monkeypatch.setattr(sampling.torch, "rand", lambda *a, **k: torch.ones(1, dtype=torch.float64))
    assert sampling.draw(torch.tensor([0.2, 0.5, 0.0, 0.0])) == 1


def _min_p_by_probabilities(logits, min_p):
    # vLLM's way, written out: softmax, then drop what is below min_p * the top probability.
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < min_p * probs.max(), -math.inf)


@pytest.mark.parametrize("values, min_p, kept", [
    ([2.0, 1.0, 0.0, -1.0], 0.3, [True, True, False, False]),  # e^-1 = 0.37 >= 0.3 > e^-2 = 0.14
    ([2.0, 1.0, 0.0, -1.0], 0.1, [True, True, True, False]),  # e^-2 = 0.14 >= 0.1 > e^-3 = 0.05
    ([2.0, 2.0, 0.0], 1.0, [True, True, False]),  # min_p = 1: the top token and its ties
    ([1.0, -math.inf, 0.5], 0.5, [True, False, True]),  # a removed token stays removed
    ([5.0, -20.0, 4.0], 0.0, [True, True, True]),  # 0: off
])
def test_min_p_keeps_tokens_within_a_factor_of_the_top_probability(values, min_p, kept):
    from tinyinfer.sampling import apply_min_p

    logits = torch.tensor(values)
    out = apply_min_p(logits, min_p)
    assert torch.isfinite(out).tolist() == kept
    assert torch.equal(out[torch.isfinite(out)], logits[torch.tensor(kept)])  # kept scores unchanged
    assert torch.equal(torch.isfinite(out), torch.isfinite(_min_p_by_probabilities(logits, min_p)))
    assert logits.tolist() == values  # the input is left alone


def test_min_p_equals_the_probability_rule_on_real_sized_rows():
    from tinyinfer.sampling import apply_min_p

    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(49152, generator=g) * 3
        for min_p in (0.01, 0.05, 0.2):
            a = torch.isfinite(apply_min_p(logits, min_p))
            b = torch.isfinite(_min_p_by_probabilities(logits, min_p))
            assert int((a != b).sum()) <= 1  # at most a token sitting on the threshold, by rounding


def test_min_p_comes_after_temperature_in_the_pipeline():
    from tinyinfer.sampling import process_logits

    logits = torch.tensor([2.0, 1.0, 0.0])
    # At T = 1, e^-1 = 0.37 < 0.5 drops the second token; at T = 2 it is e^-0.5 = 0.61, kept.
    def kept(**kw):
        return torch.isfinite(process_logits(logits, SamplingParams(**kw))).tolist()

    assert kept(temperature=1.0, min_p=0.5) == [True, False, False]
    assert kept(temperature=2.0, min_p=0.5) == [True, True, False]


def test_top_k_zero_is_off_like_minus_one():
    from tinyinfer.sampling import apply_top_k, process_logits

    logits = torch.tensor([1.0, 4.0, 2.0, 3.0])
    assert torch.equal(apply_top_k(logits, 0), logits) and torch.equal(apply_top_k(logits, -1), logits)
    off = process_logits(logits, SamplingParams(top_k=-1))
    assert torch.equal(process_logits(logits, SamplingParams(top_k=0)), off)


@pytest.mark.slow
def test_min_p_one_is_greedy_and_a_small_min_p_changes_little(llm):
    prompt, greedy = "The capital of France is", SamplingParams(temperature=0, max_tokens=8)
    want = llm.generate([prompt], greedy)[0].outputs[0].token_ids
    params = SamplingParams(temperature=1.0, min_p=1.0, seed=5, max_tokens=8)
    got = llm.generate([prompt], params)[0].outputs[0].token_ids
    assert got == want  # min_p = 1 leaves only the top token (no ties in a real row)
    probs, top = next_token_distribution(llm, prompt, SamplingParams(temperature=1.0, min_p=0.05), top=50)
    kept = int((probs > 0).sum())
    assert 1 < kept < 50 and all(p >= 0.05 * top[0][2] * 0.999 for _, _, p in top)
