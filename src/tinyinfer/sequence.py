"""One sample of a request: its tokens, its place in the KV cache, its text so
far, and when it stops.

A Sequence keeps ONE token list: the prompt, then every sampled token
(nano-vllm and vLLM do the same). Appending is O(1), and whoever needs a part
of it slices just that part, so no step pays for the whole reply again.

What the samples of a request share (its id, prompt and SamplingParams) lives
on their Request (request.py); a request with n=1 has one Sequence, one with
n=3 has three. The scheduler and the block manager work on sequences.
"""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Protocol

from .detokenizer import IncrementalDetokenizer
from .outputs import CompletionOutput, PositionLogprobs, TokenIds

if TYPE_CHECKING:
    import torch

    from .sampler import SamplingState
    from .sampling import SamplingParams


class SequenceStatus(enum.Enum):
    """Where a sequence is. Its finish reason is part of its status, so there is
    one notion of "finished" (vLLM's SequenceStatus does the same)."""

    WAITING = "waiting"  # queued, holds no KV blocks
    RUNNING = "running"  # scheduled each step, holds KV blocks
    SWAPPED = "swapped"  # preempted, its computed keys and values wait in host memory
    FINISHED_STOPPED = "stop"  # an end-of-sequence token, a stop token id or a stop string
    FINISHED_LENGTH_CAPPED = "length"  # max_tokens reached
    FINISHED_ABORTED = "abort"  # the caller gave up on it

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED


_FINISHED = {SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH_CAPPED, SequenceStatus.FINISHED_ABORTED}


class RequestLike(Protocol):
    """What a sequence reads from its request (request.Request): the id, the
    settings and the tokens that end a sample, which all its samples share."""

    request_id: str
    params: SamplingParams
    eos_token_ids: frozenset[int]


class Sequence:
    def __init__(self, request: RequestLike, index: int, prompt_token_ids: list[int], decode=None):
        self.request = request
        self.index = index  # which of the request's n parallel samples this is
        self.token_ids = list(prompt_token_ids)  # the prompt, then the output: the only token list
        self.num_prompt_tokens = len(self.token_ids)
        # The reply's text (detokenizer.text). Without a tokenizer (a bare model),
        # there is none, and the stopping rules use token ids only.
        self.detokenizer = IncrementalDetokenizer(decode, self.token_ids, self.num_prompt_tokens) if decode else None
        self.stop_reason: int | str | None = None  # the stop token id or stop string that ended it
        self.logprobs: list[PositionLogprobs] | None = [] if self.params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.token_times: list[float] = []  # when each output token was sampled
        self.status = SequenceStatus.WAITING
        # The KV cache: tokens whose keys and values are in it (or, once
        # scheduled, are being written by the step), the blocks that hold them,
        # and how many of those blocks are filed in the prefix cache. While
        # SWAPPED, num_computed_tokens counts the tokens kept in host memory.
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.num_hashed_blocks = 0
        # The sampler's slot (its random stream and penalty mask), as block_table
        # is the block manager's: it goes when the sequence goes.
        self.sampling_state: SamplingState | None = None
        # The runner's slot: K and V (and their scales, with an int8 pool) copied to host
        # memory while swapped out (swap preemption).
        self.swapped_kv: tuple[torch.Tensor, ...] | None = None

    # --- what the request's samples share -------------------------------------------

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.request.eos_token_ids

    @property
    def output_text(self) -> str:
        """The reply's text so far (a stop string cut off, incomplete characters held back)."""
        return self.detokenizer.text if self.detokenizer is not None else ""

    @property
    def seq_id(self) -> str:
        """A name for this sample, unique among live sequences: the request's id,
        with #index for the parallel samples after the first."""
        return self.request_id if self.index == 0 else f"{self.request_id}#{self.index}"

    # --- the token list -------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        """vLLM's names: "stop", "length" or "abort"; None while it runs."""
        return self.status.value if self.finished else None

    def fork(self, index: int) -> Sequence:
        """Another sample of the same request, made when the prompt is (about to
        be) in the cache and nothing is sampled yet: the same tokens and computed
        tokens (the block manager shares the blocks themselves)."""
        if self.num_output_tokens:
            raise ValueError(f"sequence {self.seq_id!r} has output tokens; samples fork from the prompt")
        decode = self.detokenizer.decode if self.detokenizer else None
        child = Sequence(self.request, index, self.token_ids, decode)
        child.num_computed_tokens, child.status = self.num_computed_tokens, self.status
        return child

    def abort(self) -> None:
        if not self.finished:
            self.status = SequenceStatus.FINISHED_ABORTED

    # --- one new token ----------------------------------------------------------------

    def append_token(self, token_id: int, logprobs: PositionLogprobs | None = None, now: float | None = None) -> None:
        """Record a sampled token (with its logprobs and time, if given), extend the
        text, and apply the stopping rules: end-of-sequence token, stop token ids,
        stop strings, then max_tokens."""
        self.token_ids.append(token_id)
        if now is not None:
            self.token_times.append(now)
        if self.logprobs is not None and logprobs is not None:
            self.logprobs.append(logprobs)
            self.cumulative_logprob += logprobs[token_id].logprob
        p = self.params
        if not p.ignore_eos and token_id in self.eos_token_ids:
            self._stop(None)
        elif token_id in p.stop_token_ids:
            self._stop(token_id)
        if self.detokenizer is not None:
            self._extend_text()
        if not self.finished and self.num_output_tokens >= p.max_tokens:
            self.status = SequenceStatus.FINISHED_LENGTH_CAPPED

    def _stop(self, reason: int | str | None) -> None:
        self.status, self.stop_reason = SequenceStatus.FINISHED_STOPPED, reason

    def _extend_text(self) -> None:
        p = self.params
        last = self.finished or self.num_output_tokens >= p.max_tokens
        # Special tokens (EOS) decode to nothing, so the text never shows them.
        new = self.detokenizer.add() + (self.detokenizer.flush() if last else "")
        if p.stop and new and not self.finished:
            # A stop string may be split across tokens, so search the text, not the
            # token; only the tail can hold a new match (it ends in the new text).
            start = max(0, len(self.output_text) - max(map(len, p.stop)) + 1)
            tail = self.output_text[start:] + new
            hits = [(i, s) for s in p.stop if (i := tail.find(s)) != -1]
            if hits:
                cut, s = min(hits)
                self.detokenizer.text = (self.output_text + new)[: start + cut]  # the stop string is not returned
                self._stop(s)
                return
        self.detokenizer.text += new

    def stable_text(self) -> str:
        """Text safe to show while streaming: without any tail that could still
        grow into a stop string, which must never reach the reader. (Incomplete
        UTF-8 characters never reach output_text: the detokenizer holds them.)"""
        text = self.output_text
        if self.finished:
            return text
        for s in self.params.stop:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    text = text[:-n]
                    break
        return text

    # --- reporting --------------------------------------------------------------------

    def completion(self, streaming: bool = False) -> CompletionOutput:
        return CompletionOutput(
            index=self.index,
            text=self.stable_text() if streaming else self.output_text,
            token_ids=TokenIds(self.token_ids, self.num_prompt_tokens),  # a view: no copy per step
            cumulative_logprob=self.cumulative_logprob if self.logprobs is not None else None,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )
