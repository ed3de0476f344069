"""The same engine, stepped from the main thread and from a background thread, in one run.

    python benchmarks/engine_thread.py [--rounds 3] [--max-tokens 64] [--dtype bfloat16] [--threads N]

Why `tinyinfer serve` runs its engine loop in a process of its own, in that
process's main thread, rather than in a thread of the HTTP server: on the
course's machine, PyTorch's parallel (OpenMP) operators ran markedly slower
when called from a thread other than the main one (measured, not traced to its
cause inside the OpenMP runtime). This measures it with no server at all: one request (128 prompt token ids, greedy, EOS
ignored) at a time, its decode steps timed around LLMEngine.step(), the rounds
alternating between the main thread and a fresh background thread.
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

from tinyinfer import LLMEngine, SamplingParams


def decode_step_ms(engine, max_tokens: int) -> float:
    """Median time of the request's decode steps (its prefill step left out), in ms."""
    engine.add_request({"prompt_token_ids": list(range(1000, 1128))},
                       SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    times = []
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:]) * 1e3


def in_thread(fn, *args):
    out = []
    worker = threading.Thread(target=lambda: out.append(fn(*args)))
    worker.start()
    worker.join()
    return out[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = LLMEngine("smollm2-135m-instruct", dtype=args.dtype)
    decode_step_ms(engine, 4)  # warm-up
    main_ms, thread_ms = [], []
    for _ in range(args.rounds):
        main_ms.append(decode_step_ms(engine, args.max_tokens))
        thread_ms.append(in_thread(decode_step_ms, engine, args.max_tokens))
    m, t = statistics.median(main_ms), statistics.median(thread_ms)
    print(f"{torch.get_num_threads()} torch threads, {args.dtype}: median decode step {m:.1f} ms from the main "
          f"thread, {t:.1f} ms from a background thread ({t / m:.2f}x)")


if __name__ == "__main__":
    main()
