"""Weight-only quantization: INT8 and INT4 linear layers, swapped in place.

A quantized weight is stored as small integers plus a little metadata that maps
them back to real numbers:

  INT8, symmetric, per output channel (one scale per row of W):
      w ≈ scale * q,           q in -127..127,   scale = max|row| / 127
  INT4, asymmetric, group-wise (one scale and one offset per `group_size`
  consecutive weights of a row, along the input dimension):
      w ≈ scale * q + zero,    q in 0..15,       scale = (max - min) / 15, zero = min

Two INT4 codes share one byte, so a [out, in] weight becomes a uint8 tensor
[out, in/2]. INT4's "zero point" is kept as a float offset, the real value that
code 0 stands for (as llama.cpp's Q4_1 and the "tinygemm" kernels do), not as an
integer code: the grid can then start exactly at the group's minimum.

Only the weights are quantized. Activations, the KV cache, norms and (by
default) the embedding and the tied LM head keep the model's dtype. Each
forward pass de-quantizes the weight to the activation dtype and does an
ordinary matmul (the readable reference path). Where torch has a packed-weight
kernel for this device, it is used instead for decode-sized inputs (see
`kernel_available` and KERNEL_MAX_ROWS).

On a CUDA GPU: torch's INT4 kernel ("tinygemm", the one gpt-fast uses) needs
compute capability 8.0 or above (A100, H100, RTX 30 and later) and bf16
activations; INT8 has a CUDA kernel in recent torch builds, but a naive one,
so on a GPU it is timed against de-quantize + cuBLAS and used only if it is
not slower (choose_int8_cuda). Where a GPU lacks a kernel (a T4, or fp16
activations for INT4), or its kernel loses, its layers take the reference
path: the weights are de-quantized at each step, which costs time but still
saves the memory, so INT4 and INT8 are never refused. The decision is made per
device and per activation dtype, once, by a probe that also checks the
kernel's numbers against the reference path; kernel_reason() says what it chose
and why.

Like gpt-fast's `replace_linear_int8`, `quantize_model` swaps the nn.Linear
modules of the decoder layers for Int8Linear / Int4Linear in place.
"""
from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F
from torch import nn

# The choices are checked in config.py, before anything loads.
from .config import QUANT_METHODS, check_quantization
from .cpu_linear import (UPCAST_DTYPES, UPCAST_MIN_ROWS, PackedModule, bump_generation, pack_weight, packable,
                         packed_linear, plain_linear, wants_grad)
from .kv_quant import quantize_symmetric

# The nn.Linear modules inside each decoder layer (model.model.layers[i]).
LAYER_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
META_DTYPE = torch.float16  # INT4 scales and zeros: 2 bytes each, as in GGUF's Q4_1
# torch's packed CPU kernels are matrix-vector kernels: their time grows with
# every row, while de-quantize-then-matmul pays a fixed cost (expanding the whole
# weight) and then multiplies rows cheaply. So the kernels serve decode-sized
# batches, and a prompt's rows take the reference path. Where the two cross
# depends on the kernel and the activation dtype. Measured on SmolLM2's 576x3072
# layer (gate and up; 2 cores, AVX-512 EPYC), the kernel's time as a fraction of
# the reference's:
#   rows:               1     4     8    16    32    64   128
#   INT4 g32, bf16   0.04  0.07  0.09  0.18  0.35  0.63  0.98
#   INT8, bf16       0.16  0.24  0.49  0.81  1.23  1.69  2.91
#   INT4 g32, fp32   0.14  0.51  0.92  1.90  3.55  6.49  14.3
#   INT8, fp32       0.14  0.67  1.34  2.57  4.02  27.9  39.0
# The 1536x576 layer (down) crosses at about the same rows in bf16; in fp32 its
# kernels lose even at one row (1.3-2.3x). Under AVX2, INT4 bf16 at 32 rows took
# 0.13-0.61x the reference's time. Each limit below is the largest power of two
# at which the kernel clearly won (at most 0.9x) on the larger layer. (One limit
# of 16 for all sent INT4 decode steps of 17-64 sequences down the slow path,
# and fp32 prompts of 5-16 rows into a kernel 2-20x slower.)
# fp16 takes bf16's limits (the same width; not measured here). A dtype not
# listed never takes a kernel. A CUDA GPU takes the same limits; they were not
# measured there (tinygemm is made for a few rows, as these kernels are; the
# CUDA INT8 kernel is used only where it won a timing at 1 row and at its limit).
KERNEL_MAX_ROWS = {("int4", torch.bfloat16): 64, ("int4", torch.float16): 64,
                   ("int8", torch.bfloat16): 16, ("int8", torch.float16): 16,
                   ("int4", torch.float32): 4, ("int8", torch.float32): 4}


# ----------------------------------------------------------------- INT8


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row INT8: returns q (int8 [out, in]) and scale (fp32 [out]).

    -128 is left unused so the grid is symmetric: +x and -x round the same way.
    The rounding is the KV cache's (kv_quant.quantize_symmetric), along each row."""
    q, scale = quantize_symmetric(w, dim=1)
    return q, scale[:, 0]


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return q.to(dtype) * scale[:, None].to(dtype)


# ----------------------------------------------------------------- INT4


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[out, in] codes 0..15 -> uint8 [out, in/2]: column 2j in the low nibble, 2j+1 in the high."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_int4: uint8 [out, in/2] -> uint8 codes [out, in]."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)


def _fp16(x: torch.Tensor, up: bool) -> torch.Tensor:
    """Round to fp16, but never below x (up=True) or above it (up=False), so the
    stored range still covers every weight of the group."""
    y = x.to(META_DTYPE)
    wrong = y.float() < x if up else y.float() > x
    toward = torch.full_like(y, float("inf") if up else float("-inf"))
    return torch.where(wrong, torch.nextafter(y, toward), y)


def _pad_to_groups(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """Widen [out, in] to a whole number of groups by repeating the last column.

    SmolLM2's hidden size, 576, is 4.5 groups of 128, so a row's last group may
    be short. Repeating a real value leaves that group's min and max unchanged;
    the padding is dropped again and never stored."""
    pad = -x.shape[1] % group_size
    return torch.cat([x, x[:, -1:].expand(-1, pad)], dim=1) if pad else x


def quantize_int4(w: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric group-wise INT4. Returns packed (uint8 [out, in/2]), and
    scales, zeros (fp16 [out, ceil(in/group_size)]) with w ≈ scale * q + zero."""
    out, inp = w.shape
    if inp % 2:
        raise ValueError(f"INT4 packs two weights per byte: the input dimension {inp} must be even")
    g = _pad_to_groups(w.float(), group_size).reshape(out, -1, group_size)
    zeros = _fp16(g.amin(-1), up=False)  # code 0 stands for the group's minimum
    scales = _fp16(((g.amax(-1) - zeros.float()) / 15).clamp(min=2**-24), up=True)  # code 15 for its maximum
    q = torch.round((g - zeros.float()[..., None]) / scales.float()[..., None]).clamp(0, 15)
    return pack_int4(q.reshape(out, -1)[:, :inp]), scales, zeros


def dequantize_int4(packed, scales, zeros, group_size: int, dtype=torch.float32) -> torch.Tensor:
    out, inp = packed.shape[0], packed.shape[1] * 2
    q = _pad_to_groups(unpack_int4(packed), group_size).reshape(out, -1, group_size).to(dtype)
    w = q * scales[..., None].to(dtype) + zeros[..., None].to(dtype)
    return w.reshape(out, -1)[:, :inp]


# ----------------------------------------------------------------- packed kernels

_KERNEL_OK: dict = {}
_KERNEL_ERRORS: dict = {}  # kernels that exist but failed: a bug to report, not a missing feature
_KERNEL_NOTES: dict = {}  # measured choices (the CUDA INT8 kernel) and why, for kernel_reason
# torch's CUDA INT4 kernel: tensor-core instructions of compute capability 8.0, and bf16 activations only.
CUDA_INT4_CAPABILITY = (8, 0)


def device_key(device) -> str:
    """The device a kernel decision is made for: 'cpu', or one GPU ('cuda:1').
    Two GPUs of one machine may differ (an A100 beside a T4), so each gets its own."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


def cuda_capability(device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(torch.device(device))


def kernel_missing(kind: str, device, dtype) -> str | None:
    """Why this device has no packed kernel for `kind` and dtype, known before
    any probe (None: a probe decides). Only CUDA's INT4 kernel has such rules:
    a GPU below them would not fail cleanly, it would run the kernel wrongly."""
    device = torch.device(device)
    if kind != "int4" or device.type != "cuda":
        return None
    if cuda_capability(device) < CUDA_INT4_CAPABILITY:
        return "torch's CUDA INT4 kernel needs compute capability 8.0 or above"
    if dtype is not torch.bfloat16:
        return f"torch's CUDA INT4 kernel takes bf16 activations, not {str(dtype).split('.')[-1]}"
    return None


def kernel_available(kind: str, device, dtype) -> bool:
    """Does torch have a working packed-weight matmul for `kind` on this device
    and dtype, worth using? Decided once per device and dtype (ops differ across
    versions, builds and GPUs). A kernel the device cannot have (kernel_missing),
    or an op this build lacks (NotImplementedError, AttributeError), just means
    no; an op that exists but fails or computes wrong numbers also means no, so
    generation falls back to the reference path, but the failure is kept for
    kernel_error() (and tests fail on it). On a CUDA GPU the INT8 kernel must
    also be as fast as the reference path (see choose_int8_cuda); kernel_reason()
    says what was decided and why."""
    key = (kind, device_key(device), dtype)
    if key not in _KERNEL_OK:
        _KERNEL_OK[key] = _decide_kernel(kind, device, dtype, key)
    return _KERNEL_OK[key]


def _decide_kernel(kind: str, device, dtype, key) -> bool:
    """kernel_available's answer, made now; failures go to _KERNEL_ERRORS[key]."""
    if kernel_missing(kind, device, dtype) is not None:
        return False
    try:
        check_kernel_numbers(kind, device, dtype)
        if kind == "int8" and torch.device(device).type == "cuda":
            # Numbers alone are not enough here: see choose_int8_cuda.
            use, _KERNEL_NOTES[key] = choose_int8_cuda(time_int8_cuda(device, dtype))
            return use
        return True
    except (NotImplementedError, AttributeError):
        return False
    except RuntimeError as e:
        _KERNEL_ERRORS[key] = f"{type(e).__name__}: {e}"
        return False


def _probe_layer(kind: str, w: torch.Tensor, dtype) -> QuantizedLinear:
    """A quantized layer of w with its kernel layout made for dtype, directly:
    from_weight would ask kernel_available, which is what is being decided.
    use_kernel is off, so calling it takes the reference path."""
    out, inp = w.shape
    layer = Int8Linear(inp, out, use_kernel=False) if kind == "int8" else Int4Linear(inp, out, 32, use_kernel=False)
    layer.weight, layer.scales, *zeros = quantize_int8(w) if kind == "int8" else quantize_int4(w, 32)
    if zeros:
        layer.zeros = zeros[0]
    for name, tensor in layer.make_layout(dtype).items():
        setattr(layer, name, tensor)
    return layer


def check_kernel_numbers(kind: str, device, dtype) -> None:
    """Run the packed kernel once on a tiny input and compare it with the
    reference path; raise RuntimeError if they differ."""
    g = torch.Generator(device=device).manual_seed(0)  # not the global stream: the probe draws no user's numbers
    layer = _probe_layer(kind, torch.randn(64, 128, device=device, generator=g), dtype)
    x = torch.randn(2, 128, device=device, generator=g).to(dtype)
    got, want = layer._kernel_forward(x).float(), layer(x).float()
    if not (got - want).abs().max() <= 0.05 * want.abs().max():  # also False for NaN
        raise RuntimeError(f"its result differs from the reference path's by "
                           f"{(got - want).abs().max().item():.3g} (largest value {want.abs().max().item():.3g})")


# torch's CUDA INT8 kernel (`_weight_int8pack_mm`, in torch's source
# aten/src/ATen/native/cuda/int8mm.cu) is a naive one: one thread per output
# number, looping alone over the whole input dimension, in fp32, with no shared
# memory or tensor cores. On a CPU the kernels are tuned and the limits above
# were measured; on a GPU the reference path has cuBLAS, which may win even
# after writing out a bf16 copy of the weight. So on CUDA the INT8 kernel is
# timed against the reference path once, and used only if it is not slower.
# (tinygemm, the CUDA INT4 kernel, is built for decode: gpt-fast uses it.)
# The timing shape: Llama 3.2 1B's gate_proj (out 8192, in 2048), PROBE_LAYERS
# of them, so their 64 MB of int8 codes overflow the GPU's L2 cache (50 MB on an
# H100) and each weight comes from memory, as it does inside a decode step.
PROBE_SHAPE = (8192, 2048)
PROBE_LAYERS = 4


def time_int8_cuda(device, dtype, repeats: int = 5) -> dict[int, tuple[float, float]]:
    """Milliseconds of (torch's CUDA INT8 kernel, the reference path) through
    PROBE_LAYERS layers of PROBE_SHAPE, for 1 row and for the most rows the
    kernel serves (KERNEL_MAX_ROWS): the median of `repeats` rounds, after a
    warm-up round. The two paths take turns, so a change of clock speed
    slows both alike. Timed eagerly; a CUDA graph replays the same kernels."""
    g = torch.Generator(device=device).manual_seed(0)
    out, inp = PROBE_SHAPE
    layers = [_probe_layer("int8", torch.randn(out, inp, device=device, generator=g), dtype)
              for _ in range(PROBE_LAYERS)]
    times = {}
    with torch.no_grad(), torch.cuda.device(device):
        for rows in sorted({1, max(1, KERNEL_MAX_ROWS.get(("int8", dtype), 1))}):
            x = torch.randn(rows, inp, device=device, generator=g).to(dtype)
            paths = (lambda: [layer._kernel_forward(x) for layer in layers],
                     lambda: [layer(x) for layer in layers])  # use_kernel is off: the reference path
            rounds = [[_cuda_ms(path) for path in paths] for _ in range(repeats + 1)][1:]
            times[rows] = tuple(statistics.median(ms) for ms in zip(*rounds))
    return times


def _cuda_ms(fn) -> float:
    """One call of fn, in ms, timed by events on the GPU's own stream: the host's
    clock would time only the launches, as the GPU runs behind it."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def choose_int8_cuda(times: dict[int, tuple[float, float]]) -> tuple[bool, str]:
    """From time_int8_cuda's {rows: (kernel ms, reference ms)}: use the kernel?
    Yes only if it was not slower at any row count measured, since it serves
    every decode batch up to the largest. Returns the answer and why, in words."""
    slower = any(kernel > reference for kernel, reference in times.values())
    measured = "; ".join(f"{rows} row{'s' * (rows > 1)}: {kernel:.2f} ms vs {reference:.2f} ms"
                         for rows, (kernel, reference) in sorted(times.items()))
    if slower:
        return False, (f"torch's CUDA INT8 kernel was slower than de-quantize + cuBLAS here ({measured}), "
                       "so INT8 layers de-quantize, then multiply")
    return True, (f"torch's CUDA INT8 kernel was not slower than de-quantize + cuBLAS here ({measured}), "
                  "so decode steps use it")


def kernel_error(kind: str, device, dtype) -> str | None:
    """Why an existing packed kernel failed its probe (None: it works, or torch has none)."""
    kernel_available(kind, device, dtype)
    return _KERNEL_ERRORS.get((kind, device_key(device), dtype))


def kernel_reason(kind: str, device, dtype) -> str:
    """Which path decode steps of `kind` take on this device and dtype, and why, in words."""
    key, name = (kind, device_key(device), dtype), kind.upper()
    used = kernel_available(kind, device, dtype)
    if key in _KERNEL_NOTES:  # a measured choice: its note says both
        return _KERNEL_NOTES[key]
    if used:
        return f"torch's packed {name} kernel serves decode steps (its numbers were checked against the reference path)"
    why = kernel_missing(kind, device, dtype)
    if why is None and key in _KERNEL_ERRORS:
        why = f"torch's {name} kernel failed its probe ({_KERNEL_ERRORS[key]})"
    if why is None:
        why = f"this torch build has no packed {name} kernel for {key[1]}"
    return f"{name} layers de-quantize, then multiply: {why}"


class QuantizedLinear(PackedModule):
    """What Int8Linear and Int4Linear share: the kernel layout (cpu_linear's rule),
    built for the activation dtype `kernel_dtype` where torch has a working kernel."""

    KIND = ""

    def build_layout(self):
        ok = kernel_available(self.KIND, self.weight.device, self.kernel_dtype) and self.kernel_fits()
        layout = self.make_layout(self.kernel_dtype) if ok else dict.fromkeys(self.LAYOUT)
        for name, tensor in layout.items():
            self.register_buffer(name, tensor, persistent=False)

    def make_layout(self, dtype) -> dict:
        raise NotImplementedError

    def kernel_fits(self) -> bool:
        """Can the kernel take a weight of this shape? (A layer it cannot takes the reference path.)"""
        return True

    def has_layout(self) -> bool:
        return getattr(self, self.LAYOUT[0]) is not None


def _kernel_serves(x: torch.Tensor, layer) -> bool:
    """Can the layer's packed kernel take this input? Its layout's dtype, a
    decode-sized batch (KERNEL_MAX_ROWS for this kernel and dtype), and no
    gradient wanted (the kernels have no backward)."""
    max_rows = KERNEL_MAX_ROWS.get((layer.KIND, x.dtype), 0)
    return (x.dtype is layer.kernel_dtype and x.device == layer.weight.device
            and x.numel() // layer.in_features <= max_rows and not wants_grad(x))


def _reference_linear(x: torch.Tensor, dequantize) -> torch.Tensor:
    """De-quantize the whole weight (dequantize(dtype)), then an ordinary matmul.
    A prompt's rows in bf16 on a CPU without bf16 units are multiplied in fp32,
    as cpu_linear.PackedLinear does there (UPCAST_DTYPES): the emulated bf16
    matmul converts every weight once per row."""
    if x.dtype in UPCAST_DTYPES and x.is_cpu and x.numel() // x.shape[-1] >= UPCAST_MIN_ROWS:
        return F.linear(x.float(), dequantize(torch.float32)).to(x.dtype)
    return F.linear(x, dequantize(x.dtype))


class Int8Linear(QuantizedLinear):
    """INT8 weights (and fp32 row scales) as persistent buffers; for the packed
    kernel, the scales in the activation dtype (its kernel layout, cpu_linear's rule)."""

    LAYOUT, KIND = ("kernel_scales",), "int8"

    def __init__(self, in_features: int, out_features: int, use_kernel: bool = True):
        super().__init__()
        self.in_features, self.out_features, self.use_kernel = in_features, out_features, use_kernel
        self.kernel_dtype = torch.float32  # the activation dtype the kernel layout is built for
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features))
        self.clear_layout()

    @classmethod
    def from_weight(cls, w: torch.Tensor, use_kernel: bool = True) -> "Int8Linear":
        layer = cls(w.shape[1], w.shape[0], use_kernel)
        layer.weight, layer.scales = quantize_int8(w)
        layer.kernel_dtype = w.dtype  # activations come in the dtype the weight had
        return layer.to(w.device)  # .to() builds the kernel layout

    def layout_sources(self):
        return self.weight, self.scales

    def make_layout(self, dtype) -> dict:
        return {"kernel_scales": self.scales.to(dtype)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_kernel and self.has_layout() and _kernel_serves(x, self):
            return self._kernel_forward(x)
        # Reference path: expand the whole weight to x's dtype, then an ordinary matmul.
        return _reference_linear(x, lambda dtype: dequantize_int8(self.weight, self.scales, dtype))

    def _kernel_forward(self, x):
        # One kernel reads the int8 weight and applies the row scales as it goes.
        # torch's CUDA version reads x by raw offsets (row * in + column), so x
        # must be contiguous, and some versions return fp32 whatever x was: cast
        # back, or the residual stream would silently become fp32.
        x2 = x.reshape(-1, self.in_features).contiguous()
        y = torch.ops.aten._weight_int8pack_mm(x2, self.weight, self.kernel_scales).to(x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)


class Int8LMHead(Int8Linear):
    """The LM head in INT8 (quantize_model's lm_head="int8"), as GGUF files keep
    theirs: SmolLM2's Q4_1 file stores its tied embedding and head in Q8_0.

    The head is the largest matrix a decode step reads (49152 x 576 in SmolLM2:
    in bf16, 57 of the 123 MB an INT4 step reads). One sequence's row goes through
    the INT8 kernel, which reads 1 byte per weight instead of 2 (bf16) or 4.
    That kernel's time grows with every row, so more rows take a de-quantized
    copy of the same weights (a kernel layout, packed for oneDNN where this CPU
    packs its dtype). Measured on the 49152 x 576 head alone, bf16 rows, 2 cores
    of an Intel Xeon (AVX-512 BF16), then the same kept to AVX2:
      rows:                          1      4     32
      AVX-512 BF16: INT8 kernel   0.86   1.63   13.1 ms   packed bf16 copy 1.10  1.11  1.94
      AVX2 only:    INT8 kernel   1.14   2.47   20.1 ms   bf16 F.linear    2.13  8.04  54.3
    Inside a decode step, where the head comes from memory rather than cache,
    the one-row kernel took 2.5-2.7 ms (the packed bf16 head 2.7, the AVX2 bf16 one 5.3).
    Both paths multiply by the same de-quantized weights, so a sequence's tokens
    do not depend on how many others share its step beyond rounding.

    On a CUDA GPU this head saves no memory (it adds some), and it saves time
    only at one row, and only if torch's INT8 kernel measured no slower than
    de-quantize + cuBLAS there (kernel_reason says whether it did). There is no
    packed bf16 layout on a GPU, so the de-quantized copy is a plain tensor
    (`dense_weight`) kept beside the int8 codes: 3 bytes per weight, against a
    bf16 head's 2 (or none extra, where the head is tied to the embedding).
    Every row that skips the kernel reads that copy, in a bf16 head's time. The
    copy stays because without it each step would de-quantize the whole head,
    moving more bytes than a bf16 head does. On a GPU, leave the head
    unquantized."""

    LAYOUT = ("kernel_scales", "packed_weight", "dense_weight")
    MAX_KERNEL_ROWS = 1

    def build_layout(self):
        super().build_layout()  # kernel_scales, where torch has a working INT8 kernel
        dense = dequantize_int8(self.weight, self.scales, self.kernel_dtype)
        packed = pack_weight(dense) if packable(dense, None) else None
        self.register_buffer("packed_weight", packed, persistent=False)
        self.register_buffer("dense_weight", None if packed is not None else dense, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if self.use_kernel and self.has_layout() and rows <= self.MAX_KERNEL_ROWS and _kernel_serves(x, self):
            return self._kernel_forward(x)
        if x.dtype is not self.kernel_dtype or wants_grad(x) or (self.packed_weight is None
                                                                  and self.dense_weight is None):
            return super().forward(x)  # the reference path
        if self.packed_weight is not None:
            return packed_linear(x, self.packed_weight, self.out_features)
        return plain_linear(x, self.dense_weight)  # as cpu_linear.PackedLinear multiplies without a packed copy


class Int4Linear(QuantizedLinear):
    """INT4 codes (two per byte) and fp16 group scales and zeros as persistent
    buffers; for torch's packed kernel, a second copy of the codes in that
    kernel's own nibble layout plus (scale, zero') pairs in the activation dtype:
    its kernel layout, kept by cpu_linear's rule. The kernel path trades memory
    for speed."""

    LAYOUT, KIND = ("kernel_weight", "kernel_scales_zeros"), "int4"

    def __init__(self, in_features: int, out_features: int, group_size: int = 128, use_kernel: bool = True):
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.use_kernel = use_kernel
        self.kernel_dtype = torch.float32  # the activation dtype the kernel layout is built for
        groups = -(-in_features // group_size)  # a short last group still gets a scale
        self.register_buffer("weight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8))
        self.register_buffer("scales", torch.ones(out_features, groups, dtype=META_DTYPE))
        self.register_buffer("zeros", torch.zeros(out_features, groups, dtype=META_DTYPE))
        self.clear_layout()

    @classmethod
    def from_weight(cls, w: torch.Tensor, group_size: int = 128, use_kernel: bool = True) -> "Int4Linear":
        layer = cls(w.shape[1], w.shape[0], group_size, use_kernel)
        layer.weight, layer.scales, layer.zeros = quantize_int4(w, group_size)
        layer.kernel_dtype = w.dtype  # activations come in the dtype the weight had
        return layer.to(w.device)  # .to() builds the kernel layout

    def layout_sources(self):
        return self.weight, self.scales, self.zeros

    def kernel_fits(self) -> bool:
        return self.out_features % 16 == 0  # torch's int4 packing works on blocks of 16 output rows

    def make_layout(self, dtype) -> dict:
        # torch's int4 kernels want their own nibble layout and, per group,
        # (scale, zero') in x's dtype with w = (q - 8) * scale + zero'.
        codes = _pad_to_groups(unpack_int4(self.weight), self.group_size)
        s, z = self.scales.float(), self.zeros.float()
        scales_zeros = torch.stack([s.T, (z + 8 * s).T], dim=-1).to(dtype).contiguous()
        if codes.is_cuda:  # tinygemm: codes two per byte, tiles of the tensor cores' shape
            weight = torch.ops.aten._convert_weight_to_int4pack(cuda_int4_bytes(codes), inner_k_tiles(codes.shape[1]))
        else:
            weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
        return {"kernel_weight": weight, "kernel_scales_zeros": scales_zeros}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_kernel and self.has_layout() and _kernel_serves(x, self):
            return self._kernel_forward(x)
        return _reference_linear(x, lambda dtype: dequantize_int4(self.weight, self.scales, self.zeros,
                                                                  self.group_size, dtype))

    def _kernel_forward(self, x):
        x2 = x.reshape(-1, self.in_features)
        pad = -self.in_features % self.group_size
        if pad:  # the kernel wants whole groups: zero inputs meet the padded columns
            x2 = F.pad(x2, (0, pad))
        if x2.is_cuda:
            y = torch.ops.aten._weight_int4pack_mm(x2.contiguous(), self.kernel_weight, self.group_size,
                                                   self.kernel_scales_zeros)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.kernel_weight, self.group_size,
                                                           self.kernel_scales_zeros)
        return y.reshape(*x.shape[:-1], self.out_features)


def cuda_int4_bytes(codes: torch.Tensor) -> torch.Tensor:
    """Codes [out, in] (0..15) two per byte as torch's CUDA INT4 packing reads
    them: column 2j in the HIGH nibble, 2j+1 in the low (pack_int4's order
    reversed)."""
    codes = codes.to(torch.uint8)
    return (codes[:, 0::2] << 4 | codes[:, 1::2]).contiguous()


def inner_k_tiles(in_features: int) -> int:
    """How many 16-wide tiles of the input dimension tinygemm keeps side by
    side: 8, 4 or 2, the most that divide it (more: wider loads)."""
    return next(n for n in (8, 4, 2) if in_features % (16 * n) == 0)


# ----------------------------------------------------------------- whole models


def quantize_model(model: nn.Module, method: str | None, group_size: int = 128, lm_head: str | None = None,
                   use_kernel: bool = True) -> nn.Module:
    """Replace every linear layer of the decoder layers by its quantized twin
    (`method`: int8 or int4; None leaves them), in place.

    The embedding always stays as it is. The LM head is left alone by default:
    in SmolLM2 it is tied to the embedding (one tensor), so quantizing it adds
    a second, quantized copy rather than saving anything. lm_head="int8" makes
    that copy anyway (Int8LMHead: a decode step then reads the head in 1 byte
    per weight, as llama.cpp does from a GGUF file); lm_head="int4" an INT4 one.
    use_kernel lets decode steps use torch's packed kernels where they exist;
    each new layer builds its kernel layout now, for activations in the dtype
    the model's weights had (cpu_linear's rule; the INT4 one is a second copy
    of the weight)."""
    if method is not None:
        check_quantization(method, group_size)
    if lm_head not in (None, *QUANT_METHODS):
        raise ValueError(f"lm_head={lm_head!r} is invalid: must be None or one of "
                         f"{', '.join(map(repr, QUANT_METHODS))}")
    targets = [(layer, name, method) for layer in model.model.layers for name in LAYER_LINEARS if method]
    if lm_head is not None:
        targets.append((model, "lm_head", lm_head))
    for parent, dotted, kind in targets:
        *path, leaf = dotted.split(".")
        owner = parent
        for part in path:
            owner = getattr(owner, part)
        linear = getattr(owner, leaf)
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"{dotted} is a {type(linear).__name__}; is the model already quantized?")
        w = linear.weight.detach()
        if kind == "int4":
            new = Int4Linear.from_weight(w, group_size, use_kernel)
        else:
            new = (Int8LMHead if dotted == "lm_head" else Int8Linear).from_weight(w, use_kernel)
        setattr(owner, leaf, new)
    bump_generation(model)  # cpu_linear's rule 5: a compiled step must not run the old layers
    return model


def set_use_kernel(model: nn.Module, on: bool) -> None:
    """Switch every quantized layer between the packed kernel and the reference path."""
    for m in model.modules():
        if isinstance(m, (Int8Linear, Int4Linear)):
            m.use_kernel = on
    bump_generation(model)  # another path in forward: a compiled step traces it again


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def model_bytes(model: nn.Module) -> dict:
    """Exact bytes held by the model's tensors, by kind (a tied tensor counted once).
    Kernel layouts (cpu_linear.PackedModule.LAYOUT) are copies made for speed, not
    stored weights, and are not counted."""
    out = {"packed_weights": 0, "scales": 0, "zeros": 0, "unquantized": 0, "quantized_params": 0,
           "unquantized_params": 0}
    quantized = set()
    for m in model.modules():
        if isinstance(m, (Int8Linear, Int4Linear)):
            out["packed_weights"] += _nbytes(m.weight)
            out["scales"] += _nbytes(m.scales)
            out["zeros"] += _nbytes(m.zeros) if isinstance(m, Int4Linear) else 0
            out["quantized_params"] += m.in_features * m.out_features
            quantized.update(id(b) for b in m.buffers())
        if isinstance(m, PackedModule):
            quantized.update(id(getattr(m, name)) for name in m.LAYOUT)
    # rope tables (rope_cos, rope_sin, and any other rope_* the model keeps) are
    # recomputed from the config, not weights
    rope = {id(t) for name, t in model.named_buffers(recurse=False) if name.startswith("rope_")}
    seen = set()
    for t in list(model.parameters()) + list(model.buffers(recurse=True)):
        if id(t) in quantized or id(t) in rope or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        out["unquantized"] += _nbytes(t)
        out["unquantized_params"] += t.numel()
    out["total"] = out["packed_weights"] + out["scales"] + out["zeros"] + out["unquantized"]
    return out


def ideal_bytes(params: int, bits: float) -> float:
    """Raw weight bytes by formula, before any metadata or packing: params × bits / 8."""
    return params * bits / 8


def linear_shapes(config) -> list[tuple[int, int]]:
    """(out, in) of the four linear layers of one decoder layer, from the config alone."""
    c, d, i = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    return [(q + 2 * kv, c), (c, q), (2 * i, c), (c, i)]


def formula_bytes(config, method: str, group_size: int = 128) -> dict:
    """The bytes model_bytes must find in the quantized layers, by formula:
    INT8: 1 byte per weight + a 4-byte scale per row;
    INT4: 1/2 byte per weight + a 2-byte scale and a 2-byte zero per group
    (per row, ceil(in / group_size) groups)."""
    check_quantization(method, group_size)
    shapes = linear_shapes(config) * config.num_hidden_layers
    params = sum(o * i for o, i in shapes)
    if method == "int8":
        return {"params": params, "packed_weights": params, "scales": 4 * sum(o for o, _ in shapes), "zeros": 0}
    groups = sum(o * -(-i // group_size) for o, i in shapes)  # a short last group counts as one
    return {"params": params, "packed_weights": params // 2, "scales": 2 * groups, "zeros": 2 * groups,
            "groups": groups}
