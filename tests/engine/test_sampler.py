"""The engine's Sampler (tinyinfer.sampler): unseeded rows in one batch, seeded rows on
their own stream, and the sampler's state on the sequence."""
import torch
from chi_square import chi2_sf  # tests/ is on sys.path
from tinyinfer import SamplingParams


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
    from tinyinfer_course.labcheck.sampling import chi_square

    return df == 0 or chi2_sf(chi_square(counts, probs), df) > 1e-3


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
