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

The step itself: schedule() says what runs, as a list of ScheduledSeq records
(a sequence, its new tokens, its block table, who samples after it); the model
runner runs it and the sampler draws; update_from_output() appends the tokens,
applies the stopping rules and frees what finished.

Nothing may wait forever. check_request refuses, when it arrives, a request
that could never be scheduled; a recompute preemption never grows a sequence
past what one step can re-read; and a step that could schedule nothing while
requests wait and nothing runs raises instead of returning empty forever.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .block_manager import BlockManager
from .sampling import SamplerOutput
from .sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from .request import Request


@dataclass
class SchedulerConfig:
    max_num_seqs: int  # running sequences at most
    max_num_batched_tokens: int  # tokens processed per step at most (the token budget)
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"  # or "swap": keep the preempted cache in host memory


@dataclass
class SchedulerStats:
    """What the engine looked like at its last step (vLLM logs the same).

    A request with n > 1 runs as n sequences: num_running and num_waiting count
    sequences, num_running_reqs and num_waiting_reqs count requests (a request
    runs while any of its samples does)."""

    num_running: int = 0
    num_waiting: int = 0
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
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
    # With enforce_eager=False: why this step ran eagerly (None: compiled, or not a
    # decode-only step, which always runs eagerly), and how many decode-only steps have.
    eager_decode_reason: str | None = None
    num_eager_decode_steps: int = 0  # cumulative
    # On a CPU: the kernel one-row products take, "packed" (oneDNN's layout) or
    # "plain" (F.linear), measured once per CPU (kernel_choice.py); None on a GPU.
    one_row_kernel: str | None = None


@dataclass
class ScheduledSeq:
    """One sequence's share of a step, as it was decided: the runner reads the
    positions and the block table from here, not from the live sequence."""

    seq: Sequence
    start: int  # its first new token's position (tokens before it are in the cache)
    num_new_tokens: int
    block_table: list[int]  # a copy: the blocks that hold positions 0..start + num_new_tokens - 1
    # Who samples from this entry's last position after the step: nobody for a
    # prompt chunk that is not the last; the sequence itself; or, when a request
    # forks its n samples, the sequence and its new siblings.
    samples: list[Sequence] = field(default_factory=list)
    prompt_logprobs: bool = False  # return the logits of its prompt positions too


@dataclass
class BlockSwap:
    """Swap preemption: a sequence's computed keys and values, copied out to host
    memory before the step's writes, or back in for a resumed sequence."""

    seq: Sequence  # the runner keeps the host copy on it (seq.swapped_kv), so it goes when the sequence goes
    block_table: list[int]
    num_tokens: int


@dataclass
class SchedulerOutput:
    """Everything the model runner needs for one step, and who samples after it."""

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write block copies (src, dst)
    swap_out: list[BlockSwap] = field(default_factory=list)
    swap_in: list[BlockSwap] = field(default_factory=list)
    num_decode_tokens: int = 0  # one new token right after an already sampled one

    @property
    def sampling(self) -> list[Sequence]:
        """The sequences that sample a token after this step, in row order."""
        return [s for entry in self.scheduled for s in entry.samples]

    @property
    def num_batched_tokens(self) -> int:
        return sum(entry.num_new_tokens for entry in self.scheduled)

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

    def add(self, request: Request) -> None:
        """Queue a request: its first sample, which prefills the prompt for all of them."""
        self.waiting.append(request.samples[0])

    def check_request(self, request: Request, where: str) -> None:
        """Refuse, before it queues, a request that could never be scheduled: one
        the KV pool could never hold, with more samples than may run at once, or
        (without chunked prefill) a prompt longer than a step."""
        bm, p, cfg = self.block_manager, request.params, self.config
        num_prompt = request.samples[0].num_tokens
        need = bm.blocks_for(num_prompt + p.max_tokens) + (p.n - 1) * (bm.blocks_for(p.max_tokens) + 1)
        if need > bm.num_blocks:
            raise ValueError(f"{where}: {num_prompt} prompt tokens + max_tokens {p.max_tokens} (n={p.n}) need "
                             f"{need} KV blocks, but the KV cache holds {bm.num_blocks}; lower max_tokens or n, "
                             f"or raise kv_cache_memory_bytes")
        if p.n > cfg.max_num_seqs:
            raise ValueError(f"SamplingParams.n={p.n} is invalid: must be <= max_num_seqs ({cfg.max_num_seqs})")
        if not cfg.enable_chunked_prefill and num_prompt > cfg.max_num_batched_tokens:
            raise ValueError(f"{where}: {num_prompt} prompt tokens do not fit in one step of "
                             f"max_num_batched_tokens={cfg.max_num_batched_tokens}, and with "
                             f"enable_chunked_prefill=False a prompt is never cut; shorten the prompt, raise "
                             f"max_num_batched_tokens to at least {num_prompt}, or set enable_chunked_prefill=True")

    # --- deciding a step ----------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:  # after a preemption the pool is full already: admit nobody
            self._schedule_waiting(out, budget)
        if out.is_empty and not out.preempted and self.waiting and not self.running:
            raise RuntimeError(self._stuck_message())
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        bm = self.block_manager
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._num_new_tokens(seq, seq.num_computed_tokens, budget)
            if n == 0:
                break
            while not bm.can_append(seq, seq.num_computed_tokens + n):
                victim = self.running.pop()  # the newest has waited least: it pays
                self._preempt(victim, out)
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:  # it preempted itself
                break
            out.copies += bm.append_slots(seq, seq.num_computed_tokens + n)
            self._add_to_step(out, seq, seq.num_computed_tokens, n)
            budget -= n
            i += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        bm = self.block_manager
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            # A new request's samples run side by side once its prompt is in.
            if len(self.running) + 1 + seq.request.num_unforked > self.config.max_num_seqs:
                break
            # A sequence whose cache comes back from host memory starts after it;
            # a request that wants prompt logprobs needs every prompt position
            # computed, so it does not look in the prefix cache. Otherwise the
            # prefix is matched once, and the match handed to the block manager.
            swapped = seq.status == SequenceStatus.SWAPPED
            hits = [] if swapped or seq.request.wants_prompt_logprobs(seq) else bm.match_prefix(seq)
            start = seq.num_computed_tokens if swapped else len(hits) * bm.block_size
            n = self._num_new_tokens(seq, start, budget)
            if n == 0 or not bm.can_allocate(seq, start + n, hits):
                break  # first come, first served: nobody overtakes the head of the queue
            self.waiting.popleft()
            bm.allocate(seq, start + n, hits)
            if swapped:
                out.swap_in.append(BlockSwap(seq, list(seq.block_table), start))
                self.num_swapped_in += 1
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._add_to_step(out, seq, start, n)
            budget -= n

    def _num_new_tokens(self, seq: Sequence, computed: int, budget: int) -> int:
        n = seq.num_tokens - computed
        if n > budget and not self.config.enable_chunked_prefill:
            return 0  # wait for a step with room for the whole prompt
        return min(n, budget)

    def _add_to_step(self, out: SchedulerOutput, seq: Sequence, start: int, n: int) -> None:
        """Put n tokens of seq, from position `start`, in the step. As in vLLM,
        they count as computed from here on: the step that computes them is
        decided, and the block manager places the next write after them."""
        entry = ScheduledSeq(seq, start, n, list(seq.block_table),
                             prompt_logprobs=seq.request.wants_prompt_logprobs(seq))
        out.scheduled.append(entry)
        seq.num_computed_tokens = start + n
        if seq.num_computed_tokens < seq.num_tokens:
            return  # a prompt chunk that is not the last: nothing to sample yet
        if n == 1 and seq.num_output_tokens:
            out.num_decode_tokens += 1
        entry.samples = [seq]
        if seq.request.num_unforked:  # n > 1, and the prompt is complete after this step: fork here
            # The children run from the next step on. They join the end of the
            # running list now, and nothing after them can preempt them this
            # step: a prompt still being cut into chunks takes all the budget
            # left, so nothing running was admitted after it. _schedule_running
            # stops at them (they have no new token until they sample one).
            for child in seq.request.fork():
                self.block_manager.fork(seq, child)
                self.running.append(child)
                entry.samples.append(child)

    # --- after the step -----------------------------------------------------------------

    def update_from_output(self, out: SchedulerOutput, sampled: SamplerOutput) -> list[Sequence]:
        """The step ran and the sampler drew: file the newly computed blocks in the
        prefix cache, collect prompt logprobs, append each new token, apply the
        stopping rules and free what finished. Returns the sequences that got a token."""
        for entry in out.scheduled:
            self.block_manager.mark_computed(entry.seq)
        for chunk in sampled.prompt_logprobs:
            chunk.seq.request.add_prompt_logprobs(chunk.start, chunk.entries)
        now, progressed = time.perf_counter(), []
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
        self.block_manager.free(seq)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Free the sequence's blocks and queue it first. With recompute, its
        tokens so far (prompt and output) become the prompt it re-reads; with
        swap, its computed keys and values wait in host memory instead."""
        if seq.num_computed_tokens and (self.config.preemption_mode == "swap" or not self._fits_one_step(seq)):
            # The blocks are reused by others only from this step's writes on,
            # so the runner copies them out before running the step.
            out.swap_out.append(BlockSwap(seq, list(seq.block_table), seq.num_computed_tokens))
            seq.status = SequenceStatus.SWAPPED
            self.num_swapped_out += 1
        else:
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING
        self.block_manager.free(seq)
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        self.num_preemptions += 1

    def _fits_one_step(self, seq: Sequence) -> bool:
        """Could seq be recomputed? Without chunked prefill its whole token list
        (prompt and output so far) is re-read in one step, which must fit the
        budget; a sequence grown past it is swapped instead (vLLM, too, picks the
        preemption mode per sequence), or it would wait forever."""
        return self.config.enable_chunked_prefill or seq.num_tokens <= self.config.max_num_batched_tokens

    def _stuck_message(self) -> str:
        """The state, for the error that replaces an endless loop of empty steps.
        It should be unreachable: check_request refuses what could never run."""
        seq, bm, cfg = self.waiting[0], self.block_manager, self.config
        return (f"the scheduler cannot make progress: nothing runs, and the first of {len(self.waiting)} waiting "
                f"sequences ({seq.seq_id!r}: {seq.num_tokens} tokens, {seq.status.value}, "
                f"{seq.request.num_unforked + 1} sample(s) to start) cannot be scheduled with "
                f"max_num_batched_tokens={cfg.max_num_batched_tokens}, enable_chunked_prefill="
                f"{cfg.enable_chunked_prefill}, max_num_seqs={cfg.max_num_seqs} and {bm.num_free_blocks} of "
                f"{bm.num_blocks} KV blocks free (block_size={bm.block_size})")

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
        record_queue_stats(st, self.running, self.waiting)
        st.kv_blocks_total, st.kv_blocks_used = bm.num_blocks, bm.num_used_blocks
        st.kv_blocks_free = bm.num_free_blocks
        st.kv_bytes_reserved = bm.num_used_blocks * st.kv_bytes_per_block
        # Per sequence: a prefix shared through the prefix cache (or a fork) counts
        # once for each sequence here, but its blocks only once in kv_bytes_reserved.
        st.kv_bytes_used = sum(s.num_computed_tokens for s in self.running) * self.kv_bytes_per_token


def record_queue_stats(st: SchedulerStats, running: Collection[Sequence], waiting: Collection[Sequence]) -> None:
    """Sequences and requests running and waiting (a request runs while any of
    its samples does)."""
    running_reqs = {s.request_id for s in running}
    st.num_running, st.num_waiting = len(running), len(waiting)
    st.num_running_reqs = len(running_reqs)
    st.num_waiting_reqs = len({s.request_id for s in waiting} - running_reqs)
