"""The same weights through three CPU kernels: what a decode step's matrix products cost.

    python benchmarks/linear.py [--batches 1,8,32] [--dtypes float32,bfloat16] [--repeats 15] [--threads N]
        [--part step|layers|head]

Every linear layer of the default model (30 layers x qkv, o, gate_up, down,
then the LM head: all of a decode step's matrix products) multiplies a batch of
B rows, in the order a step runs them, so each matrix is read from memory, not
from cache. Three kernels, same bytes, same result:
  F.linear    PyTorch's general path (plain row-major weight)
  torch.mv    its matrix-vector kernel (batch 1 only)
  packed      oneDNN with the weight packed once into its blocked layout
              (tinyinfer.cpu_linear.PackedLinear, what pack_for_cpu swaps in)
and, for bf16 on a CPU without bf16 units (cpu_linear.UPCAST_DTYPES: oneDNN
would emulate bf16, so it packs nothing there), two fp32 routes:
  upcast      the weight converted to fp32 UPCAST_BLOCK rows at a time, per call
  fp32 copy   an fp32 copy of the weight, packed once (twice the bf16 bytes read)
Prints the median time per step of products, the read speed it implies
(weight bytes / time) and packed's speed-up over F.linear, measured in one run.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from tinyinfer import cpu_linear
from tinyinfer.config import DEFAULT_MODEL
from tinyinfer.quant import LAYER_LINEARS
from tinyinfer.weights import load_model, resolve_model


def step_weights(model) -> list[torch.Tensor]:
    ws = [layer.get_submodule(n).weight for layer in model.model.layers for n in LAYER_LINEARS]
    return ws + [model.lm_head.weight]


def time_step(kernel, weights, xs, repeats: int) -> float:
    def step():
        for w in weights:
            kernel(xs[w.shape[1]], w)
    step()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--part", choices=["step", "layers", "head"], default="step",
                    help="the whole step's products, the 30 layers' only, or the LM head's only")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    # Each kernel: (how its weight is prepared once, the product).
    kernels = {"F.linear": (None, F.linear), "torch.mv": (None, lambda x, w: torch.mv(w, x[0])),
               "packed": (cpu_linear.pack_weight, cpu_linear.linear_packed),
               # bf16 on a CPU without bf16 units (cpu_linear.UPCAST_DTYPES): the weight converted
               # to fp32 block by block at every call, or an fp32 packed copy made once
               "upcast": (None, cpu_linear.upcast_linear),
               "fp32 copy": (lambda w: cpu_linear.pack_weight(w.float()),
                             lambda x, p: cpu_linear.linear_packed(x.float(), p).to(x.dtype))}
    print(f"{torch.get_num_threads()} threads; PyTorch {torch.__version__}; "
          f"oneDNN packs: {[str(d) for d in cpu_linear.PACKED_DTYPES] or 'nothing'}")
    print(f"{'dtype':15} {'batch':>5} {'kernel':9} {'ms/step':>8} {'GB/s':>6} {'vs F.linear':>11}")
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        model = load_model(resolve_model(DEFAULT_MODEL), dtype, torch.device("cpu"))
        weights = step_weights(model)
        weights = {"step": weights, "layers": weights[:-1], "head": weights[-1:]}[args.part]
        nbytes = sum(w.numel() * w.element_size() for w in weights)
        for batch in [int(b) for b in args.batches.split(",")]:
            xs = {k: torch.randn(batch, k, dtype=dtype) for k in {w.shape[1] for w in weights}}
            base = None
            for name, (prepare, kernel) in kernels.items():
                if (name == "torch.mv" and batch != 1) or (name == "packed" and dtype not in cpu_linear.PACKED_DTYPES) \
                        or (name in ("upcast", "fp32 copy") and dtype not in cpu_linear.UPCAST_DTYPES):
                    continue
                with torch.inference_mode():
                    prepared = [prepare(w) for w in weights] if prepare else weights
                    t = time_step(kernel, prepared, xs, args.repeats)
                    del prepared
                base = base or t
                print(f"{str(dtype):15} {batch:5} {name:9} {t * 1e3:8.2f} {nbytes / t / 1e9:6.1f} {base / t:10.2f}x",
                      flush=True)


if __name__ == "__main__":
    main()
