"""Per-request state: the tokens so far, the text so far, and when to stop.

A Sequence keeps ONE token list: the prompt, then every sampled token
(nano-vllm and vLLM do the same). Appending is O(1), and whoever needs a part
of it slices just that part, so no step pays for the whole reply again.
"""
from __future__ import annotations

import torch

from .detokenizer import IncrementalDetokenizer
from .outputs import CompletionOutput, PositionLogprobs, RequestOutput, TokenIds
from .sampling import SamplingParams


class SequenceStatus:
    WAITING = "waiting"  # queued, holds no KV blocks
    RUNNING = "running"  # scheduled each step, holds KV blocks
    FINISHED = "finished"


class Sequence:
    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
                 eos_token_ids=(), generator: torch.Generator | None = None, decode=None,
                 arrival_time: float = 0.0, index: int = 0):
        self.request_id = request_id
        self.index = index  # which of the request's n parallel samples this is
        # The block manager's key: one per sequence, also for a request's parallel samples.
        self.seq_id = request_id if index == 0 else f"{request_id}#{index}"
        self.prompt = prompt
        self.token_ids = list(prompt_token_ids)  # the prompt, then the output: the only token list
        self.num_prompt_tokens = len(self.token_ids)
        self.params = params
        self.eos_token_ids = set(eos_token_ids)
        self.generator = generator
        # Without a tokenizer (a bare model), the stopping rules use token ids only.
        self.detokenizer = IncrementalDetokenizer(decode, self.token_ids, self.num_prompt_tokens) if decode else None
        self.output_text = ""
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.logprobs: list[PositionLogprobs] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.prompt_logprobs: list[PositionLogprobs | None] | None = None
        self.pending_prompt_logprobs: list = []  # filled chunk by chunk
        self.arrival_time = arrival_time  # time.perf_counter() when the request was accepted
        self.token_times: list[float] = []  # when each output token was sampled
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_swapped_tokens = 0  # tokens whose K/V wait in host memory (swap preemption)
        self.seen: torch.Tensor | None = None  # [V] mask for the repetition penalty (sampling.seen_mask)
        self.num_seen = 0  # tokens already marked in it
        self.samples = [self]  # the request's n parallel samples (this one first), shared by all of them

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
        return self.finish_reason is not None

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.params.prompt_logprobs is not None and self.prompt_logprobs is None and self.index == 0

    def fork(self) -> list[Sequence]:
        """Make the request's other n-1 samples, once its prompt is (about to be)
        in the cache: the same prompt and, in the cache, the same blocks, shared
        until one of them writes; each with its own draws (seed + index, as in vLLM)."""
        decode = self.detokenizer.decode if self.detokenizer else None
        for index in range(1, self.params.n):
            generator = None
            if self.generator is not None:
                generator = torch.Generator(device=self.generator.device).manual_seed(self.params.seed + index)
            child = Sequence(self.request_id, self.prompt, self.token_ids, self.params, self.eos_token_ids,
                             generator, decode, self.arrival_time, index)
            child.num_computed_tokens, child.status, child.samples = self.num_computed_tokens, self.status, self.samples
            self.samples.append(child)
        return self.samples[1:]

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
            self.finish_reason, self.stop_reason = "stop", None
        elif token_id in p.stop_token_ids:
            self.finish_reason, self.stop_reason = "stop", token_id
        if self.detokenizer is not None:
            self._extend_text()
        if not self.finished and self.num_output_tokens >= p.max_tokens:
            self.finish_reason = "length"

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
                self.output_text = (self.output_text + new)[: start + cut]  # the stop string itself is not returned
                self.finish_reason, self.stop_reason = "stop", s
                return
        self.output_text += new

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

    def add_prompt_logprobs(self, start: int, entries: list[PositionLogprobs]) -> None:
        """Prompt logprobs for positions start+1.. (a chunk at a time; the first
        prompt token has none). A recompute after preemption starts over at 0."""
        if start == 0:
            self.pending_prompt_logprobs = [None]
        self.pending_prompt_logprobs += entries
        if len(self.pending_prompt_logprobs) == self.num_prompt_tokens:
            self.prompt_logprobs = self.pending_prompt_logprobs

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

    def to_output(self, streaming: bool = False) -> RequestOutput:
        """The request's state as vLLM reports it: one CompletionOutput per sample.
        With streaming=True, an unfinished request's text is stable_text(): safe
        to show, never to be taken back."""
        samples, head = self.samples, self.samples[0]
        finished = all(s.finished for s in samples)
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=TokenIds(head.token_ids, 0, head.num_prompt_tokens),
            prompt_logprobs=head.prompt_logprobs,
            outputs=[s.completion(streaming) for s in samples],
            finished=finished,
            # The full list of gaps costs O(reply), so a streamed step reports it only at the end.
            metrics=head.metrics(with_itl=finished or not streaming),
        )

    def metrics(self, with_itl: bool = True) -> dict:
        """Latency as a user sees it: time to first token (queueing and prefill),
        time per output token after the first (decode), and each gap between tokens."""
        t = self.token_times
        if not t:
            return {"arrival_time": self.arrival_time}
        m = {
            "arrival_time": self.arrival_time,
            "first_token_time": t[0],
            "ttft": t[0] - self.arrival_time,
            "tpot": (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None,
            "e2e": t[-1] - self.arrival_time,
        }
        if with_itl:
            m["itl"] = [b - a for a, b in zip(t, t[1:])]
        return m
