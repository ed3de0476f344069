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
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Sequence, SequenceStatus


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 16  # running sequences at most
    max_num_batched_tokens: int = 512  # tokens processed per step at most (the token budget)
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
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, new tokens this step)
    preempted: list[Sequence] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write block copies
    # Swap preemption: (sequence, its block table, tokens to move) to copy out to
    # host memory before this step's writes, and back in for resumed sequences.
    swap_out: list[tuple[Sequence, list[int], int]] = field(default_factory=list)
    swap_in: list[tuple[Sequence, list[int], int]] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in order of admission: oldest first
        self.num_preemptions = 0
        self.num_swapped_out = self.num_swapped_in = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        bm = self.block_manager
        # 1. running sequences
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._num_new_tokens(seq, seq.num_computed_tokens, budget)
            if n == 0:
                break
            while bm.blocks_for(seq.num_computed_tokens + n) - len(bm.block_table(seq.request_id)) > bm.num_free_blocks:
                victim = self.running.pop()  # the newest has waited least: it pays
                self._preempt(victim, out)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:  # it preempted itself
                break
            out.copies += bm.append_slots(seq.request_id, seq.num_computed_tokens + n)
            out.scheduled.append((seq, n))
            budget -= n
            i += 1
        # 2. waiting sequences; none after a preemption (the pool is full already)
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs and not out.preempted:
            seq = self.waiting[0]
            # A request that wants prompt logprobs needs every prompt position
            # computed, so it does not look in the prefix cache; nor does one
            # whose cache is coming back from host memory.
            swapped = seq.num_swapped_tokens
            use_cache = seq.params.prompt_logprobs is None and not swapped
            match_ids = seq.token_ids if use_cache else []
            cached = swapped or len(bm.match_prefix(match_ids)) * bm.block_size
            n = self._num_new_tokens(seq, cached, budget)
            if n == 0 or not bm.can_allocate(seq.request_id, match_ids, cached + n):
                break  # first come, first served: nobody overtakes the head of the queue
            self.waiting.popleft()
            seq.num_cached_tokens = seq.num_computed_tokens = bm.allocate(seq.request_id, match_ids, cached + n)
            if swapped:
                out.swap_in.append((seq, bm.block_table(seq.request_id), swapped))
                seq.num_computed_tokens, seq.num_swapped_tokens = swapped, 0
                self.num_swapped_in += 1
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, n))
            budget -= n
        return out

    def _num_new_tokens(self, seq: Sequence, computed: int, budget: int) -> int:
        n = seq.num_tokens - computed
        if n > budget and not self.config.enable_chunked_prefill:
            return 0  # wait for a step with room for the whole prompt
        return min(n, budget)

    def update_after_step(self, out: SchedulerOutput) -> None:
        """The step ran: its tokens' keys and values are in the cache now."""
        for seq, n in out.scheduled:
            seq.num_computed_tokens += n
            self.block_manager.mark_computed(seq.request_id, seq.token_ids, seq.num_computed_tokens)

    def finish(self, seq: Sequence) -> None:
        """A sequence stopped (or was aborted): free its blocks at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq.request_id)
        seq.status = SequenceStatus.FINISHED

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Free the sequence's blocks and queue it first. With recompute, its
        tokens so far (prompt and output) become the prompt it re-reads; with
        swap, its computed keys and values wait in host memory instead."""
        if self.config.preemption_mode == "swap" and seq.num_computed_tokens:
            # The blocks are reused by others only from this step's writes on,
            # so the engine copies them out before running the step.
            out.swap_out.append((seq, list(self.block_manager.block_table(seq.request_id)), seq.num_computed_tokens))
            seq.num_swapped_tokens = seq.num_computed_tokens
            self.num_swapped_out += 1
        self.block_manager.free(seq.request_id)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
