"""CUDA graphs for decode steps: each fixed-size step recorded once, then
replayed with one launch.

On a GPU a small model's decode step is launch-bound: the 135M model runs
some 400 small kernels a step, and the CPU spends longer launching them than
the GPU spends running them (the README's "On a GPU" section measured a
compiled step at 6-7 ms whatever the model's size). A CUDA graph records every
kernel of a step once, with the addresses it read and wrote; replaying it
launches them all at once, with no Python in between. vLLM and nano-vllm do
this for decode steps; this file follows nano-vllm's recipe:
  - one graph per fixed batch size (decode_batch.capture_sizes), recorded at
    start-up, largest first, all in one memory pool (a smaller step's
    temporaries fit in the space a larger one used);
  - the step's inputs live in buffers that never move (decode_batch.DecodeBuffers);
    a replay copies the new step into them, and padded rows write to a block
    no sequence owns;
  - the graph ends at the last hidden state: the logits and the sampling run
    outside it, on the real rows only.
What is recorded is the eager step (model_runner.decode_forward), not a
torch.compile'd one: recording needs no compiler and takes seconds.

One difference from nano-vllm: its attention kernel reads each row's keys up to
that row's own length, whatever the graph's shapes. This engine's attention is
plain PyTorch (paged_kv_cache.py), which gathers every row's keys up to a
length S fixed in the graph. So each batch size is recorded at a few key
lengths (64, 128, 256, ... up to the context window) and a step runs the
graph of the shortest S that holds its longest context: it reads at most twice
the keys it needs, rather than the whole window.

Prompt steps and batches larger than the largest size run eagerly
(model_runner.py says why). The recording depends on the model: a new model
(runner.model = m), or a pass that changes it (its generation, prepare.py),
is recorded again before the next step.

The graph backend is what records and replays. CudaGraphBackend uses
torch.cuda.graph. EagerStandIn runs the same code path on a CPU: it "records"
by running the step once on the static buffers and "replays" by calling it
again, so a CPU test can check everything around the graph: the buffers,
the padding, the key lengths and when to record again.
"""
from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from .prepare import generation

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
    """torch.cuda.graph: records a step's kernels once; replay launches them all."""

    name = "CUDA graphs"

    def __init__(self):
        self.pool = None  # one memory pool for every graph of the runner

    def capture(self, step: Callable[[], None]) -> Callable[[], None]:
        step()  # a warm-up run first: lazy initialisation (cuBLAS handles, workspaces) must not be recorded
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            step()
        if self.pool is None:
            self.pool = graph.pool()
        torch.cuda.synchronize()
        return graph.replay


class EagerStandIn:
    """A CPU's stand-in for CUDA graphs: the step runs once when "recorded",
    and again at every "replay", on the same static buffers. Its tokens must be
    the eager engine's (tests/test_cuda_graphs.py); a real graph replays the
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
    return CudaGraphBackend() if device.type == "cuda" else None


class CUDAGraphRunner:
    """Every recorded decode step of one runner, keyed by (batch size, key length)."""

    def __init__(self, backend, buffers, sizes: list[int], lengths: list[int], hidden_size: int,
                 dtype: torch.dtype, device: torch.device):
        self.backend, self.buffers = backend, buffers
        self.sizes, self.lengths = sizes, lengths
        # The graphs' output: the last hidden state of every row, at one address.
        self.outputs = torch.zeros(sizes[-1], hidden_size, dtype=dtype, device=device)
        self.graphs: dict[tuple[int, int], Callable[[], None]] = {}
        self.model, self.generation = None, None  # what was recorded

    def is_current(self, model) -> bool:
        """Were the graphs recorded from this model, as it is now?"""
        return self.model is model and self.generation == generation(model)

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
        for size in reversed(self.sizes):
            for num_keys in reversed(self.lengths):
                self.buffers.write([0] * size, [1] * size, [[pad]] * size, size, num_keys)
                step = self._step(model, cache, size, num_keys)
                self.graphs[size, num_keys] = self.backend.capture(step)
        self.model, self.generation = model, generation(model)

    def _step(self, model, cache, size: int, num_keys: int) -> Callable[[], None]:
        """What a graph records: the step's metadata from the buffers, the eager
        model, and its last hidden states copied to the output buffer."""
        from .model_runner import decode_forward  # one definition of a decode step

        def step():
            input_ids, meta = self.buffers.metadata(size, num_keys, masked=True)
            hidden = decode_forward(model, input_ids, meta.positions, cache, meta)
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
        self.buffers.write(token_ids, context_lens, block_tables, size, num_keys)
        self.graphs[size, num_keys]()
        return self.outputs[:size]
