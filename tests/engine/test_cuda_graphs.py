"""Decode steps recorded as CUDA graphs (cuda_graphs.py), tested on a CPU.

A CPU has no CUDA graphs, so these tests give the runner cuda_graphs.EagerStandIn:
it "records" a step by running it once on the static buffers, and "replays" it
by running it again. Everything around the graph is the GPU's code path: the
buffers filled in place, the padded rows, the key lengths a step is recorded
at, when a step falls back to eager, and when the steps are recorded again.
The engines run a 1-layer random model (as tests/engine/test_compiled_decode.py does)."""
import copy

import pytest

from decode_runs import eager_decode_reasons, greedy_tokens  # tests/ is on sys.path

from tinyinfer import LLM, SamplingParams, cuda_graphs

SHORT = "The capital of France is"  # 5 tokens with the BOS
LONG = " ".join(["word"] * 69)  # 70 tokens: past the shortest key length (64)


@pytest.fixture
def stand_in(monkeypatch):
    """Every runner built from here on records with a CPU stand-in for CUDA graphs."""
    backends = []

    def backend(device):
        backends.append(cuda_graphs.EagerStandIn())
        return backends[-1]

    monkeypatch.setattr(cuda_graphs, "default_graph_backend", backend)
    return backends


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
    tensors = (buffers.inputs, graphs.outputs)  # what a graph reads from the host's side, and what it writes
    addresses = [t.data_ptr() for t in tensors]
    replayed = []
    for key, step in list(graphs.graphs.items()):
        graphs.graphs[key] = lambda key=key, step=step: replayed.append(key) or step()
    for n in range(1, 9):
        prompts = [SHORT if i % 2 else LONG for i in range(n)]
        assert greedy_tokens(graphed, prompts) == greedy_tokens(eager, prompts), n
        assert engine.stats.num_eager_decode_steps == 0, engine.stats.eager_decode_reason
    # 4 decode steps per batch; batch n pads to the next size; 70 tokens and more read 128 keys
    sizes = {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 6: 8, 7: 8, 8: 8}
    assert replayed[:4] == [(1, 128)] * 4 and len(replayed) == 8 * 4
    assert [key[0] for key in replayed] == [sizes[n] for n in range(1, 9) for _ in range(4)]
    assert stand_in[-1].captured == 4 * 5  # nothing recorded again
    assert [t.data_ptr() for t in tensors] == addresses
    only_short = greedy_tokens(graphed, [SHORT, SHORT])
    assert replayed[-1] == (2, 64) and only_short == greedy_tokens(eager, [SHORT, SHORT])


def test_an_oversize_batch_runs_eagerly_and_says_why(one_layer_dir, stand_in):
    kw = dict(dtype="float32", device="cpu", num_kv_blocks=64)
    eager = LLM(one_layer_dir, **kw)
    graphed = LLM(one_layer_dir, **kw, enforce_eager=False)
    graphed.runner.capture_sizes = [1, 2]  # as if 2 were the largest size: a batch of 3 runs eagerly
    engine = graphed.llm_engine
    prompts = [SHORT, LONG, SHORT]
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    reasons = eager_decode_reasons(engine, prompts, params)
    assert "a batch of 3 sequences is larger than the largest recorded (CUDA graph) size, 2" in reasons, reasons
    assert greedy_tokens(graphed, prompts) == greedy_tokens(eager, prompts)


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
    assert greedy_tokens(graphed, [SHORT, LONG]) == greedy_tokens(eager, [SHORT, LONG])

    for llm in (eager, graphed):  # a pass in place: the MLP's output projection becomes INT8
        mlp = llm.model.model.layers[0].mlp
        mlp.down_proj = quant.Int8Linear.from_weight(mlp.down_proj.weight.detach())
        bump_generation(llm.model)
    assert greedy_tokens(graphed, [SHORT, LONG]) == greedy_tokens(eager, [SHORT, LONG])
    assert backend.captured == 3 * per_recording
    assert graphed.runner.cuda_graphs.is_current(graphed.model)


def test_a_cpu_step_copies_nothing_it_writes_the_buffers_themselves():
    """The staging buffer (page-locked, on a GPU) is the buffers themselves on a
    CPU: a step's metadata is written once, in place."""
    from tinyinfer.decode_batch import DecodeBuffers

    buffers = DecodeBuffers(max_size=4, max_blocks_per_seq=4, block_size=4, pad_block=9, device="cpu")
    assert buffers.staging is buffers.inputs
    buffers.write([11, 12], [6, 2], [[3, 5], [7]], size=4, num_keys=12)  # 3 blocks wide, 2 padded rows
    assert buffers.input_ids.tolist() == [11, 12, 0, 0]
    assert buffers.block_tables[:4, :3].tolist() == [[3, 5, 9], [7, 9, 9], [9, 9, 9], [9, 9, 9]]
    input_ids, meta = buffers.metadata(4, 12)
    assert meta.mask.shape == (4, 1, 1, 12)
    assert (meta.mask[:, 0, 0] == 0).sum(1).tolist() == [6, 2, 1, 1]  # each row sees its own context, pad rows one key


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
    assert greedy_tokens(graphed, [SHORT, LONG]) == greedy_tokens(LLM(one_layer_dir, **kw), [SHORT, LONG])


def test_a_weight_replaced_without_a_pass_is_recorded_again(one_layer_dir, stand_in):
    """A recorded step reads every weight at the address it had. A weight
    replaced by another tensor, with no pass to say so (no bump of the
    generation), would leave a real graph reading freed memory: the runner
    compares the addresses at every step and records again. (The stand-in
    runs Python at each replay, so only the count of recordings shows it.)"""
    import torch

    kw = dict(dtype="float32", device="cpu", num_kv_blocks=64, max_num_seqs=2)
    eager = LLM(one_layer_dir, **kw)
    graphed = LLM(one_layer_dir, **kw, enforce_eager=False)
    backend, runner = stand_in[-1], graphed.runner
    per_recording = backend.captured
    greedy_tokens(graphed, [SHORT])
    assert backend.captured == per_recording and runner.cuda_graphs.is_current(graphed.model)
    for llm in (eager, graphed):
        norm = llm.model.model.layers[0].post_attention_layernorm
        norm.weight = torch.nn.Parameter(norm.weight.detach() * 3)  # a new tensor at a new address
    assert not runner.cuda_graphs.is_current(graphed.model)
    assert greedy_tokens(graphed, [SHORT, LONG]) == greedy_tokens(eager, [SHORT, LONG])
    assert backend.captured == 2 * per_recording
    with torch.no_grad():  # the same tensor edited in place keeps its address: nothing to record again
        graphed.model.model.layers[0].post_attention_layernorm.weight.mul_(1.0)
    assert runner.cuda_graphs.is_current(graphed.model)


def test_a_decode_step_hands_the_lm_head_its_rows_without_an_index(one_layer_dir, stand_in):
    """In a decode step row b of the hidden states is sequence b's: the logits
    read the first rows as a slice. An index tensor would be copied to the GPU
    and make the host wait for the graph before it could queue the LM head."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    graphed = LLM(one_layer_dir, dtype="float32", device="cpu", num_kv_blocks=64, enforce_eager=False)
    outputs = graphed.runner.cuda_graphs.outputs  # the graphs' hidden states

    class Indexing(TorchDispatchMode):
        calls = 0  # rows of the hidden states picked with an index tensor

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket is torch.ops.aten.index and args[0].data_ptr() == outputs.data_ptr():
                Indexing.calls += 1
            return func(*args, **(kwargs or {}))

    engine = graphed.llm_engine
    for prompt in (SHORT, LONG):
        engine.add_request(prompt, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    engine.step()  # the prompts
    runner, execute = graphed.runner, graphed.runner.execute_model
    counts = []

    def counted(out):
        before = Indexing.calls
        with Indexing():
            result = execute(out)
        counts.append(Indexing.calls - before)
        return result

    runner.execute_model = counted
    engine.step()
    engine.step()
    assert counts == [0, 0] and engine.stats.num_eager_decode_steps == 0


class FakeCuda:
    """The torch.cuda calls CudaGraphBackend makes, recorded in order."""

    def __init__(self, monkeypatch):
        import contextlib

        import torch

        self.log, self.device = [], None
        fake = self

        @contextlib.contextmanager
        def device(d):
            before, fake.device = fake.device, d
            fake.log.append(("device", str(d)))
            yield
            fake.device = before

        class Stream:
            def __init__(self):
                self.device = fake.device
                fake.log.append(("new stream", str(fake.device)))

            def wait_stream(self, other):
                pass

        @contextlib.contextmanager
        def stream(s):
            fake.log.append(("on stream", s is fake.streams()[-1]))
            yield

        class CUDAGraph:
            def pool(self):
                return "pool"

            def replay(self):
                fake.log.append("replay")

        @contextlib.contextmanager
        def graph(g, pool=None, stream=None, capture_error_mode="global"):
            fake.log.append(("record", pool, stream is fake.streams()[-1], capture_error_mode, str(fake.device)))
            yield

        self.made = []
        monkeypatch.setattr(torch.cuda, "device", device)
        monkeypatch.setattr(torch.cuda, "Stream", lambda: self.made.append(Stream()) or self.made[-1])
        monkeypatch.setattr(torch.cuda, "stream", stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "current")
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", CUDAGraph)
        monkeypatch.setattr(torch.cuda, "graph", graph)

    def streams(self):
        return self.made


def test_recording_runs_on_the_engines_device_and_one_side_stream(monkeypatch):
    """An engine on cuda:1 while cuda:0 is current: the warm-up and the
    recording run with cuda:1 current (a graph records the current device's
    stream; else it records nothing of cuda:1's work), both on one side stream
    made once on cuda:1, and the recording tolerates other threads' CUDA calls."""
    import torch

    fake = FakeCuda(monkeypatch)
    backend = cuda_graphs.CudaGraphBackend(torch.device("cuda:1"))
    runs = []

    def step():
        runs.append(str(fake.device))

    replay = backend.capture(step)
    backend.capture(step)
    assert runs == ["cuda:1"] * 4  # warm-up and recording, twice
    assert [entry for entry in fake.log if entry[0] == "new stream"] == [("new stream", "cuda:1")]  # one stream
    assert ("on stream", True) in fake.log  # the warm-up on it
    assert [entry for entry in fake.log if entry[0] == "record"] == [
        ("record", None, True, "thread_local", "cuda:1"), ("record", "pool", True, "thread_local", "cuda:1")]
    replay()
    assert fake.log[-1] == "replay"


@pytest.mark.slow
def test_a_compiled_step_recorded_as_a_graph_writes_the_eager_tokens(one_layer_dir, stand_in):
    """compiled_cuda_graphs=True: the step torch.compile makes is what the
    graphs record (gpt-fast's recipe); it writes the eager engine's tokens."""
    import torch

    kw = dict(dtype="float32", device="cpu", num_kv_blocks=64, max_num_seqs=2)
    with pytest.raises(ValueError, match="compiled_cuda_graphs=True is invalid with enforce_eager=True"):
        LLM(one_layer_dir, **kw, compiled_cuda_graphs=True)
    graphed = LLM(one_layer_dir, **kw, enforce_eager=False, compiled_cuda_graphs=True)
    forward = graphed.runner.cuda_graphs.forward
    assert isinstance(forward, torch._dynamo.eval_frame.OptimizedModule) or \
        hasattr(forward, "_torchdynamo_orig_callable")
    assert greedy_tokens(graphed, [SHORT, LONG]) == greedy_tokens(LLM(one_layer_dir, **kw), [SHORT, LONG])
    assert graphed.llm_engine.stats.num_eager_decode_steps == 0
