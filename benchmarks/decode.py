"""Decode speed: tinyinfer vs transformers `generate` in one run, same weights.

    python benchmarks/decode.py [--new-tokens 128] [--repeats 3] [--threads N] [--device cuda] [--compile]

For each dtype and batch size, both engines get the same 32-token prompt(s) and
must write exactly --new-tokens tokens (EOS ignored), greedy. Reported tok/s is
generated tokens / wall time (prefill included, as a user would time it); the
best of --repeats runs, alternating the engines so machine noise hits both.
Also prints the fraction of this machine's memory-bandwidth bound each reaches:
at batch 1 every decode step must read all weights once, so
  bound tok/s = measured bandwidth / weight bytes.
--compile runs tinyinfer with enforce_eager=False (decode steps through
torch.compile); transformers stays eager. The engine then compiles when it
is built; that and the warm-up are timed separately and printed, never counted in tok/s.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

from tinyinfer import LLM, SamplingParams  # noqa: E402
from tinyinfer.kv_pool import CPU_KV_CACHE_BYTES  # noqa: E402
from tinyinfer_course.analysis.hardware import measure_bandwidth  # noqa: E402
from tinyinfer.weights import ensure_packaged_model  # noqa: E402

PROMPT = ("The history of the lighthouse begins with fires lit on hills near harbours, "
          "and over the centuries it became a craft of lenses, clockwork and")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_tinyinfer(llm, ids, n, batch):
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    prompts = [{"prompt_token_ids": ids}] * batch
    sync(llm.device)
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    sync(llm.device)
    dt = time.perf_counter() - t
    assert all(len(o.outputs[0].token_ids) == n for o in outs)
    return dt


def time_transformers(hf, ids, n, batch):
    x = torch.tensor([ids] * batch, device=hf.device)
    sync(hf.device)
    t = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=2)
    sync(hf.device)
    dt = time.perf_counter() - t
    assert out.shape[1] == len(ids) + n
    return dt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--compile", action="store_true", help="tinyinfer with enforce_eager=False")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    folder = ensure_packaged_model()
    bw = measure_bandwidth(device)
    print(f"device {device}, {torch.get_num_threads()} CPU threads, torch {torch.__version__}; "
          f"measured read bandwidth {bw / 1e9:.1f} GB/s; tinyinfer "
          f"{'compiled (enforce_eager=False)' if args.compile else 'eager'}, transformers eager")
    rows = []
    for dtype in args.dtypes.split(","):
        start = time.perf_counter()
        # A fixed pool, the CPU's default: the last engine is still alive while the next is built
        # (on a GPU, each would otherwise size its pool from the memory left).
        llm = LLM(dtype=dtype, device=args.device, enforce_eager=not args.compile,
                  kv_cache_memory_bytes=CPU_KV_CACHE_BYTES)
        if args.compile:
            print(f"compiling, {dtype}: {time.perf_counter() - start:.1f} s (the engine compiles when it is built)")
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).to(device).eval()
        ids = llm.tokenizer.encode(PROMPT)[:32]
        weight_bytes = sum(p.numel() * p.element_size() for p in llm.model.parameters())
        for batch in map(int, args.batches.split(",")):
            warm = time_tinyinfer(llm, ids, 8, batch)  # warm-up
            time_transformers(hf, ids, 8, batch)
            print(f"warm-up, {dtype} batch {batch}: tinyinfer {warm:.1f} s")
            ours, theirs = [], []
            for _ in range(args.repeats):
                ours.append(time_tinyinfer(llm, ids, args.new_tokens, batch))
                theirs.append(time_transformers(hf, ids, args.new_tokens, batch))
            tok = batch * args.new_tokens
            o, h = tok / min(ours), tok / min(theirs)
            bound = bw / weight_bytes  # steps/s if each step only read the weights once
            # Each repeat's pair of runs ran back to back; the spread of their ratios
            # shows how much of a ratio is machine noise.
            paired = sorted(t / u for u, t in zip(ours, theirs))
            rows.append((dtype, batch, o, h, o / h, paired[0], paired[-1], o / batch / bound, h / batch / bound))
        del llm, hf
    print(f"\n{'dtype':9} {'batch':>5} {'tinyinfer tok/s':>16} {'transformers tok/s':>19} {'ratio':>6} "
          f"{'pairs min-max':>14} {'tinyinfer % of BW bound':>24} {'transformers % of BW bound':>27}")
    for d, b, o, h, r, lo, hi, fo, fh in rows:
        print(f"{d:9} {b:5d} {o:16.1f} {h:19.1f} {r:6.2f} {f'{lo:.2f}-{hi:.2f}':>14} {fo:24.0%} {fh:27.0%}")
    print("\n(ratio: best run against best run; pairs: the ratio within each repeat's back-to-back pair)")
    print("(% of BW bound: steps per second / (bandwidth / weight bytes); batch-1 decode "
          "cannot beat 100% without reading fewer bytes)")


if __name__ == "__main__":
    main()
