"""The inspection helpers in tinyinfer.inspect (the logits and the processed
next-token distribution that chapters and labs examine), the statistics behind
lab 3's sampler check, and the engine's batched Sampler."""
import math

import pytest
import torch

from tinyinfer import SamplingParams
from tinyinfer.inspect import next_token_distribution, next_token_logits

PROMPT = "The capital of France is"


@pytest.mark.slow
def test_logits_are_one_fp32_cpu_row_per_vocabulary_entry(llm):
    logits = next_token_logits(llm, PROMPT)
    assert logits.shape == (llm.model_config.vocab_size,)
    assert logits.dtype == torch.float32 and logits.device.type == "cpu"
    # a string and its token ids give the same scores
    assert torch.equal(logits, next_token_logits(llm, llm.tokenizer.encode(PROMPT)))


@pytest.mark.slow
def test_greedy_distribution_is_the_engines_first_token(llm):
    probs, top = next_token_distribution(llm, PROMPT, SamplingParams(temperature=0))
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1))
    first = out[0].outputs[0].token_ids[0]
    assert probs[first] == 1.0 and probs.sum() == 1.0
    assert top == [(first, llm.tokenizer.decode([first]), 1.0)]


def by_hand(logits: list[float], temperature: float, top_k: int, top_p: float) -> dict[int, float]:
    """The sampling pipeline written out in plain Python, independently of
    tinyinfer.sampling: divide by T, keep the k highest, softmax, keep the
    smallest most-likely set whose mass reaches p, renormalise."""
    scaled = sorted(((v / temperature, i) for i, v in enumerate(logits)), reverse=True)[:top_k]
    z = sum(math.exp(v - scaled[0][0]) for v, _ in scaled)
    probs = [(math.exp(v - scaled[0][0]) / z, i) for v, i in scaled]
    kept, mass = [], 0.0
    for p, i in probs:
        if mass >= top_p:
            break
        kept.append((p, i))
        mass += p
    return {i: p / mass for p, i in kept}


@pytest.mark.slow
def test_distribution_is_the_softmax_of_the_processed_logits(llm):
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.9)
    probs, top = next_token_distribution(llm, PROMPT, params, top=5)
    expected = by_hand(next_token_logits(llm, PROMPT).tolist(), 0.7, 20, 0.9)
    assert {i for i in range(len(probs)) if probs[i] > 0} == set(expected)
    for i, p in expected.items():
        assert float(probs[i]) == pytest.approx(p, abs=1e-5)
    assert abs(float(probs.sum()) - 1) < 1e-5
    assert [p for _, _, p in top] == sorted((p for _, _, p in top), reverse=True)
    assert len(top) <= 5 and all(p > 0 for _, _, p in top)


@pytest.mark.slow
def test_top_k_leaves_k_candidates_and_top_lists_only_candidates(llm):
    probs, top = next_token_distribution(llm, PROMPT, SamplingParams(top_k=3), top=10)
    assert int((probs > 0).sum()) == 3 and len(top) == 3


@pytest.mark.slow
def test_repetition_penalty_counts_the_prompt_as_seen(llm):
    ids = llm.tokenizer.encode(PROMPT)
    plain, _ = next_token_distribution(llm, PROMPT, SamplingParams())
    penalized, _ = next_token_distribution(llm, PROMPT, SamplingParams(repetition_penalty=2.0))
    seen_tokens = torch.tensor(sorted(set(ids)))
    # every token of the prompt loses probability, so the ones never seen gain
    assert bool((penalized[seen_tokens] < plain[seen_tokens]).all())
    unseen = torch.ones_like(plain, dtype=torch.bool)
    unseen[seen_tokens] = False
    assert float(penalized[unseen].sum()) > float(plain[unseen].sum())


def _chi2_sf(x: float, df: int) -> float:
    """P(X > x) for a chi-square variable with integer df, in closed form."""
    h = x / 2
    if df % 2 == 0:  # a Poisson tail
        return math.exp(-h) * sum(h**i / math.factorial(i) for i in range(df // 2))
    # odd df: the df = 1 tail plus terms that climb by two degrees of freedom each
    sf = math.erfc(math.sqrt(h))
    term = math.exp(-h) * math.sqrt(h) / math.gamma(1.5)
    for k in range(1, (df - 1) // 2 + 1):
        sf += term
        term *= h / (k + 0.5)
    return sf


def test_chi_square_critical_values_are_at_alpha():
    from tinyinfer.labcheck.sampling import ALPHA, CHI2_CRITICAL

    assert abs(_chi2_sf(3.841, 1) - 0.05) < 1e-4 and abs(_chi2_sf(7.815, 3) - 0.05) < 1e-4  # textbook values
    for df, critical in CHI2_CRITICAL.items():
        assert abs(_chi2_sf(critical, df) - ALPHA) < 1e-6, df


def test_chi_square_statistic():
    from tinyinfer.labcheck.sampling import chi_square

    assert chi_square([50, 50], [0.5, 0.5]) == 0
    assert chi_square([60, 40], [0.5, 0.5]) == pytest.approx(4.0)
    assert chi_square([50, 50, 0], [0.5, 0.5, 0.0]) == 0  # impossible and not drawn: fine
    assert chi_square([50, 49, 1], [0.5, 0.5, 0.0]) == math.inf  # impossible but drawn


# --- lab 3's checks accept any correct implementation, not only the engine's


def _top_p_vllm_style(logits, p):
    # vLLM's way: sort ascending and drop the least likely tokens whose total stays <= 1 - p.
    sorted_logits, order = torch.sort(logits)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop_sorted = cum <= 1 - p
    drop_sorted[-1] = False  # the most likely token always stays
    return logits.masked_fill(torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted), -math.inf)


def _top_k_by_sorting(logits, k):
    if k == -1:
        return logits.clone()
    kth = torch.sort(logits, descending=True).values[min(k, logits.numel()) - 1]
    return torch.where(logits >= kth, logits, torch.full_like(logits, -math.inf))


def _sample_inverse_cdf(logits, t, generator):
    if t == 0:
        return int(logits.argmax())
    cdf = torch.softmax(logits / t, -1).cumsum(-1)
    u = torch.rand(1, generator=generator) * cdf[-1]
    return int(torch.searchsorted(cdf, u).clamp(max=logits.numel() - 1))


def _sample_gumbel_max(logits, t, generator):
    # vLLM's sampler: argmax of probs / Exponential(1) noise, a draw with the same distribution.
    if t == 0:
        return int(logits.argmax())
    probs = torch.softmax(logits / t, -1)
    return int((probs / torch.empty_like(probs).exponential_(generator=generator)).argmax())


@pytest.mark.parametrize("check, fn", [
    ("check_top_p", _top_p_vllm_style),
    ("check_top_k", _top_k_by_sorting),
    ("check_sample", _sample_inverse_cdf),
    ("check_sample", _sample_gumbel_max),
])
def test_checks_accept_other_correct_implementations(check, fn, capsys):
    from tinyinfer import labcheck

    assert getattr(labcheck, check)(fn) is True, capsys.readouterr().out


# --- draw(): one index from a row of weights, by inverting the running sum -----------

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


# --- min-p and top_k = 0 (vLLM's semantics) ----------------------------------------

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
    assert torch.isfinite(process_logits(logits, SamplingParams(temperature=1.0, min_p=0.5))).tolist() == [True, False, False]
    assert torch.isfinite(process_logits(logits, SamplingParams(temperature=2.0, min_p=0.5))).tolist() == [True, True, False]


def test_top_k_zero_is_off_like_minus_one():
    from tinyinfer.sampling import apply_top_k, process_logits

    logits = torch.tensor([1.0, 4.0, 2.0, 3.0])
    assert torch.equal(apply_top_k(logits, 0), logits) and torch.equal(apply_top_k(logits, -1), logits)
    assert torch.equal(process_logits(logits, SamplingParams(top_k=0)), process_logits(logits, SamplingParams(top_k=-1)))


@pytest.mark.slow
def test_min_p_one_is_greedy_and_a_small_min_p_changes_little(llm):
    prompt, greedy = PROMPT, SamplingParams(temperature=0, max_tokens=8)
    want = llm.generate([prompt], greedy)[0].outputs[0].token_ids
    got = llm.generate([prompt], SamplingParams(temperature=1.0, min_p=1.0, seed=5, max_tokens=8))[0].outputs[0].token_ids
    assert got == want  # min_p = 1 leaves only the top token (no ties in a real row)
    probs, top = next_token_distribution(llm, prompt, SamplingParams(temperature=1.0, min_p=0.05), top=50)
    kept = int((probs > 0).sum())
    assert 1 < kept < 50 and all(p >= 0.05 * top[0][2] * 0.999 for _, _, p in top)


# --- lab 3, section 6: the hint's recipe draws exactly the engine's tokens ---------------

def _hint_recipe(logits, temperature, generator):
    # Word for word what lab 3's sampler section tells the learner to do.
    if temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    cdf = probs.double().cumsum(-1)
    u = torch.rand(1, dtype=torch.float64, generator=generator) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u, right=True)), probs.numel() - 1)


def _float32_draw(logits, temperature, generator):
    # The recipe the lab used to give: a float32 number, a float32 running total.
    probs = torch.softmax(logits / temperature, dim=-1)
    u = torch.rand(1, generator=generator)
    return int(torch.searchsorted(probs.cumsum(-1), u, right=True))


def test_the_labs_draw_recipe_gives_the_engines_tokens_and_float32_does_not():
    from tinyinfer.sampling import sample

    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(49152, generator=g) * 2 for _ in range(4)]
    for seed in range(3):
        for t in (0.7, 1.0, 1.5):
            ours, engine, f32 = (torch.Generator().manual_seed(seed) for _ in range(3))
            mine = [_hint_recipe(r, t, ours) for r in rows for _ in range(25)]
            theirs = [sample(r, SamplingParams(temperature=t), engine) for r in rows for _ in range(25)]
            assert mine == theirs
            other = [_float32_draw(r, t, f32) for r in rows for _ in range(25)]
            assert other != theirs  # a float32 draw consumes the stream differently


# --- the engine's Sampler: unseeded rows in one batch, seeded rows on their own stream ----

def _seq(params, prompt=(1, 2, 3), request_id="r"):
    from tinyinfer.request import Request

    return Request(request_id, None, list(prompt), params, eos_token_ids=()).samples[0]


# Rows that exercise every processor, each setting alone and together.
BATCH_PARAMS = [
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.3, top_k=3),
    SamplingParams(temperature=1.0, top_p=0.6),
    SamplingParams(temperature=2.0, min_p=0.1),  # min-p comes after temperature: here it matters
    SamplingParams(temperature=1.0, top_k=5, top_p=0.8, min_p=0.05),
    SamplingParams(temperature=2.0, top_k=0, top_p=1.0),
]


def test_batched_filter_equals_the_one_row_pipeline():
    from tinyinfer.sampling import processed_probs, processed_probs_batch

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(len(BATCH_PARAMS), 40, generator=g) * 3
    logits[5, :10] = logits[5, 10]  # ties, where top-k keeps every tied score
    logits[1, :4] = logits[1].max() + 1  # four tied at the top, top_k=3: all four stay
    batch = processed_probs_batch(logits, BATCH_PARAMS)
    for i, params in enumerate(BATCH_PARAMS):
        one = processed_probs(logits[i], params)
        assert torch.equal(batch[i] > 0, one > 0), i  # the same tokens survive
        torch.testing.assert_close(batch[i], one, rtol=1e-5, atol=1e-7)


def test_unseeded_rows_are_drawn_in_one_call_each_from_its_own_distribution(monkeypatch):
    from tinyinfer import sampler as sampler_module
    from tinyinfer.sampler import Sampler
    from tinyinfer.sampling import processed_probs

    calls = []
    real = sampler_module.draw_rows
    monkeypatch.setattr(sampler_module, "draw_rows", lambda w, g=None: calls.append(w.shape) or real(w, g))
    logits = torch.randn(len(BATCH_PARAMS), 8, generator=torch.Generator().manual_seed(1)) * 2
    seqs = [_seq(p, request_id=str(i)) for i, p in enumerate(BATCH_PARAMS)]
    n, m = 2000, len(BATCH_PARAMS)
    torch.manual_seed(0)
    # One step of n copies of the six rows (unseeded rows keep no state, so a
    # sequence may fill several rows).
    draws = Sampler()(logits.repeat(n, 1), seqs * n).token_ids
    assert calls == [(n * m, 8)]  # one draw for every unseeded row of the step
    for i, params in enumerate(BATCH_PARAMS):
        probs = processed_probs(logits[i], params).tolist()
        counts = torch.bincount(torch.tensor(draws[i::m]), minlength=8).tolist()
        df = sum(p > 0 for p in probs) - 1
        assert chi_square_ok(counts, probs, df), (i, counts, probs)


def chi_square_ok(counts, probs, df) -> bool:
    from tinyinfer.labcheck.sampling import chi_square

    return df == 0 or _chi2_sf(chi_square(counts, probs), df) > 1e-3


def test_a_seeded_row_draws_the_same_tokens_alone_or_in_any_batch():
    from tinyinfer.sampler import Sampler

    seeded = dict(temperature=0.9, top_p=0.9, repetition_penalty=1.3, seed=11)
    logits = [torch.randn(6, 64, generator=torch.Generator().manual_seed(s)) * 2 for s in range(12)]

    def run(batch_params, row):
        """The tokens of batch row `row`, whose logits are row 0 of each step's."""
        seqs = [_seq(p, request_id=str(i)) for i, p in enumerate(batch_params)]
        order = [row] + [i for i in range(len(seqs)) if i != row]  # batch row order[j] gets logits row j
        tokens = []
        for step in logits:
            out = Sampler()(step[torch.tensor(order).argsort()], seqs).token_ids  # state is on the seqs
            for seq, t in zip(seqs, out):
                seq.append_token(t)
            tokens.append(out[row])
        return tokens

    alone = run([SamplingParams(max_tokens=99, **seeded)], 0)
    mixed = [SamplingParams(max_tokens=99), SamplingParams(max_tokens=99, temperature=0),
             SamplingParams(max_tokens=99, **seeded), SamplingParams(max_tokens=99, temperature=1.5, top_k=4),
             SamplingParams(max_tokens=99, seed=2, repetition_penalty=1.1)]
    torch.manual_seed(0)
    assert run(mixed, 2) == alone
    torch.manual_seed(1)  # another global stream, another place in the batch
    assert run(mixed[2:3] + mixed[:2], 0) == alone


def test_a_sequences_sampler_state_lives_and_ends_with_the_sequence():
    import gc
    import weakref

    from tinyinfer.sampler import Sampler

    sampler = Sampler()
    seq = _seq(SamplingParams(seed=0, repetition_penalty=1.2))
    sampler(torch.randn(1, 16), [seq])
    state = weakref.ref(seq.sampling_state)
    assert state() is not None and state().generator is not None and bool(state().seen[[1, 2, 3]].all())
    del seq
    gc.collect()
    assert state() is None  # nothing else holds it: ending a sequence is dropping it
