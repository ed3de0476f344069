"""ModelRunner: turns scheduled sequences into tensors, runs the model, and
returns logits. It owns the device, the dtype and the KV caches.

Two ways to run a batch:
- execute(): continuous batching on the paged cache. The scheduler says how many
  new tokens each sequence gets this step; they are packed into one flat row
  (see paged_kv_cache.py), so nobody pays for anybody else's padding.
- prefill() / decode(): static batching on a contiguous cache, kept as the
  baseline that chapter 7 measures against. The batch is right-padded: sequence
  b's prompt sits at positions 0..len_b-1 and each later token at the next
  position. Padding slots are never attended to, because a query only sees keys
  at positions <= its own (see model.causal_mask).

enforce_eager=False (vLLM's switch) runs decode steps through a torch.compile'd
model instead: the many small operators of a step (normalizations, rotations,
residual adds, the SwiGLU product) are fused into a few generated kernels, so a
step pays far fewer per-operator costs. Chapter 4 shows why those costs matter.
"""
from __future__ import annotations

import sys
import warnings

import torch

from .kv_cache import KVCache
from .model import AttentionMetadata, causal_mask
from .paged_kv_cache import PagedAttentionMetadata, PagedKVCache
from .sequence import Sequence


class ModelRunner:
    def __init__(self, model, device: torch.device, dtype: torch.dtype, pad_token_id: int = 0,
                 enforce_eager: bool = True):
        self.model = model
        self.enforce_eager = enforce_eager
        self._compiled_model = None  # made on the first decode step when enforce_eager is False
        self.config = model.config
        self.device = device
        self.dtype = dtype
        self.pad_token_id = pad_token_id
        self.cache: KVCache | None = None  # static batching's contiguous cache
        self.paged_cache: PagedKVCache | None = None  # continuous batching's block pool

    def allocate_paged_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        self.paged_cache = PagedKVCache(self.config, num_blocks, block_size, self.dtype, self.device)
        return self.paged_cache

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[Sequence, int]], block_tables: list[list[int]],
                prompt_hidden_for: set[str] = frozenset()):
        """Run one continuous-batching step.

        scheduled[b] = (sequence, n): its next n uncomputed tokens. Returns the
        logits [M, V] of the M sequences that reach their last known token this
        step (they sample a new one), those sequences, and {request_id: hidden
        states [n, C]} for the ids in prompt_hidden_for (prompt logprobs)."""
        ids, query_lens, context_lens = [], [], []
        for seq, n in scheduled:
            start = seq.num_computed_tokens
            ids += seq.token_ids[start : start + n]
            query_lens.append(n)
            context_lens.append(start + n)
        meta = PagedAttentionMetadata.build(query_lens, context_lens, block_tables,
                                            self.paged_cache.block_size, self.device)
        input_ids = torch.tensor(ids, device=self.device)[None]
        if not self.enforce_eager and max(query_lens) == 1 and len(meta.groups) == 1:
            hidden = self._run_compiled(input_ids, meta)
        else:
            hidden = self.model(input_ids, meta.positions, self.paged_cache, meta)[0]  # [N, C]
        ends = torch.tensor(query_lens).cumsum(0) - 1  # each sequence's last new token
        sampling = [b for b, (seq, n) in enumerate(scheduled) if seq.num_computed_tokens + n == seq.num_tokens]
        logits = self.model.compute_logits(hidden[ends[sampling].to(self.device)])
        extra = {}
        for b, (seq, n) in enumerate(scheduled):
            if seq.request_id in prompt_hidden_for:
                extra[seq.request_id] = hidden[int(ends[b]) - n + 1 : int(ends[b]) + 1]
        return logits, [scheduled[b][0] for b in sampling], extra

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
        take the same ones every time, so they compile once, with the batch size
        and context length left symbolic (PyTorch compiles batch 1 separately,
        and a batch whose contexts differ, which needs a mask, once more).
        Prompt and mixed steps vary in shape at every step and would keep
        recompiling, so they stay eager. vLLM's FULL_DECODE_ONLY CUDA-graph mode
        draws the same line: whole-step graphs for decode-only batches only."""
        if self._compiled_model is None:
            print("tinyinfer: enforce_eager=False, so decode steps run a torch.compile'd model; each new kind "
                  "of step (batch 1, larger batches) compiles once, about a minute on a CPU", file=sys.stderr)
            self._compiled_model = torch.compile(self.model, dynamic=True)
        return self._compiled_model

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence], all_positions: bool = False):
        """Process every prompt in one forward pass and allocate this batch's cache.

        Returns the last position's logits [B, V] and, when all_positions is set,
        hidden states for every prompt position (for prompt logprobs)."""
        lens = [len(s.prompt_token_ids) for s in seqs]
        max_len = max(len(s.prompt_token_ids) + s.params.max_tokens for s in seqs)
        self.cache = KVCache(self.config, len(seqs), max_len, self.dtype, self.device)
        ids = torch.full((len(seqs), max(lens)), self.pad_token_id, dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, : lens[b]] = torch.tensor(s.prompt_token_ids)
        ids = ids.to(self.device)
        positions = torch.arange(ids.shape[1], device=self.device).expand_as(ids)
        hidden = self.model(ids, positions, self.cache, AttentionMetadata.uniform(positions, 0))
        last = hidden[torch.arange(len(seqs)), torch.tensor(lens) - 1]
        return self.model.compute_logits(last), (hidden if all_positions else None)

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One new token per sequence, attending to its cache. Returns logits [B, V].

        Finished sequences ride along (static batching) with their position
        frozen, so they never write past their own cache row."""
        ids, pos = [], []
        for s in seqs:
            n = len(s.prompt_token_ids) + len(s.output_token_ids)
            ids.append(s.output_token_ids[-1])
            pos.append(min(n - 1, self.cache.max_len - 1))
        ids = torch.tensor(ids, device=self.device)[:, None]
        positions = torch.tensor(pos, device=self.device)[:, None]
        if len(set(pos)) == 1:  # e.g. batch 1: no mask needed, slice writes
            meta = AttentionMetadata.uniform(positions, pos[0])
        else:
            meta = AttentionMetadata(positions, max(pos) + 1, mask=causal_mask(positions, max(pos) + 1))
        hidden = self.model(ids, positions, self.cache, meta)
        return self.model.compute_logits(hidden[:, -1])

    @torch.inference_mode()
    def logits_for(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)

    def release(self) -> None:
        self.cache = None
