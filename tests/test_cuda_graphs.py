"""Decode steps recorded as CUDA graphs (cuda_graphs.py), tested on a CPU.

A CPU has no CUDA graphs, so these tests give the runner cuda_graphs.EagerStandIn:
it "records" a step by running it once on the static buffers, and "replays" it
by running it again. Everything around the graph is the GPU's code path: the
buffers filled in place, the padded rows, the key lengths a step is recorded
at, when a step falls back to eager, and when the steps are recorded again.
The engines run a 1-layer random model (as tests/test_compiled_decode.py does)."""
import copy

import pytest

from tinyinfer import LLM, SamplingParams, cuda_graphs

SHORT = "The capital of France is"  # 5 tokens with the BOS
LONG = " ".join(["word"] * 69)  # 70 tokens: past the shortest key length (64)


@pytest.fixture(scope="module")
def one_layer_dir(tmp_path_factory, default_model_dir):
    from tiny_model import save_tiny_llama  # tests/ is on sys.path

    return save_tiny_llama(tmp_path_factory.mktemp("one-layer"), default_model_dir, num_hidden_layers=1)


@pytest.fixture
def stand_in(monkeypatch):
    """Every runner built from here on records with a CPU stand-in for CUDA graphs."""
    backends = []

    def backend(device):
        backends.append(cuda_graphs.EagerStandIn())
        return backends[-1]

    monkeypatch.setattr(cuda_graphs, "default_graph_backend", backend)
    return backends


def tokens(llm, prompts, max_tokens=5):
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_key_lengths_double_from_64_up_to_the_longest_context():
    assert cuda_graphs.key_lengths(8192, 16) == [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    assert cuda_graphs.key_lengths(100, 16) == [64, 112]  # whole blocks, the last one holds 100
    assert cuda_graphs.key_lengths(40, 16) == [48]


def test_no_graphs_on_a_cpu_or_with_enforce_eager(one_layer_dir):
    import torch

    assert cuda_graphs.default_graph_backend(torch.device("cpu")) is None  # a CPU compiles instead
    assert isinstance(cuda_graphs.default_graph_backend(torch.device("cuda")), cuda_graphs.CudaGraphBackend)
    assert LLM(one_layer_dir, dtype="float32", device="cpu", num_kv_blocks=16).runner.cuda_graphs is None


def test_replayed_steps_write_the_eager_tokens_from_buffers_that_never_move(one_layer_dir, stand_in):
    """Batches of 1 to 8 sequences of 5 and 70 tokens (so a step's key length
    is 64 or 128), each padded to 1, 2, 4 or 8 rows: the eager engine's tokens
    (the eager engine pads nothing and runs the two lengths in separate
    attention groups); every decode step replayed, none recorded again, and
    the buffers and the output at the addresses they had when recorded."""
    kw = dict(dtype="float32", device="cpu", num_kv_blocks=128, max_num_seqs=8)
    eager = LLM(one_layer_dir, **kw)
    graphed = LLM(one_layer_dir, **kw, enforce_eager=False)
    runner, engine = graphed.runner, graphed.llm_engine
    graphs = runner.cuda_graphs
    assert graphs is not None and graphs.sizes == [1, 2, 4, 8] and graphs.lengths == [64, 128, 256, 512, 1024]
    assert stand_in[-1].captured == 4 * 5  # every (size, key length), at start-up
    buffers = runner.decode_buffers
    tensors = (buffers.inputs, buffers.slot_mapping, buffers.key_slots, buffers.mask, graphs.outputs)
    addresses = [t.data_ptr() for t in tensors]
    replayed = []
    for key, step in list(graphs.graphs.items()):
        graphs.graphs[key] = lambda key=key, step=step: replayed.append(key) or step()
    for n in range(1, 9):
        prompts = [SHORT if i % 2 else LONG for i in range(n)]
        assert tokens(graphed, prompts) == tokens(eager, prompts), n
        assert engine.stats.num_eager_decode_steps == 0, engine.stats.eager_decode_reason
    # 4 decode steps per batch; batch n pads to the next size; 70 tokens and more read 128 keys
    sizes = {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 6: 8, 7: 8, 8: 8}
    assert replayed[:4] == [(1, 128)] * 4 and len(replayed) == 8 * 4
    assert [key[0] for key in replayed] == [sizes[n] for n in range(1, 9) for _ in range(4)]
    assert stand_in[-1].captured == 4 * 5  # nothing recorded again
    assert [t.data_ptr() for t in tensors] == addresses
    only_short = tokens(graphed, [SHORT, SHORT])
    assert replayed[-1] == (2, 64) and only_short == tokens(eager, [SHORT, SHORT])


def test_an_oversize_batch_runs_eagerly_and_says_why(one_layer_dir, stand_in):
    kw = dict(dtype="float32", device="cpu", num_kv_blocks=64)
    eager = LLM(one_layer_dir, **kw)
    graphed = LLM(one_layer_dir, **kw, enforce_eager=False)
    graphed.runner.capture_sizes = [1, 2]  # as if 2 were the largest size: a batch of 3 runs eagerly
    engine = graphed.llm_engine
    prompts = [SHORT, LONG, SHORT]
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    reasons = set()
    for prompt in prompts:
        engine.add_request(prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
        reasons.add(engine.stats.eager_decode_reason)
    assert "a batch of 3 sequences is larger than the largest recorded (CUDA graph) size, 2" in reasons, reasons
    assert tokens(graphed, prompts) == tokens(eager, prompts)


def test_a_new_model_or_a_pass_on_it_is_recorded_again(one_layer_dir, stand_in):
    """The graphs ran the model they were recorded from. runner.model = m records
    again at once; a pass that changes the model in place (its generation,
    prepare.py) records again before the next decode step. Either way the
    tokens are the eager engine's for the model as it is now."""
    import torch

    from tinyinfer import quant
    from tinyinfer.cpu_linear import bump_generation, repack

    kw = dict(dtype="float32", device="cpu", num_kv_blocks=64, max_num_seqs=2)
    eager = LLM(one_layer_dir, **kw)
    graphed = LLM(one_layer_dir, **kw, enforce_eager=False)
    backend = stand_in[-1]
    per_recording = backend.captured
    other = copy.deepcopy(eager.model)  # the same shapes, other weights
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-1.5)
    repack(other)
    eager.runner.model = other
    graphed.runner.model = copy.deepcopy(other)
    assert backend.captured == 2 * per_recording  # recorded again, at once
    assert tokens(graphed, [SHORT, LONG]) == tokens(eager, [SHORT, LONG])

    for llm in (eager, graphed):  # a pass in place: the MLP's output projection becomes INT8
        mlp = llm.model.model.layers[0].mlp
        mlp.down_proj = quant.Int8Linear.from_weight(mlp.down_proj.weight.detach())
        bump_generation(llm.model)
    assert tokens(graphed, [SHORT, LONG]) == tokens(eager, [SHORT, LONG])
    assert backend.captured == 3 * per_recording
    assert graphed.runner.cuda_graphs.is_current(graphed.model)


def test_a_cpu_step_copies_nothing_it_writes_the_buffers_themselves():
    """The staging buffer (page-locked, on a GPU) is the buffers themselves on a
    CPU: a step's metadata is written once, in place."""
    from tinyinfer.decode_batch import DecodeBuffers

    buffers = DecodeBuffers(max_size=4, max_blocks_per_seq=4, block_size=4, pad_block=9, device="cpu")
    assert buffers.staging is buffers.inputs
    buffers.write([11, 12], [6, 2], [[3, 5], [7]], size=4, num_keys=12)  # 3 blocks wide, 2 padded rows
    assert buffers.input_ids.tolist() == [[11, 12, 0, 0]]
    assert buffers.block_tables[:4, :3].tolist() == [[3, 5, 9], [7, 9, 9], [9, 9, 9], [9, 9, 9]]
    input_ids, meta = buffers.metadata(4, 12)
    assert meta.mask.shape == (4, 1, 1, 12)
    assert meta.mask[:, 0, 0].sum(1).tolist() == [6, 2, 1, 1]  # each row sees its own context, pad rows one key


def test_a_failed_recording_warns_and_the_engine_carries_on_eagerly(one_layer_dir, monkeypatch):
    """An operation that a CUDA graph cannot record is a bug, but the engine
    keeps serving: a warning, then eager steps, as after a failed compile."""
    class Broken(cuda_graphs.EagerStandIn):
        def capture(self, step):
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(cuda_graphs, "default_graph_backend", lambda device: Broken())
    kw = dict(dtype="float32", device="cpu", num_kv_blocks=64)
    with pytest.warns(RuntimeWarning, match="recording CUDA graphs failed.*stream is capturing"):
        graphed = LLM(one_layer_dir, **kw, enforce_eager=False)
    assert graphed.runner.enforce_eager and graphed.runner.cuda_graphs is None
    assert tokens(graphed, [SHORT, LONG]) == tokens(LLM(one_layer_dir, **kw), [SHORT, LONG])
