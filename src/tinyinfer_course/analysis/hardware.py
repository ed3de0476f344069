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
    step = decode_step_time(llm.model.config, roof, batch=8, context=512, bytes_per_param=4)
    print(step)                                     # the same step, operation by operation

`forward_cost` counts a whole step's FLOPs and bytes: the right tool to place a
step on the roofline, and to count its work. For how long a decode step takes,
the worked problems of every chapter use one model, `decode_step_time`: the
weights' matrix products and attention each on their own roofline, their times
added.

The micro-benchmarks report the best of a few short runs: noise (other
programs, a clock ramping up) only ever makes a run slower.
"""
from __future__ import annotations

import math
import numbers
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
    4 * head_dim FLOPs per layer, query head, and (query, visible key) pair.

    These are the whole step's totals. `.time(roofline)` puts them on one
    roofline, as if the step were one kernel: right where one operation
    dominates (a prefill; a decode step with no cache), an underestimate where
    the weights' products and attention sit on different sides of the ridge.
    For a step's time the worked problems use `decode_step_time`, which takes
    each operation on its own roofline."""
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


# ------------------------------------------------------------------ the step's time, operation by operation


def _count(value, name: str, low: int) -> int:
    """value as an int (numpy integers included), or a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name}={value!r} is invalid: must be an integer >= {low}")
    return int(value)


@dataclass(frozen=True)
class OpTime:
    """One operation of a step on its own roofline: the seconds its arithmetic
    takes at the peak and the seconds its bytes take at full bandwidth. The
    operation takes the larger of the two; the other hides under it."""

    compute_s: float
    memory_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        """'compute' or 'memory': which of the two sets the operation's time."""
        return "compute" if self.compute_s >= self.memory_s and self.compute_s > 0 else "memory"

    def __str__(self) -> str:
        return f"{self.seconds * 1e3:,.2f} ms, {self.bound}-bound"


@dataclass(frozen=True)
class StepTime:
    """Seconds of one forward step, operation by operation (see decode_step_time).

    weights: the matrix products with the weights every token goes through;
    experts: the routed experts' products of a mixture-of-experts model (zero for
    a dense one); attention: each sequence's scores and weighted sum over its own
    KV cache. The step runs them one after another, so their times add."""

    weights: OpTime
    attention: OpTime
    experts: OpTime = OpTime(0.0, 0.0)

    @property
    def total(self) -> float:
        return self.weights.seconds + self.experts.seconds + self.attention.seconds

    def __str__(self) -> str:
        parts = [f"weights {self.weights}"]
        if self.experts.seconds:
            parts.append(f"experts {self.experts}")
        if self.attention.seconds or not self.experts.seconds:
            parts.append(f"attention {self.attention}")
        return f"StepTime({self.total * 1e3:,.2f} ms: " + "; ".join(parts) + ")"

    __repr__ = __str__


def decode_step_time(model: ModelConfig | float, roofline: Roofline, batch: int = 1, context: int = 0,
                     new_tokens: int = 1, bytes_per_param: float = 2, kv_bytes_per_value: float | None = None,
                     kv_token_bytes: float = 0) -> StepTime:
    """The course's one step-time model: a lower bound on one decode step, each
    operation on its own roofline, as in the scaling book's inference chapter:

        T = B x (KV bytes per sequence) / bandwidth + max(2 B P / peak, P x bytes / bandwidth)

    - The weights' matrix products do 2 FLOPs per parameter per sequence and read
      each weight once for the whole batch: max(2 B P / peak, P x bytes_per_param /
      bandwidth). They turn compute-bound at B* = ridge x bytes_per_param / 2
      (`weights_critical_batch`), whatever the context.
    - Attention is a separate kernel: each of the B sequences reads its own cache
      (`context` positions) and writes its new one, and does 4 x head_dim FLOPs per
      query head and visible key. Nothing is shared between sequences, so batching
      never amortises it; with grouped-query attention its intensity (about twice
      the query heads per KV head over bytes per value) is far below any GPU's
      ridge, so it is memory-bound and its FLOPs hide under its reads. (It still
      gets its own max: MLA's shared latent brings it near the ridge.)

    Summing a whole step's FLOPs and bytes into one intensity instead (`forward_cost`)
    mixes the two and makes the critical batch seem to move with the context.

    `model` is a ModelConfig, or a parameter count (then the cache's bytes per token
    are kv_token_bytes, and attention's FLOPs are left out). new_tokens > 1 prices a
    prefill (or a chunk of one) by the same rule: new_tokens tokens per sequence, the
    LM head on the last one only. Activations, norms and launches are left out."""
    batch, context, new_tokens = _count(batch, "batch", 1), _count(context, "context", 0), \
        _count(new_tokens, "new_tokens", 1)
    if not isinstance(model, ModelConfig):
        params = float(model)
        product_flops = 2 * params * batch * new_tokens
        weight_bytes = params * bytes_per_param
        attention_flops = 0.0
    else:
        c = model
        head = c.vocab_size * c.hidden_size
        weights = c.num_parameters() - (0 if c.tie_word_embeddings else head)  # as in forward_cost
        product_flops = batch * (2 * (weights - head) * new_tokens + 2 * head)
        weight_bytes = weights * bytes_per_param
        pairs = new_tokens * context + new_tokens * (new_tokens + 1) / 2
        attention_flops = batch * 4 * c.head_dim * c.num_attention_heads * c.num_hidden_layers * pairs
        kv_value = bytes_per_param if kv_bytes_per_value is None else kv_bytes_per_value
        kv_token_bytes = kv_bytes_per_token(c, kv_value)
    kv_bytes = batch * (context + new_tokens) * kv_token_bytes
    peak, bandwidth = roofline.peak_flops, roofline.bandwidth
    return StepTime(weights=OpTime(product_flops / peak, weight_bytes / bandwidth),
                    attention=OpTime(attention_flops / peak, kv_bytes / bandwidth))


def weights_critical_batch(roofline: Roofline, bytes_per_param: float = 2, tokens_per_sequence: float = 1) -> int:
    """The smallest batch at which a decode step's weight matrix products turn
    compute-bound: each weight does 2 FLOPs per token and is read once per step,
    so their intensity is 2 B / bytes_per_param and B* = ridge x bytes_per_param / 2,
    rounded up. The context is not in it: the cache belongs to attention.

    tokens_per_sequence scales the tokens a weight sees per sequence: an MoE
    expert sees top_k / num_experts of the batch, so its B* is E / k times larger."""
    return math.ceil(roofline.ridge_point * bytes_per_param / 2 / tokens_per_sequence)


def largest_batch_within(step_target_s: float, model: ModelConfig | float, roofline: Roofline, context: int = 0,
                         **kw) -> int:
    """The largest batch whose decode step (decode_step_time) takes at most
    step_target_s, or 0 if even one sequence misses it. The step is linear in the
    batch on each side of B*:

        T(B) = B x a + P x bytes / bandwidth   below B* (the products wait for the weights)
        T(B) = B x (a + 2P / peak)             above it  (the products wait for arithmetic)

    with a one sequence's attention time, so the target gives B in one division.
    Keyword arguments go to decode_step_time."""
    one = decode_step_time(model, roofline, 1, context, **kw)
    per_seq, fixed = one.attention.seconds, one.weights.memory_s
    per_seq_compute = per_seq + one.weights.compute_s
    memory_side = (step_target_s - fixed) / per_seq if per_seq > 0 else math.inf
    compute_side = step_target_s / per_seq_compute
    # below B* the weights' reads set the products' time; past it, their arithmetic
    b = memory_side if one.weights.compute_s * memory_side <= fixed else compute_side
    if not math.isfinite(b):
        raise ValueError("no batch limit: the step does not grow with the batch (no cache and no arithmetic)")
    b = max(0, math.floor(b))
    # guard the floor against rounding: the answer meets the target and the next batch does not
    while b > 0 and decode_step_time(model, roofline, b, context, **kw).total > step_target_s:
        b -= 1
    while decode_step_time(model, roofline, b + 1, context, **kw).total <= step_target_s:
        b += 1
    return b


# ------------------------------------------------------------------ how close a measured step came: MFU and MBU


def _rate(amount: float, seconds: float, name: str) -> float:
    if not seconds > 0:
        raise ValueError(f"seconds={seconds!r} is invalid: a measured time must be > 0")
    if amount < 0:
        raise ValueError(f"{name}={amount!r} is invalid: must be >= 0")
    return amount / seconds


def mfu(flops: float, seconds: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: the FLOPs the model's forward needs (forward_cost's
    count: 2 per parameter per token, plus attention), per second of the measured
    step, as a share of the chip's peak FLOP/s.

    It counts the model's FLOPs, not the kernels': work a kernel repeats or wastes
    (padding, recomputation) does not raise it. It nears 1 only where the step is
    compute-bound (a prefill, a decode batch past B*); a batch-1 decode step stays
    far below 1 even when it runs as fast as the memory allows."""
    return _rate(flops, seconds, "flops") / peak_flops


def mbu(nbytes: float, seconds: float, bandwidth: float) -> float:
    """Model bandwidth utilisation: the bytes the step must read (forward_cost's
    count: every weight once, and each sequence's KV cache), per second of the
    measured step, as a share of the memory bandwidth.

    The measure for a memory-bound step such as decode: 1 means the step streamed
    its bytes at full speed and did nothing else. Bytes a kernel reads more than
    once (a copy of the cache, a re-read tile) do not count: the model did not
    need them, so they lower MBU instead of raising it."""
    return _rate(nbytes, seconds, "nbytes") / bandwidth


@dataclass(frozen=True)
class Utilisation:
    """MFU and MBU of one measured step (see utilisation)."""

    mfu: float
    mbu: float

    def __str__(self) -> str:
        return f"MFU {self.mfu:.2%}, MBU {self.mbu:.1%}"

    __repr__ = __str__


def utilisation(cost: StepCost, seconds: float, roofline: Roofline) -> Utilisation:
    """MFU and MBU of a step that needs `cost` (forward_cost) and took `seconds`,
    against a chip's peaks (Roofline.measure for this machine, CHIPS for a datasheet).

    A step exactly on the roofline has max(MFU, MBU) = 1 (roofline.time is the
    larger of the two times), and no step can beat that: a figure above 1 means
    the peaks are wrong (a bandwidth measured low, weights that sat in a cache).
    The ratio MFU / MBU is the step's intensity over the ridge point, whatever the
    time, so which of the two to watch follows from where the step sits."""
    return Utilisation(mfu(cost.flops, seconds, roofline.peak_flops), mbu(cost.nbytes, seconds, roofline.bandwidth))


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
    """The smallest batch whose aggregate intensity (all of a step's FLOPs over
    all its bytes) reaches the ridge point, or None if no batch up to max_batch
    does. `cost_at(batch)` is the step's StepCost: `lambda b: forward_cost(config, batch=b)`.

    For one operation (the weights' products alone, as with a parameter count
    and no cache) this is the batch at which it turns compute-bound:
    `weights_critical_batch` gives it in closed form. For a whole step with a
    KV cache, or an MoE step, it is only a loose bound: the aggregate mixes
    operations with different rooflines, and at the batch it finds no kernel
    need sit at the ridge (chapter 4's and chapter 7's worked problems).

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
    and its KV-cache bytes; decode_step_time's attention term): each of `batch` sequences reads its own `context`
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


def mla_decode_attention_cost(num_heads: int, kv_lora_rank: int, qk_rope_head_dim: int, num_layers: int,
                              batch: int = 1, context: int = 0, kv_bytes_per_value: float = 2) -> StepCost:
    """Decode attention of multi-head latent attention (MLA: DeepSeek-V2 and V3)
    with its projections absorbed, as DeepSeek-V2's paper describes: the key's
    up-projection is folded into the query and the value's into the output, so
    every head attends directly to the cached vector of kv_lora_rank + qk_rope_head_dim
    numbers, which all num_heads heads share.

    Per cached position, layer and head: a score over the whole cached vector
    (2 x (kv_lora_rank + qk_rope_head_dim) FLOPs) and a weighted sum of its
    latent part (2 x kv_lora_rank). Bytes: the cached vector, read once for all
    the heads. So the intensity is about num_heads x 2 x (2 kv_lora_rank + rope)
    / ((kv_lora_rank + rope) x bytes): near 242 FLOP/byte for DeepSeek-V3 in
    16 bits, where grouped-query attention gets 2 x (query heads per KV head) / bytes."""
    visible = context + 1
    per_position = num_heads * (2 * (kv_lora_rank + qk_rope_head_dim) + 2 * kv_lora_rank)
    flops = batch * num_layers * visible * per_position
    nbytes = batch * num_layers * visible * (kv_lora_rank + qk_rope_head_dim) * kv_bytes_per_value
    return StepCost(flops, nbytes)


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


def all_to_all_bytes(tokens: float, top_k: int, hidden_size: int, ep: int, bytes_per_value: float = 2,
                     local: int = 1) -> float:
    """Bytes one device sends across a link in one direction of an MoE layer's
    exchange under expert parallelism (EP: the experts spread evenly over `ep`
    devices). Each of the device's `tokens` tokens sends its hidden vector to the
    devices of its top_k experts; under uniform routing a share local / ep of those
    copies goes to devices that do not use the link, so

        tokens x top_k x hidden_size x bytes_per_value x (ep - local) / ep.

    local = 1: only the sender's own experts are free (one fast link to all the
    others). local = 8 prices the network between servers of 8 GPUs: copies to
    the 7 others in the server take NVLink, in parallel. Each token is counted
    once per expert; engines that send a token once per device (DeepSeek's
    kernels do) move less, so this is the upper end."""
    if not (isinstance(ep, int) and ep >= 1) or not (isinstance(local, int) and 1 <= local <= ep):
        raise ValueError(f"ep={ep!r}, local={local!r} are invalid: need integers with 1 <= local <= ep")
    return tokens * top_k * hidden_size * bytes_per_value * (ep - local) / ep


def all_to_all_time(tokens: float, top_k: int, hidden_size: int, ep: int, link: Link, bytes_per_value: float = 2,
                    local: int = 1) -> float:
    """Seconds of one MoE layer's communication under expert parallelism: the
    dispatch sends each token's hidden vector to its experts' devices, and the
    combine sends the k results back, the same bytes (all_to_all_bytes). In each
    exchange every device sends and receives at once, so it takes the link's
    latency once and its bytes over the link's one-way bandwidth:

        2 x (latency + all_to_all_bytes / bandwidth)

    Unlike tensor parallelism's all-reduce, the message grows with top_k, and it is
    only the device's own tokens (a 1/ep share of the batch when attention runs
    data-parallel). Uniform routing is assumed: a device that receives more than
    its share (a popular expert) takes longer, and the step waits for it."""
    if ep == 1:
        return 0.0
    nbytes = all_to_all_bytes(tokens, top_k, hidden_size, ep, bytes_per_value, local)
    return 2 * (link.latency + nbytes / link.bandwidth)


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
    each stage reads 1/n of the weights (its share of the step's time by
    decode_step_time, weights only) and sends batch x hidden_size activations to the next stage once, a
    point-to-point transfer (latency + bytes / bandwidth) instead of 2 x layers
    all-reduces. Throughput needs n micro-batches in flight; a single one
    leaves n - 1 of the n stages idle (pipeline_bubble_steady)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} is invalid: the number of stages must be an integer >= 1")
    stage = decode_step_time(params, roofline, batch, bytes_per_param=bytes_per_param).total / n
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
      weights' products' time (`decode_step_time` given a parameter count and
      no cache) divided by n; the KV cache and activations are left out;
    - each layer ends its attention block and its MLP with an all-reduce of the
      activations, batch x new_tokens x hidden_size values of `activation_bytes`
      each: 2 x num_layers all-reduces per step, each a ring (`allreduce_time`);
    - compute and communication do not overlap (engines overlap some of it).
    See allreduce_time for how real collectives differ from the ring."""
    compute = decode_step_time(params, roofline, batch, new_tokens=new_tokens,
                               bytes_per_param=bytes_per_param).total / n
    message = batch * new_tokens * hidden_size * activation_bytes
    return TensorParallelStep(n, compute, 2 * num_layers * allreduce_time(message, n, link))


def _check_pipeline(stages, micro_batches) -> None:
    if not (isinstance(stages, int) and stages >= 1):
        raise ValueError(f"stages={stages!r} is invalid: must be an integer >= 1")
    if not (isinstance(micro_batches, int) and micro_batches >= 1):
        raise ValueError(f"micro_batches={micro_batches!r} is invalid: must be an integer >= 1")


def pipeline_bubble(stages: int, micro_batches: int) -> float:
    """The share of time each stage sits idle in ONE pass of m micro-batches
    through p stages, followed by a flush: (p - 1) / (m + p - 1).

    This is the fill-and-drain of a training step (GPipe) or of one prefill batch:
    the last stage starts only after the first micro-batch has passed the p - 1
    stages before it, and the first stage has nothing to do while the last
    micro-batch finishes downstream. A pass takes m + p - 1 stage-times, of which
    each stage works m. Continuous decode has no flush: see pipeline_bubble_steady."""
    _check_pipeline(stages, micro_batches)
    return (stages - 1) / (micro_batches + stages - 1)


def pipeline_bubble_steady(stages: int, micro_batches: int) -> float:
    """The share of time each stage sits idle in steady-state continuous decode
    with m micro-batches in flight through p stages: max(0, 1 - m / p).

    There is no flush: as soon as a micro-batch's token leaves the last stage,
    its next token can enter the first. Each micro-batch is in one stage at a
    time, so m of the p stages work at any moment; with m >= p every stage is
    busy. (The hops between stages lengthen a token's round trip, so slightly
    more than p micro-batches are needed to hide them; left out here.)"""
    _check_pipeline(stages, micro_batches)
    return max(0.0, 1 - micro_batches / stages)
