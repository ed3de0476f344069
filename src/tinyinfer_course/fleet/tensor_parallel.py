"""Tensor parallelism for real, on one machine: several processes, one model.

Chapter 8's cost model (hardware.tensor_parallel_step) says what splitting a
model across N chips should cost. This module does it, on a CPU, with PyTorch's
own torch.distributed and its `gloo` backend (which runs on CPUs): N processes,
each holding 1/N of every MLP's weights, summing their partial outputs with an
all-reduce after every MLP, exactly as Megatron-style tensor parallelism does
on GPUs (where NCCL replaces gloo).

Only the MLPs are split. SmolLM2-135M has 9 attention heads and 3 key-value
heads, which two processes cannot share evenly, so every process runs attention
whole, and the norms, the embedding and the LM head too. The MLP's 1536 hidden
columns split cleanly, and they hold 75% of a layer's weights (59% of the
model's parameters, with the tied embedding): split_work counts what each
process still multiplies.

  gate_up_proj [2I, C]: rank r keeps rows r*I/N .. (r+1)*I/N of the gate and of the up half
  down_proj    [C, I]:  rank r keeps the matching I/N columns
  rank r computes down_r(silu(gate_r x) * up_r x); the sum over ranks is the full MLP

    out = run_ranks(my_function, world=2, args=(...))   # my_function(rank, world, *args) in each process
"""
from __future__ import annotations

import multiprocessing
import os
import statistics
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tinyinfer.server.background import free_port

from ..analysis.hardware import Link

# --------------------------------------------------------------------------- the split


class ParallelMLP(nn.Module):
    """One rank's share of a SwiGLU MLP (model.MLP): 1/world of its hidden columns.
    forward returns the full MLP's output on every rank (after the all-reduce)."""

    def __init__(self, mlp: nn.Module, rank: int, world: int):
        super().__init__()
        hidden = mlp.down_proj.in_features
        if hidden % world:
            raise ValueError(f"world={world} is invalid: the MLP's {hidden} hidden columns must split evenly")
        share = hidden // world
        cols = slice(rank * share, (rank + 1) * share)
        gate, up = mlp.gate_up_proj.weight.detach().chunk(2, dim=0)
        c = mlp.down_proj.out_features
        self.gate_up_proj = nn.Linear(c, 2 * share, bias=False)
        self.down_proj = nn.Linear(share, c, bias=False)
        # clone(): this rank keeps only its slice, not a view that pins the whole matrix
        self.gate_up_proj.weight = nn.Parameter(torch.cat([gate[cols], up[cols]]).clone(), requires_grad=False)
        self.down_proj.weight = nn.Parameter(mlp.down_proj.weight.detach()[:, cols].clone(), requires_grad=False)
        self.comm_s = 0.0  # seconds spent in all-reduces so far: sending, and waiting for the other ranks

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        partial = self.down_proj(F.silu(gate) * up)
        if dist.is_initialized():  # world 1 (no process group) is the plain MLP
            start = time.perf_counter()
            dist.all_reduce(partial)  # the sum of every rank's partial output, on every rank
            self.comm_s += time.perf_counter() - start
        return partial


def split_mlps(model: nn.Module, rank: int, world: int) -> nn.Module:
    """Replace every decoder layer's MLP by this rank's ParallelMLP, in place."""
    for layer in model.model.layers:
        layer.mlp = ParallelMLP(layer.mlp, rank, world)
    return model


def split_work(config, world: int = 2, lm_head: bool = True) -> dict:
    """What the MLP-only split leaves each of `world` processes to multiply, from a
    ModelConfig: weights are counted once per pass (norms, which multiply nothing,
    are left out). lm_head=False counts a pass that stops at the last hidden state,
    as the benchmark's timed steps (forward_hidden) do.

    mlp_share_of_layer   the MLP's share of a decoder layer's weights (0.75 for SmolLM2-135M)
    mlp_share_of_model   the MLPs' share of all the model's parameters
    one_process          weights one unsplit process multiplies per token
    per_process          weights each process of the split multiplies per token
    pair_over_one        world x per_process / one_process: the split's total work
                         against one process's (1 would be a perfect split)"""
    if not (isinstance(world, int) and world >= 1):
        raise ValueError(f"world={world!r} is invalid: must be an integer >= 1")
    c = config
    attention = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    mlp = 3 * c.hidden_size * c.intermediate_size
    head = c.vocab_size * c.hidden_size if lm_head else 0
    one = c.num_hidden_layers * (attention + mlp) + head
    per_process = one - c.num_hidden_layers * mlp * (1 - 1 / world)
    return {"mlp_share_of_layer": mlp / (attention + mlp),
            "mlp_share_of_model": c.num_hidden_layers * mlp / c.num_parameters(),
            "one_process": one, "per_process": per_process, "pair_over_one": world * per_process / one}


# --------------------------------------------------------------------------- processes


def _rank_main(rank, world, port, threads, fn, args, results):
    try:
        torch.set_num_threads(threads)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        try:
            results.put((rank, "ok", fn(rank, world, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001  the parent reports it; a child must not hang the others silently
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(fn, world: int = 2, args: tuple = (), threads: int = 1, timeout_s: float = 600.0) -> list:
    """Run fn(rank, world, *args) in `world` fresh processes joined by a gloo
    process group on 127.0.0.1 (a free port, so two runs can share a machine);
    return each rank's result, in rank order. fn must be importable (a module's
    top-level function), since the processes are spawned, not forked."""
    if not (isinstance(world, int) and world >= 1):
        raise ValueError(f"world={world!r} is invalid: must be an integer >= 1")
    ctx = multiprocessing.get_context("spawn")  # fork would copy this process's torch threads and locks
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, threads, fn, args, results)) for r in range(world)]
    for p in procs:
        p.start()
    out, deadline = {}, time.monotonic() + timeout_s
    try:
        while len(out) < world:
            rank, status, value = results.get(timeout=max(1.0, deadline - time.monotonic()))
            if status != "ok":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    return [out[r] for r in range(world)]


# --------------------------------------------------------------------------- measuring


def time_allreduce(nbytes: int, repeats: int = 50) -> float:
    """Median seconds of one all-reduce of `nbytes` (float32) on this rank's group.
    A barrier before each keeps one rank's late start out of the other's time."""
    x = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
    dist.all_reduce(x)  # warm-up: the first call sets up the connections
    times = []
    for _ in range(repeats):
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def fit_ring(nbytes, seconds, n: int, name: str = "measured") -> Link:
    """The ring model's link, fitted by least squares to measured all-reduces.

    hardware.allreduce_time says t = 2(n-1) * (alpha + nbytes / n / bandwidth):
    a straight line in nbytes with intercept 2(n-1) alpha and slope 2(n-1) / (n bandwidth).
    Fitting that line gives alpha (the latency of one ring step) and the bandwidth."""
    if n < 2:
        raise ValueError(f"n={n} is invalid: an all-reduce needs at least 2 processes")
    nbytes, seconds = np.asarray(nbytes, float), np.asarray(seconds, float)
    if len(nbytes) < 2 or len(set(nbytes)) < 2:
        raise ValueError("nbytes: need at least two different message sizes to fit a line")
    # Weighted by 1/seconds: each size's relative error counts alike, so the
    # microsecond latencies of small messages are not drowned by the large ones.
    slope, intercept = np.polyfit(nbytes, seconds, 1, w=1 / seconds)
    steps = 2 * (n - 1)
    return Link(name, bandwidth=steps / (n * slope), latency=max(intercept, 0.0) / steps)


def allreduce_sweep(rank: int, world: int, sizes) -> list[float]:
    """(In each rank) the median all-reduce time for every message size, in bytes."""
    return [time_allreduce(int(n), repeats=100 if n <= 1 << 16 else 20) for n in sizes]


def _load(folder):
    from tinyinfer.weights import load_model

    torch.manual_seed(0)
    return load_model(folder, torch.float32, torch.device("cpu"))


def hidden_states(rank: int, world: int, folder, token_ids: list[int]) -> np.ndarray:
    """(In each rank) the model's hidden states [T, C] for one prefill of
    token_ids, with the MLPs split over the ranks (world 1: not split)."""
    from tinyinfer.forward import forward_hidden

    model = split_mlps(_load(folder), rank, world) if world > 1 else _load(folder)
    return forward_hidden(model, token_ids).float().numpy()


def _best_s(fn, repeats: int) -> float:
    """The fastest of `repeats` runs. On a shared machine another program can take a
    core in the middle of a run (and a 2-thread step then waits for its second
    thread); the fastest run is the one least disturbed, the same for every setup."""
    fn()  # warm-up: first calls allocate and pick kernels
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def step_times(rank: int, world: int, folder, lengths, repeats: int = 5) -> dict:
    """(In each rank) the best seconds of one forward pass over T tokens, for each
    T in lengths; with world 1 also the MLPs' share of it (all layers' MLPs run
    alone on the same shape), which the cost model halves; with world > 1 also the
    seconds the fastest pass spent in its all-reduces (ParallelMLP.comm_s)."""
    from tinyinfer.forward import forward_hidden

    model = _load(folder)
    mlps = [layer.mlp for layer in model.model.layers]
    if world > 1:
        split_mlps(model, rank, world)
    out = {"threads": torch.get_num_threads(), "step_s": {}, "mlp_s": {}, "comm_s": {}}
    gen = torch.Generator().manual_seed(0)
    for t in lengths:
        ids = torch.randint(0, model.config.vocab_size, (t,), generator=gen).tolist()
        if world > 1:
            dist.barrier()  # both ranks start each length together
            out["step_s"][t], out["comm_s"][t] = _best_split_step(model, ids, repeats)
        else:
            out["step_s"][t] = _best_s(lambda: forward_hidden(model, ids), repeats)
            x = torch.randn(1, t, model.config.hidden_size, generator=gen)
            with torch.no_grad():
                out["mlp_s"][t] = _best_s(lambda: [m(x) for m in mlps], repeats)
    return out


def _best_split_step(model, ids, repeats: int) -> tuple[float, float]:
    """(seconds, seconds in all-reduces) of the fastest of `repeats` split passes."""
    from tinyinfer.forward import forward_hidden

    forward_hidden(model, ids)  # warm-up
    runs = []
    for _ in range(repeats):
        for layer in model.model.layers:
            layer.mlp.comm_s = 0.0
        start = time.perf_counter()
        forward_hidden(model, ids)
        runs.append((time.perf_counter() - start, sum(layer.mlp.comm_s for layer in model.model.layers)))
    return min(runs)
