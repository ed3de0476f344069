"""Per-request state: the tokens so far, the text so far, and when to stop."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .outputs import CompletionOutput, PositionLogprobs, RequestOutput
from .sampling import SamplingParams


class SequenceStatus:
    WAITING = "waiting"  # queued, holds no KV blocks
    RUNNING = "running"  # scheduled each step, holds KV blocks
    FINISHED = "finished"


@dataclass
class Sequence:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: list[int]
    generator: torch.Generator | None = None
    output_token_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[PositionLogprobs] | None = None
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    cumulative_logprob: float = 0.0
    arrival_time: float = 0.0  # time.perf_counter() when the request was accepted
    token_times: list[float] = field(default_factory=list)  # when each output token was sampled
    status: str = SequenceStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # of those, found in the prefix cache instead of computed
    num_swapped_tokens: int = 0  # tokens whose K/V wait in host memory (swap preemption)
    pending_prompt_logprobs: list = field(default_factory=list)  # filled chunk by chunk

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append_token(self, token_id: int, decode) -> None:
        """Record a sampled token, update the text, and apply the stopping rules:
        end-of-sequence token, stop token ids, stop strings, then max_tokens."""
        self.output_token_ids.append(token_id)
        p = self.params
        if not p.ignore_eos and token_id in self.eos_token_ids:
            self.finish_reason, self.stop_reason = "stop", None
        elif token_id in p.stop_token_ids:
            self.finish_reason, self.stop_reason = "stop", token_id
        # Special tokens (EOS) decode to nothing, so the text never shows them.
        text = decode(self.output_token_ids)
        if p.stop and not self.finished:
            # A stop string may be split across tokens, so search the text, not
            # the token; only the tail can contain a new match. (Trailing U+FFFD
            # may have just become one real character, so measure without them.)
            start = max(0, len(self.output_text.rstrip("\ufffd")) - max(map(len, p.stop)))
            hits = [(i, s) for s in p.stop if (i := text.find(s, start)) != -1]
            if hits:
                cut, s = min(hits)
                text = text[:cut]  # the stop string itself is not returned
                self.finish_reason, self.stop_reason = "stop", s
        self.output_text = text
        if not self.finished and len(self.output_token_ids) >= p.max_tokens:
            self.finish_reason = "length"

    def stable_text(self) -> str:
        """Text safe to show while streaming: hold back an incomplete UTF-8
        character (decoded as U+FFFD) and any tail that could still grow into
        a stop string, which must never reach the reader."""
        text = self.output_text
        if self.finished:
            return text
        if text.endswith("\ufffd"):
            text = text.rstrip("\ufffd")
        for s in self.params.stop:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    text = text[:-n]
                    break
        return text

    def to_output(self, streaming: bool = False) -> RequestOutput:
        """The request's state as vLLM reports it. With streaming=True, an unfinished
        request's text is stable_text(): safe to show, never to be taken back."""
        completion = CompletionOutput(
            index=0,
            text=self.stable_text() if streaming else self.output_text,
            token_ids=list(self.output_token_ids),
            cumulative_logprob=self.cumulative_logprob if self.logprobs is not None else None,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=list(self.prompt_token_ids),
            prompt_logprobs=self.prompt_logprobs,
            outputs=[completion],
            finished=self.finished,
            metrics=self.metrics(),
        )

    def metrics(self) -> dict:
        """Latency as a user sees it: time to first token (queueing and prefill),
        time per output token after the first (decode), and each gap between tokens."""
        t = self.token_times
        if not t:
            return {"arrival_time": self.arrival_time}
        itl = [b - a for a, b in zip(t, t[1:])]
        return {
            "arrival_time": self.arrival_time,
            "first_token_time": t[0],
            "ttft": t[0] - self.arrival_time,
            "tpot": (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None,
            "itl": itl,
            "e2e": t[-1] - self.arrival_time,
        }
