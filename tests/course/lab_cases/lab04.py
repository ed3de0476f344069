"""Lab 4 (prefill and decode): wrong implementations each check must reject, a
correct implementation written here (independently of labcheck and the
engine) that each must accept, and the course's own answers each must refuse.
Collected by tests/course/test_labs.py."""
import statistics
import time

import torch

from tinyinfer_course.analysis import hardware
from tinyinfer_course import labcheck
from tinyinfer.kv_cache import KVCache
from tinyinfer.kv_cache import AttentionMetadata
from tinyinfer.sampling import SamplingParams

# ---------------------------------------------------------------- the generation loop


def _loop(model, prompt_ids, max_tokens, sample, stop_ids=(), cache_class=None, *, position_shift=0,
          include_stop=True, honour_stops=True, extra_token=False, fresh_cache_each_step=False, row=-1,
          recompute=False, grad=False, cache_dtype=None):
    """One loop, with one of several realistic mistakes switched on."""
    cache_class = cache_class or KVCache
    w = model.model.embed_tokens.weight
    max_len = len(prompt_ids) + max_tokens + 2
    dtype = {None: w.dtype, "float32": torch.float32, "default": torch.get_default_dtype()}[cache_dtype]
    cache = cache_class(model.config, 1, max_len, dtype, w.device)
    ids, positions = torch.tensor([prompt_ids]), torch.arange(len(prompt_ids))[None]
    out = []
    with torch.inference_mode(not grad):  # grad: autograd records every pass, for a backward nobody takes
        while True:
            hidden = model(ids, positions, cache)
            token = sample(model.compute_logits(hidden[:, row])[0])
            if honour_stops and token in stop_ids:
                return out + [token] if include_stop else out
            out.append(token)
            if len(out) >= max_tokens + (1 if extra_token else 0):
                return out
            if recompute:  # no cache reuse: the whole sequence again, in a fresh cache
                seq = list(prompt_ids) + out
                cache = cache_class(model.config, 1, max_len, w.dtype, w.device)
                ids, positions = torch.tensor([seq]), torch.arange(len(seq))[None]
                continue
            if fresh_cache_each_step:  # the cache is made anew every step: the prompt is forgotten
                cache = cache_class(model.config, 1, max_len, w.dtype, w.device)
            ids = torch.tensor([[token]])
            positions = torch.tensor([[len(prompt_ids) + len(out) - 1 + position_shift]])


@torch.inference_mode()
def _generate_by_steps(model, prompt_ids, max_tokens, sample, stop_ids=(), cache_class=None):
    # Correct, and unlike the course's answer: a for loop over steps, uniform
    # metadata (every step's start position given), the cache sized exactly.
    w = model.model.embed_tokens.weight
    cache = (cache_class or KVCache)(model.config, 1, len(prompt_ids) + max_tokens - 1, w.dtype, w.device)
    tokens, start, reply = list(prompt_ids), 0, []
    for _ in range(max_tokens):
        new = tokens[start:]
        positions = torch.arange(start, len(tokens)).unsqueeze(0)
        hidden = model(torch.tensor([new]), positions, cache, AttentionMetadata.uniform(positions, start))
        next_id = sample(model.compute_logits(hidden)[0, -1])
        reply.append(next_id)
        if next_id in stop_ids:
            break
        start = len(tokens)
        tokens.append(next_id)
    return reply


def _engine_generate(model, prompt_ids, max_tokens, sample, stop_ids=(), cache_class=None):
    # The engine's own loop, called the way a learner might.
    llm = labcheck.generation._engine()
    params = SamplingParams(temperature=0, max_tokens=max_tokens, stop_token_ids=list(stop_ids))
    return list(llm.generate([{"prompt_token_ids": prompt_ids}], params)[0].outputs[0].token_ids)


def _engine_steps(model, prompt_ids, max_tokens, sample, stop_ids=(), cache_class=None):
    engine = labcheck.generation._engine().llm_engine
    rid = engine.add_request({"prompt_token_ids": prompt_ids}, SamplingParams(temperature=0, max_tokens=max_tokens))
    while True:
        for out in engine.step():
            if out.request_id == rid and out.finished:
                return list(out.outputs[0].token_ids)


# ---------------------------------------------------------------- the timing harness


def _harness(step, device="cpu", repeats=3, *, warmup=True, pick=min, sync=True, time_warmup=False,
             unit=1.0, sync_before_only=False):
    on_gpu = torch.device(device).type == "cuda"
    times = []
    if warmup:
        t = time.perf_counter()
        step()
        if on_gpu and sync:
            torch.cuda.synchronize()
        if time_warmup:
            times.append(time.perf_counter() - t)
    for _ in range(repeats):
        if on_gpu and sync_before_only:
            torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        if on_gpu and sync and not sync_before_only:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return pick(times) * unit


def _time_step_ns(step, device="cpu", repeats=3):
    # Correct, and unlike the course's answer: nanosecond clock, a sorted list,
    # and a synchronize after every call (warm-up included) through a helper.
    def call_and_wait():
        step()
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()

    call_and_wait()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        call_and_wait()
        samples.append(time.perf_counter_ns() - t0)
    return sorted(samples)[0] / 1e9


WRONG = {
    "check_generate": [
        lambda *a: _loop(*a, position_shift=1),  # the new token one position too far: a gap in the cache
        lambda *a: _loop(*a, include_stop=False),  # drops the stop token LLM.generate reports
        lambda *a: _loop(*a, honour_stops=False),  # never stops early
        lambda *a: _loop(*a, extra_token=True),  # one token past max_tokens
        lambda *a: _loop(*a, fresh_cache_each_step=True),  # a new cache every step: no context
        lambda *a: _loop(*a, row=0),  # predicts from the first position, not the last
        lambda *a: _loop(*a, recompute=True),  # right tokens, but the whole sequence again each step
        lambda *a: _loop(*a, grad=True),  # right tokens and passes, without torch.inference_mode()
        # Issue 56: the cache in float32 whatever the weights: right on the fp32 model, refused on a bf16 one.
        lambda *a: _loop(*a, cache_dtype="float32"),
        lambda *a: _loop(*a, cache_dtype="default"),  # torch.get_default_dtype()
    ],
    "check_time_step": [
        lambda s, d="cpu", r=3: _harness(s, d, r, pick=statistics.mean),  # the mean: noise included
        lambda s, d="cpu", r=3: _harness(s, d, r, time_warmup=True),  # the warm-up counted as a timing
        lambda s, d="cpu", r=3: _harness(s, d, r, warmup=False),  # no warm-up
        lambda s, d="cpu", r=3: _harness(s, d, r, unit=1e3),  # milliseconds, not seconds
        lambda s, d="cpu", r=3: _harness(s, d, r, sync=False),  # on a GPU, times the queueing only
        lambda s, d="cpu", r=3: _harness(s, d, r, sync_before_only=True),  # waits before the step, not after
        lambda s, d="cpu", r=3: _harness(s, d, r, pick=sum),  # the total of the repeats
    ],
}
REFERENCE = {
    "check_generate": lambda: _generate_by_steps,
    "check_time_step": lambda: _time_step_ns,
}
ANSWERS = {
    "check_generate": [labcheck.reference_generate, _engine_generate, _engine_steps],
    "check_time_step": [labcheck.reference_time_step, hardware.best_time],
}
