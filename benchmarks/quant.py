"""Quantization: bytes, quality and decode speed of every weight format, in one run.

    python benchmarks/quant.py [--ppl-tokens 2048] [--window 512] [--new-tokens 32] [--threads N]

Formats: fp32, bf16 (the whole model in that dtype), and weight-only INT8 and
INT4 (group sizes 32/64/128) of the decoder layers' linear layers, with fp32
activations. For each format it prints
  - bytes: measured from the tensors, beside the formula params x bits / 8;
  - perplexity on the course's evaluation text (tinyinfer_course/data/eval_text.txt);
  - decode speed at batch 1 (time per output token after the first), through
    the reference path (de-quantize, then matmul) and, where torch has one,
    a packed-weight kernel;
then the bars this course sets, PASS or FAIL. It also measures how far each
format moves the weights: the packaged weights were themselves distributed as
4-bit Q4_1 (blocks of 32), which matters for INT4.
"""
from __future__ import annotations

import argparse
import gc
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from tinyinfer import LLM, SamplingParams  # noqa: E402
from tinyinfer.kv_pool import CPU_KV_CACHE_BYTES  # noqa: E402
from tinyinfer_course.analysis.eval import eval_text, perplexity  # noqa: E402
from tinyinfer.quant import (  # noqa: E402
    LAYER_LINEARS, dequantize_int4, dequantize_int8, formula_bytes, ideal_bytes, kernel_available, model_bytes,
    quantize_int4, quantize_int8, quantize_model, set_use_kernel,
)

PROMPT = "The history of the lighthouse begins with fires lit on hills near harbours, and over the centuries it became"
FORMATS = [("fp32", None, 0), ("bf16", None, 0), ("int8", "int8", 0),
           ("int4 g32", "int4", 32), ("int4 g64", "int4", 64), ("int4 g128", "int4", 128)]
GiB = 2**30


def source_example():
    print("The source's 7B example (raw weights, before metadata and packing):")
    for name, bits in [("FP16", 16), ("INT8", 8), ("INT4", 4)]:
        print(f"  7e9 x {bits:>2} bits / 8 / 2**30 = {ideal_bytes(7e9, bits) / GiB:6.2f} GiB  {name}")
    print()


def decode_tpot(llm, n: int, repeats: int = 2) -> float:
    """Best-of-`repeats` seconds per output token after the first (prefill excluded)."""
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    best = float("inf")
    for _ in range(repeats):
        out = llm.generate([PROMPT], params)[0]
        best = min(best, out.metrics["tpot"])
    return best


def requant_error(llm):
    """Relative Frobenius error ||W_hat - W|| / ||W|| over all quantized layers, per format,
    and how many 32-weight blocks already hold at most 16 distinct values (Q4_1's trace)."""
    ws = [getattr(getattr(layer, a), b).weight.detach().float() for layer in llm.model.model.layers
          for a, b in (n.split(".") for n in LAYER_LINEARS)]
    blocks = torch.cat([w.reshape(-1, 32) for w in ws])
    distinct = sum(len(torch.unique(b)) <= 16 for b in blocks[:: max(1, len(blocks) // 4000)])
    sampled = len(blocks[:: max(1, len(blocks) // 4000)])
    print(f"Q4_1 trace: {distinct}/{sampled} sampled 32-weight blocks hold <= 16 distinct values\n")
    errs = {"int8": [0.0, 0.0]} | {f"int4 g{g}": [0.0, 0.0] for g in (32, 64, 128)}
    for w in ws:
        norm = float(w.norm()) ** 2
        errs["int8"][0] += float((dequantize_int8(*quantize_int8(w)) - w).norm()) ** 2
        for g in (32, 64, 128):
            errs[f"int4 g{g}"][0] += float((dequantize_int4(*quantize_int4(w, g), g) - w).norm()) ** 2
        for e in errs.values():
            e[1] += norm
    return {k: (a / b) ** 0.5 for k, (a, b) in errs.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ppl-tokens", type=int, default=2048,
                    help="tokens of the eval text to score (about 6,000 in all)")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--stride", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    source_example()

    rows, errors = [], None
    for name, method, group in FORMATS:
        # A fixed pool, the CPU's default: the last engine is still alive while the next is built.
        llm = LLM(dtype="bfloat16" if name == "bf16" else "float32", device=args.device,
                  kv_cache_memory_bytes=CPU_KV_CACHE_BYTES)
        dev = llm.device
        if errors is None:
            print(f"device {dev.type}, {torch.get_num_threads()} threads, torch {torch.__version__}")
            errors = requant_error(llm)
            ids = llm.tokenizer.encode(eval_text())[: args.ppl_tokens]
            print(f"perplexity over {len(ids)} tokens, window {args.window}, stride {args.stride}\n")
        if method:
            quantize_model(llm.model, method, group or 128, use_kernel=False)
        b = model_bytes(llm.model)
        ppl = perplexity(llm, ids, args.window, args.stride)
        speed = {"ref": 1 / decode_tpot(llm, args.new_tokens)}
        if method and kernel_available(method, dev, llm.dtype):
            set_use_kernel(llm.model, True)
            speed["kernel"] = 1 / decode_tpot(llm, args.new_tokens)
        rows.append(dict(name=name, method=method, group=group, bytes=b, ppl=ppl, speed=speed,
                         formula=formula_bytes(llm.model.config, method, group or 128) if method else None))
        print(f"  {name:<10} ppl {ppl:7.3f}  total {b['total'] / 1e6:7.1f} MB  "
              + "  ".join(f"{k} {v:5.1f} tok/s" for k, v in speed.items()), flush=True)
        del llm
        gc.collect()
    report(rows, errors)
    print(f"\nbenchmark wall time {time.perf_counter() - t_start:.0f} s")


def report(rows, errors):
    base = rows[0]
    layer_params = rows[2]["formula"]["params"]
    print(f"\nQuantized layers: {layer_params:,} weights (the decoder layers' linear layers); "
          f"embedding + norms stay in the model dtype.")
    print(f"\n{'format':<10}{'weights MB':>11}{'formula MB':>11}{'scales MB':>10}{'zeros MB':>9}"
          f"{'total MB':>9}{'B/weight':>9}{'rel.err':>8}{'ppl':>8}{'ref tok/s':>10}{'kernel tok/s':>13}")
    for r in rows:
        b = r["bytes"]
        if r["method"]:
            wmb, bits = b["packed_weights"], 8 if r["method"] == "int8" else 4
            fmb = ideal_bytes(layer_params, bits)
            per_w = (b["packed_weights"] + b["scales"] + b["zeros"]) / layer_params
            err = f"{errors[r['name']]:.4f}"
        else:
            dtype_bytes = 4 if r["name"] == "fp32" else 2
            wmb = fmb = layer_params * dtype_bytes
            per_w, err = dtype_bytes, "0"
        k = r["speed"].get("kernel")
        print(f"{r['name']:<10}{wmb / 1e6:>11.2f}{fmb / 1e6:>11.2f}{b['scales'] / 1e6:>10.2f}{b['zeros'] / 1e6:>9.2f}"
              f"{b['total'] / 1e6:>9.1f}{per_w:>9.3f}{err:>8}{r['ppl']:>8.3f}{r['speed']['ref']:>10.1f}"
              f"{(f'{k:.1f}' if k else '-'):>13}")

    by = {r["name"]: r for r in rows}
    bars = []
    d8 = by["int8"]["ppl"] / base["ppl"] - 1
    bars.append((f"INT8 perplexity within 2% of fp32 ({d8:+.2%})", abs(d8) <= 0.02))
    d4 = by["int4 g32"]["ppl"] / base["ppl"] - 1
    bars.append((f"INT4 g32 perplexity within 15% of fp32 ({d4:+.2%})", abs(d4) <= 0.15))
    for r in rows[2:]:
        got, bits = r["bytes"]["packed_weights"], 8 if r["method"] == "int8" else 4
        dev = got / ideal_bytes(layer_params, bits) - 1
        bars.append((f"{r['name']} weight bytes within 1% of params x {bits} / 8 ({dev:+.3%})", abs(dev) <= 0.01))
        if r["method"] == "int4":
            f = r["formula"]
            meta = 4 * f["groups"]
            stored = r["bytes"]["packed_weights"] + r["bytes"]["scales"] + r["bytes"]["zeros"]
            bars.append((f"{r['name']} storage {stored / layer_params:.4f} B/weight <= 0.5 + metadata "
                         f"{meta / layer_params:.4f} (2 fp16 per group)", stored <= layer_params / 2 + meta))
    bf = by["bf16"]["speed"]["ref"]
    print()
    for r in rows:
        best = max(r["speed"].values())
        print(f"decode {r['name']:<10} best {best:5.1f} tok/s = {best / bf:4.2f} x bf16")
    print()
    for text, ok in bars:
        print(f"[{'PASS' if ok else 'FAIL'}] {text}")


if __name__ == "__main__":
    main()
