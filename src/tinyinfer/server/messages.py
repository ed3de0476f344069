"""What the API server and the engine core say to each other, one dataclass per message.

    API server process                              engine core process
    AddRequest | Abort | Shutdown  ---commands--->
                                   <---reports---   Ready | Fatal (once) ... StepReport (every step)

Everything here is pickled across a pipe, so its size is the price of every
step. A StepReport therefore carries only what is NEW since the last one: for
each sample that advanced, its new token ids, their logprobs and the text they
added (a RequestDelta), never the prompt or the reply so far. The core works the
deltas out (it keeps, per sample, how much it has already sent); the API server
only forwards them, so a step costs the pipe the same for a 10-token prompt as
for a 2,000-token one. vLLM's engine core does the same (its EngineCoreOutput
carries `new_token_ids`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..outputs import PositionLogprobs
from ..sampling import SamplingParams

# --- commands: API server -> engine core ---------------------------------------------


@dataclass
class ChatPrompt:
    """A conversation, turned into token ids by the chat template of the engine's
    own tokenizer, in the core: the one process that tokenizes."""

    messages: list[dict[str, str]]


@dataclass
class AddRequest:
    request_id: str
    prompt: str | dict | ChatPrompt  # text, {"prompt_token_ids": [...]}, or a chat
    params: SamplingParams
    # OpenAI's chat default when the client sets no max_tokens: as many tokens as
    # the context window and the KV cache leave after the prompt.
    max_tokens_from_room: bool = False


@dataclass
class Abort:
    request_id: str


@dataclass
class Shutdown:
    pass


Command = AddRequest | Abort | Shutdown

# --- reports: engine core -> API server ------------------------------------------------


@dataclass
class EngineStats:
    """The engine as it is after a step (or an abort). Requests are counted as
    requests: one with n parallel samples is one request, running while any of
    its samples is in the batch."""

    num_requests_running: int = 0
    num_requests_waiting: int = 0  # accepted by the engine, not in the batch
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    prefix_cache_hit_tokens: int = 0  # cumulative: prompt tokens read from the prefix cache
    num_preemptions: int = 0  # cumulative


@dataclass
class Ready:
    """Sent once, when the engine is loaded."""

    model_name: str
    max_model_len: int
    stats: EngineStats


@dataclass
class Fatal:
    """Sent instead of Ready when the engine cannot start, or last when the core's loop dies."""

    reason: str


@dataclass
class Refused:
    """An AddRequest the engine did not take. `invalid`: the request was at fault
    (a ValueError naming the field, answered 400); else the engine failed (500)."""

    request_id: str
    message: str
    invalid: bool


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int  # over all of the request's samples


@dataclass
class RequestMetrics:
    """One finished request's latency, on the core's clock, from the moment it
    reached the engine: what /metrics' histograms are made of."""

    ttft_s: float | None  # time to first token (None: it produced none)
    tpot_s: float | None  # mean time per output token after the first, of its longest sample (None: < 2 tokens)
    e2e_s: float  # until its last sample finished


@dataclass
class RequestDelta:
    """What one sample of one request gained in one step."""

    request_id: str
    index: int  # which of the request's n samples
    new_token_ids: list[int]
    new_logprobs: list[PositionLogprobs] | None  # one per new token, when the request asked for logprobs
    text_delta: str
    text_offset: int  # where text_delta starts in the sample's text (the completions logprobs' text_offset)
    finish_reason: str | None = None  # set on the sample's last delta: "stop" or "length"
    # Set on the request's very last delta (its last sample finished):
    usage: Usage | None = None
    metrics: RequestMetrics | None = None


@dataclass
class StepStats:
    """One engine step, as the core timed it."""

    num_prompt_tokens: int  # prompt lengths of the requests that got their first token in it
    num_generation_tokens: int  # tokens it added, over every sample
    inter_token_s: list[float]  # for each request it brought tokens, the time since the request's last ones
    prefill_tokens: int  # prompt tokens it computed (0 when the engine does not say)
    decode_seqs: int  # sequences it decoded (0 when the engine does not say)
    step_s: float  # inside engine.step()
    turn_s: float | None  # the whole turn of the core's loop, when the loop was already busy before it


@dataclass
class StepReport:
    """One turn of the core's loop: what it accepted or refused, every live
    request's progress, and the engine's numbers after it."""

    accepted: list[str] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)
    deltas: list[RequestDelta] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # requests dropped because the step raised
    error: str | None = None  # why the step raised
    step: StepStats | None = None  # None: no step ran this turn
    stats: EngineStats = field(default_factory=EngineStats)


Report = Ready | Fatal | StepReport
