"""kv_cache_dtype="int8": the paged pool stores keys and values as int8 with
one float32 scale per token and KV head (kv_quant.py), quantized as they are
written and de-quantized as attention reads them.

- bytes per token and the blocks a fixed pool holds: int8 + scales, counted
  alike by tinyinfer_course.analysis.memory, by the engine and by the pool's own tensors;
- quality: greedy replies agree with the "auto" cache's on the tiny model and
  on the default model. Not exactly (int8 rounds every key), so each check has
  a floor, and broken versions (no scale, a scale over the wrong axis) are run
  through the same check to show that it fails them;
- the compiled decode step writes the eager one's tokens; prefix caching,
  preemption (swap and recompute) and chunked prefill give the same tokens as
  a roomy engine with the same int8 cache;
- a bad value is refused, naming the field and the allowed values, in the
  engine and on the server's command line."""
import argparse

import pytest
import torch
from decode_runs import greedy_tokens  # tests/ is on sys.path

from tinyinfer import LLM, LLMEngine, SamplingParams
from tinyinfer_course.analysis import memory
from tinyinfer import paged_kv_cache as pkc
from tinyinfer.config import EngineConfig, ModelConfig
from tinyinfer.kv_quant import QMAX, dequantize, quantize_per_head
from tinyinfer.llm_engine import run_until_done

PROMPTS = ["The capital of France is", "A recipe for bread starts with flour, water and", "def fibonacci(n):",
           "Once upon a time, in a small village,"]
SMOL = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                   num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192)


def _wrong_axis(x):
    """Broken: scales taken per channel across the KV heads, [N, 1, D], but
    stored as one per head (their largest): the values are divided by one
    scale and multiplied back by another."""
    scale = (x.float().abs().amax(-2, keepdim=True) / QMAX).clamp(min=1e-12).expand_as(x)
    return torch.round(x.float() / scale).clamp(-QMAX, QMAX).to(torch.int8), scale.amax(-1, keepdim=True)


BROKEN = {
    "no scale": {"dequantize": lambda q, scale, dtype: q.to(dtype)},
    "wrong axis": {"quantize_per_head": _wrong_axis},
}


def break_cache(monkeypatch, name):
    for attr, fn in BROKEN[name].items():
        monkeypatch.setattr(pkc, attr, fn)


def agreement(want, got):
    """Share of positions where the two replies hold the same token."""
    return sum(a == b for w, g in zip(want, got) for a, b in zip(w, g)) / sum(map(len, want))


# --- quantizing ------------------------------------------------------------------------


def test_quantize_per_head_rounds_each_vector_to_its_own_scale():
    torch.manual_seed(0)
    x = torch.randn(5, 3, 64) * torch.tensor([0.01, 1.0, 100.0])[None, :, None]  # heads of very different sizes
    x[0, 0] = 0  # an all-zero vector: scale positive, numbers exactly 0
    q, scale = quantize_per_head(x)
    assert q.dtype == torch.int8 and scale.shape == (5, 3, 1) and scale.dtype == torch.float32
    err = (dequantize(q, scale, torch.float32) - x).abs()
    assert (err <= scale / 2 + 1e-7).all()  # half a step of that vector's own scale
    assert (err / x.abs().amax(-1, keepdim=True).clamp(min=1e-30) <= 0.5 / QMAX + 1e-6).all()  # relative to each head
    assert (q.abs().amax(-1) == QMAX)[1:].all() and (q[0, 0] == 0).all()


# --- bytes ------------------------------------------------------------------------------


def test_bytes_per_token_count_int8_and_its_scales():
    # SmolLM2-135M: 30 layers x 3 KV heads x 2 (K and V) x (64 numbers x bytes + a 4-byte int8 scale)
    assert memory.engine_kv_bytes_per_token(SMOL, "float32") == 30 * 3 * 2 * 64 * 4 == 46080
    assert memory.engine_kv_bytes_per_token(SMOL, "bfloat16") == 23040
    assert memory.engine_kv_bytes_per_token(SMOL, "float32", "int8") == 30 * 3 * 2 * (64 + 4) == 12240
    assert memory.engine_kv_bytes_per_token(SMOL, "bfloat16", "int8") == 12240  # int8 whatever the model's dtype
    # The pool's own tensors: bytes per slot equal the formula, scales included.
    for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
        for kv in ("auto", "int8"):
            cache = pkc.PagedKVCache(SMOL, num_blocks=2, block_size=16, dtype=dtype, device="cpu", kv_cache_dtype=kv)
            assert cache.nbytes() == 32 * memory.engine_kv_bytes_per_token(SMOL, name, kv), (name, kv)


def test_a_fixed_pool_holds_about_twice_bf16s_tokens_and_four_times_fp32s():
    pool = 512 * 2**20
    tokens = {(d, kv): memory.pool_capacity(SMOL, pool, d, kv)[1] for d in ("float32", "bfloat16")
              for kv in ("auto", "int8")}
    assert tokens[("float32", "auto")] == 11648 and tokens[("float32", "int8")] == 43856
    assert 1.85 < tokens[("bfloat16", "int8")] / tokens[("bfloat16", "auto")] < 2  # 64 / 68 of twice
    assert 3.7 < tokens[("float32", "int8")] / tokens[("float32", "auto")] < 4


@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_the_engine_sizes_its_pool_as_memory_counts(tiny_dir, kv):
    pool = 2**20
    engine = LLMEngine(tiny_dir, dtype="float32", device="cpu", kv_cache_memory_bytes=pool, kv_cache_dtype=kv)
    blocks, _ = memory.pool_capacity(tiny_dir, pool, "float32", kv, block_size=engine.config.block_size)
    assert engine.block_manager.num_blocks == blocks
    assert engine.kv_bytes_per_token == memory.engine_kv_bytes_per_token(tiny_dir, "float32", kv)
    cache = engine.model_runner.paged_cache  # one block more than the manager's: the pad block
    block_bytes = engine.config.block_size * engine.kv_bytes_per_token
    assert blocks * block_bytes <= pool < (blocks + 1) * block_bytes
    assert cache.nbytes() == (blocks + 1) * block_bytes
    assert (cache.k.dtype == torch.int8) == (kv == "int8")


# --- quality ------------------------------------------------------------------------------


TINY_FLOOR = 0.9  # int8 agrees with auto on 100% of the tiny model's greedy tokens; "no scale" 0%, "wrong axis" 17%


@pytest.fixture(scope="module")
def tiny_auto_replies(tiny_dir):
    return greedy_tokens(LLM(tiny_dir, dtype="float32", device="cpu", num_kv_blocks=64), PROMPTS, 32)


@pytest.mark.parametrize("broken", [None, *BROKEN])
def test_greedy_agreement_on_the_tiny_model(tiny_dir, tiny_auto_replies, monkeypatch, broken):
    if broken:
        break_cache(monkeypatch, broken)
    int8 = LLM(tiny_dir, dtype="float32", device="cpu", num_kv_blocks=64, kv_cache_dtype="int8")
    got = greedy_tokens(int8, PROMPTS, 32)
    share = agreement(tiny_auto_replies, got)
    assert (share >= TINY_FLOOR) == (broken is None), f"{broken or 'int8'}: {share:.0%} of tokens agree"


@pytest.mark.slow
@pytest.mark.parametrize("broken", [None, "wrong axis"])
def test_greedy_agreement_on_the_default_model(llm, monkeypatch, broken):
    """A short prompt on the default model, fp32: the int8 cache wrote the auto
    cache's 32 tokens (2026-12-05, Xeon, 2 cores); a scale over the wrong
    axis agreed on none. Over longer replies the two do part (a near-tie decides
    once, and the rest follows): benchmarks/kv_int8.py measures how often."""
    if broken:
        break_cache(monkeypatch, broken)
    want = greedy_tokens(llm, PROMPTS[:1], 32)
    int8 = LLM("smollm2-135m-instruct", dtype="float32", device="cpu", kv_cache_memory_bytes=16 * 2**20,
               kv_cache_dtype="int8")
    share = agreement(want, greedy_tokens(int8, PROMPTS[:1], 32))
    assert (share >= 0.75) == (broken is None), f"{broken or 'int8'}: {share:.0%} of tokens agree"


# --- every path of the engine ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_prefix_caching_and_chunks_keep_int8_replies(tiny_dir, mode):
    """A pool too small for the batch (preemption, in both modes), a budget of
    24 tokens per step (chunked prompts) and a shared 40-token prefix (prefix
    caching): the same int8 tokens as each request alone on a roomy engine.
    Swapping moves the int8 numbers and their scales as they are; recompute
    and chunks quantize the same keys again."""
    base = dict(dtype="float32", device="cpu", block_size=8, kv_cache_dtype="int8")
    prefix = PROMPTS[1] * 5
    prompts = [prefix + " one", prefix + " two", PROMPTS[0], PROMPTS[2] * 4]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    alone = [LLM(tiny_dir, num_kv_blocks=64, **base).generate(p, params)[0].outputs[0].token_ids for p in prompts]
    busy = LLMEngine(tiny_dir, num_kv_blocks=14, max_num_batched_tokens=24, preemption_mode=mode, **base)
    for i, p in enumerate(prompts):
        busy.add_request(p, params, request_id=str(i))
    done = run_until_done(busy)
    assert busy.stats.num_preemptions > 0, "the pool was meant to force preemption"
    if mode == "swap":
        assert busy.stats.num_swapped_out > 0
    assert [list(done[str(i)].outputs[0].token_ids) for i in range(len(prompts))] == [list(a) for a in alone]


@pytest.mark.slow
def test_compiled_decode_with_an_int8_cache_writes_the_eager_tokens(one_layer_dir):
    """enforce_eager=False: the compiled step quantizes and de-quantizes inside
    its graph; at batch 1 and in a batch of unequal lengths its tokens are the
    eager int8 engine's."""
    kw = dict(dtype="float32", device="cpu", num_kv_blocks=64, kv_cache_dtype="int8", max_num_seqs=2)  # sizes 1, 2
    eager, compiled = LLM(one_layer_dir, **kw), LLM(one_layer_dir, **kw, enforce_eager=False)
    for prompts in (PROMPTS[:1], PROMPTS[:2]):
        assert greedy_tokens(compiled, prompts, 12) == greedy_tokens(eager, prompts, 12), prompts
    assert compiled.llm_engine.stats.num_eager_decode_steps == 0  # every decode step ran compiled


# --- refusing -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["fp8", "int4", None, "INT8"])
def test_a_bad_kv_cache_dtype_is_refused_before_loading(bad):
    with pytest.raises(ValueError, match=r"kv_cache_dtype=.* is invalid: must be one of 'auto', 'int8'"):
        EngineConfig(kv_cache_dtype=bad)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM("no-such-model", kv_cache_dtype=bad)  # refused before any model is looked for


def test_int8_needs_the_paged_pool():
    with pytest.raises(ValueError, match="kv_cache_dtype='int8' is invalid with scheduling='static'"):
        EngineConfig(kv_cache_dtype="int8", scheduling="static")


def test_the_server_and_the_terminal_take_the_flag(tiny_dir):
    from tinyinfer import cli
    from tinyinfer.server import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args([]).kv_cache_dtype == "auto"
    args = p.parse_args(["--model", tiny_dir, "--kv-cache-dtype", "int8", "--num-kv-blocks", "8"])
    config = EngineConfig.from_cli_args(args)
    assert config.kv_cache_dtype == "int8"
    engine = LLMEngine(**{k: getattr(config, k) for k in ("model", "kv_cache_dtype", "num_kv_blocks")})
    assert engine.model_runner.paged_cache.k.dtype == torch.int8  # what `tinyinfer serve` builds from the flag
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8' is invalid"):
        EngineConfig.from_cli_args(p.parse_args(["--kv-cache-dtype", "fp8"]))
    assert "kv_cache_dtype" in cli.ENGINE_FLAGS  # generate and chat take it too


# --- the stored report --------------------------------------------------------------------


def test_the_stored_report_renders_with_its_engine_note():
    from tinyinfer_course.reports import kv_int8 as kvq

    report = kvq.load()
    meta = report["meta"]
    assert meta["cpu"] and meta["engine_stamp"]["engine_fingerprint"] and meta["engine_stamp"]["engine_modules"]
    assert [r["dtype"] for r in report["rows"]] == ["float32", "bfloat16"] and report["reference"]
    for row in report["rows"]:
        assert row["bytes_per_token"] == {kv: memory.engine_kv_bytes_per_token(meta["model"], row["dtype"], kv)
                                          for kv in ("auto", "int8")}
    table = kvq.table(report)
    assert len(table.splitlines()) == 2 + len(report["rows"]) + len(report["reference"])  # header, rule, rows
    same = kvq.engine_note(report, today=meta["engine_stamp"])
    assert "the same code as today's engine" in same and meta["cpu"] in same
    today = {"engine_fingerprint": "0" * 16,
             "engine_modules": {**meta["engine_stamp"]["engine_modules"], "tinyinfer.kv_quant": "changed!"}}
    older = kvq.engine_note(report, today=today)
    assert "older engine" in older and "kv_quant" in older


def test_one_int8_rule_and_one_scale_size():
    """The weights' int8 and the KV cache's int8 round by one rule (kv_quant.quantize_symmetric),
    and the pool's bytes per token count the scale the pool stores (config.KV_SCALE_BYTES)."""
    from tinyinfer import quant
    from tinyinfer.config import KV_SCALE_BYTES
    from tinyinfer.kv_quant import SCALE_DTYPE, quantize_per_head

    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    w[3] = 0  # an all-zero row quantizes to zeros, with a positive scale
    q_rows, s_rows = quant.quantize_int8(w)
    q_vecs, s_vecs = quantize_per_head(w)
    assert torch.equal(q_rows, q_vecs) and torch.equal(s_rows, s_vecs[:, 0])
    assert not q_rows[3].any() and s_rows[3] > 0
    assert torch.finfo(SCALE_DTYPE).bits // 8 == KV_SCALE_BYTES
