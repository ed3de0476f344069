"""Where the time of one batch-1 decode step goes: per operator and per Python function.

    python benchmarks/profile_decode.py [--dtype float32] [--quantization int4] [--group-size 32]
        [--steps 30] [--compile] [--threads N] [--top 15] [--batch 1] [--lm-head-quantization int8]

Runs the engine on one request (or --batch requests of the same prompt, which
then decode together: a step under load), lets the prompt and a few decode steps pass
(warm-up, and compiling with --compile), then:
  1. times --steps decode steps with nothing attached (ms per step, median);
  2. records the same number of steps under torch.profiler and prints, per
     step, each operator's own time (self CPU) and call count, largest first;
     the operators that do a linear layer's product are summed separately;
  3. records them under cProfile and prints the Python functions with the most
     own time (the interpreter's share of a step: module calls, dispatch).
The profiler's own overhead inflates small operators, so read (2) and (3) for
where the time goes, and (1) for how much there is.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from tinyinfer import LLM, SamplingParams  # noqa: E402

PROMPT = "The lighthouse keeper climbed the stairs and"
# Operators that compute a linear layer's product (dense, packed, quantized).
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::mv", "mkldnn::",
              "aten::_weight_int4pack_mm", "aten::_weight_int8pack_mm", "tinyinfer::", "quantized::")


def decode_engine(args):
    head = {"lm_head_quantization": args.lm_head_quantization} if args.lm_head_quantization else {}
    llm = LLM(dtype=args.dtype, quantization=args.quantization, group_size=args.group_size, **head,
              enforce_eager=not args.compile, max_model_len=4096, max_num_seqs=max(16, args.batch))
    engine = llm.llm_engine if hasattr(llm, "llm_engine") else llm
    params = SamplingParams(max_tokens=2000, temperature=0, ignore_eos=True)  # within max_model_len
    for _ in range(args.batch):
        engine.add_request(PROMPT, params)
    for _ in range(args.warmup):  # the prompt step, then decode steps (compiling, with --compile)
        engine.step()
    return llm, engine


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--lm-head-quantization", default=None, help="int8: the LM head in 8 bits (default: the dtype)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--batch", type=int, default=1, help="requests decoding together (default 1)")
    args = ap.parse_args()
    if args.batch < 1:
        ap.error(f"--batch must be at least 1, got {args.batch}")
    if args.threads:
        torch.set_num_threads(args.threads)
    llm, engine = decode_engine(args)
    n = args.steps
    times, cpu = [], time.process_time()
    for _ in range(n):
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    cpu_ms = (time.process_time() - cpu) / n * 1e3  # all threads' CPU time: what a busy machine inflates least
    label = f"{args.dtype}" + (f", {args.quantization} g{args.group_size}" if args.quantization else "") \
        + (f", LM head {args.lm_head_quantization}" if args.lm_head_quantization else "") + f", batch {args.batch}"
    print(f"{label}, {'compiled' if args.compile else 'eager'}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"decode step: median {statistics.median(times) * 1e3:.2f} ms, best {min(times) * 1e3:.2f} ms "
          f"over {n} steps; CPU time {cpu_ms:.2f} ms per step (all threads; with --threads 1, a step's work "
          f"even on a busy machine)")

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            engine.step()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) / n / 1e3
    print(f"\ntorch.profiler: {total:.2f} ms of operator self time per step (profiler overhead included)")
    print(f"{'operator':48} {'ms/step':>8} {'share':>6} {'calls/step':>10}")
    events.sort(key=lambda e: -e.self_cpu_time_total)
    for e in events[: args.top]:
        ms = e.self_cpu_time_total / n / 1e3
        print(f"{e.key[:48]:48} {ms:8.3f} {ms / total:6.1%} {e.count / n:10.1f}")
    mm = [e for e in events if e.key.startswith(MATMUL_OPS)]
    mm_ms = sum(e.self_cpu_time_total for e in mm) / n / 1e3
    calls = sum(e.count for e in events) / n
    print(f"matrix products: {mm_ms:.2f} ms/step ({mm_ms / total:.0%}) in "
          + ", ".join(f"{e.key} x{e.count / n:.0f}" for e in mm))
    print(f"everything else: {total - mm_ms:.2f} ms/step in {calls:.0f} operator calls per step")

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        engine.step()
    pr.disable()
    out = io.StringIO()
    stats = pstats.Stats(pr, stream=out)
    print(f"\ncProfile: {stats.total_tt / n * 1e3:.2f} ms per step under the profiler; "
          f"functions by own time per step:")
    stats.sort_stats("tottime").print_stats(args.top)
    for line in out.getvalue().splitlines():
        if line.strip() and not line.startswith(("   Ordered", "         ")) or "function calls" in line:
            print(line[:150])


if __name__ == "__main__":
    main()
