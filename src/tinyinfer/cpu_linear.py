"""Linear layers on a CPU, with the weights laid out once for oneDNN.

A decode step is mostly reading weights: every matrix is multiplied by one row
per sequence (chapter 4). How fast a CPU reads them depends on the kernel, not
only on the bytes. PyTorch's `F.linear` hands oneDNN (or MKL) the weight in its
plain row-major layout on every call, and the library must then work from a
layout that suits none of its vector kernels. oneDNN can instead reorder the
weight once into its own blocked layout ("packing"), after which every call
streams it straight into the AVX-512 kernels. On the course's machine (2 cores,
AVX-512 with BF16) a decode step's products over SmolLM2's weights ran 1.4x as
fast as `F.linear` in bf16 and 1.9-2.1x as fast in fp32, at batch 1 to 32
(`python benchmarks/linear.py` measures it on the reader's machine).
vLLM's CPU backend does the same: it builds a oneDNN matmul with a prepacked
weight for every dense layer (`dispatch_cpu_unquantized_gemm` in
vllm/model_executor/layers/utils.py).

The result is the same product: in bf16 and fp32 alike oneDNN accumulates in
fp32, as `F.linear` does, and only the order of the additions may differ.

The packed copy is made on first use and kept beside the weight (one more copy
of the weight's bytes in host memory); it is remade if the weight changes.
It is wrapped in a custom operator, `torch.ops.tinyinfer.linear`, so that
torch.compile (enforce_eager=False) keeps calling it as one opaque kernel and
fuses the small operators around it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _onednn_dtypes() -> tuple[torch.dtype, ...]:
    """The weight dtypes whose packed oneDNN kernels this CPU runs natively."""
    if not torch.backends.mkldnn.is_available():
        return ()
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return torch.float32, torch.bfloat16
    return (torch.float32,)  # without AVX-512 BF16, bf16 would be emulated: keep F.linear


PACKED_DTYPES = _onednn_dtypes()


def use_packed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """True when linear(x, weight) can run the packed kernel: a CPU tensor of a
    packable dtype, no bias (the course's models have none) and no gradient
    wanted (the packed kernel has no backward)."""
    return (x.is_cpu and x.dtype is weight.dtype and weight.dtype in PACKED_DTYPES and bias is None
            and not (weight.requires_grad and torch.is_grad_enabled()))


class PackedCopy:
    """A weight's packed copy, kept on the weight as `_tinyinfer_packed`. It is
    a cache: saving or copying the weight (torch.save, copy.deepcopy) leaves it
    behind (oneDNN's layout cannot be saved), and the next call packs again."""

    def __init__(self, key=None, tensor=None):
        self.key, self.tensor = key, tensor

    def __reduce__(self):
        return PackedCopy, ()


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's blocked copy of `weight`, made once and remade whenever the
    weight's memory, contents (its version counter) or dtype change."""
    key = (weight.data_ptr(), weight._version, weight.dtype)
    cached = getattr(weight, "_tinyinfer_packed", None)
    if cached is None or cached.key != key:
        # batch-size hint 1: the layout suited to decode; measured as fast as a
        # larger hint for batches up to 32 here.
        cached = PackedCopy(key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1))
        weight._tinyinfer_packed = cached
    return cached.tensor


def linear_packed(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T through the packed weight: F.linear(x, weight), read faster.

    A weight made inside torch.inference_mode keeps no version counter, so a
    change to it could not be noticed and a packed copy could go stale: such a
    weight takes the plain path."""
    if weight.is_inference():
        return F.linear(x, weight)
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight(weight), None, "none", [], "")


@torch.library.custom_op("tinyinfer::linear", mutates_args=())
def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """linear_packed as an operator torch.compile can call but need not trace."""
    return linear_packed(x, weight)


@linear.register_fake
def _(x, weight):  # the output's shape, for torch.compile's tracing
    return x.new_empty(*x.shape[:-1], weight.shape[0])

