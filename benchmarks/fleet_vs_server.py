"""Does the fleet simulator predict the real server? One replica, one workload, one run.

    python benchmarks/fleet_vs_server.py [--requests 32] [--rate 1.0] [--max-num-seqs 8] [--threads N]

1. Fit the simulator's StepCostModel by timing whole engine steps
   (fleet.calibrate_steps) of an engine with the given max_num_seqs and token
   budget: the "offline calibration", made before the run.
2. Start `tinyinfer serve` with the same settings: by default as its own
   process, as a reader runs it (--in-process runs it in a thread of this
   process instead, where the server, the engine and the load generator share
   one interpreter lock).
3. Load-test the server with `tinyinfer bench` (Poisson arrivals, prompt and
   output lengths drawn uniformly, EOS ignored).
4. Fit a second StepCostModel to the steps the server itself ran during the
   load test (GET /debug/steps: what each step carried and how long the whole
   turn of its engine loop took). This one is "calibrated from the real server":
   it holds what serving adds to each step, and the machine's load at the time
   of the run, which on a shared machine drifts between step 1 and step 3.
5. Replay exactly those requests (their send times, prompt and output lengths)
   through fleet.simulate(replicas=1) with the same limits, once per model.
6. Print p50 / p95 end-to-end latency and TTFT from both, the ratio sim/real,
   and whether the e2e figures agree within 20% (the course's bar), judged on
   the model fitted to the server's own steps.

On a machine shared with other jobs, two torch threads per engine make every
step wait for both threads to get a core, and step times then swing by several
times within one run; --threads 1 keeps the comparison meaningful there. On
2026-11-30, on a 2-core machine shared with four other jobs: --threads 1 passed
three runs out of three (e2e p50/p95 sim/real 0.88/0.97, 0.96/0.99, 0.87/1.03);
the defaults (2 threads) failed one run (1.35/0.94, with the server 20 times
slower than when the machine is quiet). On 2026-12-01, on the same machine with
nothing else running, the defaults passed three runs out of three (1.01/0.95,
1.04/0.97, 1.03/0.96), while the offline calibration of step 1 still
under-predicted by 23-36% (0.69-0.77 / 0.64-0.71): batched steps in the served
run cost more than calibrate_steps measures offline, a gap not yet explained.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from tinyinfer import LLMEngine  # noqa: E402
from tinyinfer.bench import run_benchmark  # noqa: E402
from tinyinfer.fleet import ReplicaConfig, StepCostModel, calibrate_steps, simulate, workload_from  # noqa: E402
from tinyinfer.metrics import percentile  # noqa: E402
from tinyinfer.server import build_app  # noqa: E402
from tinyinfer.server.background import BackgroundServer  # noqa: E402

MODEL = "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server_process(args):
    """`tinyinfer serve` as a child process; yields its base URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "tinyinfer", "serve", "--port", str(port), "--dtype", "float32", "--device", "cpu",
           "--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens", str(args.max_num_batched_tokens),
           "--max-waiting", "10000", "--log-level", "warning"]
    env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()))
    proc = subprocess.Popen(cmd, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not come up (exit code {proc.poll()})")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--rate", type=float, default=1.0, help="requests per second (Poisson)")
    ap.add_argument("--input-len", default="16:128")
    ap.add_argument("--output-len", default="8:48")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-num-batched-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--in-process", action="store_true", help="run the server in a thread of this process")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = LLMEngine(MODEL, dtype="float32", device="cpu", max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens)
    cost, points = calibrate_steps(engine, return_measurements=True)
    print(f"step cost model: {cost}")
    print("  prefill (tokens, s):", [(t, round(s, 4)) for t, s in points["prefill"]])
    print("  decode (batch, s):  ", [(b, round(s, 4)) for b, s in points["decode"]])

    def bench(url):
        res = run_benchmark(url, MODEL, num_prompts=args.requests, request_rate=args.rate,
                            input_len=args.input_len, output_len=args.output_len, tokenizer=MODEL,
                            seed=args.seed, progress=True)
        return res, httpx.get(url + "/debug/steps", timeout=30, trust_env=False).json()["steps"]

    if args.in_process:
        with BackgroundServer(build_app(engine, model_name=MODEL, max_waiting=10_000)) as server:
            res, steps = bench(server.url)
    else:
        del engine  # the server process loads its own
        with server_process(args) as url:
            res, steps = bench(url)
    served_cost = fit_served_steps(steps)
    print(f"step cost model fitted to the server's {len(steps)} busy steps: {served_cost}")
    ok = [r for r in res.records if r.ok]
    if len(ok) != args.requests:
        raise SystemExit(f"{args.requests - len(ok)} requests failed; the comparison needs all of them")
    t0 = min(r.send_time for r in ok)
    records = [{"arrival_time": r.send_time - t0, "prompt_len": r.input_tokens, "output_len": r.output_tokens}
               for r in ok]
    config = ReplicaConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens)
    sims = {name: simulate(workload_from(records), replicas=1, cost_model=c, replica_config=config)
            for name, c in (("offline", cost), ("served", served_cost))}
    real = {"e2e": [r.chunk_times[-1] - r.send_time for r in ok], "ttft": [r.chunk_times[0] - r.send_time for r in ok]}
    print(f"\n{args.requests} requests, Poisson {args.rate}/s, input {args.input_len}, output {args.output_len}, "
          f"max_num_seqs {args.max_num_seqs}, torch threads {torch.get_num_threads()}, "
          f"server {'in this process' if args.in_process else 'in its own process'}\n")
    print("| metric | real server (bench) | sim, offline calibration | sim / real | sim, fitted to the server's "
          "steps | sim / real |")
    print("|---|---|---|---|---|---|")
    verdicts = []
    for name in ("e2e", "ttft"):
        for p in (50, 95):
            a = percentile(real[name], p)
            b, c = (percentile([getattr(q, name) for q in sims[k].requests], p) for k in ("offline", "served"))
            print(f"| {name} p{p} | {a:.2f} s | {b:.2f} s | {b / a:.2f} | {c:.2f} s | {c / a:.2f} |")
            if name == "e2e":
                verdicts.append(abs(c / a - 1) <= 0.20)
    print(f"\ne2e p50 and p95 within 20% (simulator on the server's own step costs): "
          f"{'PASS' if all(verdicts) else 'FAIL'}")


def fit_served_steps(steps: list[dict]) -> StepCostModel:
    """Least squares: turn_s = decode_base_s + prefill_s_per_token * prefill_tokens
    + decode_s_per_seq * decode_seqs over the server's busy steps. The turn of the
    core's loop, not just step(), so what serving adds per step is in the model."""
    if len(steps) < 3:
        raise SystemExit(f"the server reported {len(steps)} busy steps; the fit needs at least 3")
    X = np.array([[1.0, s["prefill_tokens"], s["decode_seqs"]] for s in steps])
    y = np.array([s["turn_s"] for s in steps])
    base, per_token, per_seq = (max(0.0, float(v)) for v in np.linalg.lstsq(X, y, rcond=None)[0])
    return StepCostModel(prefill_s_per_token=per_token, decode_base_s=base, decode_s_per_seq=per_seq)


if __name__ == "__main__":
    main()
