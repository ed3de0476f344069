"""The engine's core on a tiny random model that uses the real tokenizer: fast
enough to run many steps and many engines.

- the incremental detokenizer gives exactly what decoding the whole reply gives;
- per-token work stays bounded as the reply grows, shown by COUNTING work
  (tokens the detokenizer decodes, token ids read from a sequence's list), not time;
- parallel sampling (n) forks the prompt's blocks, copy-on-write runs, and each
  sample equals the same seeded request run alone;
- seeded sampling and prompt logprobs survive forced preemption in both modes;
- aborting a swapped-out request, and chunked prefill turned off;
- nothing waits forever: unschedulable requests are refused, a step that cannot
  progress raises;
- requests and their sequences are counted apart.
"""
import json
import random
import time

import pytest

from tinyinfer import LLM, LLMEngine, SamplingParams
from tinyinfer.detokenizer import IncrementalDetokenizer
from tinyinfer.llm_engine import run_until_done
from tinyinfer.sequence import SequenceStatus
from tinyinfer.tokenizer import Tokenizer

VOCAB = 49152  # the real tokenizer's, so text and multi-byte characters are real


def tiny_engine(tiny_dir, **kw):
    kw.setdefault("num_kv_blocks", 256)  # not the default 512 MiB pool: many engines are built here
    return LLMEngine(tiny_dir, dtype="float32", device="cpu", **kw)


def run(engine, requests):
    """requests: {request_id: (prompt ids, SamplingParams)} -> {request_id: final RequestOutput}."""
    for rid, (ids, params) in requests.items():
        engine.add_request({"prompt_token_ids": ids}, params, request_id=rid)
    return run_until_done(engine)


def prompt(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


# --- the incremental detokenizer ---------------------------------------------------


@pytest.mark.parametrize("case", ["text", "random"])
def test_incremental_detokenizer_equals_decoding_everything(default_model_dir, case):
    """Emoji, CJK and accents split over byte-level tokens, and random token
    streams (which hold bytes that never form a character): the pieces joined
    must be exactly the full decode, and no piece may end in half a character."""
    tok = Tokenizer(default_model_dir)
    if case == "text":
        streams = [tok.encode(t) for t in ["emoji 🎉🚀 fun", "日本語のテキスト", "naïve café — ok", "a\n\n  b"]]
    else:
        rng = random.Random(0)
        streams = [[rng.randrange(VOCAB) for _ in range(60)] for _ in range(20)]
        streams.append([tok.encode("🎉")[0]] * 5 + tok.encode(" ok"))  # lead bytes that never complete
    for ids in streams:
        ids_list = [7]  # a prompt token that must not show up in the text
        detok = IncrementalDetokenizer(tok.decode, ids_list, start=1)
        pieces = []
        for t in ids:
            ids_list.append(t)
            pieces.append(detok.add())
        pieces.append(detok.flush())
        assert "".join(pieces) == tok.decode(ids)
        assert not any(p.endswith("\ufffd") for p in pieces[:-1] if p) or case == "random"


# --- O(1) work per token, by counting ------------------------------------------------


class CountingList(list):
    """A token list that counts how many ids are read out of it in Python: by
    slicing, iterating, copying or concatenating. (C code that reads a list
    directly, such as torch.tensor(list), is not counted; the engine only
    passes it slices, which are.)"""

    reads = 0

    def __getitem__(self, i):
        got = list.__getitem__(self, i)
        CountingList.reads += len(got) if isinstance(i, slice) else 1
        return got

    def __iter__(self):
        CountingList.reads += len(self)
        return list.__iter__(self)

    def __add__(self, other):
        CountingList.reads += len(self)
        return list.__add__(self, other)

    def copy(self):
        CountingList.reads += len(self)
        return list.copy(self)


def per_step_work(engine, prompt_ids, max_tokens):
    """Per decode step: (token ids read from the sequence's list, tokens decoded)."""
    request = engine.make_request({"prompt_token_ids": prompt_ids},
                                  SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    seq = request.samples[0]
    seq.token_ids = seq.detokenizer.token_ids = CountingList(seq.token_ids)
    engine.queue_request(request)
    engine.step()  # the prefill (and its prefix-cache hashing) happens once
    reads, decoded = [], []
    while engine.has_unfinished_requests():
        CountingList.reads, before = 0, seq.detokenizer.num_decoded_tokens
        outs = engine.step()
        reads.append(CountingList.reads)
        decoded.append(seq.detokenizer.num_decoded_tokens - before)
    assert len(outs[0].outputs[0].token_ids) == max_tokens
    return reads, decoded


def test_per_token_work_stays_bounded_as_the_reply_grows(tiny_dir):
    """With one concatenated token list and a full re-decode per token, both
    counts would grow with the reply (about 600 ids read and 400 tokens decoded
    per step at its end). Here they stay a small constant: the step's own token,
    a block's 16 ids when a block fills and is hashed, a detokenizer window."""
    engine = tiny_engine(tiny_dir, block_size=16)
    reads, decoded = per_step_work(engine, prompt(200, 1), max_tokens=400)
    early, late = slice(0, 50), slice(-50, None)
    assert max(reads) <= 48 and max(decoded) <= 24, (max(reads), max(decoded))
    assert max(reads[late]) <= max(reads[early]) and max(decoded[late]) <= max(decoded[early]) + 4
    assert sum(decoded) <= 8 * len(decoded)  # amortised: a handful of tokens per token


# --- parallel sampling: fork and copy-on-write -------------------------------------------


def test_parallel_samples_share_the_prompt_and_equal_seeded_runs_alone(tiny_dir, monkeypatch):
    """n=3 with seed 7: sample i draws from its own stream seeded 7+i (vLLM's
    rule), so it must equal a lone n=1 request with seed 7+i, token for token.
    The prompt (37 tokens: a partly filled third block) is prefilled once and
    its blocks shared; the first write into the shared block copies it. Were
    the copy skipped, the samples would overwrite each other's keys and values
    there and their tokens would drift from the lone runs."""
    llm = LLM(tiny_dir, dtype="float32", device="cpu", block_size=16, num_kv_blocks=64)
    engine = llm.llm_engine
    copies, computed = [], []
    real_copy = engine.model_runner.paged_cache.copy_blocks
    monkeypatch.setattr(engine.model_runner.paged_cache, "copy_blocks",
                        lambda c: (copies.extend(c), real_copy(c)))
    real_execute = engine.model_runner.execute_model
    monkeypatch.setattr(engine.model_runner, "execute_model",
                        lambda out: (computed.append(out.num_batched_tokens), real_execute(out))[1])
    ids = {"prompt_token_ids": prompt(37, 2)}
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12, ignore_eos=True, logprobs=1)
    out = llm.generate(ids, params)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert computed[0] == 37  # the prompt ran once, not three times
    assert len(copies) == 2  # two of the three sharers copied the shared partly filled block
    assert engine.block_manager.num_used_blocks == 0  # every block came back
    alone = [llm.generate(ids, SamplingParams(temperature=1.0, seed=7 + i, max_tokens=12, ignore_eos=True,
                                              logprobs=1))[0].outputs[0] for i in range(3)]
    for got, want in zip(out.outputs, alone):
        assert got.token_ids == want.token_ids and got.text == want.text
        assert got.cumulative_logprob == pytest.approx(want.cumulative_logprob, abs=1e-4)
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3  # different streams, different samples
    again = llm.generate(ids, params)[0]  # seeded: reproducible
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]


def test_parallel_sampling_checks_its_settings(tiny_dir):
    engine = tiny_engine(tiny_dir, max_num_seqs=4)
    with pytest.raises(ValueError, match="SamplingParams.n"):
        SamplingParams(n=0)
    with pytest.raises(ValueError, match=r"n=5 is invalid: must be <= max_num_seqs \(4\)"):
        engine.add_request("hi", SamplingParams(n=5))
    static = tiny_engine(tiny_dir, scheduling="static")
    with pytest.raises(ValueError, match="scheduling='static'"):
        static.add_request("hi", SamplingParams(n=2))
    assert not engine.has_unfinished_requests() and not static.has_unfinished_requests()


# --- preemption, swap, chunked prefill ----------------------------------------------------


def workload():
    """Seeded sampled requests, some with prompt logprobs, and one with n=2."""
    reqs = {}
    for i in range(4):
        reqs[f"r{i}"] = (prompt(20 + 14 * i, 10 + i),
                         SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=20, ignore_eos=True,
                                        logprobs=2, prompt_logprobs=2 if i % 2 == 0 else None))
    reqs["n2"] = (prompt(30, 99), SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=16, ignore_eos=True))
    return reqs


def same_output(got, want):
    assert [c.token_ids for c in got.outputs] == [c.token_ids for c in want.outputs]
    for g, w in zip(got.outputs, want.outputs):
        assert g.text == w.text
        for pg, pw in zip(g.logprobs or [], w.logprobs or []):
            assert pg.keys() == pw.keys()
            assert [x.logprob for x in pg.values()] == pytest.approx([x.logprob for x in pw.values()], abs=1e-4)
    assert (got.prompt_logprobs is None) == (want.prompt_logprobs is None)
    for pg, pw in zip(got.prompt_logprobs or [], want.prompt_logprobs or []):
        assert (pg is None) == (pw is None)
        if pg is not None:
            assert pg.keys() == pw.keys()
            assert [x.logprob for x in pg.values()] == pytest.approx([x.logprob for x in pw.values()], abs=1e-4)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_seeded_sampling_and_prompt_logprobs_survive_preemption(tiny_dir, mode):
    """A pool of 12 blocks of 8 tokens cannot hold these requests at once, and a
    budget of 40 tokens per step chunks the longer prompts: sequences are
    preempted mid-reply and mid-prompt. Each request must still give what it
    gives alone on a roomy engine: the same seeded tokens, logprobs and prompt
    logprobs (collected across chunks, and again after a recompute)."""
    reqs = workload()
    alone = {}
    for rid, req in reqs.items():
        alone.update(run(tiny_engine(tiny_dir, block_size=8), {rid: req}))
    busy = tiny_engine(tiny_dir, block_size=8, num_kv_blocks=12, max_num_batched_tokens=40, preemption_mode=mode)
    together = run(busy, reqs)
    assert busy.stats.num_preemptions > 0, "the pool was meant to force preemption"
    if mode == "swap":
        assert busy.stats.num_swapped_out == busy.stats.num_swapped_in > 0
    assert busy.block_manager.num_used_blocks == 0
    for rid in reqs:
        same_output(together[rid], alone[rid])


def test_aborting_a_swapped_out_request_frees_its_host_copy(tiny_dir):
    """Step until a request sits swapped out in host memory, abort it: its host
    copy goes, the engine keeps serving the others, and every block comes back."""
    import gc
    import weakref

    engine = tiny_engine(tiny_dir, block_size=8, num_kv_blocks=10, preemption_mode="swap")
    for i in range(4):
        engine.add_request({"prompt_token_ids": prompt(20, i)}, SamplingParams(max_tokens=30, temperature=0,
                                                                              ignore_eos=True), request_id=f"r{i}")

    def host_copies():
        """Each queued sequence holds a host copy exactly while it is swapped out."""
        queued = list(engine.scheduler.waiting) + list(engine.scheduler.running)
        assert all((s.swapped_kv is not None) == (s.status == SequenceStatus.SWAPPED) for s in queued)
        return [s for s in queued if s.swapped_kv is not None]

    victim = None
    for _ in range(200):
        engine.step()
        if host_copies():
            victim = host_copies()[0]
            break
    assert victim is not None, "no request was swapped out"
    rid, host_copy = victim.request_id, weakref.ref(victim.swapped_kv[0])
    engine.abort_request(rid)
    del victim
    gc.collect()
    assert host_copy() is None and rid not in engine.requests  # the copy went with its sequence
    finished = run_until_done(engine, on_step=host_copies)
    assert rid not in finished and len(finished) == 3
    assert all(len(o.outputs[0].token_ids) == 30 for o in finished.values())
    assert engine.block_manager.num_used_blocks == 0


def test_without_chunked_prefill_a_prompt_waits_for_a_step_that_fits_it(tiny_dir):
    """enable_chunked_prefill=False: a prompt is never cut. A 60-token prompt
    with a 64-token budget waits while others decode, then runs whole; the
    tokens equal those of the chunked engine."""
    reqs = {"a": (prompt(50, 1), SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)),
            "b": (prompt(60, 2), SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))}
    whole = tiny_engine(tiny_dir, max_num_batched_tokens=64, enable_chunked_prefill=False)
    sizes = []
    real_execute = whole.model_runner.execute_model
    def execute(out):
        sizes.append([e.num_new_tokens for e in out.scheduled])
        return real_execute(out)

    whole.model_runner.execute_model = execute
    got = run(whole, reqs)
    assert sizes[0] == [50]  # b's 60 tokens do not fit the 14 left: b waits, whole
    assert sizes[1] == [1, 60]  # next step they fit beside a's decode token
    assert all(n in (1, 50, 60) for step in sizes for n in step)  # never a chunk
    want = run(tiny_engine(tiny_dir, max_num_batched_tokens=32), reqs)  # chunked into 32s
    assert {r: o.outputs[0].token_ids for r, o in got.items()} == {r: o.outputs[0].token_ids for r, o in want.items()}


# --- nothing waits forever ------------------------------------------------------------------


def test_a_prompt_that_can_never_fit_a_step_is_refused_at_once(tiny_dir):
    """Without chunked prefill a prompt runs whole, in one step: one longer than
    max_num_batched_tokens could never run (the engine used to loop forever on
    it). It is refused when added, naming the settings, and the engine goes on."""
    llm = LLM(tiny_dir, dtype="float32", device="cpu", num_kv_blocks=64, enable_chunked_prefill=False,
              max_num_batched_tokens=32)
    t = time.perf_counter()
    with pytest.raises(ValueError, match=r"max_num_batched_tokens=32.*enable_chunked_prefill=False"):
        llm.generate(["word " * 60], SamplingParams(max_tokens=4))
    assert time.perf_counter() - t < 10  # a no-hang bound: refusing takes microseconds, the old loop forever
    assert not llm.llm_engine.has_unfinished_requests()
    out = llm.generate(["word " * 10], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 4


def test_recompute_never_grows_a_sequence_past_one_step(tiny_dir):
    """Without chunked prefill, a recomputed sequence re-reads its prompt and
    output in one step. Here prompts fit the 24-token budget but replies grow
    past it, and a 12-block pool forces preemptions: a sequence too long to
    re-read is swapped instead (it used to wait forever), and every request
    still gives what it gives alone."""
    reqs = {f"r{i}": (prompt(12 + 4 * i, 40 + i), SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
            for i in range(3)}
    alone = {}
    for rid, req in reqs.items():
        alone.update(run(tiny_engine(tiny_dir, block_size=8), {rid: req}))
    busy = tiny_engine(tiny_dir, block_size=8, num_kv_blocks=12, max_num_batched_tokens=24,
                       enable_chunked_prefill=False, preemption_mode="recompute")
    got = run(busy, reqs)
    assert busy.stats.num_swapped_out > 0  # in recompute mode: only the sequences too long to re-read
    assert busy.stats.num_swapped_in == busy.stats.num_swapped_out
    assert {r: o.outputs[0].token_ids for r, o in got.items()} == {r: o.outputs[0].token_ids for r, o in alone.items()}


def test_a_step_that_cannot_progress_raises_instead_of_spinning(tiny_dir):
    """The safety net: were a request that can never run let in (here by
    skipping the check), step() raises with the state instead of returning
    nothing forever; aborting it leaves the engine usable."""
    engine = tiny_engine(tiny_dir, enable_chunked_prefill=False, max_num_batched_tokens=32)
    engine.scheduler.check_request = lambda request, where: None
    rid = engine.add_request({"prompt_token_ids": prompt(60, 3)}, SamplingParams(max_tokens=4))
    with pytest.raises(RuntimeError, match=r"cannot make progress.*60 tokens.*max_num_batched_tokens=32"):
        engine.step()
    engine.abort_request(rid)
    assert not engine.step() and engine.block_manager.num_used_blocks == 0  # idle: an empty step is fine
    done = run(engine, {"ok": (prompt(20, 4), SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))})
    assert len(done["ok"].outputs[0].token_ids) == 3


def test_a_token_budget_smaller_than_a_block_still_schedules(tiny_dir):
    """A budget below block_size is slow (a 4-token chunk per step), not stuck:
    it is allowed, and gives the same tokens."""
    reqs = {"a": (prompt(37, 5), SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)),
            "b": (prompt(9, 6), SamplingParams(n=2, max_tokens=5, temperature=1.0, seed=1, ignore_eos=True))}
    want = run(tiny_engine(tiny_dir), reqs)
    for chunked in (True, False):
        budget = 4 if chunked else 10  # without chunking, b's 9-token prompt must fit one step; a is refused
        engine = tiny_engine(tiny_dir, block_size=16, max_num_batched_tokens=budget, enable_chunked_prefill=chunked)
        got = run(engine, reqs if chunked else {"b": reqs["b"]})
        for rid, out in got.items():
            assert [c.token_ids for c in out.outputs] == [c.token_ids for c in want[rid].outputs]


# --- requests and their samples -------------------------------------------------------------


def test_stats_count_requests_and_sequences_apart(tiny_dir):
    """An n=3 request runs as three sequences but is one request; a second
    request waits for room (max_num_seqs=3)."""
    engine = tiny_engine(tiny_dir, max_num_seqs=3)
    engine.add_request({"prompt_token_ids": prompt(10, 7)}, SamplingParams(n=3, max_tokens=5, seed=0),
                       request_id="three")
    engine.add_request({"prompt_token_ids": prompt(10, 8)}, SamplingParams(max_tokens=5), request_id="one")
    engine.step()
    st = engine.stats
    assert (st.num_running, st.num_running_reqs, st.num_waiting, st.num_waiting_reqs) == (3, 1, 1, 1)
    assert list(engine.requests) == ["three", "one"]
    three = engine.requests["three"]
    assert [s.index for s in three.samples] == [0, 1, 2] and all(s.request is three for s in three.samples)
    # one sample's state, not the request's (with the slots its managers own:
    # block_table, sampling_state, swapped_kv)
    assert len(vars(three.samples[0])) <= 17
    done = run(engine, {})
    assert len(done["three"].outputs) == 3 and done["one"].finished
    assert engine.stats.num_running_reqs == engine.stats.num_waiting_reqs == 0
    assert not hasattr(engine.sampler, "states")  # per-sequence state lives on the sequence, and went with it


def test_engine_config_and_arguments_must_agree(tiny_dir):
    from tinyinfer.config import EngineConfig

    cfg = EngineConfig(model=tiny_dir, device="cpu")
    with pytest.raises(ValueError, match="disagrees with config.model"):
        LLMEngine("another-model", config=cfg)
    with pytest.raises(ValueError, match="not both.*max_num_seqs"):
        LLMEngine(config=cfg, max_num_seqs=2)


def test_the_server_returns_n_choices(tiny_dir):
    """POST /v1/completions with n=2 (whole and streamed): one choice per sample,
    each equal to the offline API's sample with the same index."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from tinyinfer.server import build_app
    from tinyinfer.server.background import BackgroundServer

    body = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 1.0, "seed": 3, "n": 2,
            "ignore_eos": True}
    llm = LLM(tiny_dir, dtype="float32", device="cpu", num_kv_blocks=64)
    want = llm.generate(body["prompt"], SamplingParams(n=2, max_tokens=6, temperature=1.0, seed=3,
                                                       ignore_eos=True))[0].outputs
    with BackgroundServer(build_app(tiny_engine(tiny_dir), model_name="tiny")) as server:
        whole = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
        streamed = {0: "", 1: ""}
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        streamed[choice["index"]] += choice["text"]
    assert [(c["index"], c["text"]) for c in whole["choices"]] == [(c.index, c.text) for c in want]
    assert whole["usage"]["completion_tokens"] == 12
    assert streamed == {c.index: c.text for c in want}
    assert want[0].text != want[1].text


def test_the_newest_running_sequence_is_the_one_preempted(tiny_dir):
    """When the KV pool runs out, the sequence admitted last gives its blocks back
    (it has waited least, as in vLLM), and the older ones keep running. Three
    prompts of 8 tokens fill 6 of 7 blocks of 4; each first decode token needs a
    block of its own: a takes the last free one, so b's needs c's."""
    engine = LLMEngine(tiny_dir, dtype="float32", device="cpu", num_kv_blocks=7, block_size=4,
                       enable_prefix_caching=False)
    for rid, first in (("a", 10), ("b", 30), ("c", 50)):
        engine.add_request({"prompt_token_ids": list(range(first, first + 8))},
                           SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), request_id=rid)
    schedule, preempted = engine.scheduler.schedule, []

    def watched():
        out = schedule()
        preempted.append([seq.request_id for seq in out.preempted])
        return out

    engine.scheduler.schedule = watched
    done = run_until_done(engine)
    first = next(p for p in preempted if p)
    assert first == ["c"], preempted
    assert {rid: len(o.outputs[0].token_ids) for rid, o in done.items()} == {"a": 3, "b": 3, "c": 3}


# --- how the engine is built ----------------------------------------------------------------


def test_static_batching_has_no_block_pool_and_an_aborted_member_rides_along(tiny_dir):
    """scheduling="static" gives each batch a contiguous cache: no BlockManager,
    no prefix cache to reset, no KV blocks in the stats (the paged engine's are
    there from the start). An aborted member leaves `running` at once but keeps
    its row in the batch, whose shape is fixed, until the batch ends; the
    request queued behind it starts with the next batch."""
    paged = tiny_engine(tiny_dir)
    assert paged.stats.kv_blocks_total == paged.stats.kv_blocks_free == paged.block_manager.num_blocks == 256
    engine = tiny_engine(tiny_dir, scheduling="static", max_num_seqs=2)
    assert engine.block_manager is None and engine.reset_prefix_cache() == 0 and engine.stats.kv_blocks_total == 0
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    alone = run(tiny_engine(tiny_dir, scheduling="static"), {"b": (prompt(9, 2), params)})
    for rid, ids in (("a", prompt(5, 1)), ("b", prompt(9, 2)), ("c", prompt(7, 3))):
        engine.add_request({"prompt_token_ids": ids}, params, request_id=rid)
    engine.step()
    engine.abort_request("a")
    sched = engine.scheduler
    assert [s.request_id for s in sched.running] == ["b"] and len(sched.batch) == 2 and len(sched.waiting) == 1
    done = run_until_done(engine)
    assert set(done) == {"b", "c"} and done["b"].outputs[0].token_ids == alone["b"].outputs[0].token_ids
    assert sched.running == [] and sched.batch == [] and engine.stats.kv_bytes_reserved == 0


def test_eos_ids_merge_the_model_configs_and_the_tokenizers(default_model_dir):
    from dataclasses import replace

    from tinyinfer.weights import read_config

    tok, config = Tokenizer(default_model_dir), read_config(default_model_dir)
    own = tok.eos_token_id
    assert own is not None
    assert tok.eos_token_ids(replace(config, eos_token_id=[own + 7, own + 3])) == [own, own + 3, own + 7]
    assert tok.eos_token_ids(replace(config, eos_token_id=None)) == [own]
    assert tok.eos_token_ids(replace(config, eos_token_id=own)) == [own]  # listed once
