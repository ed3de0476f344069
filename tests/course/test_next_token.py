"""The inspection helpers in tinyinfer_course.notebook.inspect (the logits and the processed
next-token distribution that chapters and labs examine), the statistics behind lab 3's
sampler check, its checks' acceptance of other correct samplers, and the draw recipe its hint gives."""
import math
import pytest
import torch
from chi_square import chi2_sf  # tests/ is on sys.path
from tinyinfer import SamplingParams
from tinyinfer_course.notebook.inspect import next_token_distribution, next_token_logits


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


def test_chi_square_critical_values_are_at_alpha():
    from tinyinfer_course.labcheck.sampling import ALPHA, CHI2_CRITICAL

    assert abs(chi2_sf(3.841, 1) - 0.05) < 1e-4 and abs(chi2_sf(7.815, 3) - 0.05) < 1e-4  # textbook values
    for df, critical in CHI2_CRITICAL.items():
        assert abs(chi2_sf(critical, df) - ALPHA) < 1e-6, df


def test_chi_square_statistic():
    from tinyinfer_course.labcheck.sampling import chi_square

    assert chi_square([50, 50], [0.5, 0.5]) == 0
    assert chi_square([60, 40], [0.5, 0.5]) == pytest.approx(4.0)
    assert chi_square([50, 50, 0], [0.5, 0.5, 0.0]) == 0  # impossible and not drawn: fine
    assert chi_square([50, 49, 1], [0.5, 0.5, 0.0]) == math.inf  # impossible but drawn


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
    from tinyinfer_course import labcheck

    assert getattr(labcheck, check)(fn) is True, capsys.readouterr().out


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
