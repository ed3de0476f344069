"""Does the fleet simulator's clock match the real engine? One run, one machine.

    python benchmarks/fleet_calibrate.py [--requests 12] [--max-num-seqs 4] [--threads N]

1. calibrate(): fit a StepCostModel to the model's own forward passes.
2. Send the same burst of requests (random token prompts, fixed output lengths,
   EOS ignored) to a real LLMEngine, stepping it in a loop, and to
   simulate(..., replicas=1) with the same max_num_seqs / token budget.
3. Print TTFT and end-to-end latency from both and their ratio (sim / real).
A ratio near 1 means the linear step model captures where the time goes; the
real engine also pays for sampling, scheduling and paging, which the fit omits.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tinyinfer import LLMEngine, SamplingParams  # noqa: E402
from tinyinfer_course.fleet import ReplicaConfig, calibrate, simulate, workload_from  # noqa: E402
from tinyinfer.llm_engine import run_until_done  # noqa: E402
from tinyinfer.metrics import LatencyStats  # noqa: E402


def run_real(engine, records, vocab, seed=0):
    """All requests arrive at once (a burst), so arrival timing needs no threads."""
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    for r in records:
        ids = rng.integers(0, vocab, size=r["prompt_len"]).tolist()
        engine.add_request({"prompt_token_ids": ids}, SamplingParams(max_tokens=r["output_len"], ignore_eos=True,
                                                                     temperature=0), arrival_time=t0)
    done = run_until_done(engine).values()
    return LatencyStats.of(o.metrics["ttft"] for o in done), LatencyStats.of(o.metrics["e2e"] for o in done)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--max-num-batched-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = LLMEngine("smollm2-135m-instruct", dtype="float32", device="cpu", max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens, enable_prefix_caching=False, seed=0)
    t = time.perf_counter()
    cost, points = calibrate(engine, return_measurements=True)
    print(f"calibrate: {time.perf_counter() - t:.1f} s -> {cost}")
    print("  prefill (tokens, s):", [(T, round(s, 4)) for T, s in points["prefill"]])
    print("  decode (batch, s):  ", [(B, round(s, 4)) for B, s in points["decode"]])
    # how well the two lines reproduce their own points (tests check the fit's arithmetic
    # on scripted timings; how close it comes on this machine is this benchmark's question)
    fitted = [(f"prefill {T}", cost.step_time(prefill_tokens=T), s) for T, s in points["prefill"]]
    fitted += [(f"decode {B}", cost.step_time(decode_seqs=B), s) for B, s in points["decode"]]
    print("  fit / measured:     ", ", ".join(f"{name} {f / s:.2f}" for name, f, s in fitted))

    rng = np.random.default_rng(1)
    records = [{"arrival_time": 0.0, "prompt_len": int(rng.integers(16, 200)), "output_len": int(rng.integers(8, 32))}
               for _ in range(args.requests)]
    real_ttft, real_e2e = run_real(engine, records, engine.model_config.vocab_size)
    cfg = ReplicaConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens)
    sim = simulate(workload_from(records), 1, cost, replica_config=cfg)
    print(f"\n{args.requests} requests in one burst, max_num_seqs={args.max_num_seqs}")
    print(f"{'':14}{'real':>9}{'sim':>9}{'sim/real':>10}")
    for name, real, simulated in (("TTFT mean", real_ttft.mean, sim.ttft.mean),
                                  ("TTFT p95", real_ttft.p95, sim.ttft.p95),
                                  ("E2E mean", real_e2e.mean, sim.e2e.mean), ("E2E p95", real_e2e.p95, sim.e2e.p95)):
        print(f"{name:14}{real:9.2f}{simulated:9.2f}{simulated / real:10.2f}")


if __name__ == "__main__":
    main()
