"""Scheduler: continuous batching, one step at a time.

Before every model step the scheduler decides which sequences run and how many
of their tokens. There is no separate "prefill batch" and "decode batch": a
sequence simply has tokens whose keys and values are not yet in the cache
(num_tokens - num_computed_tokens). For a decoding sequence that is 1 token; for
a new prompt it is the whole prompt, which may be cut into chunks.

Each step:
1. Running sequences first, oldest first: each gets its next tokens (1 for
   decode, the next chunk for a prompt) within the step's token budget. If the
   KV pool has no block for them, the newest running sequence is preempted
   (its blocks freed, put back at the front of the queue, recomputed later)
   until there is room. Never crash, never drop a request. A preempted
   sequence either drops its cache and recomputes it later (recompute, the
   default) or has its blocks copied to host memory and back (swap).
2. Then waiting sequences, first come first served, while the token budget,
   the cap on running sequences and the free blocks allow. A long prompt takes
   what is left of the budget and continues next step (chunked prefill), so it
   does not stall the sequences that are decoding.

Finished sequences leave at once, so their blocks serve the queue next step.

A request with n > 1 (parallel sampling) prefills its prompt once. When its
last prompt token is scheduled, it forks n-1 more sequences that share its
blocks; the first write into a shared, partly filled block copies it
(copy-on-write), so the samples part ways without recomputing the prompt.

The step itself: schedule() says what runs; the model runner runs it and the
sampler draws; update_from_output() appends the tokens, applies the stopping
rules and frees what finished.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Sequence, SequenceStatus


@dataclass
class SchedulerConfig:
    max_num_seqs: int  # running sequences at most
    max_num_batched_tokens: int  # tokens processed per step at most (the token budget)
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"  # or "swap": keep the preempted cache in host memory


@dataclass
class SchedulerStats:
    """What the engine looked like at its last step (vLLM logs the same)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    kv_blocks_free: int = 0
    block_size: int = 0
    kv_bytes_per_block: int = 0
    kv_bytes_reserved: int = 0  # blocks in use (or a contiguous reservation) in bytes
    kv_bytes_used: int = 0  # bytes that hold real tokens' keys and values
    prefix_cache_hit_tokens: int = 0  # cumulative: prompt tokens not recomputed
    num_preemptions: int = 0  # cumulative
    num_swapped_out: int = 0  # cumulative: preemptions that kept their cache in host memory
    num_swapped_in: int = 0  # cumulative
    num_prefill_tokens: int = 0  # this step
    num_decode_tokens: int = 0  # this step
    step_time_s: float = 0.0


@dataclass
class SchedulerOutput:
    """Everything the model runner needs for one step, and who samples after it."""

    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, new tokens this step)
    block_tables: list[list[int]] = field(default_factory=list)  # one per scheduled sequence
    # The sequences that sample a token after this step (they reach their last
    # known token), and for each the scheduled entry whose last position's
    # logits it samples from (a forked sample shares its parent's).
    sampling: list[Sequence] = field(default_factory=list)
    sample_rows: list[int] = field(default_factory=list)
    forked: list[Sequence] = field(default_factory=list)  # parallel samples made this step
    preempted: list[Sequence] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write block copies
    # Swap preemption: (sequence, its block table, tokens to move) to copy out to
    # host memory before this step's writes, and back in for resumed sequences.
    swap_out: list[tuple[Sequence, list[int], int]] = field(default_factory=list)
    swap_in: list[tuple[Sequence, list[int], int]] = field(default_factory=list)
    num_decode_tokens: int = 0  # one new token right after an already sampled one

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, kv_bytes_per_token: int = 0):
        self.config = config
        self.block_manager = block_manager
        self.kv_bytes_per_token = kv_bytes_per_token  # for stats only
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in order of admission: oldest first
        self.num_preemptions = 0
        self.num_swapped_out = self.num_swapped_in = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def check_request(self, seq: Sequence, where: str) -> None:
        """Refuse, before it queues, a request the KV pool could never hold."""
        bm, p = self.block_manager, seq.params
        need = bm.blocks_for(seq.num_tokens + p.max_tokens) + (p.n - 1) * (bm.blocks_for(p.max_tokens) + 1)
        if need > bm.num_blocks:
            raise ValueError(f"{where}: {seq.num_tokens} prompt tokens + max_tokens {p.max_tokens} (n={p.n}) need "
                             f"{need} KV blocks, but the KV cache holds {bm.num_blocks}; lower max_tokens or n, "
                             f"or raise kv_cache_memory_bytes")
        if p.n > self.config.max_num_seqs:
            raise ValueError(f"SamplingParams.n={p.n} is invalid: must be <= max_num_seqs ({self.config.max_num_seqs})")

    # --- deciding a step ----------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:  # after a preemption the pool is full already: admit nobody
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        bm = self.block_manager
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._num_new_tokens(seq, seq.num_computed_tokens, budget)
            if n == 0:
                break
            while not bm.can_append(seq.seq_id, seq.num_computed_tokens + n):
                victim = self.running.pop()  # the newest has waited least: it pays
                self._preempt(victim, out)
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:  # it preempted itself
                break
            out.copies += bm.append_slots(seq.seq_id, seq.num_computed_tokens + n)
            self._add_to_step(out, seq, n)
            budget -= n
            i += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        bm = self.block_manager
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            new_seqs = seq.params.n if len(seq.samples) == 1 else 1  # its samples run side by side
            if len(self.running) + len(out.forked) + new_seqs > self.config.max_num_seqs:
                break
            # A request that wants prompt logprobs needs every prompt position
            # computed, so it does not look in the prefix cache; nor does one
            # whose cache is coming back from host memory. The prefix is matched
            # once, and the match handed to the block manager.
            swapped = seq.num_swapped_tokens
            hits = [] if swapped or seq.wants_prompt_logprobs else bm.match_prefix(seq.token_ids)
            cached = swapped or len(hits) * bm.block_size
            n = self._num_new_tokens(seq, cached, budget)
            if n == 0 or not bm.can_allocate(seq.seq_id, [], cached + n, hits):
                break  # first come, first served: nobody overtakes the head of the queue
            self.waiting.popleft()
            seq.num_computed_tokens = bm.allocate(seq.seq_id, [], cached + n, hits)
            if swapped:
                out.swap_in.append((seq, bm.block_table(seq.seq_id), swapped))
                seq.num_computed_tokens, seq.num_swapped_tokens = swapped, 0
                self.num_swapped_in += 1
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._add_to_step(out, seq, n)
            budget -= n

    def _num_new_tokens(self, seq: Sequence, computed: int, budget: int) -> int:
        n = seq.num_tokens - computed
        if n > budget and not self.config.enable_chunked_prefill:
            return 0  # wait for a step with room for the whole prompt
        return min(n, budget)

    def _add_to_step(self, out: SchedulerOutput, seq: Sequence, n: int) -> None:
        out.scheduled.append((seq, n))
        out.block_tables.append(self.block_manager.block_table(seq.seq_id))
        if seq.num_computed_tokens + n < seq.num_tokens:
            return  # a prompt chunk that is not the last: nothing to sample yet
        if n == 1 and seq.num_output_tokens:
            out.num_decode_tokens += 1
        samples = [seq]
        if len(seq.samples) < seq.params.n:  # the prompt is complete after this step: fork its samples here
            for child in seq.fork():
                self.block_manager.fork(seq.seq_id, child.seq_id)
                out.forked.append(child)
                samples.append(child)
        out.sampling += samples
        out.sample_rows += [len(out.scheduled) - 1] * len(samples)

    # --- after the step -----------------------------------------------------------------

    def update_from_output(self, out: SchedulerOutput, sampled) -> list[Sequence]:
        """The step ran and the sampler drew: record what is now in the cache,
        append each new token, apply the stopping rules and free what finished.
        Returns the sequences that got a token."""
        bm = self.block_manager
        for seq, n in out.scheduled:
            if seq.seq_id in sampled.prompt_logprobs:
                seq.add_prompt_logprobs(seq.num_computed_tokens, sampled.prompt_logprobs[seq.seq_id])
            seq.num_computed_tokens += n
            bm.mark_computed(seq.seq_id, seq.token_ids, seq.num_computed_tokens)
        for child in out.forked:  # they share the parent's blocks, now computed
            child.num_computed_tokens = child.samples[0].num_computed_tokens
            bm.mark_computed(child.seq_id, child.token_ids, child.num_computed_tokens)
            self.running.append(child)
        now = time.perf_counter()
        progressed = []
        for seq, token, logprobs in zip(out.sampling, sampled.token_ids, sampled.logprobs):
            if seq.finished:  # aborted while its step ran
                continue
            seq.append_token(token, logprobs, now)
            progressed.append(seq)
            if seq.finished:
                self.finish(seq)
        return progressed

    def finish(self, seq: Sequence) -> None:
        """A sequence stopped (or was aborted): free its blocks at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq.seq_id)
        seq.status = SequenceStatus.FINISHED

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Free the sequence's blocks and queue it first. With recompute, its
        tokens so far (prompt and output) become the prompt it re-reads; with
        swap, its computed keys and values wait in host memory instead."""
        if self.config.preemption_mode == "swap" and seq.num_computed_tokens:
            # The blocks are reused by others only from this step's writes on,
            # so the runner copies them out before running the step.
            out.swap_out.append((seq, list(self.block_manager.block_table(seq.seq_id)), seq.num_computed_tokens))
            seq.num_swapped_tokens = seq.num_computed_tokens
            self.num_swapped_out += 1
        self.block_manager.free(seq.seq_id)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        self.num_preemptions += 1

    def record_stats(self, st: SchedulerStats, out: SchedulerOutput | None = None) -> None:
        """The step's work, and the queue and pool as they are after it (once
        finished requests have left)."""
        bm = self.block_manager
        if out is not None:
            st.num_decode_tokens = out.num_decode_tokens
            st.num_prefill_tokens = out.num_batched_tokens - out.num_decode_tokens
        st.prefix_cache_hit_tokens = bm.prefix_cache_hit_tokens
        st.num_preemptions, st.num_swapped_out, st.num_swapped_in = (
            self.num_preemptions, self.num_swapped_out, self.num_swapped_in)
        st.num_running, st.num_waiting = len(self.running), len(self.waiting)
        st.kv_blocks_used, st.kv_blocks_free = bm.num_used_blocks, bm.num_free_blocks
        st.kv_bytes_reserved = bm.num_used_blocks * st.kv_bytes_per_block
        # Per sequence: a prefix shared through the prefix cache (or a fork) counts
        # once for each sequence here, but its blocks only once in kv_bytes_reserved.
        st.kv_bytes_used = sum(s.num_computed_tokens for s in self.running) * self.kv_bytes_per_token
