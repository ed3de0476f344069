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
plainest one. Every setting lives in EngineConfig (config.py);
scheduling="static" swaps in static_batching.py's scheduler and runner, behind
the same four calls.

The engine keeps one Request (request.py) per unfinished id; the scheduler
runs its samples, one Sequence each.
"""
from __future__ import annotations

import itertools
import time

import torch

from .block_manager import BlockManager
from .checks import check_context_window, check_prompt_ids
from .config import EngineConfig, resolve_device, resolve_dtype
from .model_runner import ModelRunner
from .outputs import RequestOutput
from .prepare import prepare_model
from .request import Request
from .sampling import Sampler, SamplingParams
from .scheduler import Scheduler, SchedulerConfig, SchedulerStats
from .tokenizer import Tokenizer
from .weights import load_model, read_config, resolve_model

# Default KV pool size: plenty for the course's workloads, small enough for a laptop.
DEFAULT_KV_CACHE_BYTES = {"cpu": 512 * 2**20, "cuda": 8 * 2**30}


class LLMEngine:
    def __init__(self, model: str | None = None, config: EngineConfig | None = None, **engine_args):
        """LLMEngine(model, **settings), settings as in EngineConfig, or LLMEngine(config=EngineConfig(...))."""
        if config is not None and engine_args:
            raise ValueError(f"config: pass the settings either in config or as keyword arguments, not both "
                             f"(got config and {', '.join(sorted(engine_args))})")
        if config is not None and model is not None and model != config.model:
            raise ValueError(f"model={model!r} disagrees with config.model={config.model!r}; give it once")
        if model is not None:
            engine_args["model"] = model
        self.config = cfg = config or EngineConfig(**engine_args)  # checks the cheap settings before loading
        self.device = resolve_device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        folder = resolve_model(cfg.model)
        self.model_name, self.model_config = cfg.model, read_config(folder)
        window = self.model_config.max_position_embeddings
        if cfg.max_model_len is not None and cfg.max_model_len > window:
            raise ValueError(f"max_model_len={cfg.max_model_len!r} is invalid: must be in [1, {window}]")
        self.max_model_len = cfg.max_model_len or window
        if cfg.seed is not None:
            torch.manual_seed(cfg.seed)
        self.tokenizer = Tokenizer(folder)
        eos = set(self.model_config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = sorted(eos)
        model_ = prepare_model(load_model(folder, self.dtype, self.device), self.device, cfg.quantization,
                               cfg.group_size, cfg.lm_head_quantization)  # quantize, then kernel layouts: once
        self.kv_bytes_per_token = int(self.model_config.kv_bytes_per_token(torch.finfo(self.dtype).bits // 8))
        num_blocks = cfg.num_kv_blocks or max(1, (cfg.kv_cache_memory_bytes or DEFAULT_KV_CACHE_BYTES[
            self.device.type]) // (self.kv_bytes_per_token * cfg.block_size))
        sched_config = SchedulerConfig(cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.enable_chunked_prefill,
                                       cfg.preemption_mode)
        self.block_manager = BlockManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching)
        if cfg.scheduling == "static":  # chapter 7's baseline: the same interface, a contiguous cache
            from .static_batching import StaticModelRunner, StaticScheduler

            self.scheduler = StaticScheduler(sched_config, self.kv_bytes_per_token)
            self.model_runner = StaticModelRunner(model_, self.device, self.dtype, pad_token_id=min(eos, default=0))
        else:
            self.scheduler = Scheduler(sched_config, self.block_manager, self.kv_bytes_per_token)
            self.model_runner = ModelRunner(model_, self.device, self.dtype, num_blocks, cfg.block_size,
                                            cfg.enforce_eager, cfg.max_num_seqs)
            self.model_runner.compile_or_warm_up_model()  # enforce_eager=False: compile now, not mid-request
        self.sampler = Sampler(self.tokenizer.decode)
        self.requests: dict[str, Request] = {}  # unfinished requests, by id
        self._ids = itertools.count()
        self.stats = SchedulerStats(kv_blocks_total=num_blocks, kv_blocks_free=num_blocks, block_size=cfg.block_size,
                                    kv_bytes_per_block=self.kv_bytes_per_token * cfg.block_size)

    model = property(lambda self: self.model_runner.model)
    runner = property(lambda self: self.model_runner)  # the name the labs use
    scheduling = property(lambda self: self.config.scheduling)
    max_num_seqs = property(lambda self: self.config.max_num_seqs)

    # --- requests -----------------------------------------------------------------

    def add_request(self, prompt, params: SamplingParams | None = None, request_id: str | None = None,
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

    def abort_request(self, request_id) -> None:
        """Stop requests (an id or a list of ids) and free their KV blocks. Unknown
        or already finished ids are ignored."""
        for rid in [request_id] if isinstance(request_id, str) else list(request_id):
            request = self.requests.get(rid)
            if request is None:
                continue
            for seq in request.samples:
                seq.abort()
                self.scheduler.finish(seq)
                self.model_runner.drop_swapped(seq.seq_id)  # a swapped-out sequence's host copy
            self._release(request)
        self.scheduler.record_stats(self.stats)

    def reset_prefix_cache(self) -> int:
        """Forget the cached prefixes of free KV blocks; returns how many blocks."""
        return self.block_manager.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def make_request(self, prompt, params, request_id=None, arrival_time=None,
                     prompt_index: int | None = None) -> Request:
        """Check a request and build it, changing nothing in the engine.
        prompt_index: its place in LLM.generate's list, for the error messages."""
        where = "prompt" if prompt_index is None else f"prompts[{prompt_index}]"
        p = params if params is not None else SamplingParams()
        if not isinstance(p, SamplingParams):
            raise ValueError(f"sampling_params: expected SamplingParams, got {type(p).__name__}")
        p.validate()  # fields may have been changed after construction
        text, ids = self._tokenize(prompt, where)
        check_context_window(len(ids), p.max_tokens, self.max_model_len, where)
        rid = str(next(self._ids)) if request_id is None else str(request_id)
        if rid in self.requests:
            raise ValueError(f"request_id={rid!r} is already in use by an unfinished request")
        request = Request(rid, text, ids, p, self.eos_token_ids, self.tokenizer.decode,
                          time.perf_counter() if arrival_time is None else arrival_time)
        self.scheduler.check_request(request, where)
        return request

    def _tokenize(self, prompt, where: str) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            text, ids = prompt, self.tokenizer.encode(prompt)
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, ids = prompt.get("prompt"), list(prompt["prompt_token_ids"])
            where += ".prompt_token_ids"
        else:
            raise ValueError(f"{where}: expected a string or {{'prompt_token_ids': [...]}}, got {type(prompt).__name__}")
        check_prompt_ids(ids, self.model_config.vocab_size, where)
        return text, ids

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

    def _record_eager_decode(self, scheduler_output) -> None:
        """With enforce_eager=False, a decode-only step that ran eagerly says why in the stats."""
        reason = None if scheduler_output.is_empty else self.model_runner.eager_decode_reason
        self.stats.eager_decode_reason = reason
        self.stats.num_eager_decode_steps += reason is not None

    def _make_outputs(self, progressed) -> list[RequestOutput]:
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
        self.sampler.free(request.samples)


def run_until_done(engine: LLMEngine, on_step=None) -> dict[str, RequestOutput]:
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
