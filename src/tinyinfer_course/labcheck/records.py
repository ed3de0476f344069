"""Lab 7's data model: a request record and a step result, simpler than the
engine's Sequence and SchedulerOutput but with the same meaning. Lab 7's
scheduler and loop work on them, and so does lab 11's engine."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Request:
    """One request as lab 7's scheduler and loop see it."""

    seq_id: str
    prompt_ids: list[int]
    max_tokens: int  # stop after this many output tokens
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose keys and values are in the KV cache
    token_times: list[float] = field(default_factory=list)  # time.perf_counter() of each output token
    temperature: float = 0.0  # 0: greedy
    seed: int | None = None  # a seeded request draws from its own stream, whatever else runs
    generator: torch.Generator | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        # The engine's rule (sampling.make_generator): one generator per seeded
        # request, seeded once, so its draws equal LLM.generate's with that seed.
        if self.seed is not None:
            self.generator = torch.Generator().manual_seed(self.seed)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass
class Step:
    """What one scheduler step decided."""

    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, new tokens this step)
    preempted: list[Request] = field(default_factory=list)
