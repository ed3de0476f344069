"""What preemption costs: keep the cache, drop and recompute it, or swap it to host memory.

    python benchmarks/preemption.py [--requests 16] [--blocks 24] [--threads N] [--device cuda]

One workload (seeded prompts from the course's text, greedy, EOS ignored), three
engines in one run:
  keep       a KV pool big enough that nobody is ever preempted (the baseline);
  recompute  a small pool: preempted sequences drop their blocks and later
             re-read their tokens (prompt and output so far) as a prefill;
  swap       the same small pool: preempted sequences copy their blocks to host
             memory and back.
Every engine must produce the same tokens (checked). Printed per engine: wall
time, output tokens/s and its ratio to `keep`, preemptions, tokens recomputed
(recompute) or bytes copied (swap). On a CPU "host memory" is the same RAM, so
swapping is a memory copy; on a GPU it crosses PCIe, and the balance shifts.
"""
from __future__ import annotations

import argparse
import random
import time

import torch

from tinyinfer import LLMEngine, SamplingParams
from tinyinfer.kv_pool import CPU_KV_CACHE_BYTES
from tinyinfer_course.analysis.eval import eval_text
from tinyinfer.llm_engine import run_until_done


def workload(tokenizer, n: int, seed: int):
    ids = tokenizer.encode(eval_text())
    rng = random.Random(seed)
    work = []
    for _ in range(n):
        length, start = rng.randint(16, 64), rng.randrange(0, len(ids) - 100)
        params = SamplingParams(temperature=0, max_tokens=rng.randint(32, 96), ignore_eos=True)
        work.append(({"prompt_token_ids": ids[start : start + length]}, params))
    return work


def run(engine: LLMEngine, work) -> tuple[float, list[list[int]], int]:
    """Wall time, outputs in order, and tokens computed by the model in total."""
    t = time.perf_counter()
    ids = [engine.add_request(p, sp) for p, sp in work]
    computed, st = [0], engine.stats
    done = run_until_done(engine, on_step=lambda: computed.append(st.num_prefill_tokens + st.num_decode_tokens))
    return time.perf_counter() - t, [done[i].outputs[0].token_ids for i in ids], sum(computed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=24, help="KV blocks of the small pool (block size 16)")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    common = dict(device=args.device, max_num_seqs=args.max_num_seqs, enable_prefix_caching=False)
    engines = {
        "keep": LLMEngine(**common, kv_cache_memory_bytes=CPU_KV_CACHE_BYTES),  # fixed: three engines live here
        "recompute": LLMEngine(**common, num_kv_blocks=args.blocks, preemption_mode="recompute"),
        "swap": LLMEngine(**common, num_kv_blocks=args.blocks, preemption_mode="swap"),
    }
    work = workload(engines["keep"].tokenizer, args.requests, args.seed)
    useful = sum(sp.max_tokens for _, sp in work)
    for e in engines.values():  # warm-up: first calls pay one-off costs
        run(e, work[:1])
    rows, reference = [], None
    for name, e in engines.items():
        e.scheduler.num_preemptions = e.scheduler.num_swapped_out = 0
        wall, outs, computed = run(e, work)
        reference = reference or outs
        same = outs == reference
        rows.append((name, wall, useful / wall, e.scheduler.num_preemptions, computed, e.scheduler.num_swapped_out,
                     same))
    base = rows[0][2]
    print(f"\n{args.requests} requests, {useful} output tokens, torch threads {torch.get_num_threads()}, "
          f"small pool {args.blocks} blocks x 16 tokens, max_num_seqs {args.max_num_seqs}\n")
    print("| engine | wall s | output tok/s | vs keep | preemptions | tokens computed | swapped out | same tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for name, wall, tps, pre, computed, swaps, same in rows:
        print(f"| {name} | {wall:.1f} | {tps:.1f} | {tps / base:.2f}x | {pre} | {computed} | {swaps} | {same} |")
    print("\ntokens computed: prompt + output tokens the model processed; recompute re-reads preempted tokens.")


if __name__ == "__main__":
    main()
