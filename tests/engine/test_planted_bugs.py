"""Tests for what nothing pinned before (issue 54, item 7). A review planted
bugs in the engine one at a time, and no assertion caught them. Each test here
passes on the engine as it is and fails with its bug planted; its docstring
names the bug.

Most run a 1-layer random model (as tests/engine/test_cuda_graphs.py does), eagerly
or with a CPU stand-in for CUDA graphs. The stand-in here, FrozenStandIn, is
stricter than cuda_graphs.EagerStandIn: like a real graph, it replays the
model as it was when recorded, so a graph that should have been recorded
again gives the old model's tokens, not only a wrong count of recordings."""
import copy

import pytest
import torch
from decode_runs import greedy_tokens  # tests/ is on sys.path

from tinyinfer import LLM, SamplingParams, cuda_graphs, quant
from tinyinfer.cpu_linear import bump_generation, repack
from tinyinfer.decode_batch import DecodeBuffers
from tinyinfer.paged_kv_cache import PagedKVCache

PROMPTS = ["The capital of France is", "A recipe for bread starts with flour, water and"]  # 5 and 10 tokens


def tokens(llm):
    return greedy_tokens(llm, PROMPTS)


# --- a stand-in for CUDA graphs that replays what it recorded ----------------------------


def _state(attributes: dict) -> dict:
    """A module's attributes, with its parameter, buffer and child tables copied:
    the tensors and children themselves are the same objects."""
    return {k: copy.copy(v) if isinstance(v, dict) else v for k, v in attributes.items()}


def _put(module, state: dict) -> None:
    vars(module).clear()
    vars(module).update(_state(state))  # copied again: a replay must not change the recording


class FrozenStandIn(cuda_graphs.EagerStandIn):
    """Replays a step on the model as it was when the step was recorded, as a
    real CUDA graph does: the modules, tensors and flags of then. An in-place
    edit of a recorded tensor shows (a graph reads that address again); a
    tensor or module replaced since, or a flag flipped (use_kernel), does not."""

    model = None  # what the runner records from (the `frozen` fixture sets it)

    def capture(self, step):
        recorded = [(m, _state(vars(m))) for m in self.model.modules()]

        def replay():
            live = [(m, _state(vars(m))) for m, _ in recorded]
            try:
                for m, state in recorded:
                    _put(m, state)
                step()
            finally:
                for m, state in live:
                    _put(m, state)

        return super().capture(replay)  # run once, counted


@pytest.fixture
def frozen(monkeypatch):
    """Every runner built from here on records with a FrozenStandIn."""
    backends = []
    capture_model = cuda_graphs.CUDAGraphRunner.capture_model

    def capture(self, model, cache):
        self.backend.model = model
        return capture_model(self, model, cache)

    def backend(device):
        backends.append(FrozenStandIn())
        return backends[-1]

    monkeypatch.setattr(cuda_graphs.CUDAGraphRunner, "capture_model", capture)
    monkeypatch.setattr(cuda_graphs, "default_graph_backend", backend)
    return backends


# --- 1. every pass bumps the generation ---------------------------------------------------


def test_set_use_kernel_records_the_graphs_again(one_layer_dir, frozen, monkeypatch):
    """quant.set_use_kernel is a pass (cpu_linear's rule 5): it flips a flag, so no
    weight moves and only the model's generation tells the runner. Planted
    bug: no bump_generation in set_use_kernel; the graphs then replay the
    INT8 kernel after it was switched off."""
    kernel_rows = []
    kernel_forward = quant.Int8Linear._kernel_forward
    monkeypatch.setattr(quant.Int8Linear, "_kernel_forward", lambda self, x: kernel_rows.append(x.shape) or
                        kernel_forward(self, x))
    kw = dict(dtype="float32", device="cpu", num_kv_blocks=64, max_num_seqs=2, quantization="int8")
    eager = LLM(one_layer_dir, **kw)
    graphed = LLM(one_layer_dir, **kw, enforce_eager=False)
    backend = frozen[-1]
    per_recording = backend.captured
    assert tokens(graphed) == tokens(eager) and kernel_rows  # decode rows take the INT8 kernel
    for llm in (eager, graphed):
        quant.set_use_kernel(llm.model, False)
    kernel_rows.clear()
    assert tokens(graphed) == tokens(eager)
    assert kernel_rows == [], "a decode step replayed the INT8 kernel after set_use_kernel(model, False)"
    assert backend.captured == 2 * per_recording


def test_repack_records_the_graphs_again(one_layer_dir, frozen):
    """repack is a pass too. Here it rebuilds one INT8 layer's layout after an
    in-place edit of its scales; in fp32 that layout is the scales tensor
    itself, so no address moves and only the generation says a pass ran.
    Planted bug: no bump_generation in repack; the graphs are then not
    recorded again (cuda_graphs.py promises they are, after any pass)."""
    kw = dict(dtype="float32", device="cpu", num_kv_blocks=64, max_num_seqs=2, quantization="int8")
    eager = LLM(one_layer_dir, **kw)
    graphed = LLM(one_layer_dir, **kw, enforce_eager=False)
    backend, runner = frozen[-1], graphed.runner
    per_recording = backend.captured
    for llm in (eager, graphed):
        with torch.no_grad():
            llm.model.model.layers[0].mlp.down_proj.scales.mul_(-2)
        repack(llm.model, only_stale=True)  # the edited layer's layout only
    assert tokens(graphed) == tokens(eager)
    assert backend.captured == 2 * per_recording, "repack ran, and the graphs were not recorded again"
    assert runner.cuda_graphs.is_current(graphed.model)


@pytest.mark.slow
def test_repack_traces_the_compiled_decode_step_again(one_layer_dir):
    """The compiled side of the same edit: decode_forward guards on the
    generation, and nothing else dynamo guards changes (the layout is the same
    tensor), so only the bump makes the next decode step trace again (rule 5).
    Planted bug: no bump_generation in repack; no step is traced again."""
    from torch._dynamo.utils import counters

    kw = dict(dtype="float32", device="cpu", num_kv_blocks=64, max_num_seqs=2, quantization="int8")
    eager = LLM(one_layer_dir, **kw)
    torch._dynamo.reset()  # no graph another test compiled may serve the generation this one reaches
    compiled = LLM(one_layer_dir, **kw, enforce_eager=False)
    for llm in (eager, compiled):
        with torch.no_grad():
            llm.model.model.layers[0].mlp.down_proj.scales.mul_(-2)
        repack(llm.model, only_stale=True)
    graphs = counters["stats"]["unique_graphs"]
    assert tokens(compiled) == tokens(eager)
    assert counters["stats"]["unique_graphs"] > graphs, "repack ran, and the compiled step was not traced again"


# --- 2. copy-on-write in an int8 cache copies the scales -----------------------------------


def test_an_int8_block_copied_on_write_reads_back_the_same_keys_and_values():
    """copy_blocks copies every tensor a block holds: in an int8 pool, the K
    and V codes and their scales. Planted bug: copy only K and V; the copy is
    then read with the scales its destination held before (here zeros)."""
    from tinyinfer.config import ModelConfig

    config = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    cache = PagedKVCache(config, num_blocks=4, block_size=4, dtype=torch.float32, device="cpu", kv_cache_dtype="int8")
    torch.manual_seed(0)
    a, b = torch.arange(4, 8), torch.arange(12, 16)  # the slots of blocks 1 and 3
    shape = (4, config.num_key_value_heads, config.head_dim)
    for layer in range(config.num_hidden_layers):
        cache._write(layer, a, torch.randn(shape) * 5, torch.randn(shape) / 5)
    cache.copy_blocks([(1, 3)])
    for layer in range(config.num_hidden_layers):
        (k_copy, v_copy), (k, v) = cache._read(layer, b), cache._read(layer, a)
        assert torch.equal(k_copy, k), f"layer {layer}: keys off by up to {(k_copy - k).abs().max():.3g}"
        assert torch.equal(v_copy, v), f"layer {layer}: values off by up to {(v_copy - v).abs().max():.3g}"


def test_int8_parallel_samples_equal_seeded_runs_alone(tiny_dir):
    """The same through the engine: n=3 samples share a 37-token prompt, whose
    third block is partly filled; the first write of two of them copies it.
    Each sample must equal a lone request with its seed (vLLM's rule, seed
    7+i), as in tests/engine/test_llm_engine.py, here with kv_cache_dtype="int8"."""
    llm = LLM(tiny_dir, dtype="float32", device="cpu", block_size=16, num_kv_blocks=64, kv_cache_dtype="int8")
    ids = {"prompt_token_ids": [3 + (i * 7919) % 40000 for i in range(37)]}
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)
    together = [c.token_ids for c in llm.generate(ids, params)[0].outputs]
    alone = [llm.generate(ids, SamplingParams(temperature=1.0, seed=7 + i, max_tokens=12,
                                              ignore_eos=True))[0].outputs[0].token_ids for i in range(3)]
    assert together == alone


# --- 3. a decode step's padded rows are pad rows, whatever an earlier step left -----------


def test_a_smaller_step_leaves_nothing_of_a_larger_one_in_the_buffers():
    """A step of 8 rows, then one of 2 rows padded to 4 and only one block wide
    in its first row: rows 2-3 must be pad rows (token 0, position 0, context
    1, the pad block), and every column a row reads past its own blocks the pad
    block, not blocks an earlier longer row left there. Else a pad row writes its
    key into a live sequence's block. Planted bugs: buffers made as pad rows
    once, then only each step's real rows written; or tables made all pad
    once, then only each row's own blocks written. A fresh buffer, which is
    what the other tests use, shows neither."""
    pad, bs = 9, 4
    buffers = DecodeBuffers(max_size=8, max_blocks_per_seq=4, block_size=bs, pad_block=pad, device="cpu")
    buffers.write(list(range(101, 109)), [16] * 8, [[1, 2, 3, 4]] * 8, size=8, num_keys=16)
    buffers.write([11, 12], [6, 3], [[3, 5], [7]], size=4, num_keys=8)  # 2 blocks wide
    tables = [[3, 5], [7, pad], [pad, pad], [pad, pad]]
    rows = (buffers.input_ids, buffers.positions, buffers.context_lens, buffers.block_tables[:, :2])
    assert [t[:4].tolist() for t in rows] == [[11, 12, 0, 0], [5, 2, 0, 0], [6, 3, 1, 1], tables]
    _, meta = buffers.metadata(4, 8)
    assert meta.key_slots.tolist() == [[tables[r][p // bs] * bs + p % bs for p in range(8)] for r in range(4)]
    assert meta.slot_mapping.tolist() == [5 * bs + 1, 7 * bs + 2, pad * bs, pad * bs]  # pad rows: the pad block
    assert (meta.mask[:, 0, 0] == 0).sum(1).tolist() == [6, 3, 1, 1]


# --- 4. a replayed graph after an in-place change gives the eager tokens ------------------


def test_a_replaced_model_a_pass_or_a_replaced_weight_replays_the_eager_tokens(one_layer_dir, frozen):
    """A graph runs the model it recorded. After runner.model = other, after a
    pass (a module swapped, bump_generation) and after a parameter replaced by
    another tensor (cuda_graphs.moved), the next decode step must be
    recorded again, or it writes the old model's tokens. Each change here
    changes the tokens, so a stale graph shows in them. Planted bug:
    CUDAGraphRunner.is_current always True."""
    kw = dict(dtype="float32", device="cpu", num_kv_blocks=64, max_num_seqs=2)
    eager = LLM(one_layer_dir, **kw)
    graphed = LLM(one_layer_dir, **kw, enforce_eager=False)
    seen = [tokens(eager)]
    assert tokens(graphed) == seen[-1]

    other = copy.deepcopy(eager.model)  # the same shapes, other weights
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-1.5)
    repack(other)
    eager.runner.model, graphed.runner.model = other, copy.deepcopy(other)
    seen.append(tokens(eager))
    assert tokens(graphed) == seen[-1], "after runner.model = other"

    for llm in (eager, graphed):  # a pass: the final norm swapped for one of other weights
        norm = copy.deepcopy(llm.model.model.norm)
        norm.weight = torch.nn.Parameter(norm.weight.detach() * torch.linspace(-2, 2, norm.weight.numel()))
        llm.model.model.norm = norm
        bump_generation(llm.model)
    seen.append(tokens(eager))
    assert tokens(graphed) == seen[-1], "after a pass"

    for llm in (eager, graphed):  # a weight replaced, no pass
        norm = llm.model.model.norm
        norm.weight = torch.nn.Parameter(-norm.weight.detach())
    seen.append(tokens(eager))
    assert tokens(graphed) == seen[-1], "after a replaced weight"
    assert all(x != y for x, y in zip(seen, seen[1:])), seen  # every change showed in the tokens
