"""What generate() returns. Names and fields follow vLLM's `vllm.outputs`."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass
class Logprob:
    logprob: float
    rank: int  # 1 = the most likely token at that position
    decoded_token: str | None = None


# One dict per position: token id -> Logprob (the chosen token plus the top N).
PositionLogprobs = dict[int, Logprob]


class TokenIds(Sequence):
    """A read-only view of token_ids[start:stop] of a sequence's one token list.

    Every step reports every running request; copying its ids each time would
    cost O(reply) per step. The list only ever grows at its end, so a view with
    a fixed stop never changes. It compares equal to a list with the same ids,
    slices to a list, and pickles as a list."""

    __slots__ = ("_ids", "_start", "_stop")

    def __init__(self, ids: list[int], start: int = 0, stop: int | None = None):
        self._ids, self._start, self._stop = ids, start, len(ids) if stop is None else stop

    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._ids[self._start : self._stop][i]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("token index out of range")
        return self._ids[self._start + (i % n)]

    def __iter__(self):
        return iter(self._ids[self._start : self._stop])

    def __eq__(self, other) -> bool:
        return isinstance(other, (list, tuple, TokenIds)) and list(self) == list(other)

    def __add__(self, other) -> list[int]:  # concatenates like the list it stands for
        return list(self) + list(other)

    def __radd__(self, other) -> list[int]:
        return list(other) + list(self)

    def __repr__(self) -> str:
        return repr(list(self))

    def __reduce__(self):
        return list, (list(self),)


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int] | TokenIds
    cumulative_logprob: float | None
    logprobs: list[PositionLogprobs] | None
    finish_reason: str | None = None  # "stop" (EOS or stop string) or "length"
    stop_reason: int | str | None = None  # the stop string or stop token id, if any

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | TokenIds
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: dict = field(default_factory=dict)


# --- what a model runner hands the sampler (model_runner.py, static_batching.py) -------


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
