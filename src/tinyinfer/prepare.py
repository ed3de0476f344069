"""The model prepared once for its device: quantize, then lay the weights out for
this CPU's kernels, and keep what the runner needs to know about that layer.

The plain model (model.py) is pure PyTorch. Making it fast happens in one place,
once, in this order:
  1. quantize (quant.quantize_model), if asked: the decoder layers' linears
     become INT8 or INT4 twins, each owning its kernel layout;
  2. on a CPU, pack (cpu_linear.pack_for_cpu): every other linear gets the
     fastest layout this CPU has, and the faster route for a single row,
     measured once on this CPU (kernel_choice.py);
  3. compile (ModelRunner.compile_or_warm_up_model), if asked, happens after,
     on the prepared model.

The runner then asks the PreparedModel for two things only, so that it never
needs to know a kernel's constants:
  - check_current(): once per step, that no kernel layout is older than an
    in-place edit of its weights (eager and compiled steps alike). A pass run
    on the model since (quantize_model, repack, ...: cpu_linear's rule 5) may
    have swapped modules, so their list is made again first;
  - which generation of the model it is (generation(model), the number a
    compiled decode step guards on: decode_batch.decode_forward).
A swapped model (runner.model = m) gets a PreparedModel of its own, and the
runner drops the compiled decode steps of the old one.
"""
from __future__ import annotations

import torch
from torch import nn

from .cpu_linear import PackedLinear, PackedModule, bump_generation, check_layouts, generation, pack_for_cpu
from .kernel_choice import one_row_kernel


class PreparedModel:
    """A model whose kernel layouts are made, and the modules that keep them."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._list_kernel_modules()

    def _list_kernel_modules(self) -> None:
        # Listed once per generation: walking 300 modules at every step would cost more than checking them.
        self.generation = generation(self.model)
        self.kernel_modules = [m for m in self.model.modules() if isinstance(m, PackedModule)]

    def check_current(self) -> None:
        """Refuse a step on a layout made before an in-place edit (cpu_linear's rule 4)."""
        if generation(self.model) != self.generation:  # a pass changed the modules: list them again
            self._list_kernel_modules()
        check_layouts(self.kernel_modules)


def prepare_model(model: nn.Module, device: torch.device, quantization: str | None = None,
                  group_size: int = 128, lm_head_quantization: str | None = None,
                  one_row_kernel: str = "auto") -> nn.Module:
    """Quantize (if asked), then make the kernel layouts for `device`, in place,
    once. Returns the model; a runner wraps it in a PreparedModel. On a CPU the
    route of one-row products is one_row_kernel ("auto": measured, kernel_choice.py)."""
    if quantization or lm_head_quantization:  # weight-only: swap Linears for quantized twins
        from .quant import quantize_model  # the kernels' probes run only for a quantized engine

        quantize_model(model, quantization, group_size, lm_head=lm_head_quantization)
    if device.type == "cpu":  # kernel layouts for this CPU (cpu_linear.py)
        pack_for_cpu(model)
        choose_one_row_route(model, one_row_kernel)
    return model


def choose_one_row_route(model: nn.Module, choice: str = "auto") -> str:
    """Give every packed linear layer the route for one row: `choice`, or with
    "auto" the faster on this CPU (kernel_choice.py), measured once per CPU and
    dtype, then read back. Returns it; one_row_route(model) reads it later."""
    layers = [m for m in model.modules() if isinstance(m, PackedLinear) and m.packed_weight is not None]
    route = choice if choice != "auto" else one_row_kernel([m.weight for m in layers],
                                                         [m.packed_weight for m in layers])
    for m in layers:
        m.one_row = route
    bump_generation(model)  # another path in forward (cpu_linear's rule 5)
    return route


def one_row_route(model: nn.Module) -> str | None:
    """The route one-row products take in this model ("packed" or "plain"), or
    None where no layer has a packed layout (on a GPU)."""
    return next((m.one_row for m in model.modules() if isinstance(m, PackedLinear) and m.packed_weight is not None),
                None)
