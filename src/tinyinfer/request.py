"""A request: one prompt, what was asked of it, and its samples (vLLM's Request).

    request = Request("0", "The capital of France is", ids, SamplingParams(n=2))
    request.samples  # [Sequence]: one sample now; the other n-1 fork later

The Request holds what its samples share: the id, the prompt, the
SamplingParams, when it arrived and the prompt's logprobs. Each sample is a
Sequence (sequence.py) with its own tokens, text and place in the KV cache.
With n > 1 the prompt is prefilled once, by the first sample; when its last
prompt token is scheduled, the scheduler asks the request to fork() the other
n-1, which share the prompt's KV blocks (copy-on-write, block_manager.py).

The engine keeps one Request per id; the scheduler and block manager see only
sequences, and reach a sequence's request through `seq.request`.
"""
from __future__ import annotations

from .metrics import token_latencies
from .outputs import PositionLogprobs, RequestOutput, TokenIds
from .sampling import SamplingParams
from .sequence import Sequence


class Request:
    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
                 eos_token_ids=(), decode=None, arrival_time: float = 0.0):
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.eos_token_ids = frozenset(eos_token_ids)  # the tokens that end a sample (unless params.ignore_eos)
        self.arrival_time = arrival_time  # time.perf_counter() when the request was accepted
        self.prompt_logprobs: list[PositionLogprobs | None] | None = None  # set once every position has its entry
        self._pending_prompt_logprobs: list[PositionLogprobs | None] = []  # filled chunk by chunk
        self.samples = [Sequence(self, 0, prompt_token_ids, decode)]  # the n samples, in order

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.samples)

    # --- parallel sampling ----------------------------------------------------------------

    @property
    def num_unforked(self) -> int:
        """Samples still to be forked from the first (n - 1 until the prompt is in the cache)."""
        return self.params.n - len(self.samples)

    def fork(self) -> list[Sequence]:
        """Make the samples not made yet, from the first: the same prompt and, in
        the cache, the same blocks; each draws from its own stream (seed + index,
        as in vLLM). Returns them ([] once all n exist)."""
        first = self.samples[0]
        children = [first.fork(index) for index in range(len(self.samples), self.params.n)]
        self.samples += children
        return children

    # --- prompt logprobs --------------------------------------------------------------------

    def wants_prompt_logprobs(self, seq: Sequence) -> bool:
        """Should this step compute logprobs for seq's prompt positions? Only the
        first sample's, and only until they are complete (a recompute after a
        preemption needs them no more)."""
        return self.params.prompt_logprobs is not None and self.prompt_logprobs is None and seq is self.samples[0]

    def add_prompt_logprobs(self, start: int, entries: list[PositionLogprobs]) -> None:
        """Prompt logprobs for positions start+1.. (a chunk at a time; the first
        prompt token has none). A recompute after preemption starts over at 0."""
        if start == 0:
            self._pending_prompt_logprobs = [None]
        self._pending_prompt_logprobs += entries
        if len(self._pending_prompt_logprobs) == self.samples[0].num_prompt_tokens:
            self.prompt_logprobs = self._pending_prompt_logprobs

    # --- reporting ----------------------------------------------------------------------------

    def to_output(self, streaming: bool = False) -> RequestOutput:
        """The request's state as vLLM reports it: one CompletionOutput per sample.
        With streaming=True, an unfinished request's text is stable_text(): safe
        to show, never to be taken back."""
        first, finished = self.samples[0], self.finished
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=TokenIds(first.token_ids, 0, first.num_prompt_tokens),
            prompt_logprobs=self.prompt_logprobs,
            outputs=[s.completion(streaming) for s in self.samples],
            finished=finished,
            # The full list of gaps costs O(reply), so a streamed step reports it only at the end.
            metrics=self.metrics(with_itl=finished or not streaming),
        )

    def metrics(self, with_itl: bool = True) -> dict:
        """Latency as a user sees it, timed by the first sample's tokens (the
        definitions are metrics.token_latencies'): ttft, tpot, e2e and itl."""
        times = self.samples[0].token_times
        m = {"arrival_time": self.arrival_time}
        if times:
            m["first_token_time"] = times[0]
            m.update(token_latencies(self.arrival_time, times, with_itl=with_itl))
        return m
