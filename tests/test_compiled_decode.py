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

from tinyinfer import LLM, SamplingParams

PROMPTS = ["The capital of France is", "A recipe for bread starts with flour, water and"]  # 5 and 10 tokens


@pytest.fixture(scope="module")
def one_layer_dir(tmp_path_factory, default_model_dir):
    from tiny_model import save_tiny_llama  # tests/ is on sys.path

    return save_tiny_llama(tmp_path_factory.mktemp("one-layer"), default_model_dir, num_hidden_layers=1)


def test_enforce_eager_is_checked_before_loading():
    with pytest.raises(ValueError, match="enforce_eager=1 is invalid"):
        LLM(enforce_eager=1)
    with pytest.raises(ValueError, match="scheduling='static'"):
        LLM(enforce_eager=False, scheduling="static")


@pytest.mark.slow
def test_compiled_decode_writes_the_eager_tokens(one_layer_dir):
    """INT8 weights with fp32 activations: its packed kernel serves up to 4 rows
    (quant.KERNEL_MAX_ROWS), so a batch of 5 takes another path, and another
    graph, which the engine must have compiled when it was built too. (On a CPU
    without bf16 units, a bf16 model switches at 4 rows in the same way.)"""
    from torch._dynamo.utils import counters

    kw = dict(dtype="float32", device="cpu", num_kv_blocks=64, quantization="int8")
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
    for folder in (one_layer_dir, tiny_dir):
        eager = LLM(folder, dtype="float32", device="cpu", num_kv_blocks=64)
        compiled = LLM(folder, dtype="float32", device="cpu", num_kv_blocks=64, enforce_eager=False)
        for prompts in (PROMPTS[:1], PROMPTS):
            want = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
            assert [o.outputs[0].token_ids for o in compiled.generate(prompts, params)] == want, (folder, prompts)


def test_each_emulated_cpu_compiles_into_a_cache_of_its_own():
    from conftest import inductor_cache_dir  # tests/ is on sys.path

    assert inductor_cache_dir({}) is None  # native kernels: torch's default folder
    avx2 = inductor_cache_dir({"ATEN_CPU_CAPABILITY": "avx2"})
    default = inductor_cache_dir({"ATEN_CPU_CAPABILITY": "default"})
    assert None not in (avx2, default) and avx2 != default
    user_set = {"ATEN_CPU_CAPABILITY": "avx2", "TORCHINDUCTOR_CACHE_DIR": "/x"}
    assert inductor_cache_dir(user_set) is None  # the user's choice wins


def test_the_warm_up_crosses_every_row_limit_of_a_layer_up_to_max_num_seqs():
    """Each kernel module declares its row limits (cpu_linear's rule 5); the runner
    asks the prepared model for the sizes just past them, and knows no kernel constant."""
    import torch
    from torch import nn

    from tinyinfer import quant
    from tinyinfer.cpu_linear import UPCAST_DTYPES, UPCAST_MIN_ROWS, pack_for_cpu
    from tinyinfer.prepare import PreparedModel

    w = torch.randn(64, 128)
    layers = [quant.Int8Linear.from_weight(w), quant.Int4Linear.from_weight(w.bfloat16(), 32),
              quant.Int8LMHead.from_weight(w), *pack_for_cpu(nn.Sequential(nn.Linear(128, 64, bias=False).bfloat16()))]
    prepared = PreparedModel(nn.Sequential(*layers))
    want = set()
    for layer in layers[:3]:
        if layer.has_layout():
            want.add(quant.KERNEL_MAX_ROWS[(layer.KIND, layer.kernel_dtype)] + 1)
    if layers[2].has_layout():
        want.add(quant.Int8LMHead.MAX_KERNEL_ROWS + 1)
    if torch.bfloat16 in UPCAST_DTYPES:  # a CPU without bf16 units: bf16 rows from 4 on in fp32
        want.add(UPCAST_MIN_ROWS)
    wide = prepared.path_switches(1000)
    assert wide == sorted(n for n in want if n > 3)
    assert prepared.path_switches(16) == [n for n in wide if n <= 16] and prepared.path_switches(3) == []
    import tinyinfer.model_runner as runner_module  # the runner knows no kernel: it asks the prepared model
    source = open(runner_module.__file__).read()
    assert "cpu_linear" not in source and "from .quant" not in source


@pytest.mark.slow
def test_compiled_steps_are_checked_swapped_and_explained(one_layer_dir, tiny_dir):
    """Three promises of the compiled path, on one compiled engine:
    - an in-place weight edit is refused before a compiled step, as before an eager one;
    - a batch whose contexts are far apart (5 and 40 tokens) runs eagerly and says why in the stats;
    - runner.model = m drops the compiled steps of the old model (else decode steps would run it)."""
    import copy

    import torch

    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    eager = LLM(one_layer_dir, dtype="float32", device="cpu", num_kv_blocks=64)
    compiled = LLM(one_layer_dir, dtype="float32", device="cpu", num_kv_blocks=64, enforce_eager=False)
    engine = compiled.llm_engine

    long_prompt = " ".join(["word"] * 39)
    for prompts in (PROMPTS[:1], [PROMPTS[0], long_prompt]):
        want = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
        assert [o.outputs[0].token_ids for o in compiled.generate(prompts, params)] == want, prompts
    assert engine.stats.num_eager_decode_steps > 0  # the far-apart batch
    reasons = set()
    engine.add_request(PROMPTS[0], params)
    engine.add_request(long_prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
        reasons.add(engine.stats.eager_decode_reason)
    assert any(r and "groups" in r for r in reasons), reasons

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
