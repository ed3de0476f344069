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

from ..analysis.hardware import best_time
from tinyinfer.forward import forward_hidden, new_cache
from tinyinfer.kv_cache import AttentionMetadata
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


def calibrate_steps(engine, prompt_lens=(16, 64, 128), batch_sizes=(1, 2, 4, 8), context: int = 64,
                    repeats: int = 3, return_measurements: bool = False, clock=time.perf_counter):
    """Like calibrate(), but times whole LLMEngine.step() calls, so the fit also
    covers what a real step pays besides the forward pass: scheduling, building
    the paged-attention metadata, sampling and detokenising. Use it when the
    simulator is compared with the real server (benchmarks/fleet_vs_server.py).

    It times the three kinds of step a server runs: a prompt alone (each of
    prompt_lens), decodes alone (each of batch_sizes), and a prompt arriving
    while sequences decode (the middle prompt length beside 1 sequence and
    beside as many as the batch has room for). Each point is the median of `repeats` steps, a typical step rather
    than the luckiest, and one least-squares plane goes through all of them
    (fit_steps), as through the steps a server reports. Step costs are not
    quite linear: on a CPU the matrix products of a batch of 2 take much longer
    than those of one sequence (a third longer in fp32 on the course's machine,
    benchmarks/linear.py --batches 1,2), and then grow slowly, so batch 1 is
    cheaper than the plane says and batch 2 dearer; the plane splits the difference.

    `clock` reads the time before and after each step. A test hands in a
    scripted clock whose steps cost what it says, so that it can check the fit's
    arithmetic without depending on how busy the machine is.

    The engine must be idle; it is left idle. Its prefix cache is emptied
    first: the prompts are seeded, so a second calibration would otherwise find
    its prompts cached and time steps that compute only part of them."""
    from tinyinfer.llm_engine import run_until_done
    from tinyinfer.sampling import SamplingParams

    if engine.has_unfinished_requests():
        raise ValueError("calibrate_steps: the engine must have no unfinished requests")
    if max(batch_sizes) > engine.max_num_seqs:  # that many could never decode together: it would wait forever
        raise ValueError(f"calibrate_steps: batch_sizes={tuple(batch_sizes)} is invalid: each must be in "
                         f"[1, {engine.max_num_seqs}] (the engine's max_num_seqs)")
    engine.reset_prefix_cache()
    vocab = engine.model_config.vocab_size
    gen = torch.Generator().manual_seed(0)

    def prompt(n):
        return {"prompt_token_ids": torch.randint(0, vocab, (n,), generator=gen).tolist()}

    def start_decoding(B: int) -> None:
        """B sequences of `context` prompt tokens, stepped until all of them decode together."""
        for _ in range(B):
            engine.add_request(prompt(context), SamplingParams(max_tokens=repeats + 3, ignore_eos=True))
        engine.step()
        while engine.stats.num_decode_tokens < B:
            engine.step()

    def timed_step() -> tuple[int, int, float]:
        t = clock()
        engine.step()
        return engine.stats.num_prefill_tokens, engine.stats.num_decode_tokens, clock() - t

    def median_point(points: list[tuple[int, int, float]]) -> tuple[int, int, float]:
        return points[0][0], points[0][1], float(np.median([s for _, _, s in points]))

    def prefill(T: int, B: int = 0) -> tuple[int, int, float]:
        """A prompt of T tokens in one step (T <= the token budget), beside B decodes."""
        points = []
        for _ in range(repeats):
            if B:
                start_decoding(B)
            engine.add_request(prompt(T), SamplingParams(max_tokens=1, ignore_eos=True))
            points.append(timed_step())
            if points[-1][:2] != (T, B):  # e.g. a budget too small for T: the point would be mislabelled
                raise ValueError(f"calibrate_steps: a step meant to hold {T} prompt tokens beside {B} decodes "
                                 f"held {points[-1][0]} and {points[-1][1]}; check max_num_batched_tokens")
            run_until_done(engine)
        return median_point(points)

    def decode(B: int) -> tuple[int, int, float]:
        start_decoding(B)
        points = []
        while engine.has_unfinished_requests():
            p = timed_step()
            if p[:2] == (0, B):  # every sequence decoding, none finished yet
                points.append(p)
        return median_point(points)

    steps = [prefill(T) for T in prompt_lens] + [decode(B) for B in batch_sizes]
    room = min(max(batch_sizes), engine.max_num_seqs - 1)  # the prompt needs a batch slot of its own
    steps += [prefill(sorted(prompt_lens)[len(prompt_lens) // 2], B) for B in sorted({1, room}) if B <= room]
    cost = fit_steps(steps)
    if return_measurements:
        return cost, {"steps": steps}
    return cost


def fit_steps(steps) -> StepCostModel:
    """Least squares over measured steps (prefill_tokens, decode_seqs, seconds):
    seconds = decode_base_s + prefill_s_per_token * prefill_tokens
              + decode_s_per_seq * decode_seqs.
    Negative coefficients (noise) are clipped to 0."""
    steps = list(steps)
    if len(steps) < 3:
        raise ValueError(f"fit_steps: {len(steps)} steps given; the fit needs at least 3")
    X = np.array([[1.0, p, d] for p, d, _ in steps])
    y = np.array([s for _, _, s in steps])
    base, per_token, per_seq = (max(0.0, float(v)) for v in np.linalg.lstsq(X, y, rcond=None)[0])
    return StepCostModel(prefill_s_per_token=per_token, decode_base_s=base, decode_s_per_seq=per_seq)
