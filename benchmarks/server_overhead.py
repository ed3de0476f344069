"""What does serving add to the engine? The same request, offline and over HTTP, in one run.

    python benchmarks/server_overhead.py [--rounds 5] [--prompt-len 128] [--max-tokens 64] [--dtype bfloat16]
                                         [--quantization int4 --group-size 32] [--compile]
                                         [--modes process,thread] [--before-src DIR]

For each round, one request of `prompt-len` prompt token ids asking for
`max-tokens` greedy tokens (EOS ignored) runs
  * offline: LLMEngine in this process, add_request then step() until done;
  * served: through `tinyinfer serve` (a child process, as a reader runs it),
    streamed from /v1/completions, once per server mode:
      process  the engine core in a process of its own (the default)
      thread   --no-engine-process: the engine loop in a thread of the HTTP process
      before   (with --before-src DIR) `tinyinfer serve` from another checkout's src/
The servers idle while the others run; the rounds interleave, so a burst of
load from elsewhere on the machine hits every row alike. Each round uses a new
prompt, so no prefix cache helps either side.

Figures per row: TTFT (request sent -> first token) and the median gap between
tokens (offline: between step() returns that add a token; served: between
streamed chunks). The bars (issue 17): served chunk gap <= 1.10x the offline
decode step, served TTFT <= offline TTFT + 30 ms.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import httpx  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serving import install_signal_handlers, serve_tinyinfer  # noqa: E402

from tinyinfer import LLMEngine, SamplingParams  # noqa: E402

MODEL = "smollm2-135m-instruct"


def prompt_ids(engine, n: int, seed: int) -> list[int]:
    """n real-text token ids, different for every seed (so the prefix cache never hits)."""
    g = torch.Generator().manual_seed(seed)
    words = ["river", "stone", "light", "market", "window", "garden", "music", "winter", "paper", "engine",
             "silver", "harbor", "forest", "letter", "morning", "bridge"]
    text = " ".join(words[int(i)] for i in torch.randint(len(words), (4 * n,), generator=g))
    return engine.tokenizer.encode(text)[:n]


def offline(engine, ids: list[int], max_tokens: int) -> tuple[float, list[float], float]:
    """(TTFT, token times, mean time inside step()) in seconds, stepping the engine by hand."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    t0 = time.perf_counter()
    engine.add_request({"prompt_token_ids": ids}, params)
    times, seen, steps = [], 0, []
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        outputs = engine.step()
        steps.append(time.perf_counter() - t)
        for out in outputs:
            n = len(out.outputs[0].token_ids)
            if n > seen:
                times.append(time.perf_counter() - t0)
                seen = n
    return times[0], times, statistics.mean(steps)


def engine_step_counters(client: httpx.Client, url: str) -> tuple[float, float] | None:
    """(steps, seconds inside engine.step()) from the server's /metrics; None if it has no such counters.
    Read with prometheus_client's parser, whatever the labels (a --before-src server has none)."""
    from prometheus_client.parser import text_string_to_metric_families

    values = {s.name: s.value for f in text_string_to_metric_families(client.get(url + "/metrics").text)
              for s in f.samples}
    try:
        return values["tinyinfer:engine_steps_total"], values["tinyinfer:engine_step_seconds_total"]
    except KeyError:
        return None


def served(client: httpx.Client, url: str, ids: list[int], max_tokens: int) -> tuple[float, list[float], float]:
    """(TTFT, chunk times, mean time inside the server's engine.step()) in seconds, one streamed completion."""
    import json

    body = {"model": MODEL, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    times = []
    before = engine_step_counters(client, url)
    t0 = time.perf_counter()
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("error"):
                raise RuntimeError(chunk["error"])
            if chunk["choices"] and chunk["choices"][0]["text"]:
                times.append(time.perf_counter() - t0)
    after = engine_step_counters(client, url)
    step = (after[1] - before[1]) / max(1.0, after[0] - before[0]) if before and after else float("nan")
    return times[0], times, step


def median_gap(times: list[float]) -> float:
    return statistics.median(b - a for a, b in zip(times, times[1:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=None, help="torch threads, here and in the servers")
    ap.add_argument("--quantization", default=None, help="int8 or int4, here and in the servers")
    ap.add_argument("--group-size", type=int, default=32, help="weights per INT4 scale")
    ap.add_argument("--compile", action="store_true", help="decode steps compiled (--no-enforce-eager)")
    ap.add_argument("--modes", default="process,thread", help="server modes to measure: process, thread")
    ap.add_argument("--before-src", default=None, help="also serve from this checkout's src/ (row 'before')")
    args = ap.parse_args()
    install_signal_handlers()  # SIGTERM stops the servers as Ctrl-C does
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    engine = LLMEngine(MODEL, dtype=args.dtype, device="cpu", quantization=args.quantization,
                       group_size=args.group_size if args.quantization else 128, enforce_eager=not args.compile)
    rows = {"offline": []}
    servers = {}
    common = (["--quantization", args.quantization, "--group-size", str(args.group_size)] if args.quantization
              else []) + (["--no-enforce-eager"] if args.compile else [])
    flags = {"process": common, "thread": [*common, "--no-engine-process"]}
    with contextlib.ExitStack() as stack:
        for mode in [m for m in args.modes.split(",") if m]:
            servers[mode] = stack.enter_context(serve_tinyinfer(MODEL, args.dtype, threads, flags[mode]))
        if args.before_src:
            servers["before"] = stack.enter_context(serve_tinyinfer(MODEL, args.dtype, threads, common,
                                                            pythonpath=os.path.join(args.before_src, "src")))
        rows.update({name: [] for name in servers})
        with httpx.Client(timeout=300, trust_env=False) as client:
            warm = prompt_ids(engine, args.prompt_len, seed=10_000)
            offline(engine, warm, 8)
            for url in servers.values():
                served(client, url, warm, 8)
            for r in range(args.rounds):
                ids = prompt_ids(engine, args.prompt_len, seed=r)
                rows["offline"].append(offline(engine, ids, args.max_tokens))
                for name, url in servers.items():
                    rows[name].append(served(client, url, ids, args.max_tokens))
                print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                    f"{name} {rows[name][-1][0] * 1e3:.0f} ms / {median_gap(rows[name][-1][1]) * 1e3:.1f} ms"
                    for name in rows), flush=True)
    report(rows, args, threads)


def report(rows: dict, args, threads: int) -> None:
    step = [median_gap(t) for _, t, _ in rows["offline"]]
    ttft = [t for t, _, _ in rows["offline"]]
    inside = [m for _, _, m in rows["offline"]]
    fmt = args.dtype + (f", {args.quantization}" + (f" g{args.group_size}" if args.quantization == "int4" else "")
                        if args.quantization else "") + (", compiled" if args.compile else ", eager")
    print(f"\n{args.prompt_len} prompt token ids, {args.max_tokens} greedy tokens, {fmt}, torch threads "
          f"{threads}, {args.rounds} rounds (median over rounds; [min, max] of the per-round figure)\n")
    print("| run | TTFT | median gap between tokens | gap / offline step | TTFT - offline TTFT "
          "| mean time inside step() |")
    print("|---|---|---|---|---|---|")
    print(f"| offline engine | {statistics.median(ttft) * 1e3:.0f} ms | {statistics.median(step) * 1e3:.1f} ms "
          f"| 1.00 | 0 ms | {statistics.median(inside) * 1e3:.1f} ms |")
    verdicts = {}
    for name, runs in rows.items():
        if name == "offline":
            continue
        gaps = [median_gap(t) for _, t, _ in runs]
        ratios = [g / s for g, s in zip(gaps, step)]
        extra = [(t - o) * 1e3 for (t, _, _), o in zip(runs, ttft)]
        ratio, delta = statistics.median(ratios), statistics.median(extra)
        verdicts[name] = ratio <= 1.10 and delta <= 30
        core = statistics.median(m for _, _, m in runs)
        print(f"| served ({name}) | {statistics.median(t for t, _, _ in runs) * 1e3:.0f} ms "
              f"| {statistics.median(gaps) * 1e3:.1f} ms | {ratio:.3f} [{min(ratios):.2f}, {max(ratios):.2f}] "
              f"| {delta:+.0f} ms [{min(extra):+.0f}, {max(extra):+.0f}] "
              f"| {'n/a' if core != core else f'{core * 1e3:.1f} ms'} |")
    print("\nmean time inside step(): offline, measured around engine.step(); served, the server's own "
          "/metrics counters\n(tinyinfer:engine_step_seconds_total / engine_steps_total) over the request. "
          "A served step that is\nslower than the offline one was slowed inside the engine (CPU or lock "
          "contention); a gap longer than\nthe step is time between steps (the pipe, the event loop, HTTP).")
    print("\nbars: gap <= 1.10x offline step and TTFT <= offline + 30 ms")
    for name, ok in verdicts.items():
        print(f"  served ({name}): {'PASS' if ok else 'FAIL'}")

if __name__ == "__main__":
    main()
