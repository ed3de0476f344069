"""Static batching: the baseline chapter 7 measures continuous batching against.

A batch of up to max_num_seqs requests starts together on a contiguous,
max-length cache (kv_cache.py), right-padded, and nobody new joins until its
longest member ends. Finished sequences ride along, computing tokens nobody
reads, because the batch's shape is fixed. Sequence b's prompt sits at
positions 0..len_b-1 and each later token at the next position; padding slots
are never attended to, because a query only sees keys at positions <= its own
(see kv_cache.causal_mask).

StaticScheduler and StaticModelRunner have the same interface as Scheduler and
ModelRunner (step_parts.py's SchedulerLike and RunnerLike), so LLMEngine runs
the same step for both: set the two files side by side to see what continuous
batching changes. Static batching has no KV blocks, so no BlockManager.
"""
from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

import torch

from .kv_cache import AttentionMetadata, KVCache, causal_mask
from .outputs import ModelOutput, PromptLogits
from .prepare import PreparedModel
from .sampling import SamplerOutput
from .scheduler import ScheduledSeq, SchedulerConfig, SchedulerOutput, SchedulerStats, record_queue_stats
from .sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from .model import LlamaForCausalLM
    from .request import Request


class StaticScheduler:
    block_manager = None  # a contiguous cache per batch: no KV blocks to manage

    def __init__(self, config: SchedulerConfig, kv_bytes_per_token: int):
        self.config = config
        self.kv_bytes_per_token = kv_bytes_per_token
        self.waiting: deque[Sequence] = deque()
        self.batch: list[Sequence] = []  # the batch, finished members included: its shape is fixed
        self.running: list[Sequence] = []  # the batch's members that have not finished

    def add(self, request: Request) -> None:
        self.waiting.append(request.samples[0])

    def check_request(self, request: Request, where: str) -> None:
        if request.params.n != 1:
            raise ValueError(f"SamplingParams.n={request.params.n} is invalid with scheduling='static': must be 1")

    def schedule(self) -> SchedulerOutput:
        if not self.running:  # every member ended (or was aborted): a new batch, everyone prefills together
            self.batch = []
            while self.waiting and len(self.batch) < self.config.max_num_seqs:
                self.batch.append(self.waiting.popleft())
                self.batch[-1].status = SequenceStatus.RUNNING
            self.running = list(self.batch)
        out = SchedulerOutput()
        for seq in self.batch:  # a finished member rides along: 0 new tokens, nobody samples
            entry = ScheduledSeq(seq, seq.num_computed_tokens, seq.num_tokens - seq.num_computed_tokens, [],
                                 [] if seq.finished else [seq], seq.request.wants_prompt_logprobs(seq))
            out.scheduled.append(entry)
        out.num_decode_tokens = len(out.sampling) if any(s.num_computed_tokens for s in self.batch) else 0
        return out

    def update_from_output(self, out: SchedulerOutput, sampled: SamplerOutput) -> list[Sequence]:
        for entry in out.scheduled:
            entry.seq.num_computed_tokens += entry.num_new_tokens
        for chunk in sampled.prompt_logprobs:
            chunk.seq.request.add_prompt_logprobs(chunk.start, chunk.entries)
        now = time.perf_counter()
        progressed = []
        for seq, token, logprobs in zip(out.sampling, sampled.token_ids, sampled.logprobs):
            if not seq.finished:  # not aborted while its step ran
                seq.append_token(token, logprobs, now)
                progressed.append(seq)
        self.running = [s for s in self.running if not s.finished]
        if not self.running:
            self.batch = []
        return progressed

    def finish(self, seq: Sequence) -> None:
        """Aborted: leave the queue, or ride along in the batch until it ends."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def record_stats(self, st: SchedulerStats, out: SchedulerOutput | None = None) -> None:
        if out is not None:
            st.num_decode_tokens = out.num_decode_tokens
            st.num_prefill_tokens = out.num_batched_tokens - out.num_decode_tokens
        record_queue_stats(st, self.running, self.waiting)
        # The contiguous cache reserves every member's longest possible length.
        max_len = max((s.num_prompt_tokens + s.params.max_tokens for s in self.batch), default=0)
        st.kv_bytes_reserved = len(self.batch) * max_len * self.kv_bytes_per_token
        st.kv_bytes_used = sum(s.num_tokens for s in self.batch) * self.kv_bytes_per_token


class StaticModelRunner:
    def __init__(self, model: LlamaForCausalLM, device: torch.device, dtype: torch.dtype, pad_token_id: int = 0):
        self.prepared = PreparedModel(model)
        self.device = device
        self.dtype = dtype
        self.pad_token_id = pad_token_id
        self.cache: KVCache | None = None
        self.eager_decode_reason = None  # never compiled (EngineConfig refuses it): nothing to explain

    @property
    def model(self):
        return self.prepared.model

    @model.setter
    def model(self, model) -> None:
        self.prepared = PreparedModel(model)

    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput) -> ModelOutput:
        self.prepared.check_current()  # no kernel layout older than its weights (cpu_linear's rule 4)
        batch = [entry.seq for entry in out.scheduled]
        rows = [b for b, entry in enumerate(out.scheduled) if entry.samples]
        if all(entry.start == 0 for entry in out.scheduled):
            return self.prefill(out.scheduled, rows)
        return ModelOutput(self.decode(batch)[rows])

    def prefill(self, entries: list[ScheduledSeq], rows: list[int]) -> ModelOutput:
        """Process every prompt in one forward pass and allocate this batch's cache."""
        seqs = [entry.seq for entry in entries]
        lens = [s.num_prompt_tokens for s in seqs]
        max_len = max(s.num_prompt_tokens + s.params.max_tokens for s in seqs)
        self.cache = KVCache(self.model.config, len(seqs), max_len, self.dtype, self.device)
        ids = torch.full((len(seqs), max(lens)), self.pad_token_id, dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, : lens[b]] = torch.tensor(s.token_ids)
        ids = ids.to(self.device)
        positions = torch.arange(ids.shape[1], device=self.device).expand_as(ids)
        hidden = self.model(ids, positions, self.cache, AttentionMetadata.uniform(positions, 0))
        last = hidden[torch.arange(len(seqs)), torch.tensor(lens) - 1]
        prompt_logits = [PromptLogits(e.seq, 0, self.model.compute_logits(hidden[b, : lens[b] - 1]))
                         for b, e in enumerate(entries) if e.prompt_logprobs]
        return ModelOutput(self.model.compute_logits(last[rows]), prompt_logits)

    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One new token per sequence, attending to its cache. Returns logits [B, V].
        Finished sequences ride along with their position frozen, so they never
        write past their own cache row."""
        ids = [s.token_ids[-1] for s in seqs]
        pos = [min(s.num_tokens - 1, self.cache.max_len - 1) for s in seqs]
        ids = torch.tensor(ids, device=self.device)[:, None]
        positions = torch.tensor(pos, device=self.device)[:, None]
        if len(set(pos)) == 1:  # e.g. batch 1: no mask needed, slice writes
            meta = AttentionMetadata.uniform(positions, pos[0])
        else:
            meta = AttentionMetadata(positions, max(pos) + 1, mask=causal_mask(positions, max(pos) + 1))
        hidden = self.model(ids, positions, self.cache, meta)
        return self.model.compute_logits(hidden[:, -1])

