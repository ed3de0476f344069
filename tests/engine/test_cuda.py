"""The engine on a CUDA GPU. Skipped without one (torch.cuda.is_available()).

The model is built here from seeded random weights in the real shape of the
default model (SmolLM2-135M: 30 layers, width 576, 9 query and 3 key/value
heads), with the default model's tokenizer: nothing is downloaded. A GPU
machine needs only the tokenizer files in the default model's folder
(config.cache_dir() / "smollm2-135m-instruct": tokenizer.json,
tokenizer_config.json; 4 MB), or TINYINFER_HOME pointing at a folder that has
them: without them, on a GPU, every test fails and says so (a run of skips
would look green). Random weights check what parity checks: both programs
compute the same function, with the real shapes and so the real kernels.
The file needs none of conftest.py's Jupyter packages: the GPU machine's image
has none.

What is checked:
  - parity with transformers, fp32 with TF32 off: greedy tokens and prompt
    log-probabilities, eager and with CUDA graphs (enforce_eager=False);
  - the graphs: every decode step replayed, buffers that never move, a few
    launches per step where eager makes hundreds, an oversize batch eager;
  - INT8 and INT4 run (torch's kernel where the GPU has one, the reference path
    elsewhere; never refused), agree with the unquantized model, and run under graphs;
  - preemption by swap: a sequence's keys go to host memory and come back, and
    the tokens are those of an engine with room for all;
  - bf16: graphs against eager (attention's 16-bit kernels), and fp16 (a T4's
    type) against fp32 on a long prompt;
  - two engines with default settings in one process; cuDNN attention off; a
    weight replaced after recording; an engine on a GPU that is not the current
    one (with two GPUs).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

SHAPE_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                  num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                  rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Here is a short poem about the sea:\n",
           "In one sentence, the lighthouse keeper's advice was"]
POOL = 2**30  # each engine a fixed 1 GiB KV pool: several live side by side here
# The CUDA runtime's and driver's calls that launch work (cuBLAS on Hopper uses the *Ex ones).
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaLaunchCooperativeKernel", "cudaGraphLaunch", "cuGraphLaunch")


@pytest.fixture(autouse=True)
def no_tf32():
    """fp32 parity means fp32 products: TF32 (10-bit mantissas) off, then as it
    was. torch 2.9 and later have one setting per backend and refuse a mix of
    it and the older flags; older ones have the flags only."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        before = matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision
        matmul.fp32_precision = torch.backends.cudnn.conv.fp32_precision = "ieee"
        yield
        matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = before
        return
    before = matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def tokenizer_folder() -> Path:
    """The default model's tokenizer files, under TINYINFER_HOME (default
    ~/.cache/tinyinfer). Missing on a GPU, they fail the run rather than skip it."""
    from tinyinfer.config import cache_dir

    folder = cache_dir() / "smollm2-135m-instruct"
    if not (folder / "tokenizer.json").exists():
        pytest.fail(f"no tokenizer files in {folder}: set TINYINFER_HOME to a folder whose smollm2-135m-instruct/ "
                    "holds tokenizer.json and tokenizer_config.json (scripts/gpu_prepare.py makes one)",
                    pytrace=False)
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """Seeded random weights in the 135M shape, saved with the default model's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer_folder()
    folder = tmp_path_factory.mktemp("random-135m")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**SHAPE_135M)).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def hf(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to("cuda").eval()


def engine(model_dir, **kw):
    from tinyinfer import LLM

    kw.setdefault("dtype", "float32")
    kw.setdefault("device", "cuda")
    return LLM(str(model_dir), kv_cache_memory_bytes=POOL, max_num_seqs=8, **kw)


def greedy(llm, prompts, n):
    from tinyinfer import SamplingParams

    outs = llm.generate(prompts, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outs]


def hf_greedy(hf, ids, n):
    x = torch.tensor([ids], device="cuda")
    with torch.inference_mode():
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=2)
    return out[0, len(ids):].tolist()


def prompt_logprobs(llm, ids):
    from tinyinfer import SamplingParams

    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))[0]
    return torch.tensor([out.prompt_logprobs[t][ids[t]].logprob for t in range(1, len(ids))])


@pytest.mark.parametrize("enforce_eager", [True, False], ids=["eager", "graphs"])
def test_parity_with_transformers(model_dir, hf, enforce_eager):
    """fp32: 4 prompts' greedy continuations of 32 tokens are transformers', and so
    are the log-probabilities of every token of a 150-token prompt."""
    from tinyinfer.cuda_graphs import CudaGraphBackend

    llm = engine(model_dir, enforce_eager=enforce_eager)
    graphs = llm.runner.cuda_graphs
    assert (graphs is None) == enforce_eager
    if graphs is not None:
        assert isinstance(graphs.backend, CudaGraphBackend) and graphs.graphs
    tok = llm.get_tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS]
    ours = greedy(llm, [{"prompt_token_ids": p} for p in prompts], 32)
    assert ours == [hf_greedy(hf, p, 32) for p in prompts]
    assert llm.llm_engine.stats.num_eager_decode_steps == 0, llm.llm_engine.stats.eager_decode_reason
    ids = tok.encode(" ".join(PROMPTS) * 5)[:150]
    with torch.inference_mode():
        ref = torch.log_softmax(hf(torch.tensor([ids], device="cuda")).logits[0].float(), -1).cpu()
    want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert (prompt_logprobs(llm, ids) - want).abs().max().item() < 1e-3


def test_graphs_replay_from_fixed_buffers_with_few_launches(model_dir):
    """Batches of 1 to 8 with contexts of different lengths: the eager engine's
    tokens; every decode step a replay (none re-recorded); the buffers where
    they were when recorded; a replayed step launches a handful of kernels (the
    graph, the copies, the logits and the sampling) where an eager one launches
    hundreds; a batch past the largest size runs eagerly and says why."""
    from torch.profiler import ProfilerActivity, profile

    from tinyinfer import SamplingParams

    eager = engine(model_dir)
    graphed = engine(model_dir, enforce_eager=False)
    runner = graphed.runner
    recorded = dict(runner.cuda_graphs.graphs)
    buffers = runner.decode_buffers
    tensors = (buffers.inputs, runner.cuda_graphs.outputs)
    addresses = [t.data_ptr() for t in tensors]
    long_prompt = " ".join(["word"] * 99)  # 100 tokens: past the shortest key length
    for n in range(1, 9):
        prompts = [PROMPTS[i % 4] if i % 2 else long_prompt for i in range(n)]
        assert greedy(graphed, prompts, 8) == greedy(eager, prompts, 8), n
    assert graphed.llm_engine.stats.num_eager_decode_steps == 0
    assert runner.cuda_graphs.graphs == recorded  # nothing recorded again
    assert [t.data_ptr() for t in tensors] == addresses

    def launches_per_decode_step(llm):
        engine_ = llm.llm_engine
        for p in PROMPTS:
            engine_.add_request(p, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
        engine_.step()
        engine_.step()  # prefill done: decode steps from here
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(4):
                engine_.step()
            torch.cuda.synchronize()
        engine_.abort_request(list(engine_.requests))
        return sum(e.count for e in prof.key_averages() if e.key in LAUNCH_CALLS) / 4

    few, many = launches_per_decode_step(graphed), launches_per_decode_step(eager)
    assert few < 40 < 300 < many, (few, many)

    runner.capture_sizes = [1, 2]  # as if 2 were the largest size: a batch of 4 runs eagerly
    engine_ = graphed.llm_engine
    for p in PROMPTS:
        engine_.add_request(p, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    reasons = set()
    while engine_.has_unfinished_requests():
        engine_.step()
        reasons.add(engine_.stats.eager_decode_reason)
    assert "a batch of 4 sequences is larger than the largest recorded (CUDA graph) size, 2" in reasons


def test_a_pinned_staging_buffer_feeds_the_step_in_one_copy(model_dir):
    runner = engine(model_dir, enforce_eager=False).runner
    buffers = runner.decode_buffers
    assert buffers.staging is not buffers.inputs and buffers.staging.is_pinned() and buffers.inputs.is_cuda
    buffers.write([5, 6], [3, 40], [[1], [2, 3, 4]], size=4, num_keys=64)
    torch.cuda.synchronize()
    assert buffers.input_ids[:4].tolist() == [5, 6, 0, 0]
    assert buffers.positions[:4].tolist() == [2, 39, 0, 0]
    pad = buffers.pad_block
    assert buffers.block_tables[:4, :4].tolist() == [[1, pad, pad, pad], [2, 3, 4, pad]] + [[pad] * 4] * 2


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_layers_match_their_reference_path(method):
    """On this GPU each kind takes torch's kernel if it has a working one (the
    probe checks its numbers), else the reference path; a kernel that exists
    but fails is a bug. Either way the layer computes the reference's numbers.
    Width 576 (the 135M model's) is not a whole number of 128-wide groups."""
    from tinyinfer import quant

    assert quant.kernel_error(method, "cuda", torch.bfloat16) is None
    has_kernel = quant.kernel_available(method, "cuda", torch.bfloat16)
    if method == "int4":
        major, minor = torch.cuda.get_device_capability()
        assert has_kernel or (major, minor) < quant.CUDA_INT4_CAPABILITY, "an A100 or later has tinygemm"
    torch.manual_seed(0)
    w = (torch.randn(1536, 576) * 0.02).to("cuda", torch.bfloat16)
    layer = quant.Int4Linear.from_weight(w, 128) if method == "int4" else quant.Int8Linear.from_weight(w)
    assert layer.has_layout() == has_kernel
    x = torch.randn(3, 576, device="cuda").to(torch.bfloat16)
    fast = layer(x).float()
    layer.use_kernel = False
    ref = layer(x).float()
    torch.testing.assert_close(fast, ref, rtol=3e-2, atol=3e-2 * ref.abs().max().item())


def test_int8_and_int4_run_and_agree_with_the_unquantized_model(model_dir):
    """bf16 (tinygemm's dtype). Each quantized engine's log-probabilities of a
    120-token prompt follow the unquantized engine's (on a CPU, with this
    model: correlation 0.9995 for INT8 and 0.93 for INT4). And each writes
    under graphs what it writes eagerly: the same kernels, recorded. A random
    model's best tokens are nearly tied, so bf16 rounding may change a token
    and everything after it; up to there, the tokens' log-probabilities agree,
    and the continuations agree past their first token (from the prompt step,
    eager in both) somewhere."""
    from tinyinfer.tokenizer import Tokenizer

    ids = Tokenizer(model_dir).encode(" ".join(PROMPTS) * 3)[:120]
    base = prompt_logprobs(engine(model_dir, dtype="bfloat16"), ids)
    for method, least in (("int8", 0.99), ("int4", 0.8)):
        quantized = engine(model_dir, dtype="bfloat16", quantization=method)
        got = prompt_logprobs(quantized, ids)
        assert torch.corrcoef(torch.stack([base, got]))[0, 1] > least, method
        graphed = engine(model_dir, dtype="bfloat16", quantization=method, enforce_eager=False)
        assert decoded_alike(quantized, graphed) >= 4, method  # of 28: graphs that ran garbage agree on none


def decoded_alike(a_llm, b_llm) -> int:
    """Greedy continuations of PROMPTS from two engines in 16 bits: up to
    their first different token, the chosen tokens' log-probabilities agree;
    returns how many decoded tokens (past the first, from the eager prompt
    step) agreed. A random model's best tokens are nearly tied, so rounding
    may change a token and everything after it."""
    from tinyinfer import SamplingParams

    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0)
    agreed = 0
    for a, b in zip(a_llm.generate(PROMPTS, params), b_llm.generate(PROMPTS, params)):
        a, b = a.outputs[0], b.outputs[0]
        for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)):
            if x != y:
                break
            assert abs(a.logprobs[i][x].logprob - b.logprobs[i][y].logprob) < 0.1, i
            agreed += i > 0
    return agreed


def test_preemption_by_swap(model_dir):
    """A pool too small for 4 sequences at once: some are swapped out to host
    memory and back, with graphs on; the tokens are those of an engine with room."""
    from tinyinfer import LLMEngine, SamplingParams
    from tinyinfer.llm_engine import run_until_done

    def run(**kw):
        llm_engine = LLMEngine(str(model_dir), dtype="float32", device="cuda", block_size=8, enforce_eager=False,
                               max_num_seqs=4, **kw)
        for i, p in enumerate(PROMPTS):
            llm_engine.add_request(p, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True),
                                   request_id=f"r{i}")
        finished = run_until_done(llm_engine)
        return llm_engine, {rid: list(o.outputs[0].token_ids) for rid, o in finished.items()}

    _, roomy = run(kv_cache_memory_bytes=POOL)
    tight, squeezed = run(num_kv_blocks=14, preemption_mode="swap")  # 112 slots for about 4 x 52 tokens
    assert tight.stats.num_swapped_out > 0 and tight.stats.num_swapped_out == tight.stats.num_swapped_in
    assert squeezed == roomy


def test_bf16_graphs_decode_as_eager_bf16_does(model_dir):
    """bf16 attention takes the GPU's 16-bit kernels (fp32 parity never
    reaches them): recorded steps, padded to a key length, against eager ones."""
    assert decoded_alike(engine(model_dir, dtype="bfloat16"),
                         engine(model_dir, dtype="bfloat16", enforce_eager=False)) >= 4


def test_fp16_keeps_to_fp32_on_a_long_prompt(model_dir):
    """fp16, a T4's 16-bit type, has 5 exponent bits: a residual stream past
    65,504 becomes inf. The log-probabilities of a 512-token prompt stay finite
    and near fp32's. (Random weights; with the packaged weights, on a CPU, the
    stream peaked at 27,347 and the largest difference was 0.031.)"""
    from tinyinfer.tokenizer import Tokenizer

    ids = (Tokenizer(model_dir).encode(" ".join(PROMPTS)) * 40)[:512]
    half = prompt_logprobs(engine(model_dir, dtype="float16"), ids)
    full = prompt_logprobs(engine(model_dir, dtype="float32"), ids)
    assert torch.isfinite(half).all() and (half - full).abs().max().item() < 0.1


def test_two_engines_with_default_settings_share_the_gpu(model_dir):
    """No pool size given: each engine's pool holds what it can use (16
    sequences x 8,192 tokens, twice over), so a second engine finds room."""
    from tinyinfer import LLM
    from tinyinfer.kv_pool import PREFIX_CACHE_MARGIN

    first = LLM(str(model_dir), device="cuda")
    second = LLM(str(model_dir), device="cuda", dtype="float32")
    for llm in (first, second):
        cap = 16 * 8192 * PREFIX_CACHE_MARGIN // llm.llm_engine.config.block_size
        assert 0 < llm.llm_engine.block_manager.num_blocks <= cap
    assert greedy(first, PROMPTS[:1], 4) and greedy(second, PROMPTS[:1], 4)


def test_cudnn_attention_is_out_of_the_engines_path(model_dir):
    engine(model_dir, dtype="bfloat16")
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    q = torch.randn(4, 3, 3, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(4, 3, 128, 64, device="cuda", dtype=torch.bfloat16)
    mask = torch.zeros(4, 1, 1, 128, device="cuda", dtype=torch.bfloat16)
    assert torch._fused_sdp_choice(q, k, k, mask) != 3  # 3 is cuDNN's number in SDPBackend


def test_a_weight_replaced_after_recording_is_recorded_again(model_dir):
    """A recorded step reads weights by address: a replaced weight would be
    read from freed memory. The tokens are those of the eager engine with the
    same replacement."""
    eager, graphed = engine(model_dir), engine(model_dir, enforce_eager=False)
    for llm in (eager, graphed):
        norm = llm.model.model.layers[3].post_attention_layernorm
        norm.weight = torch.nn.Parameter(norm.weight.detach() * 2)
    assert greedy(graphed, PROMPTS, 16) == greedy(eager, PROMPTS, 16)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_an_engine_on_a_gpu_that_is_not_current(model_dir):
    """cuda:1 while cuda:0 is current: the graphs record cuda:1's work."""
    eager = engine(model_dir, device="cuda:1")
    graphed = engine(model_dir, device="cuda:1", enforce_eager=False)
    torch.cuda.set_device(0)
    assert greedy(graphed, PROMPTS, 16) == greedy(eager, PROMPTS, 16)
