"""A real router beside the simulator: one session workload, three of vllm-router's policies.

    python benchmarks/fleet_router.py [--save _build/fleet-router.json]     # `make fleet`

1. Draw the session workload (tinyinfer_course.fleet.sessions): sessions arriving as a
   Poisson process, each picking one of a few long system prompts and sending
   a few turns, each turn re-sending the earlier ones.
2. Calibrate the simulator: fit its StepCostModel (fleet.calibrate_steps) by
   timing whole steps of an engine with one replica's settings and threads, in
   this process, before any replica starts: the prediction is made first.
3. For each policy: start 2 `tinyinfer serve` replicas (the cores shared out)
   behind vllm-router (fleet.live_fleet.start_fleet), warm each replica up with one
   request, replay the workload through the router with `tinyinfer bench`'s
   client, and read each replica's share and prefix-cache hits from /metrics
   (fleet.live_replay.measure_policy). A fresh fleet per policy: empty caches.
4. Simulate the same requests, at the moments they were really sent, with the
   simulator's nearest policy, twice: on the offline calibration (the
   prediction) and on a cost model fitted to the steps the replicas really ran
   in that run (what is left of the gap once the step costs are right).
5. Store one JSON report, stamped with the engine's fingerprint and the CPU;
   tinyinfer_course.reports.router renders it (chapter 8).

It takes about 4 minutes on 2 cores (mostly starting replicas). Run it on an
idle machine: TTFT is a timing.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

from tinyinfer import LLMEngine  # noqa: E402
from tinyinfer.bench.prompts import load_tokenizer  # noqa: E402
from tinyinfer_course.fleet import ReplicaConfig, calibrate_steps, fit_steps  # noqa: E402
from tinyinfer_course import machine  # noqa: E402
from tinyinfer_course.fleet import live_fleet  # noqa: E402
from tinyinfer_course.reports import router as router_report
from tinyinfer_course.fleet.live_replay import measure_policy, simulate_policy  # noqa: E402
from tinyinfer_course.fleet.sessions import make_session_workload, to_sim_requests  # noqa: E402

MODEL = "smollm2-135m-instruct"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="round_robin,power_of_two,cache_aware")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=None, help="torch threads per replica (default: cores shared out)")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--sessions", type=int, default=18)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--system-prompts", type=int, default=3)
    ap.add_argument("--system-len", type=int, default=192)
    ap.add_argument("--user-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--session-rate", type=float, default=1.5, help="new sessions per second (Poisson)")
    ap.add_argument("--turn-gap", type=float, default=2.0, help="seconds between a session's turns")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", default=None, help="write the JSON report here")
    args = ap.parse_args()
    policies = args.policies.split(",")
    if live_fleet.router_binary() is None:
        sys.exit(f"vllm-router is not installed: {live_fleet.INSTALL_HINT}. The simulator alone: tinyinfer fleet.")
    threads = args.threads or live_fleet.split_threads(args.replicas)
    load_at_start = _load()  # other work on the machine slows every timing below

    tokenizer = load_tokenizer(args.model)
    turns = make_session_workload(tokenizer, args.sessions, args.turns, args.system_prompts, args.system_len,
                                  args.user_len, args.output_len, args.session_rate, args.turn_gap, args.seed)
    print(f"{len(turns)} requests: {args.sessions} sessions x {args.turns} turns, {args.system_prompts} system "
          f"prompts of {args.system_len} tokens, {args.output_len} output tokens", flush=True)

    torch.set_num_threads(threads)
    engine = LLMEngine(args.model, dtype=args.dtype, device="cpu", max_num_seqs=args.max_num_seqs)
    config = ReplicaConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=engine.config.max_num_batched_tokens)
    cost, points = calibrate_steps(engine, prompt_lens=(32, 128, 256), batch_sizes=(1, 2, 4, 8),
                                   return_measurements=True)
    del engine
    print(f"offline calibration ({threads} thread(s)): {cost}", flush=True)

    runs = {}
    for policy in policies:
        load = _load()
        with live_fleet.start_fleet(args.replicas, policy, args.model, dtype=args.dtype, threads=threads,
                              max_num_seqs=args.max_num_seqs) as fleet:
            real = measure_policy(fleet, turns, args.model)
        steps = [s for rs in real.pop("steps") for s in rs]
        served_cost = fit_steps(steps)
        runs[policy] = {
            "real": real,
            "sim": simulate_policy(turns, real, cost, policy, args.replicas, config, args.seed),
            "sim_served": simulate_policy(turns, real, served_cost, policy, args.replicas, config, args.seed),
            "served_cost": served_cost.to_dict(),
            # how much slower the replicas' steps were than the offline model says, on the same steps
            "step_ratio": sum(s for _, _, s in steps) / max(1e-9, sum(cost.step_time(p, d) for p, d, _ in steps)),
            "num_steps": len(steps),
            "load_average": load,
        }
        r, s = runs[policy]["real"], runs[policy]["sim"]
        print(f"{policy:>13}: real shares {[round(x, 2) for x in r['share']]} hit {r['prefix_hit_rate']:.0%} "
              f"TTFT p50/p95 {r['ttft_p50_s'] * 1e3:.0f}/{r['ttft_p95_s'] * 1e3:.0f} ms | sim ({s['policy']}) "
              f"shares {[round(x, 2) for x in s['share']]} hit {s['prefix_hit_rate']:.0%} TTFT p50/p95 "
              f"{s['ttft_p50_s'] * 1e3:.0f}/{s['ttft_p95_s'] * 1e3:.0f} ms", flush=True)

    sim_reqs = to_sim_requests(turns)
    report = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            **machine.facts(),
            "load_average": load_at_start,
            "threads_per_replica": threads, "replicas": args.replicas, "model": args.model, "dtype": args.dtype,
            "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": config.max_num_batched_tokens,
            "router": f"vllm-router {router_report.router_version()}",
            "command": "python benchmarks/fleet_router.py " + " ".join(sys.argv[1:]),
            "engine_stamp": router_report.REPORT.stamp(),
        },
        "workload": {
            "sessions": args.sessions, "turns": args.turns, "system_prompts": args.system_prompts,
            "system_len": args.system_len, "user_len": args.user_len, "output_len": args.output_len,
            "session_rate": args.session_rate, "turn_gap_s": args.turn_gap, "seed": args.seed,
            "requests": len(turns), "prompt_tokens": sum(t.prompt_len for t in turns),
            # what a prefix cache could reuse: the system prompts' whole blocks (the simulator's prefix) and
            # a session's earlier turns beyond them (only the real engine sees those)
            "system_block_tokens": sum(r.prefix_len for r in sim_reqs),
            "history_block_tokens": sum(max(0, (t.history_len // 16) * 16 - r.prefix_len)
                                        for t, r in zip(turns, sim_reqs)),
        },
        "calibration": {"cost": cost.to_dict(), "steps": points["steps"]},
        "runs": runs,
    }
    print()
    print(router_report.render(report, with_note=False))
    if args.save:
        Path(args.save).parent.mkdir(parents=True, exist_ok=True)
        Path(args.save).write_text(json.dumps(report, indent=1) + "\n")
        print(f"\nsaved {args.save}")


def _load() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


if __name__ == "__main__":
    main()
