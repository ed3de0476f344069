"""LLMEngine: requests in, tokens out, one step at a time (vLLM's LLMEngine).

    engine = LLMEngine("smollm2-135m-instruct")
    engine.add_request("The capital of France is", SamplingParams(max_tokens=8))
    while engine.has_unfinished_requests():
        for out in engine.step():
            print(out.request_id, out.outputs[0].text)

Requests may arrive at any time; each step() asks the scheduler what to run,
runs the model once, samples one token for every sequence that needs one, and
reports who made progress. LLM.generate, LLM.stream and the HTTP server are all
loops around step().

enforce_eager=False (vLLM's name; vLLM compiles by default, tinyinfer does not,
because compiling takes about a minute on a laptop CPU) runs decode steps
through torch.compile: see model_runner.py.

scheduling="static" is the baseline chapter 7 compares against: a batch of up
to max_num_seqs requests starts together on a contiguous, max-length cache,
right-padded, and nobody new joins until its longest member ends.
"""
from __future__ import annotations

import itertools
import time
from collections import deque

import torch

from .block_manager import BlockManager
from .hardware import kv_bytes_per_token
from .model_runner import ModelRunner
from .outputs import Logprob, RequestOutput
from .sampling import SamplingParams, make_generator, sample
from .scheduler import Scheduler, SchedulerConfig, SchedulerStats
from .sequence import Sequence
from .tokenizer import Tokenizer
from .weights import DEFAULT_MODEL, load_model, read_config, resolve_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Default KV pool size: plenty for the course's workloads, small enough for a laptop.
DEFAULT_KV_CACHE_BYTES = {"cpu": 512 * 2**20, "cuda": 8 * 2**30}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"device={device!r} is invalid: must be 'auto', 'cpu' or 'cuda[:N]'")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for, but torch sees no CUDA device; use 'cpu' or 'auto'")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":  # fp32 on CPU (exact, widely fast), bf16 on GPU
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is invalid: must be one of 'auto', {', '.join(map(repr, DTYPES))}")
    return DTYPES[dtype]


def _check_int(name: str, value, low: int) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
        raise ValueError(f"{name}={value!r} is invalid: must be an integer >= {low}")


class LLMEngine:
    def __init__(self, model: str = DEFAULT_MODEL, dtype: str = "auto", device: str = "auto",
                 max_model_len: int | None = None, max_num_seqs: int = 16, max_num_batched_tokens: int = 512,
                 block_size: int = 16, kv_cache_memory_bytes: int | None = None, num_kv_blocks: int | None = None,
                 enable_prefix_caching: bool = True, enable_chunked_prefill: bool = True,
                 preemption_mode: str = "recompute", scheduling: str = "continuous", seed: int | None = None,
                 quantization: str | None = None, group_size: int = 128, enforce_eager: bool = True):
        # Check the cheap arguments before loading anything.
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        if quantization is not None or group_size != 128:
            from .quant import check_method  # names the field and its allowed values

            check_method(quantization or "int4", group_size)
        _check_int("max_num_seqs", max_num_seqs, 1)
        _check_int("max_num_batched_tokens", max_num_batched_tokens, 1)
        _check_int("block_size", block_size, 1)
        if kv_cache_memory_bytes is not None:
            _check_int("kv_cache_memory_bytes", kv_cache_memory_bytes, 1)
        if num_kv_blocks is not None:
            _check_int("num_kv_blocks", num_kv_blocks, 1)
        if preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode={preemption_mode!r} is invalid: must be 'recompute' or 'swap'")
        if scheduling not in ("continuous", "static"):
            raise ValueError(f"scheduling={scheduling!r} is invalid: must be 'continuous' or 'static'")
        if not isinstance(enforce_eager, bool):
            raise ValueError(f"enforce_eager={enforce_eager!r} is invalid: must be True or False")
        if not enforce_eager and scheduling == "static":  # the static baseline stays as chapter 7 measures it
            raise ValueError("enforce_eager=False is invalid with scheduling='static': compiled decode steps "
                             "run on the paged cache; use scheduling='continuous'")
        folder = resolve_model(model)
        self.model_name = model
        self.model_config = read_config(folder)
        window = self.model_config.max_position_embeddings
        if max_model_len is not None and not (isinstance(max_model_len, int) and 1 <= max_model_len <= window):
            raise ValueError(f"max_model_len={max_model_len!r} is invalid: must be in [1, {window}]")
        self.max_model_len = max_model_len or window
        self.max_num_seqs = max_num_seqs
        self.scheduling = scheduling
        if seed is not None:
            torch.manual_seed(seed)
        self.tokenizer = Tokenizer(folder)
        eos = set(self.model_config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = sorted(eos)
        model_ = load_model(folder, self.dtype, self.device)
        if quantization is not None:  # weight-only: swap each decoder Linear for its quantized twin
            from .quant import quantize_model

            quantize_model(model_, quantization, group_size)
        self.runner = ModelRunner(model_, self.device, self.dtype, pad_token_id=self.eos_token_ids[0] if eos else 0,
                                  enforce_eager=enforce_eager)
        self.kv_bytes_per_token = int(kv_bytes_per_token(self.model_config, torch.finfo(self.dtype).bits // 8))
        if num_kv_blocks is None:
            budget = kv_cache_memory_bytes or DEFAULT_KV_CACHE_BYTES[self.device.type]
            num_kv_blocks = max(1, budget // (self.kv_bytes_per_token * block_size))
        self.block_manager = BlockManager(num_kv_blocks, block_size, enable_prefix_caching)
        self.scheduler = Scheduler(SchedulerConfig(max_num_seqs, max_num_batched_tokens, enable_chunked_prefill,
                                                   preemption_mode), self.block_manager)
        self.swapped: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # request id -> K, V in host memory
        if scheduling == "continuous":
            self.runner.allocate_paged_cache(num_kv_blocks, block_size)
        self.requests: dict[str, Sequence] = {}
        self._static_waiting: deque[Sequence] = deque()
        self._static_batch: list[Sequence] = []
        self._ids = itertools.count()
        self.stats = SchedulerStats(kv_blocks_total=num_kv_blocks, kv_blocks_free=num_kv_blocks,
                                    block_size=block_size, kv_bytes_per_block=self.kv_bytes_per_token * block_size)

    @property
    def model(self):
        return self.runner.model

    # --- requests -----------------------------------------------------------------

    def add_request(self, prompt, params: SamplingParams | None = None, request_id: str | None = None,
                    arrival_time: float | None = None) -> str:
        """Validate and queue one request; return its id. Raises ValueError, naming
        the field, before anything changes."""
        seq = self.make_sequence(prompt, params, request_id, arrival_time)
        self.requests[seq.request_id] = seq
        if self.scheduling == "static":
            self._static_waiting.append(seq)
        else:
            self.scheduler.add(seq)
        return seq.request_id

    def abort_request(self, request_id) -> None:
        """Stop requests (an id or a list of ids) and free their KV blocks. Unknown
        or already finished ids are ignored."""
        for rid in [request_id] if isinstance(request_id, str) else list(request_id):
            seq = self.requests.pop(rid, None)
            if seq is None:
                continue
            seq.finish_reason = seq.finish_reason or "abort"
            if self.scheduling == "static":
                if seq in self._static_waiting:
                    self._static_waiting.remove(seq)
            else:
                self.scheduler.finish(seq)
                self.swapped.pop(rid, None)
        self._refresh_pool_stats()

    def reset_prefix_cache(self) -> int:
        """Forget the cached prefixes of free KV blocks; returns how many blocks."""
        return self.block_manager.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def make_sequence(self, prompt, params, request_id=None, arrival_time=None, index: int | None = None) -> Sequence:
        where = "prompt" if index is None else f"prompts[{index}]"
        p = params if params is not None else SamplingParams()
        if not isinstance(p, SamplingParams):
            raise ValueError(f"sampling_params: expected SamplingParams, got {type(p).__name__}")
        p.validate()  # fields may have been changed after construction
        text, ids = self._tokenize(prompt, where)
        over = len(ids) + p.max_tokens - self.max_model_len
        if over > 0:
            raise ValueError(f"{where}: {len(ids)} prompt tokens + max_tokens {p.max_tokens} exceeds the "
                             f"context window of {self.max_model_len} tokens by {over} tokens")
        need = self.block_manager.blocks_for(len(ids) + p.max_tokens)
        if self.scheduling == "continuous" and need > self.block_manager.num_blocks:
            raise ValueError(f"{where}: {len(ids)} prompt tokens + max_tokens {p.max_tokens} need {need} KV blocks, "
                             f"but the KV cache holds {self.block_manager.num_blocks}; lower max_tokens or raise "
                             f"kv_cache_memory_bytes")
        rid = str(next(self._ids)) if request_id is None else str(request_id)
        if rid in self.requests:
            raise ValueError(f"request_id={rid!r} is already in use by an unfinished request")
        return Sequence(request_id=rid, prompt=text, prompt_token_ids=ids, params=p,
                        eos_token_ids=self.eos_token_ids, generator=make_generator(p.seed, self.device),
                        logprobs=[] if p.logprobs is not None else None,
                        arrival_time=time.perf_counter() if arrival_time is None else arrival_time)

    def _tokenize(self, prompt, where: str) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            text, ids = prompt, self.tokenizer.encode(prompt)
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, ids = prompt.get("prompt"), list(prompt["prompt_token_ids"])
            vocab = self.model_config.vocab_size
            if any(not (isinstance(t, int) and 0 <= t < vocab) for t in ids):
                raise ValueError(f"{where}.prompt_token_ids: every id must be an integer in [0, {vocab - 1}]")
        else:
            raise ValueError(f"{where}: expected a string or {{'prompt_token_ids': [...]}}, got {type(prompt).__name__}")
        if not ids:
            raise ValueError(f"{where}: the prompt is empty (0 tokens); give at least one token")
        return text, ids

    # --- the step -----------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One model step. Returns a RequestOutput for every request that got a
        new token this step (finished ones included, for the last time)."""
        t0 = time.perf_counter()
        progressed = self._step_static() if self.scheduling == "static" else self._step_continuous()
        outputs = []
        for seq in progressed:
            outputs.append(seq.to_output(streaming=True))
            if seq.finished:
                self.requests.pop(seq.request_id, None)
        self._refresh_pool_stats()
        self.stats.step_time_s = time.perf_counter() - t0
        return outputs

    def _step_continuous(self) -> list[Sequence]:
        out = self.scheduler.schedule()
        self._update_stats(out)
        if out.is_empty:
            return []
        cache = self.runner.paged_cache
        for seq, table, n in out.swap_out:  # before anything overwrites those blocks
            self.swapped[seq.request_id] = cache.swap_out(table, n)
        for seq, table, n in out.swap_in:
            cache.swap_in(table, self.swapped.pop(seq.request_id))
        cache.copy_blocks(out.copies)
        want_plp = {s.request_id for s, _ in out.scheduled
                    if s.params.prompt_logprobs is not None and s.prompt_logprobs is None}
        tables = [self.block_manager.block_table(s.request_id) for s, _ in out.scheduled]
        logits, sampling, hidden = self.runner.execute(out.scheduled, tables, want_plp)
        for seq, n in out.scheduled:
            if seq.request_id in hidden:
                self._collect_prompt_logprobs(seq, hidden[seq.request_id], seq.num_computed_tokens)
        self.scheduler.update_after_step(out)
        self._sample_and_append(sampling, logits)
        for seq in sampling:
            if seq.finished:
                self.scheduler.finish(seq)
        return sampling

    def _step_static(self) -> list[Sequence]:
        batch = self._static_batch
        if not batch:  # start a new batch: everyone prefills together
            while self._static_waiting and len(batch) < self.max_num_seqs:
                batch.append(self._static_waiting.popleft())
            if not batch:
                return []
            want_plp = any(s.params.prompt_logprobs is not None for s in batch)
            logits, hidden = self.runner.prefill(batch, all_positions=want_plp)
            for b, s in enumerate(batch):
                if s.params.prompt_logprobs is not None:
                    self._collect_prompt_logprobs(s, hidden[b, : len(s.prompt_token_ids)], 0)
        else:  # finished sequences ride along until the longest one ends
            logits = self.runner.decode(batch)
        live = [b for b, s in enumerate(batch) if not s.finished]
        self._sample_and_append([batch[b] for b in live], logits[live])
        progressed = [batch[b] for b in live]
        self._update_static_stats(batch)
        if all(s.finished for s in batch):
            batch.clear()
            self.runner.release()
        return progressed

    # --- sampling and logprobs -----------------------------------------------------------

    def _sample_and_append(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        now = time.perf_counter()
        for s, row in zip(seqs, logits):
            if s.finished:  # aborted while its step ran
                continue
            seen = None
            if s.params.repetition_penalty != 1.0:
                seen = torch.tensor(sorted(set(s.token_ids)), device=row.device)
            token = sample(row, s.params, s.generator, seen)
            if s.logprobs is not None:
                lp = torch.log_softmax(row.float(), -1)
                s.logprobs.append(self._top_logprobs(lp, token, s.params.logprobs))
                s.cumulative_logprob += float(lp[token])
            s.append_token(token, self.tokenizer.decode)
            s.token_times.append(now)

    def _collect_prompt_logprobs(self, seq: Sequence, hidden: torch.Tensor, start: int) -> None:
        """hidden holds positions start..start+n-1; position t's output scores
        prompt token t+1. Chunked prefill calls this once per chunk."""
        n_prompt = len(seq.prompt_token_ids)
        if start == 0:  # a first chunk (or a recompute after preemption) starts over
            seq.pending_prompt_logprobs = [None]
        stop = min(start + hidden.shape[0], n_prompt - 1)
        if stop > start:
            lp = torch.log_softmax(self.runner.logits_for(hidden[: stop - start]), -1)
            ids, k = seq.prompt_token_ids, seq.params.prompt_logprobs
            seq.pending_prompt_logprobs += [self._top_logprobs(lp[t - start], ids[t + 1], k) for t in range(start, stop)]
        if len(seq.pending_prompt_logprobs) == n_prompt:
            seq.prompt_logprobs = seq.pending_prompt_logprobs

    def _top_logprobs(self, lp: torch.Tensor, token: int, n: int) -> dict[int, Logprob]:
        """The chosen token plus the n most likely ones, each with its rank."""
        out = {}
        if n:
            values, ids = torch.topk(lp, n)
            for rank, (v, t) in enumerate(zip(values.tolist(), ids.tolist()), start=1):
                out[t] = Logprob(v, rank, self.tokenizer.decode([t]))
        if token not in out:
            rank = int((lp > lp[token]).sum()) + 1
            out[token] = Logprob(float(lp[token]), rank, self.tokenizer.decode([token]))
        return out

    # --- stats ---------------------------------------------------------------------------

    def _update_stats(self, out) -> None:
        """This step's work. The queue and the pool are read at the end of the
        step (_refresh_pool_stats), once finished requests have left."""
        st = self.stats
        st.prefix_cache_hit_tokens = self.block_manager.prefix_cache_hit_tokens
        st.num_preemptions = self.scheduler.num_preemptions
        st.num_swapped_out, st.num_swapped_in = self.scheduler.num_swapped_out, self.scheduler.num_swapped_in
        # A decode token: one new token right after an already sampled one.
        st.num_decode_tokens = sum(1 for s, n in out.scheduled
                                   if n == 1 and s.output_token_ids and s.num_computed_tokens == s.num_tokens - 1)
        st.num_prefill_tokens = out.num_batched_tokens - st.num_decode_tokens

    def _refresh_pool_stats(self) -> None:
        """Queue and pool as they are now, after finished or aborted requests left."""
        st = self.stats
        if self.scheduling == "static":
            st.num_waiting = len(self._static_waiting)
            st.num_running = sum(not s.finished for s in self._static_batch)
            if not self._static_batch:  # the batch ended and released its cache
                st.kv_bytes_reserved = st.kv_bytes_used = 0
            return
        bm = self.block_manager
        st.num_running, st.num_waiting = len(self.scheduler.running), len(self.scheduler.waiting)
        st.kv_blocks_used, st.kv_blocks_free = bm.num_used_blocks, bm.num_free_blocks
        st.kv_bytes_reserved = bm.num_used_blocks * st.kv_bytes_per_block
        # Per sequence: a prefix shared through the prefix cache counts once for
        # each sequence here, but its blocks only once in kv_bytes_reserved.
        st.kv_bytes_used = sum(s.num_computed_tokens for s in self.scheduler.running) * self.kv_bytes_per_token

    def _update_static_stats(self, batch: list[Sequence]) -> None:
        st = self.stats
        st.num_running, st.num_waiting = len(batch), len(self._static_waiting)
        cache = self.runner.cache
        st.kv_bytes_reserved = cache.nbytes() if cache is not None else 0
        st.kv_bytes_used = sum(s.num_tokens for s in batch) * self.kv_bytes_per_token
