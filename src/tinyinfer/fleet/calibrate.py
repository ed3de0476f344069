"""Fit a StepCostModel to the real engine, so the simulator's clock is this machine's.

Two short experiments on the actual model:
  prefill  one prompt of T tokens, for a few T: time = a + prefill_s_per_token * T
  decode   one new token for each of B sequences, for a few B:
           time = decode_base_s + decode_s_per_seq * B
Each is a straight-line fit (least squares). We keep the prefill slope and the
decode line: the decode intercept is the cost of reading every weight once,
which every step pays whatever it carries.

We call the model's forward pass directly (with a contiguous KVCache), not
LLM.generate: sampling, detokenising and Python bookkeeping are not what the
step-time model is about, and a direct call keeps the whole fit to seconds.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..hardware import best_time
from ..forward import forward_hidden, new_cache
from ..model import AttentionMetadata
from .cost import StepCostModel


def _find_model(obj):
    """The LlamaForCausalLM of an LLM, an LLMEngine, a ModelRunner, or the model itself."""
    for m in (obj, getattr(obj, "model", None)):  # LLM and LLMEngine both expose .model
        if isinstance(m, torch.nn.Module) and hasattr(m, "compute_logits"):
            return m
    raise ValueError(f"calibrate: could not find a tinyinfer model in {type(obj).__name__}; "
                     "pass an LLM, an LLMEngine, a ModelRunner or the model")


def _fit_line(xs, ys) -> tuple[float, float]:
    """Least-squares intercept and slope; a negative slope (noise) is clipped to 0."""
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return max(float(intercept), 0.0), max(float(slope), 0.0)


def _fit_cost(prefill, decode, return_measurements: bool):
    """The StepCostModel through the measured (tokens, s) and (batch, s) points."""
    _, per_token = _fit_line(*zip(*prefill))
    base, per_seq = _fit_line(*zip(*decode))
    cost = StepCostModel(prefill_s_per_token=per_token, decode_base_s=base, decode_s_per_seq=per_seq)
    if return_measurements:
        return cost, {"prefill": prefill, "decode": decode}
    return cost


def calibrate(llm_or_engine, prompt_lens=(16, 64, 128), batch_sizes=(1, 4, 8),
              context: int = 64, repeats: int = 2, return_measurements: bool = False):
    """Measure prefill cost per token and decode step time vs batch size on the
    real model; return a fitted StepCostModel (and the raw points if asked)."""
    model = _find_model(llm_or_engine)
    device, vocab = next(model.parameters()).device, model.config.vocab_size
    gen = torch.Generator().manual_seed(0)

    def prefill_time(T: int) -> float:
        cache = new_cache(model, T)  # made once, outside the timed call
        ids = torch.randint(0, vocab, (T,), generator=gen).tolist()
        with torch.inference_mode():
            return best_time(lambda: model.compute_logits(forward_hidden(model, ids, 0, cache)[-1]), device, repeats)

    def decode_time(B: int) -> float:
        # B sequences, one new token each: a batch, which forward.py's one-sequence
        # helpers do not cover. Every sequence sits at the same position `context`,
        # as after equal prompts; the cache holds zeros there, which cost exactly
        # what real keys cost.
        cache = new_cache(model, context + 1, batch_size=B)
        ids = torch.randint(0, vocab, (B, 1), generator=gen).to(device)
        pos = torch.full((B, 1), context, device=device)
        meta = AttentionMetadata.uniform(pos, context)
        with torch.inference_mode():
            return best_time(lambda: model.compute_logits(model(ids, pos, cache, meta)[:, -1]), device, repeats)

    prefill = [(T, prefill_time(T)) for T in prompt_lens]
    decode = [(B, decode_time(B)) for B in batch_sizes]
    return _fit_cost(prefill, decode, return_measurements)


def calibrate_steps(engine, prompt_lens=(16, 64, 128), batch_sizes=(1, 4, 8), context: int = 64,
                    repeats: int = 3, return_measurements: bool = False):
    """Like calibrate(), but times whole LLMEngine.step() calls, so the fit also
    covers what a real step pays besides the forward pass: scheduling, building
    the paged-attention metadata, sampling and detokenising. Use it when the
    simulator is compared with the real server (benchmarks/fleet_vs_server.py).

    The engine must be idle; it is left idle."""
    from ..sampling import SamplingParams

    if engine.has_unfinished_requests():
        raise ValueError("calibrate_steps: the engine must have no unfinished requests")
    vocab = engine.model_config.vocab_size
    gen = torch.Generator().manual_seed(0)

    def prompt(n):
        return {"prompt_token_ids": torch.randint(0, vocab, (n,), generator=gen).tolist()}

    def prefill_time(T: int) -> float:
        best = float("inf")
        for _ in range(repeats):
            engine.add_request(prompt(T), SamplingParams(max_tokens=1, ignore_eos=True))
            t = time.perf_counter()
            engine.step()  # the whole prompt in one step (T <= the token budget)
            best = min(best, time.perf_counter() - t)
            while engine.has_unfinished_requests():
                engine.step()
        return best

    def decode_time(B: int) -> float:
        for _ in range(B):
            engine.add_request(prompt(context), SamplingParams(max_tokens=repeats + 2, ignore_eos=True))
        engine.step()
        while engine.stats.num_decode_tokens < B:  # until every prompt is in and all decode together
            engine.step()
        best = float("inf")
        while engine.has_unfinished_requests():
            t = time.perf_counter()
            engine.step()
            if engine.stats.num_decode_tokens == B:
                best = min(best, time.perf_counter() - t)
        return best

    prefill = [(T, prefill_time(T)) for T in prompt_lens]
    decode = [(B, decode_time(B)) for B in batch_sizes]
    return _fit_cost(prefill, decode, return_measurements)
