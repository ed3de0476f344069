"""Today's decode step against an older commit's, on this machine, in one run.

    python benchmarks/decode_vs_commit.py [--commit 1bb9b52] [--dtype bfloat16] [--quantization int4]
        [--batch 8] [--eager] [--rounds 3] [--isa avx2]

Issue 58 asked whether compiled decode got slower between two commits on AVX2
laptops. A single run of each cannot say: on a 2-core machine one process's
decode step varies by a quarter from the next process's (memory placement, the
neighbours of a virtual machine), more than the difference looked for. So this
script checks the old commit out into a temporary git worktree and then runs the
two engines in alternation, `--rounds` times each, each run a fresh process with
the same workload: 8 prompts of 128 tokens (`--batch`), 64 greedy tokens each.
It prints every run, then each commit's median and the ratio of the medians.

Each run reports the engine's start-up (compiling, with enforce_eager=False), the
offline output tokens per second (best of 3 `generate` calls after a warm-up) and
the median of 30 decode steps at full batch. `--isa avx2` runs both under the
AVX2 emulation of `make test-portable` (torch's kernels, oneDNN and MKL limited
to AVX2), each commit with a torch.compile cache of its own: a cache is not keyed
on the ISA, and two commits' graphs differ (tests/inductor_cache.py).

Emulation limits the instruction set, not the machine: an AVX2-only AMD EPYC has
other caches and memory than the AVX-512 Xeon that emulates it, so a difference
seen on one may not show on the other. Run it on an idle machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ISA_ENV = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}}

# One run, in a child process whose `tinyinfer` is the tree on its PYTHONPATH.
# It uses only what both old and new engines have: LLM, generate, add_request, step.
CHILD = r"""
import json, statistics, sys, time
import torch
from tinyinfer import LLM, SamplingParams
dtype, quantization, batch, eager = sys.argv[1], sys.argv[2] or None, int(sys.argv[3]), sys.argv[4] == "1"
torch.manual_seed(0)
start = time.perf_counter()
llm = LLM(dtype=dtype, quantization=quantization, enforce_eager=eager, max_num_seqs=batch)
startup = time.perf_counter() - start
text = "The lighthouse keeper climbed the spiral stairs at dusk and trimmed the wick. " * 20
ids = llm.tokenizer.encode(text)
prompts = [{"prompt_token_ids": ids[i : i + 128]} for i in range(batch)]
params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))  # warm-up
best = 0.0
for _ in range(3):
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    best = max(best, sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0))
engine = llm.llm_engine
for p in prompts:
    engine.add_request(p, SamplingParams(max_tokens=100, temperature=0, ignore_eos=True))
for _ in range(8):  # the prompts (chunked if the token budget is small), then a few decode steps
    engine.step()
steps = []
for _ in range(30):
    t0 = time.perf_counter()
    engine.step()
    steps.append(time.perf_counter() - t0)
print(json.dumps({"startup_s": startup, "tok_s": best, "step_ms": statistics.median(steps) * 1e3}))
"""


def worktree(commit: str, folder: Path) -> Path:
    """The commit's files in a temporary git worktree (removed at the end)."""
    subprocess.run(["git", "worktree", "add", "--detach", "-f", str(folder), commit], cwd=ROOT, check=True,
                   capture_output=True)
    return folder


def run_once(src: Path, cache: Path, args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src), HF_HUB_OFFLINE="1", TORCHINDUCTOR_CACHE_DIR=str(cache),
               **ISA_ENV.get(args.isa, {}))
    eager = "1" if args.eager else "0"
    cmd = [sys.executable, "-c", CHILD, args.dtype, args.quantization or "", str(args.batch), eager]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"a run failed ({src}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commit", default="1bb9b52", help="the older commit (default: before fixed-size decode steps)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--eager", action="store_true", help="eager steps (default: compiled, enforce_eager=False)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--isa", choices=["native", *ISA_ENV], default="native")
    args = ap.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="decode-vs-commit-"))
    old = worktree(args.commit, scratch / "old")
    trees = {args.commit: old / "src", "today": ROOT / "src"}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    mode = "eager" if args.eager else "compiled"
    print(f"{args.dtype}, {args.quantization or 'no quantization'}, batch {args.batch}, {mode}, ISA {args.isa}; "
          f"{args.rounds} rounds, the two commits in alternation")
    print(f"{'round':>5} {'commit':>10} {'start-up s':>11} {'tok/s':>7} {'step ms':>8}")
    try:
        for r in range(1, args.rounds + 1):
            for name, src in trees.items():
                result = run_once(src, scratch / f"inductor-{name}-{args.isa}", args)
                runs[name].append(result)
                print(f"{r:5d} {name:>10} {result['startup_s']:11.1f} {result['tok_s']:7.1f} {result['step_ms']:8.1f}",
                      flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, capture_output=True)
    med = {name: {k: statistics.median(r[k] for r in rs) for k in ("tok_s", "step_ms")} for name, rs in runs.items()}
    for name, m in med.items():
        spread = [r["step_ms"] for r in runs[name]]
        print(f"median {name:>10}: {m['tok_s']:6.1f} tok/s, step {m['step_ms']:6.1f} ms "
              f"(steps {min(spread):.1f}-{max(spread):.1f} ms)")
    print(f"today / {args.commit}: tok/s x{med['today']['tok_s'] / med[args.commit]['tok_s']:.2f}, "
          f"step time x{med['today']['step_ms'] / med[args.commit]['step_ms']:.2f}")


if __name__ == "__main__":
    main()
