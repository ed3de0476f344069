"""A bursty load on this machine, to run the test suite beside (issue: tests that
time the real engine failed only when something else used the CPU in bursts).

    python scripts/bursty_load.py [--workers 3] [--seconds 1800] [--seed 0]

Each worker spins for a random 20-400 ms, then sleeps for a random 20-400 ms,
and again, until --seconds have passed: it stops by itself. A steady busy loop
does not reproduce such failures (the scheduler shares the cores evenly); bursts
that start and stop mid-measurement do.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import signal
import time


def worker(seconds: float, seed: int) -> None:
    rng = random.Random(seed)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        spin_until = time.monotonic() + rng.uniform(0.02, 0.4)
        while time.monotonic() < spin_until:
            pass
        time.sleep(rng.uniform(0.02, 0.4))


def _stop(signum, frame) -> None:
    raise SystemExit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=3, help="processes, each spinning in bursts (default 3)")
    ap.add_argument("--seconds", type=float, default=1800, help="how long the load lasts (default 1800)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not 1 <= args.workers <= 16:
        ap.error(f"--workers={args.workers} is invalid: it must be in [1, 16]")
    signal.signal(signal.SIGTERM, _stop)  # `kill` stops the workers too, as Ctrl-C does
    procs = [mp.Process(target=worker, args=(args.seconds, args.seed + i)) for i in range(args.workers)]
    for p in procs:
        p.start()
    print(f"bursty load: {args.workers} workers for {args.seconds:.0f} s", flush=True)
    try:
        for p in procs:
            p.join()
    except (KeyboardInterrupt, SystemExit):
        for p in procs:
            p.terminate()  # each worker exits quietly through _stop


if __name__ == "__main__":
    main()
