"""Speculative decoding (tinyinfer_course.speculative).

The rejection rule is checked statistically on a small vocabulary, against the
target distribution it promises to reproduce; the decoder is checked against
plain greedy decoding, on a tiny random model (fast) and on the real model."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM as HFLlama

from tinyinfer import SamplingParams
from tinyinfer_course.speculative import SpeculativeDecoder, accept_draft_tokens
# Target p and draft q rows for k=3 drafted positions (+1 for the bonus token):
# the same ones lab 9's check uses.
from tinyinfer_course.labcheck.speculative import P, Q  # noqa: E402
from tinyinfer.weights import load_model

# --- the acceptance rule, on a 6-token vocabulary --------------------------------

TRIALS = 4000
# 99.9% quantile of the chi-square distribution with 6 - 1 = 5 degrees of freedom:
# a correct rule exceeds it with probability 0.001 (and the seed is fixed).
CHI2_CRITICAL_5DF = 20.52


def run_trials(rule, trials=TRIALS, seed=0):
    """Draw drafts from q, apply `rule`; return the list of output token lists."""
    g = torch.Generator().manual_seed(seed)
    outs = []
    for _ in range(trials):
        drafts = [int(torch.multinomial(q, 1, generator=g)) for q in Q]
        tokens, n = rule(P, Q, drafts, g)
        assert len(tokens) == n + 1 and tokens[:n] == drafts[:n]
        outs.append(tokens)
    return outs


def chi_square(observed: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * observed.sum()
    return float(((observed - expected) ** 2 / expected).sum())


def position_chi_squares(outs) -> list[float]:
    """For each position j: among trials that produced a token there, how far are
    its counts from p_j? (Given that j tokens came before it, the token at j must
    still follow p_j, since the rows here do not depend on the history.)"""
    stats = []
    for j in range(len(P)):
        tokens = torch.tensor([o[j] for o in outs if len(o) > j])
        stats.append(chi_square(torch.bincount(tokens, minlength=P.shape[1]).float(), P[j]))
    return stats


def always_accept(p, q, drafts, g):  # WRONG: ignores the target, outputs the draft's distribution
    return list(drafts) + [int(torch.multinomial(p[len(drafts)], 1, generator=g))], len(drafts)


def resample_from_p(p, q, drafts, g):  # WRONG: on rejection draws from p instead of max(0, p - q)
    for i, x in enumerate(drafts):
        if torch.rand((), generator=g) * q[i, x] < p[i, x]:
            continue
        return list(drafts[:i]) + [int(torch.multinomial(p[i], 1, generator=g))], i
    return list(drafts) + [int(torch.multinomial(p[len(drafts)], 1, generator=g))], len(drafts)


def test_output_tokens_follow_the_target_distribution():
    stats = position_chi_squares(run_trials(accept_draft_tokens))
    assert max(stats) < CHI2_CRITICAL_5DF, stats


@pytest.mark.parametrize("wrong_rule", [always_accept, resample_from_p])
def test_the_chi_square_check_rejects_a_wrong_rule(wrong_rule):
    stats = position_chi_squares(run_trials(wrong_rule))
    assert stats[0] > CHI2_CRITICAL_5DF, stats


def test_first_position_is_accepted_with_probability_sum_of_min_p_q():
    outs = run_trials(accept_draft_tokens, seed=1)
    rate = sum(len(o) > 1 for o in outs) / len(outs)  # at least one draft kept
    expected = float(torch.minimum(P[0], Q[0]).sum())  # 0.55
    sigma = (expected * (1 - expected) / len(outs)) ** 0.5
    assert abs(rate - expected) < 4 * sigma, (rate, expected)


def test_everything_is_accepted_when_draft_equals_target():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        drafts = [int(torch.multinomial(q, 1, generator=g)) for q in P[:3]]
        tokens, n = accept_draft_tokens(P, P[:3].clone(), drafts, g)
        assert n == 3 and tokens[:3] == drafts


def test_deterministic_draft_is_kept_with_probability_p_and_never_redrawn_on_rejection():
    # q = one-hot (None): draft token 0 is kept with probability p[0][0] = 0.4;
    # after a rejection the replacement must never be token 0 itself.
    g = torch.Generator().manual_seed(0)
    outs = [accept_draft_tokens(P[:2], None, [0], g)[0] for _ in range(TRIALS)]
    kept = sum(len(o) == 2 for o in outs) / TRIALS
    assert abs(kept - 0.4) < 4 * (0.4 * 0.6 / TRIALS) ** 0.5
    assert all(o[0] != 0 for o in outs if len(o) == 1)
    assert position_chi_squares([o + [0, 0, 0] for o in outs])[0] < CHI2_CRITICAL_5DF  # first token ~ p_0


def test_greedy_rule_keeps_exactly_the_argmax_prefix():
    one_hot = torch.eye(6)[[2, 4, 1, 5]]  # target argmax per position: 2, 4, 1, bonus 5
    assert accept_draft_tokens(one_hot, None, [2, 4, 1]) == ([2, 4, 1, 5], 3)
    assert accept_draft_tokens(one_hot, None, [2, 3, 1]) == ([2, 4], 1)
    assert accept_draft_tokens(one_hot, None, [0, 4, 1]) == ([2], 0)
    assert accept_draft_tokens(one_hot[:1], None, []) == ([2], 0)  # k = 0 is plain decoding


@pytest.mark.parametrize("args,field", [
    ((P[:3], Q, [0, 1, 2]), "target_probs"),
    ((P, Q[:2], [0, 1, 2]), "draft_probs"),
    ((P, Q, [0, 1, 9]), "draft_tokens"),
    ((P, Q, [0, 1, 0.5]), "draft_tokens"),
])
def test_accept_rejects_bad_shapes_naming_the_argument(args, field):
    with pytest.raises(ValueError, match=field):
        accept_draft_tokens(*args)


# --- the decoder on a tiny random model -----------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      eos_token_id=None, bos_token_id=None)
    folder = tmp_path_factory.mktemp("tiny")
    HFLlama(cfg).eval().save_pretrained(folder)
    return load_model(folder, torch.float32, torch.device("cpu"))


def greedy_without_cache(model, prompt, n):
    """The reference: recompute the whole sequence every step, take the argmax."""
    from tinyinfer.kv_cache import KVCache

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            cache = KVCache(model.config, 1, len(ids), torch.float32, "cpu")
            hidden = model(torch.tensor([ids]), torch.arange(len(ids))[None], cache)
            ids.append(int(model.compute_logits(hidden[0, -1]).argmax()))
    return ids[len(prompt):]


TINY_PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9, 10, 7, 8, 9, 10, 7, 8], [40, 41, 42, 43, 44, 45]]
TINY_DRAFTS = [("ngram", {"num_speculative_tokens": 2}), ("ngram", {"num_speculative_tokens": 5}),
               ("layers", {"num_speculative_tokens": 3, "draft_layers": 2}),
               ("layers", {"num_speculative_tokens": 4, "draft_layers": 4}), ("none", {})]


@pytest.mark.parametrize("draft,kwargs", TINY_DRAFTS, ids=lambda x: str(x))
def test_greedy_equals_plain_decoding_on_a_tiny_model(tiny, draft, kwargs):
    spec = SpeculativeDecoder(tiny, draft=draft, **kwargs)
    proposed = 0
    for prompt in TINY_PROMPTS:
        out, stats = spec.generate(prompt, SamplingParams(max_tokens=40, temperature=0))
        assert out == greedy_without_cache(tiny, prompt, 40)
        assert stats.num_generated == 40 and stats.num_accepted <= stats.num_proposed
        # every target pass but the prefill yields its accepted drafts plus one token
        assert stats.num_generated == 1 + stats.num_accepted + (stats.num_target_forward_passes - 1)
        proposed += stats.num_proposed
    assert (proposed > 0) == (draft != "none")


def test_draft_equal_to_target_accepts_everything_when_sampling(tiny):
    spec = SpeculativeDecoder(tiny, draft="layers", num_speculative_tokens=4, draft_layers=4)
    _, stats = spec.generate([1, 2, 3], SamplingParams(max_tokens=30, temperature=0.9, seed=3))
    assert stats.num_proposed > 20 and stats.acceptance_rate == 1.0


def test_stop_token_ids_and_max_tokens_cut_where_plain_decoding_would(tiny):
    prompt = TINY_PROMPTS[1]
    ref = greedy_without_cache(tiny, prompt, 40)
    stop = ref[12]
    expected = ref[: ref.index(stop) + 1]
    for draft in ("ngram", "layers"):
        spec = SpeculativeDecoder(tiny, draft=draft, num_speculative_tokens=6, draft_layers=3)
        out, _ = spec.generate(prompt, SamplingParams(max_tokens=40, temperature=0, stop_token_ids=[stop]))
        assert out == expected
        for n in (1, 2, 7):
            out, stats = spec.generate(prompt, SamplingParams(max_tokens=n, temperature=0))
            assert out == ref[:n] and stats.num_generated == n


def test_eos_stops_unless_ignored(tmp_path):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    HFLlama(cfg).eval().save_pretrained(tmp_path)
    model = load_model(tmp_path, torch.float32, torch.device("cpu"))
    ref = greedy_without_cache(model, [5, 6, 7], 30)
    eos = ref[9]
    model.config = type(model.config)(**{**model.config.to_dict(), "eos_token_id": eos})
    spec = SpeculativeDecoder(model, draft="ngram", num_speculative_tokens=4)
    out, _ = spec.generate([5, 6, 7], SamplingParams(max_tokens=30, temperature=0))
    assert out == ref[: ref.index(eos) + 1]
    out, _ = spec.generate([5, 6, 7], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    assert out == ref


@pytest.mark.parametrize("kwargs,field", [
    ({"draft": "medusa"}, "draft"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"num_speculative_tokens": 2.5}, "num_speculative_tokens"),
    ({"draft": "layers", "draft_layers": 0}, "draft_layers"),
    ({"draft": "layers", "draft_layers": 5}, "draft_layers"),
    ({"prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_max"),
])
def test_bad_settings_raise_naming_the_field(tiny, kwargs, field):
    with pytest.raises(ValueError, match=field):
        SpeculativeDecoder(tiny, **kwargs)


@pytest.mark.parametrize("prompt,params,field", [
    ([], SamplingParams(), "prompt_token_ids"),
    ([1, 64], SamplingParams(), "prompt_token_ids"),
    ("hello", SamplingParams(), "prompt_token_ids"),
    ([1] * 100, SamplingParams(max_tokens=40), "prompt_token_ids"),  # 140 > 128 positions
    ([1, 2], SamplingParams(stop=["x"]), "stop"),  # a bare model has no tokenizer
    ([1, 2], SamplingParams(logprobs=2), "logprobs"),
    ([1, 2], {"max_tokens": 3}, "sampling_params"),
])
def test_bad_requests_raise_naming_the_field_and_the_decoder_stays_usable(tiny, prompt, params, field):
    spec = SpeculativeDecoder(tiny, draft="layers", draft_layers=2)
    with pytest.raises(ValueError, match=field):
        spec.generate(prompt, params)
    out, _ = spec.generate([1, 2, 3], SamplingParams(max_tokens=5, temperature=0))
    assert out == greedy_without_cache(tiny, [1, 2, 3], 5)


# --- the real model ---------------------------------------------------------------

REAL_PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:\n",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
]


GREEDY = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine_greedy(llm):
    """The engine's plain greedy replies, computed once for both drafts."""
    ids = [llm.tokenizer.encode(text) for text in REAL_PROMPTS]
    outs = llm.generate([{"prompt_token_ids": i} for i in ids], GREEDY)
    return [(i, list(o.outputs[0].token_ids)) for i, o in zip(ids, outs)]


@pytest.mark.slow
@pytest.mark.parametrize("draft,kwargs", [("ngram", {"num_speculative_tokens": 4}),
                                          ("layers", {"num_speculative_tokens": 2, "draft_layers": 28})])
def test_greedy_equals_the_engine_on_the_real_model(llm, engine_greedy, draft, kwargs):
    spec = SpeculativeDecoder(llm, draft=draft, **kwargs)
    accepted = 0
    for ids, ref in engine_greedy:
        out, stats = spec.generate(ids, GREEDY)
        assert out == ref, llm.tokenizer.decode(ids)
        accepted += stats.num_accepted
    assert accepted > 0  # the multi-token verify path was exercised, not just rejections


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["ngram", "layers"])
def test_sampling_on_the_real_model_is_reproducible_with_a_seed(llm, draft):
    spec = SpeculativeDecoder(llm, draft=draft, num_speculative_tokens=2, draft_layers=28)
    ids = llm.tokenizer.encode(REAL_PROMPTS[2])

    def run(seed):
        params = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.95, top_k=50, seed=seed, ignore_eos=True)
        return spec.generate(ids, params)

    (a, stats), (b, _), (c, _) = run(1234), run(1234), run(99)
    assert a == b and a != c
    assert len(a) == 16 and all(0 <= t < llm.model_config.vocab_size for t in a)
    # every target pass but the prefill yields its accepted drafts plus one token
    assert stats.num_proposed > 0 and stats.num_generated == 16
    assert 16 == 1 + stats.num_accepted + (stats.num_target_forward_passes - 1)


# --- end to end: sampled speculative decoding keeps the target's distribution -------------


@pytest.fixture(scope="module")
def sharp(tiny):
    """The tiny model with its scores scaled up, so its distributions are peaked
    and a draft (its first layer) disagrees with it often: a wrong accept rule
    would show. A fresh copy: other tests use `tiny` as it is."""
    import copy

    model = copy.deepcopy(tiny)
    with torch.no_grad():
        model.lm_head.weight.mul_(25.0)
    return model


def exact_probs(model, ids, params):
    """The target's processed next-token distribution after ids: a fresh full
    forward pass, no cache reuse, no speculation."""
    from tinyinfer.kv_cache import KVCache
    from tinyinfer.sampling import processed_probs

    with torch.no_grad():
        cache = KVCache(model.config, 1, len(ids), torch.float32, "cpu")
        hidden = model(torch.tensor([ids]), torch.arange(len(ids))[None], cache)
        return processed_probs(model.compute_logits(hidden[0, -1]), params).double()


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty: the chi-square quantile at 1 - 0.001 (z = 3.09) for df degrees of freedom."""
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


@pytest.mark.parametrize("draft,kwargs", [("ngram", {}), ("layers", {"draft_layers": 1})])
def test_sampled_speculative_decoding_follows_the_target_distribution(sharp, draft, kwargs):
    """3 tokens at T=0.9, top_p=0.9, over 2000 seeds. The first is sampled from
    the prefill; the second goes through draft -> verify -> accept or resample.
    Its distribution must be the target's: P(t2) = sum over t1 of
    p(t1 | prompt) p(t2 | prompt, t1), computed by 1 + 64 plain forward passes.
    A chi-square test at the 0.001 level compares the counts with it."""
    # The model's own greedy text, which repeats itself: the n-gram draft finds t1
    # in it and proposes what followed, often what the target would say (accepted).
    prompt = [1, 2, 3] + greedy_without_cache(sharp, [1, 2, 3], 40)
    params = SamplingParams(max_tokens=3, temperature=0.9, top_p=0.9, ignore_eos=True)
    p1 = exact_probs(sharp, prompt, params)
    p2 = sum(p1[t] * exact_probs(sharp, prompt + [t], params) for t in range(64) if p1[t] > 0)
    spec = SpeculativeDecoder(sharp, draft=draft, num_speculative_tokens=2, **kwargs)
    counts = torch.zeros(64, dtype=torch.float64)
    proposed = accepted = 0
    for seed in range(2000):
        tokens, stats = spec.generate(prompt, SamplingParams(max_tokens=3, temperature=0.9, top_p=0.9,
                                                             ignore_eos=True, seed=seed))
        counts[tokens[1]] += 1
        proposed, accepted = proposed + stats.num_proposed, accepted + stats.num_accepted
    assert proposed > 500 and 0 < accepted < proposed  # the accept/reject path really ran, both ways
    expected = p2 * counts.sum()
    big = expected >= 5  # cells expected to hold fewer than 5 are pooled into one
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    expect = torch.cat([expected[big], expected[~big].sum()[None]])
    assert counts[p2 == 0].sum() == 0  # never a token the target could not produce
    keep = expect > 0
    chi2 = float(((observed[keep] - expect[keep]) ** 2 / expect[keep]).sum())
    assert chi2 < chi2_critical(int(keep.sum()) - 1), chi2
