"""Which kernel multiplies one row fastest on this CPU: measured once, then remembered.

A batch-1 decode step multiplies one row by every weight of the model. For a
single row, oneDNN's packed layout (cpu_linear.py) is not always the fastest
route. In fp32, 2 threads, the packed kernel took about half the time of
`F.linear` on an AMD EPYC (AVX-512), but on an Intel Xeon with AMX it was
slower than `F.linear` on the plain weight, whose MKL matrix-vector kernel
reads the weight at full speed. At 4 rows or more the packed kernel was as
fast or faster on both. No rule written in advance picks right on every CPU,
so the engine measures, once per CPU, torch version and dtype, and keeps the
answer in a small JSON file (`one_row_kernels.json` beside the packaged
models; delete it to measure again, or set TINYINFER_ONE_ROW_KERNEL to
"packed" or "plain" to decide yourself).

The measurement runs the model's own weights, in the order a step reads them,
so each matrix comes from memory, as in a real step: one row through each,
by both routes in turn, several times, and the best time of each route.
"plain" must win by 5% to be chosen: a choice that close is not worth a second
code path, and the packed kernel stays the default.
"""
from __future__ import annotations

import json
import os
import platform
import time
from typing import Callable

import torch
import torch.nn.functional as F

from .config import cache_dir
from .cpu_linear import linear_packed

ROUTES = ("packed", "plain")
MARGIN = 0.95  # plain is chosen only when it takes under 95% of packed's time
ENV = "TINYINFER_ONE_ROW_KERNEL"


def cpu_key(dtype: torch.dtype) -> str:
    """What the answer depends on: the CPU, its vector units (and any emulation
    of fewer, as `make test-portable` sets), torch, the dtype."""
    name, flags = platform.processor() or platform.machine(), ""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
        name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), name)
        flag_line = next((line.split(":", 1)[1] for line in lines if line.startswith("flags")), "")
        flags = " ".join(sorted(w for w in flag_line.split() if w.startswith(("avx", "amx"))))
    except OSError:  # not Linux: the name alone
        pass
    emulated = " ".join(f"{v}={os.environ[v]}" for v in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
                        if v in os.environ)
    return f"{name} | {flags} | {emulated} | torch {torch.__version__} | {dtype}"


def time_routes(weights: list[torch.Tensor], packed: list[torch.Tensor], repeats: int = 5,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Best time of one row through every weight, by each route, the routes taking turns."""
    xs = {w.shape[1]: torch.randn(1, w.shape[1], dtype=w.dtype) for w in weights}
    routes = {"packed": lambda: [linear_packed(xs[w.shape[1]], p) for w, p in zip(weights, packed)],
              "plain": lambda: [F.linear(xs[w.shape[1]], w) for w in weights]}
    best = dict.fromkeys(routes, float("inf"))
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first round warms up; its times count like the others
            for name, run in routes.items():
                start = clock()
                run()
                best[name] = min(best[name], clock() - start)
    return best


def decide(times: dict[str, float]) -> str:
    return "plain" if times["plain"] < MARGIN * times["packed"] else "packed"


def one_row_kernel(weights: list[torch.Tensor], packed: list[torch.Tensor], store=None,
                   clock: Callable[[], float] = time.perf_counter) -> str:
    """"packed" or "plain": the faster route for one row through these weights
    on this CPU, from the store if this CPU was measured before, else measured
    now and stored. store: the JSON file (default: one_row_kernels.json in
    config.cache_dir())."""
    forced = os.environ.get(ENV)
    if forced:
        if forced not in ROUTES:
            raise ValueError(f"{ENV}={forced!r} is invalid: must be one of {', '.join(map(repr, ROUTES))}")
        return forced
    if not weights:
        return "packed"
    if store is None:
        store = cache_dir() / "one_row_kernels.json"
    key = cpu_key(weights[0].dtype)
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        times = time_routes(weights, packed, clock=clock)
        known[key] = {"kernel": decide(times), "ms": {k: round(v * 1e3, 3) for k, v in times.items()}}
        try:
            store.parent.mkdir(parents=True, exist_ok=True)
            store.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
        except OSError:  # a read-only home: measured again next time, nothing breaks
            pass
    return known[key]["kernel"]
