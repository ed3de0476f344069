"""Tensor parallelism measured on this CPU: two processes, torch.distributed, gloo.

1. All-reduce latency against message size, between two processes of one
   thread each, and the ring model's alpha (latency per step) and bandwidth
   fitted to it (tensor_parallel.fit_ring, the inverse of hardware.allreduce_time).
2. SmolLM2-135M's forward pass over T tokens (T = 1 is a decode step at batch
   1, larger T a prefill), three ways:
     one process, 2 threads   the usual way to use both cores
     one process, 1 thread    the baseline the cost model starts from
     two processes, 1 thread each, every MLP split in two (tensor_parallel.split_mlps)
   and the cost model's prediction for the split: the 1-thread step with its
   MLP time halved, plus one all-reduce of T x 576 float32 values per layer on
   the fitted link. The two processes' outputs are compared with one process's.

    python benchmarks/tp_gloo.py --save src/tinyinfer_course/reports/data/tp-gloo-DATE.json

Run it alone on the machine (flock /tmp/coord/heavy.lock ...): two processes on
two cores is the point, and anything else running skews both.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from tinyinfer_course import machine
from tinyinfer_course.reports import tp_gloo as tp_report
from tinyinfer_course.analysis.hardware import allreduce_time
from tinyinfer_course.fleet.tensor_parallel import allreduce_sweep, fit_ring, hidden_states, run_ranks, step_times
from tinyinfer.weights import ensure_packaged_model

SIZES = [4 * 4 ** k for k in range(12)]  # 4 B .. 16 MiB
LENGTHS = [1, 8, 64, 256]


def machine_meta() -> dict:
    """When, on what, with which torch, and the stamp of the code the processes ran."""
    import torch

    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **machine.facts(),
            "torch": torch.__version__, "backend": "gloo", "engine_stamp": tp_report.REPORT.stamp()}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--save", default=None, help="write the report (JSON) here")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    args = p.parse_args(argv)
    lengths = [int(t) for t in args.lengths.split(",")]
    folder = str(ensure_packaged_model())

    load_before = os.getloadavg()  # other programs on the machine skew every number below: say how many
    sweep = run_ranks(allreduce_sweep, world=2, args=(SIZES,))
    seconds = [max(a, b) for a, b in zip(*sweep)]  # a collective ends when its slower rank does
    link = fit_ring(SIZES, seconds, 2, "gloo, two processes on one CPU")
    print(f"all-reduce: alpha {link.latency * 1e6:.1f} us per ring step, {link.bandwidth / 1e9:.2f} GB/s", flush=True)

    ids = list(range(100, 164))
    (alone,) = run_ranks(hidden_states, world=1, args=(folder, ids))
    split = run_ranks(hidden_states, world=2, args=(folder, ids))
    max_diff = float(max(np.abs(s - alone).max() for s in split))
    print(f"hidden states, two processes vs one: max |difference| {max_diff:.2e}", flush=True)

    (two_threads,) = run_ranks(step_times, world=1, args=(folder, lengths, args.repeats), threads=2)
    (one_thread,) = run_ranks(step_times, world=1, args=(folder, lengths, args.repeats), threads=1)
    tp = run_ranks(step_times, world=2, args=(folder, lengths, args.repeats), threads=1)
    from tinyinfer.weights import read_config

    config = read_config(Path(folder))
    rows = []
    for t in lengths:
        step1, mlp1 = one_thread["step_s"][t], one_thread["mlp_s"][t]
        comm = config.num_hidden_layers * allreduce_time(t * config.hidden_size * 4, 2, link)
        rows.append({"tokens": t, "one_process_2_threads_s": two_threads["step_s"][t], "one_process_1_thread_s": step1,
                     "mlp_1_thread_s": mlp1, "two_processes_s": max(r["step_s"][t] for r in tp),
                     "two_processes_allreduce_s": max(r["comm_s"][t] for r in tp),
                     "predicted_two_processes_s": step1 - mlp1 / 2 + comm, "predicted_communication_s": comm})
        r = rows[-1]
        print(f"T={t:4d}: 1 proc x 2 threads {r['one_process_2_threads_s'] * 1e3:8.1f} ms, 1 thread "
              f"{step1 * 1e3:8.1f} ms, 2 procs {r['two_processes_s'] * 1e3:8.1f} ms "
              f"(predicted {r['predicted_two_processes_s'] * 1e3:8.1f} ms; all-reduces "
              f"{r['two_processes_allreduce_s'] * 1e3:.1f} ms, predicted {comm * 1e3:.1f})", flush=True)

    meta = machine_meta() | {"load_average_before": load_before, "load_average_after": os.getloadavg()}
    report = {"meta": meta, "model": {"name": "smollm2-135m-instruct", "dtype": "float32",
                                                         "layers": config.num_hidden_layers,
                                                         "hidden_size": config.hidden_size,
                                                         "intermediate_size": config.intermediate_size},
              "allreduce": {"nbytes": SIZES, "seconds": seconds, "per_rank_seconds": sweep,
                            "fit": {"alpha_s": link.latency, "bandwidth_bytes_per_s": link.bandwidth}},
              "max_abs_difference": max_diff, "steps": rows,
              "command": "python benchmarks/tp_gloo.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    if args.save:
        Path(args.save).write_text(json.dumps(report, indent=1) + "\n")
        print("saved", args.save)
    return report


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # each rank sets its own thread count
    t0 = time.perf_counter()
    main()
    print(f"took {time.perf_counter() - t0:.0f} s")
