"""ModelRunner: turns a scheduled step into tensors, runs the model, and
returns logits. It owns the device, the dtype and the paged KV cache, so it
also moves blocks when the scheduler says so: copy-on-write copies, and swaps
to and from host memory (it keeps the host copies).

The scheduler says how many new tokens each sequence gets this step; they are
packed into one flat row (see paged_kv_cache.py), so nobody pays for anybody
else's padding. Static batching, chapter 7's baseline, has its own runner in
static_batching.py.

enforce_eager=False (vLLM's switch) runs decode steps through a torch.compile'd
model: the many small operators of a step are fused into a few generated
kernels. Chapter 4 shows why those per-operator costs matter.
"""
from __future__ import annotations

import re
import sys
import warnings
from dataclasses import dataclass, field

import torch

from .paged_kv_cache import PagedAttentionMetadata, PagedKVCache
from .prepare import PreparedModel


# A guard's source inside a decoder layer other than the first: the model's
# layers[1:] and the cache's per-layer views k_layers[1:] and v_layers[1:].
_LATER_LAYER = re.compile(r"\._modules\['layers'\]\._modules\['[1-9][0-9]*'\]|_layers\[[1-9][0-9]*\]")


def decode_step_guards(guards) -> list[bool]:
    """torch.compile's guard_filter_fn: which guards to check before each call.

    A compiled graph holds only while the facts it was traced under hold: each
    module's type, hooks and attributes, each weight's dtype and shape, the
    inputs' sizes. Dynamo checks them ("guards") before every call: about
    5,000 for the default model's decode step, 2 ms of a 15 ms step on a
    2-core CPU. The decoder layers are built alike and nothing changes them
    after start-up, so layer 0's guards say what all 30 say. Keeping
    everything else (the embedding, the final norm, the number of layers,
    global state, and the step's own inputs: batch size, mask or none) still
    tells batch 1 from a batch, and one model from another in the same
    process (another dtype, quantization, width or depth), for a tenth of the
    checks. vLLM goes further: one model per process, one graph, and no
    guards at all."""
    return [not _LATER_LAYER.search(guard.name) for guard in guards]


@dataclass
class PromptLogits:
    """The model's output at the prompt positions a step computed for one
    sequence that wants prompt logprobs: logits[j] scores prompt token start+j+1."""

    seq: object  # the Sequence
    start: int
    logits: torch.Tensor  # [n, V]


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [M, V]: row i for scheduler_output.sampling[i]
    prompt_logits: list[PromptLogits] = field(default_factory=list)


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
                 enforce_eager: bool = True, max_num_seqs: int = 16):
        self.device = device
        self.dtype = dtype
        self.enforce_eager = enforce_eager
        self.max_num_seqs = max_num_seqs  # the largest decode batch: compile_or_warm_up_model covers up to it
        self.prepared = PreparedModel(model)  # the model and its kernel modules, listed once
        self._compiled_model = None  # made by compile_or_warm_up_model when enforce_eager is False
        self.paged_cache = PagedKVCache(model.config, num_blocks, block_size, dtype, device)
        self.swapped: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # seq_id -> K, V in host memory
        self.eager_decode_reason: str | None = None  # why the last decode-only step did not run compiled

    @property
    def model(self):
        return self.prepared.model

    @model.setter
    def model(self, model) -> None:
        """Swap the model (chapter 6 does, to time several on one engine). The
        compiled decode steps wrap the old model and would go on running it: they
        are dropped, and the next decode step compiles for the new one (free when
        torch has graphs for a model of the same shapes already). No warm-up runs
        here: it writes to block 0, which a live sequence may hold. The KV cache
        stays, so the new model must have the old one's cache shape."""
        _check_same_cache_shape(self.model.config, model.config)
        self.prepared = PreparedModel(model)
        self._compiled_model = None

    @torch.inference_mode()
    def execute_model(self, out) -> ModelOutput:
        """Run one scheduled step (a SchedulerOutput): move blocks, pack the new
        tokens, run the model, and return the logits the sampler needs. The
        positions and block tables come from the schedule; from each sequence
        only its token ids are read, which nothing changes during a step."""
        self.prepared.check_current()  # once per step, before anything moves: compiled steps too
        self._move_blocks(out)
        ids = []
        for entry in out.scheduled:
            ids += entry.seq.token_ids[entry.start : entry.start + entry.num_new_tokens]  # never the whole context
        query_lens = [entry.num_new_tokens for entry in out.scheduled]
        context_lens = [entry.start + entry.num_new_tokens for entry in out.scheduled]
        meta = PagedAttentionMetadata.build(query_lens, context_lens, [entry.block_table for entry in out.scheduled],
                                            self.paged_cache.block_size, self.device)
        input_ids = torch.tensor(ids, device=self.device)[None]
        wants_compiled = not self.enforce_eager and max(query_lens) == 1  # a decode-only step
        self.eager_decode_reason = self._why_eager(meta) if wants_compiled else None
        if wants_compiled and self.eager_decode_reason is None:
            hidden = self._run_compiled(input_ids, meta)
        else:
            hidden = self.model(input_ids, meta.positions, self.paged_cache, meta)[0]  # [N, C]
        ends = torch.tensor(query_lens).cumsum(0) - 1  # each sequence's last new token
        rows = [b for b, entry in enumerate(out.scheduled) for _ in entry.samples]  # one per sampling sequence
        logits = self.model.compute_logits(hidden[ends[rows].to(self.device)])
        return ModelOutput(logits, self._prompt_logits(out, hidden, ends))

    @staticmethod
    def _why_eager(meta) -> str | None:
        """Why a decode-only step cannot run the compiled model (None: it can).
        Reported in SchedulerStats.eager_decode_reason, so that a slow step is never a mystery."""
        if len(meta.groups) != 1:  # contexts too far apart: attention runs in groups (paged_kv_cache.py)
            return f"contexts of unlike lengths: attention ran in {len(meta.groups)} groups, compiled steps take 1"
        return None

    def _move_blocks(self, out) -> None:
        cache = self.paged_cache
        for swap in out.swap_out:  # before anything overwrites those blocks
            self.swapped[swap.seq_id] = cache.swap_out(swap.block_table, swap.num_tokens)
        for swap in out.swap_in:
            cache.swap_in(swap.block_table, self.swapped.pop(swap.seq_id))
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

    def drop_swapped(self, seq_id: str) -> None:
        """An aborted sequence's host copy is no longer needed."""
        self.swapped.pop(seq_id, None)

    def _run_compiled(self, input_ids, meta):
        try:
            return self.compiled_model()(input_ids, meta.positions, self.paged_cache, meta)[0]
        except torch._dynamo.exc.BackendCompilerFailed as e:  # e.g. no C++ compiler: say so, carry on eagerly
            cause = getattr(e, "inner_exception", None) or e
            first_line = (str(cause).splitlines() or [""])[0]
            warnings.warn(f"enforce_eager=False: torch.compile failed ({type(cause).__name__}: {first_line}); "
                          "running eagerly instead", RuntimeWarning, stacklevel=2)
            self.enforce_eager = True
            return self.model(input_ids, meta.positions, self.paged_cache, meta)[0]

    def compiled_model(self):
        """The model compiled for decode steps (every sequence adds one token, one
        attention group): the steady state of generation, and the step that is
        run hundreds of times. A compiled graph is specialised to the Python
        branches it took (query lengths, groups, mask or none); decode steps
        take the same ones every time. There are two kinds: batch 1 (no mask;
        PyTorch also specialises sizes of 1) and a batch (always masked, see
        paged_kv_cache.py), whose batch size and context length become symbolic
        once PyTorch has seen them change, one graph for each side of a batch
        size where a layer changes paths (path_switches).
        compile_or_warm_up_model compiles all of it up front. Prompt and mixed steps vary in shape at every step
        and would keep recompiling, so they stay eager. vLLM's FULL_DECODE_ONLY
        CUDA-graph mode draws the same line: whole-step graphs for decode-only
        batches only."""
        if self._compiled_model is None:
            self._compiled_model = torch.compile(self.model, dynamic=True,
                                                 options={"guard_filter_fn": decode_step_guards})
        return self._compiled_model

    @torch.inference_mode()
    def compile_or_warm_up_model(self) -> None:
        """Compile the decode steps now, on dummy tokens, so that no
        request waits for a compile later: a compile takes about a minute on a
        CPU, and every request in the batch that met a new kind would stall for
        it. vLLM's workers compile and capture their graphs at start-up too
        (their method of this name). Nothing of the dummy steps stays: every
        dummy position maps to block 0, which is zeroed after."""
        if self.enforce_eager:
            return
        print("tinyinfer: enforce_eager=False, so decode steps run a torch.compile'd model; compiling them now "
              "(batch 1, then batches), a minute or more each on a CPU", file=sys.stderr)
        bs = self.paged_cache.block_size
        # Batch 1; then batches of 2 and 3 sequences of unequal lengths (the
        # first batch compiles with its sizes fixed, the second with them
        # symbolic, once PyTorch has seen them change); then one batch past
        # each size where a layer changes paths (path_switches: on a CPU
        # without bf16 units, a bf16 model's first batch of 4 would otherwise
        # compile mid-request, minutes on a CPU). Every size differs from the
        # others: PyTorch assumes that sizes equal when it compiles stay equal,
        # and would compile again when they are not.
        past_switches = [list(range(2 * n + 4, n + 4, -1)) for n in self.prepared.path_switches(self.max_num_seqs)]
        for context_lens in ([5], [5, 3], [9, 7, 6], *past_switches):
            n = len(context_lens)
            meta = PagedAttentionMetadata.build([1] * n, context_lens, [[0] * max(context_lens)] * n, bs,
                                                self.device)
            self._run_compiled(torch.zeros(1, n, dtype=torch.long, device=self.device), meta)
            if self.enforce_eager:  # the compile failed and _run_compiled said so: eager from now on
                break
        self.paged_cache.k[:, :bs] = 0
        self.paged_cache.v[:, :bs] = 0
