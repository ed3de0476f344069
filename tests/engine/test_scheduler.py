"""Continuous batching on the real model: batching, chunking, preemption and
prefix caching must never change a greedy output, lose a request or leak a block."""
import random

import pytest

from tinyinfer import LLMEngine, SamplingParams
from tinyinfer_course.analysis.eval import eval_text
from tinyinfer.llm_engine import run_until_done

pytestmark = pytest.mark.slow

ENGINE_ARGS = dict(dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def text_ids(llm):
    return llm.tokenizer.encode(eval_text())


def make_workload(text_ids, n, seed=0, max_prompt=60, max_out=20):
    rng = random.Random(seed)
    work = []
    for _ in range(n):
        length, start = rng.randint(3, max_prompt), rng.randrange(0, 4000)
        params = SamplingParams(temperature=0, max_tokens=rng.randint(1, max_out), ignore_eos=rng.random() < 0.5)
        work.append(({"prompt_token_ids": text_ids[start : start + length]}, params))
    return work


def run_all(engine, work):
    """Add every request, step until all finish; return outputs by request id order."""
    ids = [engine.add_request(p, sp) for p, sp in work]
    done = run_until_done(engine)  # a step that cannot progress raises: no endless loop
    return [done[i].outputs[0].token_ids for i in ids]


def assert_no_blocks_held(engine):
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)
    assert not engine.scheduler.running and not engine.scheduler.waiting


@pytest.fixture(scope="module")
def workload_alone(text_ids):
    """16 requests, each run on its own: the reference for every batched run."""
    work = make_workload(text_ids, 16)
    engine = LLMEngine(**dict(ENGINE_ARGS, enable_prefix_caching=False))
    return work, [run_all(engine, [w])[0] for w in work]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_many_concurrent_requests_under_preemption_match_running_alone(workload_alone, mode):
    work, alone = workload_alone
    # 12 blocks of 8 tokens = 96 slots for 16 requests of up to 80 tokens each:
    # sequences must be preempted. A small token budget forces prompts to be
    # chunked too.
    args = dict(ENGINE_ARGS, num_kv_blocks=12, block_size=8, max_num_seqs=16, max_num_batched_tokens=32,
                preemption_mode=mode)
    busy = LLMEngine(**args)
    together = run_all(busy, work)
    assert busy.scheduler.num_preemptions > 0, "the block budget was meant to force preemption"
    if mode == "swap":
        assert busy.stats.num_swapped_out == busy.stats.num_swapped_in > 0
    assert_no_blocks_held(busy)
    for (prompt, params), got, ref in zip(work, together, alone):
        assert got == ref
        assert len(got) <= params.max_tokens


def test_static_batching_gives_the_same_greedy_tokens(text_ids):
    work = make_workload(text_ids, 6, seed=1)
    continuous = run_all(LLMEngine(**ENGINE_ARGS), work)
    static = LLMEngine(**dict(ENGINE_ARGS, scheduling="static", max_num_seqs=4))
    assert run_all(static, work) == continuous
    assert static.stats.kv_bytes_reserved == 0  # every batch has ended and released its cache
    # While a batch runs, its contiguous cache is reserved for the longest member.
    static.add_request(*work[0])
    static.add_request(*work[1])
    static.step()
    assert static.stats.kv_bytes_reserved > static.stats.kv_bytes_used > 0


def test_aborts_mid_generation_free_every_block(text_ids):
    engine = LLMEngine(**dict(ENGINE_ARGS, num_kv_blocks=40, block_size=8))
    work = make_workload(text_ids, 8, seed=2, max_out=30)
    ids = [engine.add_request(p, sp) for p, sp in work]
    for _ in range(4):
        engine.step()
    assert engine.block_manager.num_used_blocks > 0
    engine.abort_request(ids[::2])
    engine.abort_request("no-such-request")  # ignored
    run_until_done(engine)
    assert_no_blocks_held(engine)
    # and the engine still works afterwards
    assert run_all(engine, work[:1])[0]


def test_prefix_cache_hit_skips_tokens_and_changes_nothing(text_ids):
    shared = text_ids[100:164]  # 64 tokens = 4 full blocks of 16
    a = {"prompt_token_ids": shared + text_ids[300:305]}
    b = {"prompt_token_ids": shared + text_ids[400:410]}
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    cached = LLMEngine(**ENGINE_ARGS)
    run_all(cached, [(a, params)])
    assert cached.stats.prefix_cache_hit_tokens == 0
    with_hit = run_all(cached, [(b, params)])[0]
    assert cached.stats.prefix_cache_hit_tokens == 64
    plain = run_all(LLMEngine(**dict(ENGINE_ARGS, enable_prefix_caching=False)), [(b, params)])[0]
    assert with_hit == plain
    assert_no_blocks_held(cached)
    # After a reset the same prompt finds nothing cached and computes every token.
    assert cached.reset_prefix_cache() > 0
    assert run_all(cached, [(b, params)])[0] == plain
    assert cached.stats.prefix_cache_hit_tokens == 64  # cumulative: no new hit


def test_step_outputs_are_incremental_and_stats_are_reported(text_ids):
    engine = LLMEngine(**ENGINE_ARGS)
    rid = engine.add_request({"prompt_token_ids": text_ids[:20]}, SamplingParams(temperature=0, max_tokens=5))
    seen = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == rid
            seen.append(len(out.outputs[0].token_ids))
    assert seen == [1, 2, 3, 4, 5]
    st = engine.stats
    assert st.kv_blocks_total == st.kv_blocks_used + st.kv_blocks_free
    assert st.kv_bytes_per_block == 16 * engine.kv_bytes_per_token
    assert st.num_decode_tokens == 1 and st.num_prefill_tokens == 0


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
    (dict(block_size=0), "block_size"),
    (dict(num_kv_blocks=-1), "num_kv_blocks"),
    (dict(scheduling="fastest"), "scheduling"),
    (dict(preemption_mode="drop"), "preemption_mode"),
])
def test_bad_engine_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        LLMEngine(**dict(ENGINE_ARGS, **kwargs))


def test_a_request_larger_than_the_kv_pool_is_refused_up_front(text_ids):
    engine = LLMEngine(**dict(ENGINE_ARGS, num_kv_blocks=2, block_size=8))
    with pytest.raises(ValueError, match="KV blocks"):
        engine.add_request({"prompt_token_ids": text_ids[:10]}, SamplingParams(max_tokens=20))
    assert not engine.has_unfinished_requests()
    assert run_all(engine, [({"prompt_token_ids": text_ids[:4]}, SamplingParams(temperature=0, max_tokens=4))])
