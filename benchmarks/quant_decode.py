"""Batch-1 decode step of each weight format: predicted from bytes / bandwidth, and measured.

    python benchmarks/quant_decode.py [--new-tokens 16] [--repeats 3] [--threads N] [--device auto]

The table of chapter 6 ("Measured: when fewer bytes make decoding faster"), with
more tokens and repeats. For each configuration (weights, activation dtype, packed
kernel or de-quantize-then-matmul) it prints the bytes a decode step moves (every
stored tensor once; without a kernel, plus a full-size copy of each quantized
weight written and read back), the prediction bytes / bandwidth, where the
bandwidth is tinyinfer_course.analysis.hardware.measure_bandwidth on this machine, the best
measured time per output token after the first (over --repeats rounds through all
configurations), and the speed relative to bf16.
All rows run in one process, so their ratios are comparable even on a busy machine.
"""
from __future__ import annotations

import argparse
import copy
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from tinyinfer import LLM, SamplingParams, quant  # noqa: E402
from tinyinfer.config import half_dtype  # noqa: E402
from tinyinfer.kv_pool import CPU_KV_CACHE_BYTES  # noqa: E402
from tinyinfer_course.analysis.hardware import format_bandwidth, measure_bandwidth  # noqa: E402

PROMPT = "The lighthouse keeper climbed the stairs and"


def step_bytes(model, dtype, kernel: bool) -> int:
    b = quant.model_bytes(model)
    return b["total"] + (0 if kernel else 2 * b["quantized_params"] * dtype.itemsize)


def step_ms(engine, model, kernel: bool, n: int) -> float:
    engine.runner.model = model
    quant.set_use_kernel(model, kernel)
    engine.generate([PROMPT], SamplingParams(max_tokens=2, temperature=0))  # warm-up
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    return engine.generate([PROMPT], params)[0].metrics["tpot"] * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    start, cpu = time.perf_counter(), time.process_time()
    pool = dict(kv_cache_memory_bytes=CPU_KV_CACHE_BYTES)  # fixed pools, the CPU's default: two engines live here
    fp32 = LLM("smollm2-135m-instruct", dtype="float32", device=args.device, **pool)
    bandwidth = measure_bandwidth(fp32.device)
    bf16 = LLM("smollm2-135m-instruct", dtype=half_dtype(fp32.device), device=args.device, **pool)
    if bf16.llm_engine.dtype != torch.bfloat16:
        print("this GPU has no bf16 units (compute capability below 8.0): the rows labelled bf16 run in fp16")
    f, b = fp32.model, bf16.model
    int4_bf16 = quant.quantize_model(copy.deepcopy(b), "int4", 32)
    runs = [("fp32", fp32, f, None, False), ("bf16", bf16, b, None, False),
            ("INT8, bf16 activations", bf16, quant.quantize_model(copy.deepcopy(b), "int8"), "int8", True),
            ("INT4 g32, bf16 activations", bf16, int4_bf16, "int4", True),
            # llama.cpp's Q4_1 file reads its (tied) output matrix as Q8_0, not in 16 bits:
            # the like-for-like row quantizes the LM head too (a separate copy; lossy).
            ("INT4 g32 + INT8 head, bf16", bf16,
             quant.quantize_model(copy.deepcopy(b), "int4", 32, lm_head="int8"), "int4", True),
            ("INT8, fp32 activations", fp32, quant.quantize_model(copy.deepcopy(f), "int8"), "int8", True),
            ("INT4 g32, fp32 activations", fp32, quant.quantize_model(copy.deepcopy(f), "int4", 32), "int4", True),
            ("INT4 g32, bf16, no kernel", bf16, int4_bf16, "int4", False)]
    print(f"{fp32.device.type}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"measured bandwidth {format_bandwidth(bandwidth)}\n")
    rows, kernels = {}, {}
    for label, engine, model, method, kernel in runs:
        kernels[label] = kernel and quant.kernel_available(method, engine.device, engine.dtype)
        path = "-" if method is None else ("packed kernel" if kernels[label] else "de-quantize, then matmul")
        nbytes = step_bytes(model, engine.dtype, kernels[label] or method is None)
        rows[label] = [path, nbytes, nbytes / bandwidth * 1e3, float("inf")]
    for _ in range(args.repeats):  # rounds over all configurations: a busy moment slows all alike
        for label, engine, model, method, kernel in runs:
            rows[label][3] = min(rows[label][3], step_ms(engine, model, kernels[label], args.new_tokens))
    bf16_ms = rows["bf16"][3]
    print(f"{'weights, activations':<28}{'matmul':<26}{'MB/step':>8}{'predicted':>11}{'measured':>10}"
          f"{'meas/pred':>10}{'vs bf16 (pred)':>15}{'vs bf16 (meas)':>15}")
    for label, (path, nbytes, pred, meas) in rows.items():
        print(f"{label:<28}{path:<26}{nbytes / 1e6:8.0f}{pred:8.1f} ms{meas:7.1f} ms{meas / pred:9.1f}x"
              f"{rows['bf16'][2] / pred:14.2f}x{bf16_ms / meas:14.2f}x")
    print(f"\nwall {time.perf_counter() - start:.0f} s, CPU {time.process_time() - cpu:.0f} s")


if __name__ == "__main__":
    main()
