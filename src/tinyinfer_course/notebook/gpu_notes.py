"""What a lab prints about the GPU it ran on, computed from the lab's own run.

    note = gpu_notes.decode_note(device, step_s, bound_s, run=...)   # lab 4
    if note:
        print(note)

On a CPU every note is "" and measures nothing, so a CPU run of a lab prints
nothing new and its stored outputs stay as they are. On a CUDA device a note
says what the numbers mean there: how far a decode step is from the bytes ÷
bandwidth bound, and whether the step waits on kernel launches rather than on
memory (chapter 4, "On a GPU").

Launch-bound, in numbers: a GPU runs what the CPU queues for it, one kernel per
operator in an eager step. If queueing the step's kernels (launches × the cost of
one) takes most of the step's time, the GPU spends the step waiting for work, and
reading the weights faster would not help; fewer launches (fused kernels, a step
captured as a CUDA graph and replayed with one launch) would.

The measuring helpers (launch_cost_us, kernel_launches) need a CUDA device; the
note functions call them only there, and take their numbers as arguments so a
test can pass made-up ones on a CPU.
"""
from __future__ import annotations

import statistics
import time

import torch

# A step whose launching alone would take at least this share of its time is called
# launch-bound (the same threshold as the stored GPU report's, reports/gpu.py).
LAUNCH_BOUND_SHARE = 0.5


def is_cuda(device) -> bool:
    """Whether `device` is a CUDA device; "auto" is the engine's default (config.resolve_device)."""
    if device == "auto":
        from tinyinfer.config import resolve_device

        device = resolve_device("auto")
    return torch.device(device).type == "cuda"


def gpu_name(device) -> str:
    return torch.cuda.get_device_name(torch.device(device))


# ------------------------------------------------------------------ measuring (CUDA only)


def launch_cost_us(device, launches: int = 2000) -> float:
    """Microseconds per small operator from Python on `device`: a one-number add,
    issued `launches` times and waited for once. Its arithmetic is nothing, so the
    time is what every operator pays to be dispatched and queued as a kernel."""
    x = torch.zeros(1, device=device)
    x.add_(1)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(launches):
        x.add_(1)
    torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / launches * 1e6


def kernel_launches(fn) -> int:
    """How many kernels (and copies) fn() ran on the GPU, from PyTorch's profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def launches_per_step(run) -> int:
    """Kernel launches of one step, where run(n) sets up and runs n steps: run(2) less
    run(1), so whatever the setup launches (a cache, the inputs) cancels out."""
    return kernel_launches(lambda: run(2)) - kernel_launches(lambda: run(1))


# ------------------------------------------------------------------ the notes


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1e-2 else f"{seconds * 1e3:.1f} ms"


def launch_sentence(step_s: float, launches: int, launch_us: float) -> str:
    """The step against launches x a launch's cost: launch-bound or not, and why."""
    launching = launches * launch_us * 1e-6
    share = launching / step_s
    text = (f"The step launched {launches:,} kernels; at {launch_us:.1f} µs each (a one-number add, timed here), "
            f"queueing them takes {_ms(launching)}, {share:.0%} of the step, ")
    if share >= LAUNCH_BOUND_SHARE:
        return text + ("so the step is launch-bound: the GPU waits for the CPU to hand it work. Fewer, larger "
                       "kernels or a CUDA graph (one launch for the whole step) would shorten it; faster memory "
                       "would not.")
    return text + ("so the step is not launch-bound: most of it is the GPU's own work, and the bytes it reads "
                   "count again.")


def decode_note(device, step_s: float, bound_s: float, run=None, launches: int | None = None,
                launch_us: float | None = None, name: str | None = None) -> str:
    """Lab 4: a measured decode step against the bytes ÷ bandwidth bound, and whether
    it is launch-bound. run(n) runs n steps (for launches_per_step); launches,
    launch_us and name are measured on the device when not given. "" on a CPU."""
    if not is_cuda(device):
        return ""
    if launches is None and run is not None:
        launches = launches_per_step(run)
    launch_us = launch_cost_us(device) if launch_us is None else launch_us
    name = name or gpu_name(device)
    text = (f"On this GPU ({name}) a decode step took {_ms(step_s)} against a bound of {_ms(bound_s)}: "
            f"{bound_s / step_s:.0%} of the bound.")
    if launches is None:
        return text + " Its kernel launches were not counted."
    return text + " " + launch_sentence(step_s, launches, launch_us)


def decode_step_times(result, batch: int) -> list[float]:
    """The durations of a replay's decode-only steps that ran exactly `batch` sequences."""
    return [s.duration for s in result.steps if s.num_prefill_tokens == 0 and s.num_decode_tokens == batch]


def batch_note(device, step_s: dict[int, float], bound_s: dict[int, float], name: str | None = None) -> str:
    """Lab 7: the batch-8 decode step against the batch-1 step, and each one's share of
    its bound. step_s and bound_s map a batch size to seconds. "" on a CPU."""
    if not is_cuda(device):
        return ""
    name = name or gpu_name(device)
    sizes = sorted(b for b in step_s if b in bound_s)
    if len(sizes) < 2:
        return f"On this GPU ({name}) there were not two batch sizes with decode-only steps to compare."
    lo, hi = sizes[0], sizes[-1]
    growth = step_s[hi] / step_s[lo]
    text = (f"On this GPU ({name}) a decode step of {hi} sequences took {_ms(step_s[hi])} against {_ms(step_s[lo])} "
            f"for {lo} ({growth:.2f} times as long, for {hi // lo} times the tokens); the bytes ÷ bandwidth bound "
            f"is {bound_s[hi] / step_s[hi]:.0%} of the step at batch {hi} and {bound_s[lo] / step_s[lo]:.0%} at "
            f"batch {lo}.")
    if growth < 1.5:
        text += (" The step hardly grew: one read of the weights (and one round of kernel launches) served every "
                 "sequence, which is why batching pays off so well on a GPU.")
    return text


def replay_batch_note(device, results: dict, config=None, bytes_per_param: float = 4,
                      bandwidth: float | None = None, name: str | None = None) -> str:
    """Lab 7: batch_note from replays ({max batch: ReplayResult}): the median decode-only
    step at batch 1 and at the largest batch that ran whole decode steps, each against
    reading the weights once at the device's measured bandwidth. `device` may be "auto"
    (the engine's default), `config` None (the packaged model's). "" on a CPU."""
    if not is_cuda(device):
        return ""
    from tinyinfer.config import resolve_device
    from ..analysis.hardware import forward_cost, measure_bandwidth

    if device == "auto":
        device = resolve_device("auto")
    if config is None:
        from tinyinfer.weights import ensure_packaged_model, read_config

        config = read_config(ensure_packaged_model())

    bandwidth = bandwidth or measure_bandwidth(device)
    step_s = {}
    for result in results.values():
        sizes = {s.num_decode_tokens for s in result.steps if s.num_prefill_tokens == 0 and s.num_decode_tokens}
        for size in (min(sizes), max(sizes)) if sizes else ():
            step_s.setdefault(size, statistics.median(decode_step_times(result, size)))
    bound_s = {b: forward_cost(config, batch=b, bytes_per_param=bytes_per_param).nbytes / bandwidth for b in step_s}
    return batch_note(device, step_s, bound_s, name)


def your_engine_note(device, yours_tok_s: float, tinyinfer_tok_s: float, yours_outside_linears: float | None = None,
                     tinyinfer_outside_linears: float | None = None, name: str | None = None) -> str:
    """Lab 11: the learner's engine against tinyinfer on the GPU. The *_outside_linears
    are the shares of each engine's time spent outside the linear layers. "" on a CPU.
    (Not the stored reports' engine_note, which says which engine code measured a report.)"""
    if not is_cuda(device):
        return ""
    name = name or gpu_name(device)
    text = (f"On this GPU ({name}) your engine wrote {yours_tok_s:.1f} tokens per second against tinyinfer's "
            f"{tinyinfer_tok_s:.1f}: {yours_tok_s / tinyinfer_tok_s:.2f} of its rate.")
    if yours_outside_linears is not None and tinyinfer_outside_linears is not None:
        text += (f" Outside the linear layers (the same modules in both) your engine spent "
                 f"{yours_outside_linears:.0%} of its time, tinyinfer {tinyinfer_outside_linears:.0%}. Nothing "
                 "waits for the GPU between the stopwatches, so on a GPU they time the CPU's side: handing each "
                 "small operator to the GPU as a kernel, which is where many small calls per layer cost most.")
    return text
