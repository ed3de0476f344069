"""CUDA graphs for decode steps: each fixed-size step recorded once, then
replayed with one launch.

On a GPU a small model's decode step is launch-bound: an eager step of the
135M model launches about 580 kernels (19 per layer, 30 layers, and some 13
outside them: tests/engine/test_kernel_count.py counts them), and the CPU spends
longer launching them than the GPU spends running them (docs/benchmarks.md, "On a
GPU", measured a compiled step at 6-7 ms whatever the model's size). A
CUDA graph records every kernel of a step once, with the addresses it read and
wrote; replaying it launches them all at once, with no Python in between. vLLM
and nano-vllm do this for decode steps; this file follows nano-vllm's recipe:
  - one graph per fixed batch size (decode_batch.capture_sizes), recorded at
    start-up, largest first, all in one memory pool (a smaller step's
    temporaries fit in the space a larger one used);
  - the step's inputs live in buffers that never move (decode_batch.DecodeBuffers);
    a replay copies the new step into them, and padded rows write to a block
    no sequence owns;
  - the graph ends at the last hidden state: the logits and the sampling run
    outside it, on the real rows only.
What is recorded is the eager step (decode_batch.decode_forward): recording
needs no compiler and takes seconds. With compiled_cuda_graphs=True it is the
step compiled by torch.compile first (gpt-fast's recipe): inductor fuses the
small operations of each layer into a few generated kernels, and the graph
then replays those.

One difference from nano-vllm: its attention kernel reads each row's keys up to
that row's own length, whatever the graph's shapes. This engine's attention is
plain PyTorch (paged_kv_cache.py), which gathers every row's keys up to a
length S fixed in the graph. So each batch size is recorded at a few key
lengths (64, 128, 256, ... up to the context window) and a step runs the
graph of the shortest S that holds its longest context: it reads at most twice
the keys it needs, rather than the whole window.

Prompt steps and batches larger than the largest size run eagerly
(model_runner.py says why). A graph reads the weights at the addresses they
had when it was recorded, so it is recorded again before the next step after
a new model (runner.model = m), a pass that changes it (its generation,
prepare.py), or any weight or buffer replaced by another tensor.

The graph backend is what records and replays. CudaGraphBackend uses
torch.cuda.graph. EagerStandIn runs the same code path on a CPU: it "records"
by running the step once on the static buffers and "replays" by calling it
again, so a CPU test can check everything around the graph: the buffers,
the padding, the key lengths and when to record again.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

import torch

from .cpu_linear import generation

# The shortest key length recorded; each next one is twice as long.
MIN_KEY_LENGTH = 64


def key_lengths(max_len: int, block_size: int) -> list[int]:
    """The key lengths (S) each batch size is recorded at: 64, 128, ... and
    max_len, all whole blocks. max_len is the longest context a step can hold."""
    lengths, n = [], MIN_KEY_LENGTH
    while n < max_len:
        lengths.append(-(-n // block_size) * block_size)
        n *= 2
    lengths.append(-(-max_len // block_size) * block_size)
    return sorted(set(lengths))


class CudaGraphBackend:
    """torch.cuda.graph: records a step's kernels once; replay launches them all.

    Everything happens on the engine's device, whichever GPU is current, and on
    one side stream of its own: the warm-up run before each recording makes the
    libraries' per-stream state (cuBLAS's workspace) on the stream the
    recording then uses, as vLLM and SGLang do."""

    name = "CUDA graphs"

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = None  # one memory pool for every graph of the runner
        self.stream = None  # made on the first recording, on the engine's device

    def capture(self, step: Callable[[], None]) -> Callable[[], None]:
        with torch.cuda.device(self.device):
            if self.stream is None:
                self.stream = torch.cuda.Stream()
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                step()  # a warm-up run first: lazy initialisation (handles, workspaces) must not be recorded
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            # thread_local: a CUDA call from another thread (a server's) while a
            # lazy re-recording runs does not break the recording
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
                step()
            if self.pool is None:
                self.pool = graph.pool()
            torch.cuda.synchronize()
        return graph.replay


class EagerStandIn:
    """A CPU's stand-in for CUDA graphs: the step runs once when "recorded",
    and again at every "replay", on the same static buffers. Its tokens must be
    the eager engine's (tests/engine/test_cuda_graphs.py); a real graph replays the
    same kernels on the same addresses."""

    name = "eager stand-in for CUDA graphs"

    def __init__(self):
        self.captured = 0

    def capture(self, step: Callable[[], None]) -> Callable[[], None]:
        step()
        self.captured += 1
        return step


def default_graph_backend(device: torch.device):
    """CUDA graphs on a CUDA device; None elsewhere (a CPU step is compiled instead)."""
    return CudaGraphBackend(device) if device.type == "cuda" else None


def weight_addresses(model) -> list[tuple[torch.nn.Module, str, int]]:
    """(module, name, address) of every parameter and buffer of model: what a
    recorded step reads, by address."""
    found = []
    for module in model.modules():
        for name, t in [*module._parameters.items(), *module._buffers.items()]:
            if t is not None:
                found.append((module, name, address(t)))
    return found


def address(t: torch.Tensor) -> int:
    """Where t's numbers are. (A CPU's packed weight layout, an opaque oneDNN
    tensor, has no data pointer: the object stands for its address there.)"""
    return t.data_ptr() if t.layout == torch.strided else id(t)


def moved(addresses: list[tuple[torch.nn.Module, str, int]]) -> bool:
    """Has any of those tensors been replaced, or given new storage, since?"""
    for module, name, recorded in addresses:
        t = getattr(module, name, None)
        if t is None or address(t) != recorded:
            return True
    return False


class CUDAGraphRunner:
    """Every recorded decode step of one runner, keyed by (batch size, key length)."""

    def __init__(self, backend, buffers, sizes: list[int], lengths: list[int], hidden_size: int,
                 dtype: torch.dtype, device: torch.device, forward: Callable):
        self.backend, self.buffers = backend, buffers
        self.sizes, self.lengths = sizes, lengths
        self.device = device
        self.forward = forward  # the step to record: decode_batch.decode_forward, or it compiled
        # The graphs' output: the last hidden state of every row, at one address.
        self.outputs = torch.zeros(sizes[-1], hidden_size, dtype=dtype, device=device)
        self.graphs: dict[tuple[int, int], Callable[[], None]] = {}
        self.model, self.generation, self.addresses = None, None, []  # what was recorded

    def is_current(self, model) -> bool:
        """Were the graphs recorded from this model, as it is now: the same
        object, no pass run on it since, and every weight where it was? (Once per
        step: some 200 addresses compared, microseconds.)"""
        return self.model is model and self.generation == generation(model) and not moved(self.addresses)

    @torch.inference_mode()
    def capture_model(self, model, cache) -> None:
        """Record every (batch size, key length), largest first. Every row is a
        padded row (token 0 at position 0, the reserved block): recording
        touches no sequence's keys, so it may run again beside live sequences."""
        print(f"tinyinfer: recording decode steps with {self.backend.name} (batch sizes "
              f"{', '.join(map(str, self.sizes))}; key lengths {self.lengths[0]} to {self.lengths[-1]})",
              file=sys.stderr)
        self.graphs.clear()
        self.model = None
        pad = self.buffers.pad_block
        # A compiled step (compiled_cuda_graphs) is traced here. PyTorch gives
        # sizes that happen to be equal one symbol ("duck sizing"): at the
        # largest batch, the positions' offset in the input buffer equals the
        # batch size, and every smaller batch would be traced again.
        with self.on_device(), torch.fx.experimental._config.patch(use_duck_shape=False):
            for size in reversed(self.sizes):
                for num_keys in reversed(self.lengths):
                    self.buffers.write([0] * size, [1] * size, [[pad]] * size, size, num_keys)
                    step = self._step(model, cache, size, num_keys)
                    self.graphs[size, num_keys] = self.backend.capture(step)
        self.model, self.generation, self.addresses = model, generation(model), weight_addresses(model)

    def _step(self, model, cache, size: int, num_keys: int) -> Callable[[], None]:
        """What a graph records: the step's metadata from the buffers, the
        model's decode step, and its last hidden states copied to the output buffer."""
        def step():
            input_ids, meta = self.buffers.metadata(size, num_keys, masked=True)
            hidden = self.forward(model, input_ids, meta.positions, cache, meta)
            self.outputs[:size].copy_(hidden)

        return step

    def key_length(self, longest: int) -> int | None:
        """The shortest recorded key length that holds a context of `longest` tokens."""
        return next((n for n in self.lengths if n >= longest), None)

    def run(self, token_ids: list[int], context_lens: list[int], block_tables: list[list[int]],
            size: int) -> torch.Tensor:
        """Replay the graph for a step: copy its inputs into the buffers, launch
        the graph, and return the hidden states of its `size` rows [size, C]
        (a view of the output buffer, valid until the next replay)."""
        num_keys = self.key_length(max(context_lens))
        with self.on_device():
            self.buffers.write(token_ids, context_lens, block_tables, size, num_keys)
            self.graphs[size, num_keys]()
        return self.outputs[:size]

    def on_device(self):
        """The engine's GPU made current while its graphs are recorded and
        replayed: a graph records the current device's stream, and the input
        copy's event is recorded there, whichever GPU another engine made current."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()
