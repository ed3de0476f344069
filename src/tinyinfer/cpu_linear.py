"""Kernel layouts on a CPU, made by one explicit pass: pack_for_cpu(model).

A decode step is mostly reading weights: every matrix is multiplied by one row
per sequence (chapter 4). How fast a CPU reads them depends on the kernel, not
only on the bytes. PyTorch's `F.linear` hands oneDNN (or MKL) the weight in its
plain row-major layout on every call, and the library must then work from a
layout that suits none of its vector kernels. oneDNN can instead reorder the
weight once into its own blocked layout ("packing"), after which every call
streams it straight into its vector kernels. On the course's machine (2 cores,
AVX-512 with BF16) a decode step's products over SmolLM2's weights ran 1.4x as
fast as `F.linear` in bf16 and 1.9-2.1x as fast in fp32, at batch 1 to 32
(`python benchmarks/linear.py` measures it on the reader's machine). For a
single row the packed kernel is not the fastest on every CPU (on an Intel Xeon
with AMX, `F.linear` beat it in fp32), so that one route is measured once per
CPU and remembered (kernel_choice.py, `PackedLinear.one_row`).
vLLM's CPU backend does the same: it builds a oneDNN matmul with a prepacked
weight for every dense layer (`dispatch_cpu_unquantized_gemm` in
vllm/model_executor/layers/utils.py). The result is the same product: oneDNN
accumulates in fp32, as `F.linear` does; only the order of the additions differs.

model.py stays plain PyTorch (nn.Linear everywhere). This file turns a model
into one that reads packed weights, in the way gpt-fast turns one into a
quantized model: by swapping modules (`pack_for_cpu`), each of which owns its
kernel layout. quant.Int8Linear and quant.Int4Linear keep theirs by the same
rule, so there is one rule for every kernel layout in the engine:

  1. The layout is a non-persistent buffer, derived from the module's own
     weights. state_dict, torch.save and copy.deepcopy carry only the weights;
     a loaded or copied module builds its layout again.
  2. It is built by `repack()`: by pack_for_cpu and quant.quantize_model when
     the module is made, by load_state_dict and .to() (which change the
     weights), and by `repack(model)` after you edit weights yourself. Never
     lazily inside forward.
  3. forward reads it only when that kernel can serve the call: a CPU input of
     the layout's dtype, and no gradient wanted (these kernels have no
     backward). Anything else takes the plain path (F.linear, or de-quantize
     then matmul), which autograd understands.
  4. An in-place edit of a weight (`w.mul_(2)`, `w[0] = 0`) bumps its version
     counter. The engine checks every layout against those counters once
     before each step, compiled or eager (prepare.PreparedModel.check_current,
     which calls check_layouts), and refuses a stale one with an error that says
     to call repack(model). Edits happen between steps, never inside one, so
     forward itself checks nothing: it stays one decision and one call. Outside
     the engine, call check_layouts(model) yourself. An edit through `w.data`
     is invisible (`.data` is an alias with a counter of its own): after one,
     call repack(model), or the kernel keeps reading the old weights.
  5. Every pass over a model (pack_for_cpu, repack, quant.quantize_model,
     quant.set_use_kernel) bumps the model's `tinyinfer_generation`
     (bump_generation). A compiled decode step guards on that number
     (decode_batch.decode_forward), so a transformed model is traced again,
     even where the guards of its later layers are not checked.

Memory: a layout is a second copy of its weights (a PackedLinear keeps the
plain weight and the packed one), so a packed model holds about twice its
weight bytes; quant.model_bytes counts the weights, not the layouts.

Which kernel a layout is for is decided here, once, for the CPU at hand
(`PACKED_DTYPES`): the packed fp32 kernel everywhere oneDNN is built in; bf16
only where the CPU has bf16 units (AVX-512 BF16, AMX), since elsewhere oneDNN
would emulate bf16; there a bf16 layer keeps no layout and multiplies a
prompt's rows in fp32 instead (`UPCAST_DTYPES`), decode rows in bf16.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _onednn_dtypes() -> tuple[torch.dtype, ...]:
    """The weight dtypes whose packed oneDNN kernels this CPU runs natively."""
    if not torch.backends.mkldnn.is_available():
        return ()
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return torch.float32, torch.bfloat16
    return (torch.float32,)  # without AVX-512 BF16, bf16 would be emulated (UPCAST_DTYPES)


PACKED_DTYPES = _onednn_dtypes()

# A CPU without bf16 units (AVX2 laptops, AVX-512 without BF16) multiplies bf16
# by converting every weight to fp32 inside the kernel, once per input row: a
# 128-token prompt converts each weight 128 times. Converting the weight once,
# then one fp32 product, gives the same numbers (both accumulate in fp32 and
# round the result to bf16 once; only the order of the additions differs) and
# was 5.4x as fast for 128 rows on an AVX2 EPYC, 1.9x for 8, 1.3x for 4, but
# 2.2x slower for one row (decode), where the conversion costs more than the
# product it saves. So multi-row bf16 products take the fp32 path here.
UPCAST_DTYPES = () if torch.bfloat16 in PACKED_DTYPES else (torch.bfloat16,)
UPCAST_MIN_ROWS = 4
# The weight is converted UPCAST_BLOCK output rows at a time, never whole: the
# LM head converted whole is a new 113 MB fp32 tensor at every call, which the
# OS hands out page by page (page faults, not arithmetic: 70-80 ms per call on
# that EPYC, three times the bf16 product it replaces at batch 8). A block of
# 1,024 rows (2.4 MB for the course's model) is reused from the heap and stays
# in cache: the head's batch-8 product took 18 ms instead. Same numbers: each
# output column is the same fp32 dot product.
UPCAST_BLOCK = 1024


def upcast_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T computed in fp32 and rounded once to x's dtype, the weight
    converted UPCAST_BLOCK output rows at a time (see above)."""
    x32 = x.float()
    parts = [F.linear(x32, weight[i : i + UPCAST_BLOCK].float()) for i in range(0, weight.shape[0], UPCAST_BLOCK)]
    return torch.cat(parts, dim=-1).to(x.dtype)


def packable(weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Does oneDNN's packed kernel serve this layer here? A CPU weight of a dtype
    this CPU runs natively, and no bias (the course's models have none)."""
    return weight.is_cpu and weight.dtype in PACKED_DTYPES and bias is None


def swappable(weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Does pack_for_cpu give this layer a PackedLinear? Where it packs, or where
    its dtype takes the fp32 path for multi-row inputs (UPCAST_DTYPES)."""
    return packable(weight, bias) or (weight.is_cpu and weight.dtype in UPCAST_DTYPES and bias is None)


def wants_grad(x: torch.Tensor) -> bool:
    """Would autograd need this call's backward? Then no packed kernel may serve it."""
    return torch.is_grad_enabled() and x.requires_grad


def _versions(tensors) -> tuple | None:
    """Version counters of the tensors a layout was made from. Tensors made in
    inference mode keep none, so an edit to them cannot be noticed (rule 4)."""
    if any(t.is_inference() for t in tensors):
        return None
    return tuple(t._version for t in tensors)


class PackedModule(nn.Module):
    """A module that keeps a kernel layout of its weights (the rule above).

    A subclass names the tensors its layout is made from (`layout_sources`),
    lists its layout buffers (`LAYOUT`), and builds them (`build_layout`)."""

    LAYOUT: tuple[str, ...] = ()

    def layout_sources(self) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def build_layout(self) -> None:
        """Set every buffer in LAYOUT (None where this CPU has no kernel for it)."""
        raise NotImplementedError

    def clear_layout(self) -> None:
        for name in self.LAYOUT:
            self.register_buffer(name, None, persistent=False)
        self._layout_versions = None

    def repack(self) -> None:
        """(Re)build the kernel layout from the weights as they are now."""
        self.clear_layout()
        with torch.no_grad():
            self.build_layout()
        self._layout_versions = _versions(self.layout_sources())

    def layout_is_current(self) -> bool:
        """Was the layout made from the weights as they are now? (False when that
        cannot be known: no layout made yet, or weights made in inference mode.)"""
        return self._layout_versions is not None and _versions(self.layout_sources()) == self._layout_versions

    def check_layout(self) -> None:
        """Rule 4: refuse a layout older than its weights' last in-place edit."""
        if self._layout_versions is None:
            return  # made in inference mode: edits cannot be seen (see _versions)
        if _versions(self.layout_sources()) != self._layout_versions:
            raise RuntimeError(f"{type(self).__name__}: its weights were changed in place after their kernel layout "
                               "was made; call tinyinfer.cpu_linear.repack(model) after editing weights")

    # --- the weights change: make the layout again --------------------------------

    def _apply(self, fn, recurse=True):  # .to(), .float(), .cuda(): no stale host copy survives a move
        self.clear_layout()
        super()._apply(fn, recurse)
        self.repack()
        return self

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self.repack()

    def __getstate__(self):  # pickling and deepcopy: the weights, not the layout (rule 1)
        state = self.__dict__.copy()
        state["_buffers"] = {k: v for k, v in self._buffers.items() if k not in self.LAYOUT}
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self.repack()


class PackedLinear(nn.Linear, PackedModule):
    """nn.Linear whose weight is also kept in oneDNN's blocked layout, read by
    every call that the packed kernel can serve. Same parameters and names as the
    nn.Linear it replaces (the weight is the same Parameter object), so tied
    weights stay tied and checkpoints load as before. A bf16 layer on a CPU
    without bf16 units keeps no layout (packed_weight is None) and instead
    multiplies several rows at once in fp32 (UPCAST_DTYPES)."""

    LAYOUT = ("packed_weight",)
    # The route for a single row (a batch-1 decode step): "packed", or "plain"
    # (F.linear on the plain weight) where that was measured faster on this CPU.
    # prepare.prepare_model sets it (kernel_choice.py).
    one_row = "packed"

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "PackedLinear":
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        new.weight, new.bias = linear.weight, linear.bias  # the same Parameters: nothing is copied
        new.repack()
        return new

    def layout_sources(self):
        return (self.weight,)

    def build_layout(self):
        packed = pack_weight(self.weight) if packable(self.weight, self.bias) else None
        self.register_buffer("packed_weight", packed, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed_weight is None or x.dtype is not self.weight.dtype or not x.is_cpu or wants_grad(x) \
                or (torch.is_grad_enabled() and self.weight.requires_grad):
            return plain_linear(x, self.weight, self.bias)
        if self.one_row == "plain" and x.numel() == self.in_features:
            return F.linear(x, self.weight)
        return packed_linear(x, self.packed_weight, self.out_features)


def plain_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) without a packed copy: in fp32 for several bf16 rows
    on a CPU without bf16 units (UPCAST_DTYPES), else F.linear."""
    if x.dtype is weight.dtype and x.dtype in UPCAST_DTYPES and x.is_cpu and bias is None \
            and x.numel() // weight.shape[1] >= UPCAST_MIN_ROWS:
        return upcast_linear(x, weight)  # fp32 product, one rounding (autograd follows the casts)
    return F.linear(x, weight, bias)


def packed_linear(x: torch.Tensor, packed_weight: torch.Tensor, out_features: int) -> torch.Tensor:
    """x @ W.T through a packed copy of W that may serve x (rule 3 checked by the caller)."""
    if torch.compiler.is_compiling():  # one opaque kernel inside the compiled graph
        return torch.ops.tinyinfer.packed_linear(x, packed_weight, out_features)
    return linear_packed(x, packed_weight)  # eager: skip the custom operator's dispatch


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's blocked copy of a [out, in] weight (an opaque tensor, layout torch._mkldnn)."""
    # batch-size hint 1: the layout suited to decode; measured as fast as a
    # larger hint for batches up to 32 on the course's machine.
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


def linear_packed(x: torch.Tensor, packed_weight: torch.Tensor) -> torch.Tensor:
    """x @ W.T through oneDNN's packed copy of W (PackedLinear.packed_weight)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, None, "none", [], "")


@torch.library.custom_op("tinyinfer::packed_linear", mutates_args=())
def _packed_linear_op(x: torch.Tensor, packed_weight: torch.Tensor, out_features: int) -> torch.Tensor:
    """linear_packed as an operator torch.compile calls but need not trace."""
    return linear_packed(x, packed_weight)


@_packed_linear_op.register_fake
def _(x, packed_weight, out_features):  # the output's shape, for torch.compile's tracing
    return x.new_empty(*x.shape[:-1], out_features)


# ----------------------------------------------------------------- the pass


def pack_for_cpu(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """Give every linear layer of `model` the fastest kernel layout this CPU has, in place.

    Each nn.Linear becomes a PackedLinear (where oneDNN packs its dtype; others
    stay as they are), and every module that keeps a layout (quantized layers
    too, for activations of `dtype`: by default the dtype of the model's first
    floating-point parameter, its embedding) builds it now. Call it after
    loading and after quantizing; the engine does. Returns the model."""
    if dtype is None:
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and swappable(child.weight, child.bias):
                setattr(parent, name, PackedLinear.from_linear(child))  # packed as it is made
            elif hasattr(child, "kernel_dtype") and child.kernel_dtype is not dtype:
                child.kernel_dtype = dtype  # a quantized layer: activations arrive in `dtype`
                child.clear_layout()  # its layout was built for another dtype
    # Every other layout is rebuilt from the weights as they are now, unless it was
    # just made from them: packing each weight twice would double LLM()'s load time.
    return repack(model, only_stale=True)


def check_layouts(model_or_modules) -> None:
    """Rule 4 for a whole model (or a list of its PackedModules): refuse, naming
    the module, if any kernel layout is older than an in-place edit of its weights."""
    modules = model_or_modules.modules() if isinstance(model_or_modules, nn.Module) else model_or_modules
    for m in modules:
        if isinstance(m, PackedModule):
            m.check_layout()


def repack(model: nn.Module, only_stale: bool = False) -> nn.Module:
    """Rebuild every kernel layout in `model` from its weights as they are now.
    Call it after editing weights in place (through .data especially: rule 4).
    only_stale: skip the layouts known to be made from the weights as they are."""
    for m in model.modules():
        if isinstance(m, PackedModule) and not (only_stale and m.layout_is_current()):
            m.repack()
    bump_generation(model)
    return model


def bump_generation(model: nn.Module) -> None:
    """Rule 5: say that a pass changed `model`'s modules or layouts. A compiled
    decode step that traced the old model sees a new number and is traced again."""
    model.tinyinfer_generation = generation(model) + 1


def generation(model: nn.Module) -> int:
    """Rule 5's number: how many passes have changed the model's modules or layouts."""
    return getattr(model, "tinyinfer_generation", 0)
