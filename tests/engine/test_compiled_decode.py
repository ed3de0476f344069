"""enforce_eager=False: decode steps run a torch.compile'd model and must write
exactly the tokens the eager engine writes (greedy, fp32), at batch 1 and in a
batch whose sequences have different lengths (the masked decode path). The
engine compiles every kind of decode step when it is built, so that no request
waits for a compile: generating afterwards compiles nothing.

The engines here run a 1-layer random model: the code paths are the real
model's, and the compiles take seconds instead of minutes (a compiled graph's
size, and the C++ compiler's work, grow with the layers; the default model has
30, conftest's tiny model 2, and one layer compiled in 13% less time than two).
Chapter 4 and lab 4 compile the real model."""
import pytest

from decode_runs import eager_decode_reasons  # tests/ is on sys.path

from tinyinfer import LLM, SamplingParams

PROMPTS = ["The capital of France is", "A recipe for bread starts with flour, water and"]  # 5 and 10 tokens


def test_enforce_eager_is_checked_before_loading():
    with pytest.raises(ValueError, match="enforce_eager=1 is invalid"):
        LLM(enforce_eager=1)
    with pytest.raises(ValueError, match="scheduling='static'"):
        LLM(enforce_eager=False, scheduling="static")


@pytest.mark.slow
def test_compiled_decode_writes_the_eager_tokens(one_layer_dir):
    """INT8 weights with fp32 activations: its packed kernel serves up to 4 rows
    (quant.KERNEL_MAX_ROWS), so a batch of 5 (padded to 8) takes another path,
    and another graph, which the engine must have compiled when it was built
    too. (On a CPU without bf16 units, a bf16 model switches at 4 rows in the same way.)"""
    from torch._dynamo.utils import counters

    # max_num_seqs=8: compiled sizes 1, 2, 4 and 8 (each size is a compile; 16 would add one and test nothing more)
    kw = dict(dtype="float32", device="cpu", num_kv_blocks=64, quantization="int8", max_num_seqs=8)
    eager = LLM(one_layer_dir, **kw)
    compiled = LLM(one_layer_dir, **kw, enforce_eager=False)
    graphs = counters["stats"]["unique_graphs"]  # compiled when the engine was built
    runner = compiled.runner
    batch_sizes = []  # batch size of every step that ran the compiled model
    execute, compiled_model = runner.execute_model, runner.compiled_model

    def spy_execute(scheduler_output):
        runner.compiled_model = lambda: batch_sizes.append(len(scheduler_output.scheduled)) or compiled_model()
        return execute(scheduler_output)

    runner.execute_model = spy_execute
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    batches = (PROMPTS[:1], PROMPTS, PROMPTS[:1] * 5)  # batch 1; unequal lengths; 5 equal ones
    for prompts in batches:
        want = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
        got = [o.outputs[0].token_ids for o in compiled.generate(prompts, params)]
        assert got == want, prompts
    # Every decode step compiled, prefills eager: 7 steps at batch 1, then 7 at 2, 7 at 5.
    assert batch_sizes == [1] * 7 + [2] * 7 + [5] * 7
    assert graphs > 0 and counters["stats"]["unique_graphs"] == graphs  # nothing compiled mid-request


@pytest.mark.slow
def test_a_failed_compile_warns_and_the_engine_carries_on_eagerly(one_layer_dir, monkeypatch):
    import torch

    def no_compiler(gm, example_inputs):  # stands in for a machine without a C++ compiler
        raise RuntimeError("no C++ compiler found")

    eager = LLM(one_layer_dir, dtype="float32", device="cpu", num_kv_blocks=64)
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: compile_(model, backend=no_compiler))
    with pytest.warns(RuntimeWarning, match="torch.compile failed.*no C\\+\\+ compiler"):
        engine = LLM(one_layer_dir, dtype="float32", device="cpu", num_kv_blocks=64, enforce_eager=False)
    assert engine.runner.enforce_eager  # the engine carries on eagerly; steps do not try again
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    got = engine.generate(PROMPTS[:1], params)[0].outputs[0].token_ids
    assert got == eager.generate(PROMPTS[:1], params)[0].outputs[0].token_ids


def test_decode_guards_keep_layer_0_everything_outside_the_layers_and_the_inputs():
    from types import SimpleNamespace

    from tinyinfer.model_runner import decode_step_guards

    layers = "self._modules['model']._modules['layers']"
    kept = [f"{layers}._modules['0']._modules['mlp']._modules['down_proj']", f"{layers}._modules",  # the depth
            "self._modules['lm_head']", "cache.k_layers[0]", "cache.k_layers", "meta.groups[10].mask",
            "input_ids", "G['__import_torch']"]
    dropped = [f"{layers}._modules['1']._modules['mlp']", f"{layers}._modules['29']", f"{layers}._modules['10']",
               "cache.k_layers[1]", "cache.v_layers[29]"]
    guards = [SimpleNamespace(name=n, guard_type="TYPE_MATCH") for n in kept + dropped]
    assert decode_step_guards(guards) == [True] * len(kept) + [False] * len(dropped)


@pytest.mark.slow
def test_two_compiled_models_in_one_process_each_run_their_own_graphs(one_layer_dir, tiny_dir):
    """The guards kept tell models apart: the 2-layer model must not run the
    1-layer model's graphs (both compiled here, in one process)."""
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    kw = dict(dtype="float32", device="cpu", num_kv_blocks=64, max_num_seqs=2)  # compiled sizes 1 and 2
    for folder in (one_layer_dir, tiny_dir):
        eager = LLM(folder, **kw)
        compiled = LLM(folder, **kw, enforce_eager=False)
        for prompts in (PROMPTS[:1], PROMPTS):
            want = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
            assert [o.outputs[0].token_ids for o in compiled.generate(prompts, params)] == want, (folder, prompts)


def test_each_emulated_cpu_compiles_into_a_cache_of_its_own():
    from inductor_cache import inductor_cache_dir  # tests/ is on sys.path

    assert inductor_cache_dir({}) is None  # native kernels: torch's default folder
    avx2 = inductor_cache_dir({"ATEN_CPU_CAPABILITY": "avx2"})
    default = inductor_cache_dir({"ATEN_CPU_CAPABILITY": "default"})
    assert None not in (avx2, default) and avx2 != default
    user_set = {"ATEN_CPU_CAPABILITY": "avx2", "TORCHINDUCTOR_CACHE_DIR": "/x"}
    assert inductor_cache_dir(user_set) is None  # the user's choice wins


def test_decode_batches_pad_up_to_a_short_list_of_sizes():
    from tinyinfer.decode_batch import capture_sizes, padded_size

    assert capture_sizes(16) == [1, 2, 4, 8, 16]
    assert capture_sizes(32) == [1, 2, 4, 8, 16, 24, 32]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 24]  # the last size holds max_num_seqs
    assert capture_sizes(3) == [1, 2, 4] and capture_sizes(1) == [1]
    sizes = capture_sizes(32)
    assert [padded_size(n, sizes) for n in (1, 2, 3, 5, 8, 9, 17, 32)] == [1, 2, 4, 8, 8, 16, 24, 32]
    assert padded_size(33, sizes) is None


def test_padded_rows_touch_only_the_reserved_block():
    import torch

    from tinyinfer.decode_batch import DecodeBuffers

    buffers = DecodeBuffers(max_size=8, max_blocks_per_seq=4, block_size=4, pad_block=9, device="cpu")
    input_ids, meta = buffers.fill([11, 12, 13], [6, 2, 9], [[3, 5], [7], [0, 1, 2]], size=4)
    assert input_ids.tolist() == [[11, 12, 13, 0]]
    assert meta.positions.tolist() == [[5, 1, 8, 0]]
    assert meta.slot_mapping.tolist() == [5 * 4 + 1, 7 * 4 + 1, 2 * 4 + 0, 9 * 4]  # the pad row writes to block 9
    tables = [[3, 5, 9], [7, 9, 9], [0, 1, 2], [9, 9, 9]]  # padded with the reserved block
    assert meta.key_slots.tolist() == [[tables[b][p // 4] * 4 + p % 4 for p in range(9)] for b in range(4)]
    seen = [[p < c for p in range(9)] for c in (6, 2, 9, 1)]  # each row sees its own context; the pad row, one key
    # additive, in the model's dtype: 0 where a row may look, -inf where not (SDPA converts nothing)
    assert meta.mask.shape == (4, 1, 1, 9) and meta.mask.dtype == torch.float32
    assert meta.mask[:, 0, 0].tolist() == [[0.0 if s else -float("inf") for s in row] for row in seen]
    assert input_ids.data_ptr() == buffers.inputs.data_ptr()  # the inputs are views: their addresses never move
    assert meta.positions.data_ptr() == buffers.positions.data_ptr()
    _, meta = buffers.fill([1], [3], [[4]], size=1)
    assert meta.key_slots.tolist() == [[16, 17, 18]] and meta.mask is None  # batch 1 sees all it reads
    assert torch.equal(meta.positions, torch.tensor([[2]]))


@pytest.mark.slow
def test_every_padded_size_writes_the_eager_tokens_and_compiles_nothing_after_warm_up(one_layer_dir):
    """Batches of 1 to 8 sequences, with contexts of 5 and 40 tokens in one step,
    each padded to 1, 2, 4 or 8 rows: the tokens of the eager engine (which does
    not pad, and runs the two lengths in separate attention groups), and no
    compile after the engine was built."""
    from torch._dynamo.utils import counters

    kw = dict(dtype="float32", device="cpu", num_kv_blocks=128, max_num_seqs=8)
    eager = LLM(one_layer_dir, **kw)
    compiled = LLM(one_layer_dir, **kw, enforce_eager=False)
    assert compiled.runner.capture_sizes == [1, 2, 4, 8]
    graphs = counters["stats"]["unique_graphs"]
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    long_prompt = " ".join(["word"] * 39)  # 40 tokens with the BOS: a context 8x the short one's
    engine = compiled.llm_engine
    for n in range(1, 9):
        prompts = [PROMPTS[0] if i % 2 else long_prompt for i in range(n)]
        want = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
        assert [o.outputs[0].token_ids for o in compiled.generate(prompts, params)] == want, n
        assert engine.stats.num_eager_decode_steps == 0, engine.stats.eager_decode_reason
    assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.slow
def test_the_guard_filter_drops_the_later_layers_guards_and_the_generation_still_forces_a_trace(tiny_dir, monkeypatch):
    """decode_step_guards on the real guards of a 2-layer model: it keeps well
    under all of them (if torch renamed its guards, it would keep all, and this
    fails), and it drops only later layers' guards. A pass that changes only
    layer 1, which no kept guard watches, bumps the model's generation: the next
    step traces again and writes the eager engine's tokens."""
    import torch
    from torch._dynamo.utils import counters

    from tinyinfer import model_runner, quant
    from tinyinfer.cpu_linear import bump_generation

    seen, real_filter = [], model_runner.decode_step_guards

    def spy(guards):
        keep = real_filter(guards)
        seen.append((guards, keep))
        return keep

    kw = dict(dtype="float32", device="cpu", num_kv_blocks=64, max_num_seqs=2)
    eager = LLM(tiny_dir, **kw)
    torch._dynamo.reset()  # no graph of an earlier test may serve this model: its guards must be made here
    monkeypatch.setattr(model_runner, "decode_step_guards", spy)
    compiled = LLM(tiny_dir, **kw, enforce_eager=False)
    total = sum(len(guards) for guards, _ in seen)
    kept = sum(sum(keep) for _, keep in seen)
    assert 0 < kept < 0.8 * total, (kept, total)
    dropped = [g.name for guards, keep in seen for g, k in zip(guards, keep) if not k]
    assert all("'1'" in name or "_layers[1]" in name for name in dropped), dropped[:5]

    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    for llm in (eager, compiled):  # layer 1's MLP output projection: INT8 weights now, in both engines
        mlp = llm.model.model.layers[1].mlp
        mlp.down_proj = quant.Int8Linear.from_weight(mlp.down_proj.weight.detach())
        bump_generation(llm.model)
    graphs = counters["stats"]["unique_graphs"]
    want = [o.outputs[0].token_ids for o in eager.generate(PROMPTS, params)]
    assert [o.outputs[0].token_ids for o in compiled.generate(PROMPTS, params)] == want
    assert counters["stats"]["unique_graphs"] > graphs  # traced again for the new generation


@pytest.mark.slow
def test_compiled_steps_are_checked_swapped_and_explained(one_layer_dir, tiny_dir):
    """Three promises of the compiled path, on one compiled engine:
    - a decode batch larger than the largest compiled size runs eagerly and says why in the stats;
    - an in-place weight edit is refused before a compiled step, as before an eager one;
    - runner.model = m drops the compiled steps of the old model (else decode steps would run it)."""
    import copy

    import torch

    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    kw = dict(dtype="float32", device="cpu", num_kv_blocks=64, max_num_seqs=4)  # compiled sizes 1, 2 and 4
    eager = LLM(one_layer_dir, **kw)
    compiled = LLM(one_layer_dir, **kw, enforce_eager=False)
    engine = compiled.llm_engine

    compiled.runner.capture_sizes = [1, 2]  # as if 2 were the largest size: a batch of 3 runs eagerly
    prompts = PROMPTS + PROMPTS[:1]
    want = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in compiled.generate(prompts, params)] == want
    assert engine.stats.num_eager_decode_steps > 0
    reasons = eager_decode_reasons(engine, prompts, params)
    assert "a batch of 3 sequences is larger than the largest compiled size, 2" in reasons, reasons
    compiled.runner.capture_sizes = [1, 2, 4]

    weight = next(p for p in compiled.model.parameters() if p.dim() == 2)
    with torch.no_grad():
        weight.mul_(1)  # an in-place edit: the version counter moves, the layouts are stale
    with pytest.raises(RuntimeError, match="repack"):
        compiled.generate(PROMPTS[:1], params)
    from tinyinfer.cpu_linear import repack

    repack(compiled.model)
    engine.abort_request(list(engine.requests))

    deeper = LLM(tiny_dir, dtype="float32", device="cpu", num_kv_blocks=64)  # 2 layers: another cache shape
    with pytest.raises(ValueError, match="num_hidden_layers=1.*num_hidden_layers=2"):
        compiled.runner.model = deeper.model
    other = copy.deepcopy(eager.model)  # the same shapes, other weights
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-1.5)
    repack(other)
    eager.runner.model = other
    want = [o.outputs[0].token_ids for o in eager.generate(PROMPTS, params)]
    compiled.runner.model = copy.deepcopy(other)
    assert [o.outputs[0].token_ids for o in compiled.generate(PROMPTS, params)] == want
