"""LLMEngine: requests in, tokens out, one step at a time (vLLM's LLMEngine).

    engine = LLMEngine("smollm2-135m-instruct")
    engine.add_request("The capital of France is", SamplingParams(max_tokens=8))
    while engine.has_unfinished_requests():
        for out in engine.step():
            print(out.request_id, out.outputs[0].text)

Requests may arrive at any time. Each step() is four calls: the scheduler
decides what runs, the model runner runs it, the sampler draws a token for
every sequence that needs one, and the scheduler appends those tokens, applies
the stopping rules and frees what finished. LLM.generate, LLM.stream and the
HTTP server are all loops around step(); run_until_done(engine) is the
plainest one. Every setting lives in EngineConfig (config.py); the scheduler
and runner, continuous or static (chapter 7's baseline), come from step_parts.py.
The engine keeps one Request (request.py) per unfinished id; the scheduler
runs its samples, one Sequence each.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

from .checks import check_context_window
from .config import (EngineConfig, context_window, engine_config, kv_cache_bytes_per_value, resolve_device,
                     resolve_dtype)
from .outputs import RequestOutput
from .paged_kv_cache import keep_cudnn_attention_out
from .prepare import one_row_route, prepare_model
from .request import Request
from .sampler import Sampler
from .sampling import SamplingParams
from .scheduler import SchedulerOutput, SchedulerStats
from .step_parts import make_scheduler_and_runner
from .structured_output import StructuredOutputManager
from .tokenizer import Tokenizer
from .weights import load_model, read_config, resolve_model

if TYPE_CHECKING:
    from .sequence import Sequence


class LLMEngine:
    def __init__(self, model: str | None = None, config: EngineConfig | None = None, **engine_args):
        """LLMEngine(model, **settings), settings as in EngineConfig, or LLMEngine(config=EngineConfig(...))."""
        self.config = cfg = engine_config(model, config, engine_args)  # checks the cheap settings before loading
        self.device = resolve_device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        if self.device.type == "cuda":  # process-wide settings for a GPU engine, as vLLM's workers make them
            torch.cuda.set_device(self.device)  # CUDA graphs record on, and events fire on, the current device
            keep_cudnn_attention_out()
        folder = resolve_model(cfg.model)
        self.model_name, self.model_config = cfg.model, read_config(folder)
        self.max_model_len = context_window(cfg, self.model_config)
        if cfg.seed is not None:
            torch.manual_seed(cfg.seed)
        self.tokenizer = Tokenizer(folder)
        self.eos_token_ids = self.tokenizer.eos_token_ids(self.model_config)
        model_ = prepare_model(load_model(folder, self.dtype, self.device), self.device, cfg.quantization,
                               cfg.group_size, cfg.lm_head_quantization, cfg.one_row_kernel)  # once
        # What the pool spends per token, int8's scales included: it sizes the pool (kv_pool_blocks).
        self.kv_bytes_per_token = round(self.model_config.kv_bytes_per_token(kv_cache_bytes_per_value(
            cfg.kv_cache_dtype, self.dtype.itemsize, self.model_config.head_dim)))
        pad_token_id = min(self.eos_token_ids, default=0)  # static batching's padding: never attended to
        self.scheduler, self.model_runner = make_scheduler_and_runner(cfg, model_, self.device, self.dtype,
                                                                      self.kv_bytes_per_token, self.max_model_len,
                                                                      pad_token_id)
        self.structured_output = StructuredOutputManager(folder / "tokenizer.json", self.eos_token_ids,
                                                         self.model_config.vocab_size)
        self.sampler = Sampler(self.tokenizer.decode, self.structured_output)
        self.requests: dict[str, Request] = {}  # unfinished requests, by id
        self._ids = itertools.count()
        self.stats = SchedulerStats(block_size=cfg.block_size, one_row_kernel=one_row_route(model_),
                                    kv_bytes_per_block=self.kv_bytes_per_token * cfg.block_size)
        self.scheduler.record_stats(self.stats)  # the pool's size, all of it free

    model = property(lambda self: self.model_runner.model)
    block_manager = property(lambda self: self.scheduler.block_manager)  # None with scheduling="static"
    runner = property(lambda self: self.model_runner)  # the name the labs use
    scheduling = property(lambda self: self.config.scheduling)
    max_num_seqs = property(lambda self: self.config.max_num_seqs)

    # --- requests -----------------------------------------------------------------

    def add_request(self, prompt: str | dict, params: SamplingParams | None = None, request_id: str | None = None,
                    arrival_time: float | None = None) -> str:
        """Validate and queue one request; return its id. Raises ValueError, naming
        the field, before anything changes."""
        return self.queue_request(self.make_request(prompt, params, request_id, arrival_time))

    def queue_request(self, request: Request) -> str:
        """Queue a request already built (and checked) by make_request."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id={request.request_id!r} is already in use by an unfinished request")
        self.requests[request.request_id] = request
        self.scheduler.add(request)
        return request.request_id

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        """Stop requests (an id or a list of ids) and free their KV blocks. Unknown
        or already finished ids are ignored."""
        for rid in [request_id] if isinstance(request_id, str) else list(request_id):
            request = self.requests.get(rid)
            if request is None:
                continue
            for seq in request.samples:
                seq.abort()
                self.scheduler.finish(seq)  # its blocks; its host copy and sampler state go with it
            self._release(request)
        self.scheduler.record_stats(self.stats)

    def reset_prefix_cache(self) -> int:
        """Forget the cached prefixes of free KV blocks; returns how many blocks
        (0 with scheduling="static", which has no prefix cache)."""
        return 0 if self.block_manager is None else self.block_manager.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def make_request(self, prompt: str | dict, params: SamplingParams | None, request_id: str | None = None,
                     arrival_time: float | None = None, prompt_index: int | None = None) -> Request:
        """Check a request and build it, changing nothing in the engine.
        prompt_index: its place in LLM.generate's list, for the error messages."""
        where = "prompt" if prompt_index is None else f"prompts[{prompt_index}]"
        p = params if params is not None else SamplingParams()
        if not isinstance(p, SamplingParams):
            raise ValueError(f"sampling_params: expected SamplingParams, got {type(p).__name__}")
        p.validate()  # fields may have been changed after construction
        text, ids = self.tokenizer.encode_prompt(prompt, self.model_config.vocab_size, where)
        check_context_window(len(ids), p.max_tokens, self.max_model_len, where)
        if p.structured_outputs is not None:
            self.structured_output.check(p.structured_outputs)  # a bad schema or regex: ValueError now
        rid = str(next(self._ids)) if request_id is None else str(request_id)
        if rid in self.requests:
            raise ValueError(f"request_id={rid!r} is already in use by an unfinished request")
        request = Request(rid, text, ids, p, self.eos_token_ids, self.tokenizer.decode,
                          time.perf_counter() if arrival_time is None else arrival_time)
        self.scheduler.check_request(request, where)
        return request

    # --- the step -----------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One model step: schedule -> execute -> sample -> update. Returns a
        RequestOutput for every request that got new tokens this step (finished
        ones included, for the last time)."""
        t0 = time.perf_counter()
        scheduler_output = self.scheduler.schedule()
        outputs = []
        if not scheduler_output.is_empty:
            model_output = self.model_runner.execute_model(scheduler_output)
            sampled = self.sampler(model_output.logits, scheduler_output.sampling, model_output.prompt_logits)
            progressed = self.scheduler.update_from_output(scheduler_output, sampled)
            outputs = self._make_outputs(progressed)
        self.scheduler.record_stats(self.stats, scheduler_output)
        self._record_eager_decode(scheduler_output)
        self.stats.step_time_s = time.perf_counter() - t0
        return outputs

    def _record_eager_decode(self, scheduler_output: SchedulerOutput) -> None:
        """With enforce_eager=False, a decode-only step that ran eagerly says why in the stats."""
        reason = None if scheduler_output.is_empty else self.model_runner.eager_decode_reason
        self.stats.eager_decode_reason = reason
        self.stats.num_eager_decode_steps += reason is not None

    def _make_outputs(self, progressed: list[Sequence]) -> list[RequestOutput]:
        """One output per request (its n samples together); finished requests leave."""
        outputs = []
        for rid in dict.fromkeys(seq.request_id for seq in progressed):
            request = self.requests[rid]
            outputs.append(request.to_output(streaming=True))
            if request.finished:
                self._release(request)
        return outputs

    def _release(self, request: Request) -> None:
        """A request leaves the engine: nothing more is kept about it."""
        del self.requests[request.request_id]


def run_until_done(engine: LLMEngine, on_step: Callable[[], object] | None = None) -> dict[str, RequestOutput]:
    """Step `engine` until every request in it has finished; return each one's
    final RequestOutput by request id, in the order they finished. `on_step()`,
    if given, is called after every step (e.g. to read engine.stats)."""
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        if on_step is not None:
            on_step()
    return done
