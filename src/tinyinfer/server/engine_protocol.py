"""What `tinyinfer serve` needs from an engine, so it can serve yours.

The server drives an engine only through the calls below (LLMEngine has them
all). To serve an engine you assembled, write a function that builds it and
returns it, then point the server at that function:

    tinyinfer serve --engine my_engine:build        # a module on sys.path (the current folder included)
    tinyinfer serve --engine path/to/engine.py:build

`build()` is called with no arguments, once, in the process that runs the
engine (the engine core's own process by default; the server's with
--no-engine-process), so it may load weights, start threads or use a GPU.
The engine's settings are then its own: the --model, --dtype, ... flags are
for LLMEngine and are not passed to your factory. Everything else stays the
server's: the OpenAI routes, streaming, aborts on disconnect, 429s, /metrics.

Required (see ServableEngine):
- add_request(prompt, params, request_id): prompt is a string or
  {"prompt_token_ids": [...]}; raise ValueError, naming the field, for a
  request you refuse (the client gets 400 with your message);
- step() -> list[RequestOutput]: one step for every unfinished request; a
  RequestOutput (tinyinfer.outputs) for each request that advanced, holding
  everything so far, as LLMEngine.step returns them (the server works out what
  is new). A sample's text must only grow;
- abort_request(request_id), has_unfinished_requests();
- tokenizer (with apply_chat_template(messages) -> token ids, for chats),
  model_name (what clients send as "model"), max_model_len.

Optional (see ReportsStats): `stats` (a scheduler.SchedulerStats) and
`requests` (request id -> request, whose .samples have a .status), as
LLMEngine keeps them. With them /metrics shows the KV cache, the prefix cache,
preemptions and which requests the scheduler runs; without them those gauges
read 0 and a request counts as running from its first token.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Protocol, runtime_checkable

from ..outputs import RequestOutput
from ..sampling import SamplingParams
from ..scheduler import SchedulerStats
from ..sequence import SequenceStatus
from .messages import EngineStats


class ChatTokenizer(Protocol):
    def apply_chat_template(self, messages: list[dict]) -> list[int]: ...


class ServableEngine(Protocol):
    tokenizer: ChatTokenizer
    model_name: str
    max_model_len: int

    def add_request(self, prompt: str | dict, params: SamplingParams, request_id: str) -> str: ...

    def step(self) -> list[RequestOutput]: ...

    def abort_request(self, request_id: str) -> None: ...

    def has_unfinished_requests(self) -> bool: ...


@runtime_checkable
class ReportsStats(Protocol):
    stats: SchedulerStats
    requests: dict


def engine_stats(engine: ServableEngine, num_live: int, num_started: int) -> EngineStats:
    """The engine's numbers, with requests counted as requests: the one place the
    server counts them. `num_live`: requests the core has given the engine and
    not seen finish; `num_started`: those of them that have produced a token
    (the whole story for an engine without stats)."""
    if not isinstance(engine, ReportsStats):
        return EngineStats(num_requests_running=num_started, num_requests_waiting=num_live - num_started)
    # A request is running while any of its n samples is in the batch.
    running = sum(any(s.status == SequenceStatus.RUNNING for s in request.samples)
                  for request in engine.requests.values())
    st = engine.stats
    return EngineStats(num_requests_running=running, num_requests_waiting=len(engine.requests) - running,
                       kv_blocks_used=st.kv_blocks_used, kv_blocks_total=st.kv_blocks_total,
                       prefix_cache_hit_tokens=st.prefix_cache_hit_tokens, num_preemptions=st.num_preemptions)


def step_work(engine: ServableEngine) -> tuple[int, int]:
    """(prompt tokens computed, sequences decoded) in the engine's last step; (0, 0) when it does not say."""
    if isinstance(engine, ReportsStats):
        return engine.stats.num_prefill_tokens, engine.stats.num_decode_tokens
    return 0, 0


def kv_capacity_tokens(engine: ServableEngine) -> int:
    """Tokens the engine can hold at once: its context window, and its KV pool when it says."""
    if isinstance(engine, ReportsStats) and engine.stats.kv_blocks_total:
        return min(engine.max_model_len, engine.stats.kv_blocks_total * engine.stats.block_size)
    return engine.max_model_len


def check_engine_spec(spec: str) -> tuple[str, str]:
    """('module' or 'path/to/file.py', 'function') from --engine's value, or a ValueError saying what is wrong."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ValueError(f"--engine={spec!r} is invalid: must be 'module:function' or 'path/to/file.py:function'")
    if where.endswith(".py") and not Path(where).expanduser().is_file():
        raise ValueError(f"--engine={spec!r} is invalid: there is no file {where}")
    return where, name


def build_engine(spec: str) -> ServableEngine:
    """Import the factory --engine names and call it: the engine to serve."""
    where, name = check_engine_spec(spec)
    if where.endswith(".py"):
        path = Path(where).expanduser().resolve()
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        if "" not in sys.path:  # as `python -m` does: a module in the current folder is found
            sys.path.insert(0, "")
        module = importlib.import_module(where)
    factory = vars(module).get(name)
    if not callable(factory):
        raise ValueError(f"--engine={spec!r} is invalid: {where} has no function {name!r}")
    return factory()
