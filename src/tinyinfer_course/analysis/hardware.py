"""How fast this machine moves bytes and does arithmetic, and what that predicts
for a forward step of the model: the roofline model.

A step of the model has to do some arithmetic (FLOPs) and move some bytes
(weights and KV cache out of memory). A chip can do at most `peak_flops` FLOPs
per second and read at most `bandwidth` bytes per second, so the step takes at
least

    max(flops / peak_flops, bytes / bandwidth)

seconds. Which term wins depends on the step's arithmetic intensity, FLOPs per
byte. Prefill does hundreds of FLOPs per byte of weights (every weight is used
once per prompt token); decode at batch 1 does about two FLOPs per weight it
reads, so it waits on memory.

    roof = Roofline.measure("cpu", torch.float32)   # about a second
    print(roof)
    cost = forward_cost(llm.model.config, batch=1, context=512, bytes_per_param=4)
    print(cost, cost.time(roof))                    # a lower bound, in seconds

The micro-benchmarks report the best of a few short runs: noise (other
programs, a clock ramping up) only ever makes a run slower.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from tinyinfer.config import ModelConfig, kv_bytes_per_token

# ------------------------------------------------------------------ measuring


def best_time(fn: Callable[[], object], device: str | torch.device = "cpu", repeats: int = 3) -> float:
    """Fastest of `repeats` timed calls of fn, in seconds, after one warm-up call.

    A GPU runs work asynchronously: the Python call returns before the kernel has
    finished, so on CUDA we time with events recorded on the GPU's own stream and
    wait for them, instead of reading the host's clock."""
    device = torch.device(device)
    fn()  # warm-up: first calls pay for allocation, kernel selection, caches
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3  # elapsed_time is in ms
        else:
            t = time.perf_counter()
            fn()
            seconds = time.perf_counter() - t
        best = min(best, seconds)
    return best


def measure_bandwidth(device: str | torch.device = "cpu", nbytes: int | None = None, repeats: int = 10) -> float:
    """Memory read bandwidth in bytes per second, as torch sees it.

    Summing a tensor reads every byte once and writes a single number, so the
    time is almost all reading. The tensor must be much larger than the caches,
    or we would time the cache instead: a GPU's L2 holds tens of MB, and some
    server CPUs have hundreds of MB of L3, hence 1 GiB by default."""
    device = torch.device(device)
    if nbytes is None:
        nbytes = 2**30
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    return x.numel() * 4 / best_time(x.sum, device, repeats)


def measure_matmul_flops(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                         n: int | None = None, repeats: int = 5) -> float:
    """Arithmetic throughput in FLOP/s: an n x n by n x n matrix product.

    That product does 2*n**3 FLOPs (n**3 multiply-adds) on 3*n**2 values, so for
    large n it is limited by arithmetic, not memory: about the best a real
    workload can hope for with this dtype on this device."""
    device = torch.device(device)
    if n is None:
        n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return 2 * n**3 / best_time(lambda: a @ b, device, repeats)


# ------------------------------------------------------------------ the roofline


@dataclass(frozen=True)
class Roofline:
    """The roofline model of one chip: a compute roof and a memory slope.

    A kernel that does `intensity` FLOPs per byte it moves can reach at most
    min(peak_flops, intensity * bandwidth) FLOP/s. Below the ridge point it is
    memory-bound (the slope), above it compute-bound (the flat roof)."""

    peak_flops: float  # FLOP/s
    bandwidth: float  # bytes/s
    name: str = ""

    @classmethod
    def measure(cls, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> "Roofline":
        """This machine's roofline, from the two micro-benchmarks above."""
        device = torch.device(device)
        name = f"{device.type} {str(dtype).removeprefix('torch.')}"
        return cls(measure_matmul_flops(device, dtype), measure_bandwidth(device), name)

    @property
    def ridge_point(self) -> float:
        """The intensity (FLOP/byte) at which memory and arithmetic take equally long."""
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity):
        """The most FLOP/s a kernel of this intensity can reach: a float for a
        number, an array for an array (to draw the roofline)."""
        roof = np.minimum(self.peak_flops, np.asarray(intensity, dtype=float) * self.bandwidth)
        return float(roof) if roof.ndim == 0 else roof

    def bound(self, intensity: float) -> str:
        return "memory" if intensity < self.ridge_point else "compute"

    def time(self, flops: float, nbytes: float) -> float:
        """A lower bound on the seconds for work that does `flops` and moves `nbytes`."""
        return max(flops / self.peak_flops, nbytes / self.bandwidth)

    def __str__(self) -> str:
        label = f" ({self.name})" if self.name else ""
        return (f"Roofline{label}: peak {format_flops(self.peak_flops)}, bandwidth "
                f"{format_bandwidth(self.bandwidth)}, ridge point {self.ridge_point:.1f} FLOP/byte")

    __repr__ = __str__


# ------------------------------------------------------------------ the model's cost per step


@dataclass(frozen=True)
class StepCost:
    """The arithmetic and the memory traffic of one forward step."""

    flops: float
    nbytes: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity: FLOPs per byte moved."""
        return self.flops / self.nbytes

    def time(self, roofline: Roofline) -> float:
        """The roofline's lower bound on this step's time, in seconds."""
        return roofline.time(self.flops, self.nbytes)

    def __str__(self) -> str:
        return (f"StepCost({self.flops / 1e9:,.2f} GFLOP, {self.nbytes / 1e9:,.3f} GB moved, "
                f"intensity {self.intensity:,.1f} FLOP/byte)")

    __repr__ = __str__


def forward_cost(model: ModelConfig | float, batch: int = 1, new_tokens: int = 1, context: int = 0,
                 bytes_per_param: float = 2, kv_bytes_per_value: float | None = None,
                 kv_token_bytes: float = 0) -> StepCost:
    """FLOPs and bytes of one forward step: `new_tokens` tokens for each of
    `batch` sequences, each with `context` positions already in its KV cache.
    Decode is new_tokens=1; a prefill of a T-token prompt is new_tokens=T, context=0.

    `model` is a ModelConfig, or just a parameter count (then pass the KV
    cache's bytes per token as kv_token_bytes; attention's own FLOPs are left out).

    Bytes: every weight is read once per step, however many tokens share it,
    plus the KV cache: the `context` cached positions are read and the new ones
    written, for every sequence. Activations are left out (small next to the
    weights at the batch sizes that matter here).

    FLOPs: each weight takes part in one multiply and one add per token, 2 per
    parameter per token. With a ModelConfig we are more careful: the input
    embedding is a lookup (no arithmetic), only the last position of each
    sequence goes through the LM head (as in engines), and attention adds
    4 * head_dim FLOPs per layer, query head, and (query, visible key) pair."""
    if not isinstance(model, ModelConfig):
        params = float(model)
        flops = 2 * params * batch * new_tokens
        weight_bytes = params * bytes_per_param
    else:
        c = model
        head = c.vocab_size * c.hidden_size
        # num_parameters() counts a tied embedding once, as the LM head; an untied
        # input embedding is only looked up (one row per token), so it is not read whole.
        weights = c.num_parameters() - (0 if c.tie_word_embeddings else head)
        body = weights - head
        # (query, key) pairs: causal, so new token t sees the context plus t + 1 keys
        pairs = new_tokens * context + new_tokens * (new_tokens + 1) / 2
        attention = 4 * c.head_dim * c.num_attention_heads * c.num_hidden_layers * pairs
        flops = batch * (2 * body * new_tokens + 2 * head + attention)
        weight_bytes = weights * bytes_per_param
        kv_value = bytes_per_param if kv_bytes_per_value is None else kv_bytes_per_value
        kv_token_bytes = kv_bytes_per_token(c, kv_value)
    kv_bytes = batch * (context + new_tokens) * kv_token_bytes
    return StepCost(flops, weight_bytes + kv_bytes)


def predict_step_time(model: ModelConfig | float, roofline: Roofline, batch: int = 1, context: int = 0,
                      new_tokens: int = 1, **kw) -> float:
    """The roofline's lower bound, in seconds, on one forward step (a decode step
    by default). Keyword arguments go to forward_cost."""
    return forward_cost(model, batch, new_tokens, context, **kw).time(roofline)


# ------------------------------------------------------------------ the textbook's matrix product


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an [m, k] @ [k, n] product: m*n outputs, each k multiply-adds."""
    return 2 * m * n * k


def matmul_bytes(m: int, n: int, k: int, bytes_per_value: float) -> float:
    """Bytes it must move at least: read both inputs once, write the output once."""
    return (m * k + k * n + m * n) * bytes_per_value


def arithmetic_intensity(m: int, n: int, k: int, bytes_per_value: float) -> float:
    """FLOPs per byte of an [m, k] @ [k, n] product. With m = 1 (one token
    through a weight matrix: a matrix-vector product) it is about
    2 / bytes_per_value whatever the size; with m = n = k it grows like n."""
    return matmul_flops(m, n, k) / matmul_bytes(m, n, k, bytes_per_value)


# ------------------------------------------------------------------ when a decode step turns compute-bound


def critical_batch(cost_at: Callable[[int], StepCost], roofline: Roofline, max_batch: int = 1_000_000) -> int | None:
    """The smallest batch whose step reaches the ridge point (compute-bound),
    or None if no batch up to max_batch does. `cost_at(batch)` is the step's
    StepCost: `lambda b: forward_cost(config, batch=b, context=4096)`.

    A decode step's intensity grows with the batch (the weights are read once
    for all of it) but levels off: every sequence adds its own FLOPs and, with a
    context, its own KV-cache bytes, so the intensity can never exceed a
    sequence's FLOPs over its KV bytes. Where that limit is below the ridge, no
    batch makes the step compute-bound. Intensity only grows with the batch, so
    a bisection finds the first batch that reaches the ridge."""
    if not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch={max_batch!r} is invalid: must be an integer >= 1")
    ridge = roofline.ridge_point
    if cost_at(max_batch).intensity < ridge:
        return None
    low, high = 1, max_batch  # cost_at(high) reaches the ridge
    while low < high:
        mid = (low + high) // 2
        if cost_at(mid).intensity >= ridge:
            high = mid
        else:
            low = mid + 1
    return low


def decode_attention_cost(model: ModelConfig, batch: int = 1, context: int = 0,
                          kv_bytes_per_value: float = 2) -> StepCost:
    """The attention part alone of a decode step (forward_cost's attention FLOPs
    and its KV-cache bytes): each of `batch` sequences reads its own `context`
    cached positions and writes one, and every query head does 4 x head_dim
    FLOPs per visible key (scores, then the weighted sum of values).

    Per sequence, the FLOPs and the bytes both grow with the context, and
    nothing is shared between sequences, so the intensity is
    2 x (query heads per KV head) / kv_bytes_per_value, whatever the batch or
    the context: 1 FLOP per byte for multi-head attention in 16-bit numbers."""
    c = model
    visible = context + 1
    flops = batch * 4 * c.head_dim * c.num_attention_heads * c.num_hidden_layers * visible
    return StepCost(flops, batch * visible * kv_bytes_per_token(c, kv_bytes_per_value))


# ------------------------------------------------------------------ printing


def _si(value: float, unit: str, prefixes: str) -> str:
    """Three significant digits with the largest decimal prefix that fits."""
    scale, prefix = 1.0, ""
    for p in prefixes:
        if abs(value) >= 1000.0 ** ("KMGT".index(p) + 1):
            scale, prefix = 1000.0 ** ("KMGT".index(p) + 1), p
    v = value / scale
    return f"{v:.3g} {prefix}{unit}" if abs(v) < 1000 else f"{v:,.0f} {prefix}{unit}"


def format_bandwidth(bytes_per_s: float) -> str:
    """'33.1 GB/s' (decimal units, as memory bandwidth is quoted)."""
    return _si(bytes_per_s, "B/s", "KMGT")


def format_flops(flops_per_s: float) -> str:
    """'250 GFLOP/s' or '989 TFLOP/s'."""
    return _si(flops_per_s, "FLOP/s", "GT")


# ------------------------------------------------------------------ chips from datasheets
#
# Published peak figures (vendor datasheets, per GPU, SXM boards). Peaks, not
# what a real kernel reaches: chapter 4 measures how far below the peak real
# code runs. Dense BF16 arithmetic is half the "with sparsity" figure that
# datasheets print first.

CHIP_SOURCES = {
    "H100 SXM": "https://www.nvidia.com/en-us/data-center/h100/ "
                "(80 GB HBM3, 3.35 TB/s, 1,979 TFLOP/s BF16 with sparsity)",
    "H200 SXM": "https://www.nvidia.com/en-us/data-center/h200/ "
                "(141 GB HBM3e, 4.8 TB/s, 1,979 TFLOP/s BF16 with sparsity)",
    "B200 (HGX/DGX)": "https://www.nvidia.com/en-us/data-center/dgx-b200/ (8 GPUs: 1,440 GB HBM3e, 64 TB/s; "
                      "HGX B200: 4.5 PFLOP/s FP16/BF16 with sparsity per GPU)",
}


@dataclass(frozen=True)
class Chip:
    """One accelerator's datasheet: memory capacity, and its roofline."""

    name: str
    memory_bytes: float
    roofline: Roofline


CHIPS = {
    "H100 SXM": Chip("H100 SXM", 80e9, Roofline(989e12, 3.35e12, "H100 SXM, BF16 dense")),
    "H200 SXM": Chip("H200 SXM", 141e9, Roofline(989e12, 4.8e12, "H200 SXM, BF16 dense")),
    "B200 (HGX/DGX)": Chip("B200 (HGX/DGX)", 180e9, Roofline(2250e12, 8e12, "B200, BF16 dense")),
}


# ------------------------------------------------------------------ tensor parallelism: one cost model


@dataclass(frozen=True)
class Link:
    """A connection between GPUs: bandwidth in one direction, and the fixed
    latency that every step of a collective pays (launch, synchronization, wire)."""

    name: str
    bandwidth: float  # bytes/s, one direction, per GPU
    latency: float  # seconds per step of an all-reduce


# Assumed round numbers of the right order for three kinds of connection, not measurements.
LINKS = {
    "nvlink": Link("GPU-to-GPU links in one server (NVLink-class)", 450e9, 3e-6),
    "pcie": Link("PCIe", 25e9, 10e-6),
    "network": Link("100 Gbit/s network between servers", 12.5e9, 20e-6),
}


def allreduce_time(nbytes: float, n: int, link: Link) -> float:
    """Seconds to sum an `nbytes` message across `n` GPUs with a ring all-reduce.

    The ring takes 2(n - 1) steps (n - 1 to reduce, n - 1 to share the result);
    in each, every GPU sends nbytes / n to its neighbour and pays the link's
    latency once. So the bytes each GPU sends, 2(n - 1)/n x nbytes, hardly grow
    with n, but the latency term grows in proportion to n.

    Caveat: this is the textbook ring. Collective libraries (NCCL, and vLLM's
    custom all-reduce) pick other algorithms for the small messages of decode:
    trees, which take about 2 log2(n) steps, or a "one-shot" exchange in which
    every GPU reads the others' data at once over an NVSwitch. Measured
    all-reduce latency therefore grows much more slowly with n than 2(n - 1)
    steps, so read this model's growth with n as pessimistic; its lesson, that
    the latency of many small all-reduces caps tensor parallelism's speed-up and
    slow links reverse it, holds either way."""
    if n < 1:
        raise ValueError(f"n={n} is invalid: the number of GPUs must be at least 1")
    if n == 1:
        return 0.0
    return 2 * (n - 1) * (link.latency + nbytes / n / link.bandwidth)


@dataclass(frozen=True)
class PipelineParallelStep:
    """One decode step split over n GPUs by layers (pipeline parallelism):
    each GPU (a stage) holds 1/n of the layers and passes its activations on."""

    n: int
    stage: float  # seconds of one stage's share of the step
    hop: float  # seconds to send a micro-batch's activations to the next stage

    @property
    def latency(self) -> float:
        """Seconds from a token entering the first stage to leaving the last: it
        passes every stage in turn, so splitting by layers saves it no time."""
        return self.n * self.stage + (self.n - 1) * self.hop

    @property
    def interval(self) -> float:
        """Seconds between two micro-batches leaving the last stage, once n of
        them are in flight (every stage busy: no bubble)."""
        return self.stage + self.hop


def pipeline_parallel_step(params: float, hidden_size: int, n: int, link: Link, roofline: Roofline,
                           batch: int = 1, bytes_per_param: float = 2,
                           activation_bytes: float = 2) -> PipelineParallelStep:
    """The same assumptions as tensor_parallel_step, split by layers instead:
    each stage reads 1/n of the weights (its share of the roofline bound on the
    step) and sends batch x hidden_size activations to the next stage once, a
    point-to-point transfer (latency + bytes / bandwidth) instead of 2 x layers
    all-reduces. Throughput needs n micro-batches in flight; a single one
    leaves n - 1 of the n stages idle (the pipeline's bubble)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} is invalid: the number of stages must be an integer >= 1")
    stage = forward_cost(params, batch, bytes_per_param=bytes_per_param).time(roofline) / n
    hop = 0.0 if n == 1 else link.latency + batch * hidden_size * activation_bytes / link.bandwidth
    return PipelineParallelStep(n, stage, hop)


@dataclass(frozen=True)
class TensorParallelStep:
    """Seconds of one forward step split over n GPUs: each GPU's share of the
    roofline time, and the all-reduces between them."""

    n: int
    compute: float
    communication: float

    @property
    def total(self) -> float:
        return self.compute + self.communication


def tensor_parallel_step(params: float, num_layers: int, hidden_size: int, n: int, link: Link,
                         roofline: Roofline, batch: int = 1, new_tokens: int = 1,
                         bytes_per_param: float = 2, activation_bytes: float = 2) -> TensorParallelStep:
    """The course's one cost model of tensor parallelism (Megatron-style).

    Assumptions, all stated:
    - every weight matrix is cut into n equal slices, so each GPU reads 1/n of
      the weights and does 1/n of the arithmetic: its share of the step is the
      roofline's bound on the whole step (`forward_cost(...).time(roofline)`)
      divided by n; the KV cache and activations are left out, as in forward_cost;
    - each layer ends its attention block and its MLP with an all-reduce of the
      activations, batch x new_tokens x hidden_size values of `activation_bytes`
      each: 2 x num_layers all-reduces per step, each a ring (`allreduce_time`);
    - compute and communication do not overlap (engines overlap some of it).
    See allreduce_time for how real collectives differ from the ring."""
    compute = forward_cost(params, batch, new_tokens, bytes_per_param=bytes_per_param).time(roofline) / n
    message = batch * new_tokens * hidden_size * activation_bytes
    return TensorParallelStep(n, compute, 2 * num_layers * allreduce_time(message, n, link))


def pipeline_bubble(stages: int, micro_batches: int) -> float:
    """The share of time each stage of a pipeline sits idle: (p - 1) / (m + p - 1).

    With p stages (each GPU a block of layers) and the batch cut into m
    micro-batches, the last stage starts only after the first micro-batch has
    passed the p - 1 stages before it, and the first stage has nothing to do
    while the last micro-batch finishes downstream. A pass takes m + p - 1
    stage-times, of which each stage works m. More micro-batches shrink the bubble;
    one request decoding alone (m = 1) leaves every stage idle (p - 1) / p of the time."""
    if not (isinstance(stages, int) and stages >= 1):
        raise ValueError(f"stages={stages!r} is invalid: must be an integer >= 1")
    if not (isinstance(micro_batches, int) and micro_batches >= 1):
        raise ValueError(f"micro_batches={micro_batches!r} is invalid: must be an integer >= 1")
    return (stages - 1) / (micro_batches + stages - 1)
