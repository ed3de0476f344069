"""ModelRunner: turns a scheduled step into tensors, runs the model, and
returns logits. It owns the device, the dtype and the paged KV cache, so it
also moves blocks when the scheduler says so: copy-on-write copies, and swaps
to and from host memory (it keeps the host copies).

The scheduler says how many new tokens each sequence gets this step; they are
packed into one flat row (see paged_kv_cache.py), so nobody pays for anybody
else's padding. Static batching, chapter 7's baseline, has its own runner in
static_batching.py.

enforce_eager=False (vLLM's switch) makes decode steps cheaper to launch. On a
CPU they run through a torch.compile'd model: the many small operators of a
step are fused into a few generated kernels. Chapter 4 shows why those
per-operator costs matter. On a CUDA GPU each decode step is recorded once as a
CUDA graph and replayed (cuda_graphs.py), as vLLM does. Either way such a step
has one of a few fixed batch sizes, padded up to, and its inputs live in
buffers filled in place (decode_batch.py).
"""
from __future__ import annotations

import re
import sys
import warnings

import torch

from . import cuda_graphs
from .decode_batch import DecodeBuffers, capture_sizes, decode_forward, padded_size
from .outputs import ModelOutput, PromptLogits
from .paged_kv_cache import PagedAttentionMetadata, PagedKVCache
from .prepare import PreparedModel


# A guard's source inside a decoder layer other than the first: the model's
# layers[1:] and the cache's per-layer views k_layers[1:] and v_layers[1:].
_LATER_LAYER = re.compile(r"\._modules\['layers'\]\._modules\['[1-9][0-9]*'\]|_layers\[[1-9][0-9]*\]")


def decode_step_guards(guards) -> list[bool]:
    """torch.compile's guard_filter_fn: which guards to check before each call.

    A compiled graph holds only while the facts it was traced under hold: each
    module's type, hooks and attributes, each weight's dtype and shape, the
    inputs' sizes. Dynamo checks them ("guards") before every call: 4,405
    for the default model's fp32 batch-1 decode step (counted 2026-12-07),
    about 2 ms of a 15 ms step on a 2-core CPU. The decoder layers are built
    alike and nothing changes them after start-up, so layer 0's guards say
    what all 30 say. Keeping
    everything else (the embedding, the final norm, the number of layers,
    global state, and the step's own inputs: batch size, mask or none) still
    tells batch 1 from a batch, and one model from another in the same
    process (another dtype, quantization, width or depth), for a tenth of the
    checks. vLLM goes further: one model per process, one graph, and no
    guards at all."""
    return [not _LATER_LAYER.search(guard.name) for guard in guards]


def _check_same_cache_shape(old, new) -> None:
    """A swapped-in model must fit the KV cache the runner already holds."""
    names = ("num_hidden_layers", "num_key_value_heads", "head_dim")
    if any(getattr(old, n) != getattr(new, n) for n in names):
        shape = ", ".join(f"{n}={getattr(old, n)}" for n in names)
        got = ", ".join(f"{n}={getattr(new, n)}" for n in names)
        raise ValueError(f"runner.model: the KV cache was built for {shape}; the new model has {got}. "
                         "Build a new engine for it")


class ModelRunner:
    def __init__(self, model, device: torch.device, dtype: torch.dtype, num_blocks: int, block_size: int,
                 enforce_eager: bool = True, max_num_seqs: int = 16, kv_cache_dtype: str = "auto",
                 graph_backend=None, compiled_cuda_graphs: bool = False):
        self.device = device
        self.dtype = dtype
        self.prepared = PreparedModel(model)  # the model and its kernel modules, listed once
        self._compiled_model = None  # made by compile_or_warm_up_model when enforce_eager is False
        # One block more than the BlockManager hands out: padded rows of a
        # fixed-size decode step write there, and no sequence ever reads it.
        self.paged_cache = PagedKVCache(model.config, num_blocks + 1, block_size, dtype, device, kv_cache_dtype)
        self.capture_sizes = capture_sizes(max_num_seqs)  # the decode batch sizes that run compiled
        max_blocks = -(-model.config.max_position_embeddings // block_size)
        self.decode_buffers = DecodeBuffers(self.capture_sizes[-1], max_blocks, block_size, num_blocks, device, dtype)
        self.eager_decode_reason: str | None = None  # why the last decode-only step did not run compiled
        # CUDA graphs where the device has them (cuda_graphs.default_graph_backend), or a
        # backend given here (a test's CPU stand-in); None: compiled decode steps instead.
        backend = None if enforce_eager else graph_backend or cuda_graphs.default_graph_backend(torch.device(device))
        # compiled_cuda_graphs: the graphs record the compiled step (gpt-fast's recipe), not the eager one.
        forward = self.compiled_model() if compiled_cuda_graphs and backend is not None else decode_forward
        self.cuda_graphs = None if backend is None else cuda_graphs.CUDAGraphRunner(
            backend, self.decode_buffers, self.capture_sizes,
            # A step's context cannot outgrow the window, nor the pool's blocks.
            cuda_graphs.key_lengths(min(max_blocks, num_blocks) * block_size, block_size),
            model.config.hidden_size, dtype, torch.device(device), forward)
        # How decode-only steps run: "eager", "compiled" (torch.compile, a CPU) or
        # "graphs" (replayed CUDA graphs). A failed compile or recording falls back
        # to "eager" for good (_fall_back), and says why.
        self.decode_mode = "eager" if enforce_eager else "compiled" if self.cuda_graphs is None else "graphs"

    @property
    def enforce_eager(self) -> bool:
        return self.decode_mode == "eager"

    @property
    def model(self):
        return self.prepared.model

    @model.setter
    def model(self, model) -> None:
        """Swap the model (chapter 6 does, to time several on one engine). The
        compiled decode steps (and CUDA graphs) wrap the old model and would go on
        running it: they are dropped and compiled (or recorded) again for the new
        one, now (a compile is free when torch has graphs for a model of the same
        shapes already). The KV cache stays, so the new model must have the old
        one's cache shape. (A pass run on the
        same model, quantize_model say, needs no swap: cpu_linear's rule 5.)"""
        _check_same_cache_shape(self.model.config, model.config)
        self.prepared = PreparedModel(model)
        self._compiled_model = None
        self.compile_or_warm_up_model()  # touches only the reserved block: safe beside live sequences

    @torch.inference_mode()
    def execute_model(self, out) -> ModelOutput:
        """Run one scheduled step (a SchedulerOutput): move blocks, pack the new
        tokens, run the model, and return the logits the sampler needs. The
        positions and block tables come from the schedule; from each sequence
        only its token ids are read, which nothing changes during a step."""
        self.prepared.check_current()  # once per step, before anything moves: compiled steps too
        self._move_blocks(out)
        size = self._decode_size(out)
        if size is not None:
            hidden = self._run_decode(out, size)
        else:
            hidden = self._run_eager(out)
        query_lens = torch.tensor([entry.num_new_tokens for entry in out.scheduled])
        ends = query_lens.cumsum(0) - 1  # each sequence's last new token
        rows = [b for b, entry in enumerate(out.scheduled) for _ in entry.samples]  # one per sampling sequence
        if size is not None and rows == list(range(len(out.scheduled))):
            last = hidden[: len(rows)]  # a decode step: row b is sequence b's; no index to copy to the device
        else:
            last = hidden[ends[rows].to(self.device)]
        logits = self.model.compute_logits(last)
        return ModelOutput(logits, self._prompt_logits(out, hidden, ends))

    def _run_eager(self, out) -> torch.Tensor:
        """Any step, eagerly: the new tokens packed into one flat row, attention in groups."""
        ids = []
        for entry in out.scheduled:
            ids += entry.seq.token_ids[entry.start : entry.start + entry.num_new_tokens]  # never the whole context
        meta = PagedAttentionMetadata.build([entry.num_new_tokens for entry in out.scheduled],
                                            [entry.start + entry.num_new_tokens for entry in out.scheduled],
                                            [entry.block_table for entry in out.scheduled],
                                            self.paged_cache.block_size, self.device)
        input_ids = torch.tensor(ids, device=self.device)[None]
        return self.model(input_ids, meta.positions, self.paged_cache, meta)[0]  # [N, C]

    def _decode_size(self, out) -> int | None:
        """The padded batch size a compiled decode step runs at, or None for an
        eager step. A decode-only step that cannot run compiled says why in
        eager_decode_reason (SchedulerStats reports it), so that a slow step is never a mystery."""
        decode_only = bool(out.scheduled) and all(entry.num_new_tokens == 1 for entry in out.scheduled)
        if self.decode_mode == "eager" or not decode_only:
            self.eager_decode_reason = None  # eager by choice, or a prompt step: nothing to explain
            return None
        size = padded_size(len(out.scheduled), self.capture_sizes)
        kind = {"compiled": "compiled", "graphs": "recorded (CUDA graph)"}[self.decode_mode]
        self.eager_decode_reason = None if size is not None else (
            f"a batch of {len(out.scheduled)} sequences is larger than the largest {kind} size, "
            f"{self.capture_sizes[-1]}")
        return size

    def _run_decode(self, out, size: int) -> torch.Tensor:
        """A decode-only step, padded to `size` rows: replayed from a CUDA graph,
        or through the compiled model."""
        token_ids = [entry.seq.token_ids[entry.start] for entry in out.scheduled]
        context_lens = [entry.start + 1 for entry in out.scheduled]
        tables = [entry.block_table for entry in out.scheduled]
        if self.decode_mode == "graphs" and not self.cuda_graphs.is_current(self.model):
            self._capture()  # the model changed since they were recorded: record them again
        if self.decode_mode == "graphs":
            return self.cuda_graphs.run(token_ids, context_lens, tables, size)
        if self.decode_mode == "eager":
            return self._run_eager(out)  # the recording failed just now, and _capture said so
        input_ids, meta = self.decode_buffers.fill(token_ids, context_lens, tables, size)
        return self._run_compiled(input_ids, meta)

    def _move_blocks(self, out) -> None:
        cache = self.paged_cache
        for swap in out.swap_out:  # before anything overwrites those blocks
            swap.seq.swapped_kv = cache.swap_out(swap.block_table, swap.num_tokens)
        for swap in out.swap_in:
            cache.swap_in(swap.block_table, swap.seq.swapped_kv)
            swap.seq.swapped_kv = None
        cache.copy_blocks(out.copies)

    def _prompt_logits(self, out, hidden: torch.Tensor, ends: torch.Tensor) -> list[PromptLogits]:
        """For entries that want prompt logprobs: the logits of the prompt
        positions computed this step (position t's output scores token t+1)."""
        found = []
        for b, entry in enumerate(out.scheduled):
            if entry.prompt_logprobs:
                start, n = entry.start, entry.num_new_tokens
                stop = max(start, min(start + n, entry.seq.num_prompt_tokens - 1))
                first = int(ends[b]) - n + 1  # the entry's first row in the packed hidden states
                rows = hidden[first : first + stop - start]
                found.append(PromptLogits(entry.seq, start, self.model.compute_logits(rows)))
        return found

    def _capture(self) -> None:
        """Record the decode steps as CUDA graphs. An operation that cannot be
        recorded is a bug to report, but not a reason to stop serving: say so,
        and run eagerly from then on, as a failed compile does."""
        try:
            self.cuda_graphs.capture_model(self.model, self.paged_cache)
        except RuntimeError as e:
            self._fall_back("recording CUDA graphs", e)

    def _run_compiled(self, input_ids, meta):
        try:
            return self.compiled_model()(self.model, input_ids, meta.positions, self.paged_cache, meta)
        except torch._dynamo.exc.BackendCompilerFailed as e:  # e.g. no C++ compiler: say so, carry on eagerly
            self._fall_back("torch.compile", getattr(e, "inner_exception", None) or e)
            return self.model(input_ids, meta.positions, self.paged_cache, meta)[0]

    def _fall_back(self, what: str, error: Exception) -> None:
        """`what` failed: warn, and run every decode step eagerly from now on."""
        first_line = (str(error).splitlines() or [""])[0]
        warnings.warn(f"enforce_eager=False: {what} failed ({type(error).__name__}: {first_line}); "
                      "running eagerly instead", RuntimeWarning, stacklevel=3)
        self.decode_mode, self.cuda_graphs = "eager", None
        self.eager_decode_reason = f"{what} failed ({type(error).__name__})"

    def compiled_model(self):
        """decode_forward, compiled for decode steps (every sequence adds one
        token): the steady state of generation, and the step that is run
        hundreds of times. A compiled graph is specialised to the Python
        branches it took, and a decode step of a fixed size takes the same ones
        every time. compile_or_warm_up_model runs every size once, up front, so
        that each graph a step can need exists before the first request: batch
        1, and a batch whose size and longest context are symbolic (one graph,
        or one per side of a batch size where a layer changes paths). Prompt and
        mixed steps vary in shape at every step and would keep recompiling, so
        they stay eager. vLLM's FULL_DECODE_ONLY CUDA-graph mode draws the same
        line: whole-step graphs for decode-only batches only."""
        if self._compiled_model is None:
            # dynamic=True: one graph for every batch size and context length
            # (batch 1 apart: PyTorch specialises sizes of 1). A graph traced at
            # each fixed size was a third slower at batch 32 on a 2-core Xeon
            # (the oneDNN products inside took longer), for no gain on a CPU.
            self._compiled_model = torch.compile(decode_forward, dynamic=True,
                                                 options={"guard_filter_fn": decode_step_guards})
        return self._compiled_model

    @torch.inference_mode()
    def compile_or_warm_up_model(self) -> None:
        """Compile the decode steps now (or record them as CUDA graphs, on a
        GPU), on dummy tokens, so that no request waits for a compile later: a
        compile takes about a minute on a CPU, and every request in the batch that met a new kind would stall for it.
        vLLM's workers compile and capture their graphs at start-up too (their
        method of this name). Every dummy row is a padded row (decode_batch.py):
        it reads and writes only the runner's reserved block, so warming up
        touches no sequence's keys, and may run again after a model swap."""
        if self.decode_mode == "eager":
            return
        if self.decode_mode == "graphs":  # recorded, not compiled: seconds, and no compiler needed
            self._capture()
            return
        print(f"tinyinfer: enforce_eager=False, so decode steps run a torch.compile'd model; compiling them now "
              f"(batch sizes {', '.join(map(str, self.capture_sizes))}), a minute or more on a CPU", file=sys.stderr)
        # Contexts of 37 tokens: unlike every batch size, so that PyTorch, which
        # assumes that sizes equal when it traces stay equal, keeps the longest
        # context and the batch size apart.
        pad, context = self.decode_buffers.pad_block, 37
        table = [pad] * -(-context // self.paged_cache.block_size)
        for size in self.capture_sizes:
            input_ids, meta = self.decode_buffers.fill([0] * size, [context] * size, [table] * size, size)
            self._run_compiled(input_ids, meta)
            if self.decode_mode == "eager":  # the compile failed and _run_compiled said so
                break
