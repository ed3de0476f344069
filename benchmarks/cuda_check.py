"""The engine on a CUDA GPU: parity with transformers, decode speed against
transformers, and the fraction of the memory-bandwidth bound it reaches.

    python benchmarks/cuda_check.py [--tokenizer-dir DIR] [--out DIR] [--sizes 135m,1.7b]

A GPU machine may have no copy of the packaged model and no network, so the
weights are random (seeded) in the shapes of two real models: SmolLM2-135M
(the course's default) and SmolLM2-1.7B (3.4 GB in bf16: enough bytes that
reading them would show in a step's time). Only the tokenizer files are
needed (--tokenizer-dir; default: the packaged model's folder). Random weights
check what parity checks, that both programs compute the same function:
  1. parity, fp32 with TF32 off: prompt log-probabilities against transformers'
     forward pass, and 48 greedy tokens for 4 prompts against transformers'
     generate, eager and compiled (enforce_eager=False);
  2. the same in bf16, where rounding differs between kernels: how many greedy
     tokens agree before the first difference;
  3. decode speed, bf16, batch 1 and 8, 128 new tokens (EOS ignored), best of 3,
     tinyinfer eager and compiled against transformers eager `generate`, and
     each as a fraction of the bound: measured bandwidth / weight bytes steps/s.
Every section runs on its own: one that fails prints its error and the next runs.
On an H200 the whole run took about 9 minutes, two thirds of it compiling
(torch.compile, 1.5-2.5 min per compiled engine). The README's "On a GPU"
section holds that run's results.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

from tinyinfer import LLM, SamplingParams  # noqa: E402
from tinyinfer.hardware import measure_bandwidth  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode import time_tinyinfer, time_transformers  # noqa: E402  (the same timers as decode.py)

# The two shapes (from each model's config.json on the Hub); vocabulary and
# tokenizer are SmolLM2's, so the same tokenizer files serve both.
SHAPES = {
    "135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    "1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                 num_key_value_heads=32),
}
COMMON = dict(vocab_size=49152, max_position_embeddings=8192, rope_theta=130000.0, rms_norm_eps=1e-5,
              tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Here is a short poem about the sea:\n",
           "In one sentence, the lighthouse keeper's advice was"]
RESULTS: dict = {}


DEVICE = "cuda"  # --device cpu runs the same code on a CPU, with --sizes tiny: a smoke test of this script


# Several engines live side by side here (and a transformers model): each gets
# a fixed pool, not gpu_memory_utilization's share, which the first would take.
KV_POOL_BYTES = 4 * 2**30


def pool_bytes() -> int | None:
    return KV_POOL_BYTES if DEVICE == "cuda" else None  # a CPU smoke test keeps the CPU default

def make_model(name: str, dtype: torch.dtype, tokenizer_dir: Path, root: Path) -> Path:
    """A seeded random Llama in `name`'s shape, saved as a model folder tinyinfer and
    transformers both load."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = root / f"{name}-{str(dtype).split('.')[-1]}"
    if folder.exists():
        return folder
    torch.manual_seed(0)
    cfg = LlamaConfig(**SHAPES[name], **COMMON)
    with torch.device(DEVICE):
        hf = LlamaForCausalLM(cfg).to(dtype)
    hf.save_pretrained(folder)
    for f in tokenizer_dir.iterdir():
        if f.suffix in (".json", ".jinja") and f.name != "config.json":
            shutil.copy(f, folder / f.name)
    del hf
    if DEVICE.startswith("cuda"):
        torch.cuda.empty_cache()
    return folder


def hf_model(folder: Path, dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(DEVICE).eval()


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids], device=DEVICE)
    with torch.inference_mode():
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=2)
    return out[0, len(ids):].tolist()


def agree(a: list[int], b: list[int]) -> int:
    """How many leading tokens two continuations share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def parity(folder: Path, dtype, compiled: bool, n: int = 48) -> dict:
    label = f"{str(dtype).split('.')[-1]}, {'compiled' if compiled else 'eager'}"
    llm = LLM(model=str(folder), dtype=str(dtype).split(".")[-1], device=DEVICE, enforce_eager=not compiled,
              max_num_seqs=4, kv_cache_memory_bytes=pool_bytes())
    hf = hf_model(folder, dtype)
    tok = llm.get_tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    ours = [list(o.outputs[0].token_ids) for o in outs]
    theirs = [hf_greedy(hf, p, n) for p in prompts]
    row = {"what": label, "prompts": len(prompts), "tokens_each": n,
           "identical": sum(a == b for a, b in zip(ours, theirs)),
           "agreeing_prefix": [agree(a, b) for a, b in zip(ours, theirs)]}
    # Prompt log-probabilities: every position of a longer prompt, one forward pass each side.
    ids = tok.encode(" ".join(PROMPTS) * 6)[:256]
    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, temperature=0,
                                                                    prompt_logprobs=0))[0]
    got = torch.tensor([out.prompt_logprobs[t][ids[t]].logprob for t in range(1, len(ids))])
    with torch.inference_mode():
        ref = torch.log_softmax(hf(torch.tensor([ids], device=DEVICE)).logits[0].float(), -1).cpu()
    want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    row["prompt_logprob_max_abs_diff"] = (got - want).abs().max().item()
    row["prompt_tokens"] = len(ids)
    print(f"  parity {label}: {row['identical']}/{row['prompts']} continuations identical over {n} tokens "
          f"(agreeing prefix {row['agreeing_prefix']}); prompt log-probs over {len(ids)} tokens: "
          f"max |diff| {row['prompt_logprob_max_abs_diff']:.2e}", flush=True)
    del llm, hf
    if DEVICE.startswith("cuda"):
        torch.cuda.empty_cache()
    return row


def speed(folder: Path, bw: float, batches=(1, 8), n=128, repeats=3) -> list[dict]:
    rows = []
    hf = hf_model(folder, torch.bfloat16)
    engines = {}
    for compiled in (False, True):
        start = time.perf_counter()
        engines["compiled" if compiled else "eager"] = LLM(model=str(folder), dtype="bfloat16", device=DEVICE,
                                                          enforce_eager=not compiled, max_num_seqs=max(batches),
                                                          kv_cache_memory_bytes=pool_bytes())
        print(f"  tinyinfer {'compiled' if compiled else 'eager'} built in {time.perf_counter() - start:.1f} s",
              flush=True)
    llm = engines["eager"]
    ids = llm.get_tokenizer().encode(" ".join(PROMPTS))[:32]
    weight_bytes = sum(p.numel() * p.element_size() for p in llm.model.parameters())
    bound = bw / weight_bytes  # steps/s if a step did nothing but read every weight once
    for batch in batches:
        times = {name: [] for name in (*engines, "transformers")}
        for name, e in engines.items():
            time_tinyinfer(e, ids, 8, batch)  # warm-up
        time_transformers(hf, ids, 8, batch)
        for _ in range(repeats):  # interleaved, so a slow moment hits every engine
            for name, e in engines.items():
                times[name].append(time_tinyinfer(e, ids, n, batch))
            times["transformers"].append(time_transformers(hf, ids, n, batch))
        hf_tps = batch * n / min(times["transformers"])
        for name, ts in times.items():
            tps = batch * n / min(ts)
            row = {"model": folder.name, "engine": "transformers eager" if name == "transformers"
                   else f"tinyinfer {name}", "batch": batch, "tok_s": tps, "vs_transformers": tps / hf_tps,
                   "ms_per_step": 1e3 * min(ts) / n, "fraction_of_bw_bound": tps / batch / bound}
            rows.append(row)
            print(f"  {folder.name:12} batch {batch:2d} {row['engine']:20} {tps:8.1f} tok/s "
                  f"{row['ms_per_step']:6.2f} ms/step  x{row['vs_transformers']:.2f} vs transformers  "
                  f"{row['fraction_of_bw_bound']:.0%} of the bandwidth bound", flush=True)
    RESULTS.setdefault("weight_bytes", {})[folder.name] = weight_bytes
    del engines, llm, hf
    if DEVICE.startswith("cuda"):
        torch.cuda.empty_cache()
    return rows


def section(name: str, fn, *args, **kw):
    print(f"\n== {name}", flush=True)
    start = time.perf_counter()
    try:
        RESULTS[name] = fn(*args, **kw)
    except Exception as e:  # one broken section must not hide the others
        traceback.print_exc()
        RESULTS[name] = {"error": f"{type(e).__name__}: {e}"}
    print(f"   ({time.perf_counter() - start:.0f} s)", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer-dir", default=None, help="a folder with tokenizer.json (default: packaged model)")
    ap.add_argument("--out", default=None, help="write cuda_check.json here")
    ap.add_argument("--sizes", default="135m,1.7b", help="shapes to time: 135m, 1.7b")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("cuda_check: torch sees no CUDA device")
    if args.tokenizer_dir:
        tok_dir = Path(args.tokenizer_dir)
    else:
        from tinyinfer.weights import ensure_packaged_model

        tok_dir = ensure_packaged_model()
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 parity means fp32 products
    torch.backends.cudnn.allow_tf32 = False
    bw = measure_bandwidth(torch.device(DEVICE))
    name = torch.cuda.get_device_name() if DEVICE.startswith("cuda") else "CPU"
    RESULTS["device"] = {"name": name, "torch": torch.__version__, "measured_read_bandwidth_GBs": bw / 1e9}
    print(f"{name}, torch {torch.__version__}, measured read bandwidth {bw / 1e9:.0f} GB/s",
          flush=True)
    root = Path(tempfile.mkdtemp(prefix="cuda_check_"))
    small = "tiny" if "tiny" in args.sizes else "135m"
    f32 = make_model(small, torch.float32, tok_dir, root)
    section("parity fp32 eager", parity, f32, torch.float32, False)
    section("parity fp32 compiled", parity, f32, torch.float32, True)
    b16 = make_model(small, torch.bfloat16, tok_dir, root)
    section("parity bf16 eager", parity, b16, torch.bfloat16, False)
    for size in args.sizes.split(","):
        folder = b16 if size == small else make_model(size, torch.bfloat16, tok_dir, root)
        section(f"speed {size}", speed, folder, bw)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "cuda_check.json").write_text(json.dumps(RESULTS, indent=1))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
