"""The engine on a CUDA GPU, in two short commands that write one JSON report.

    python benchmarks/gpu_check.py engine    --out DIR [--tokenizer-dir DIR] [--compiled]
    python benchmarks/gpu_check.py notebooks --out DIR [--tokenizer-dir DIR] [--wheels DIR] [--names 01,02]

Each command is meant to take under 5 minutes on an H200; both write (or add
to) DIR/gpu_check.json, whose schema the book's renderer reads:
  meta       the machine, the versions, the measured read bandwidth (GB/s), the
             measured cost of one kernel launch from PyTorch (launch_us), the
             command, and the engine's stamp (fingerprint.stamp over the modules
             an LLM runs);
  parity     fp32 with TF32 off, the 135M shape: greedy continuations identical
             to transformers' generate, and the largest difference of a prompt's
             log-probabilities from transformers' forward pass; eager and with
             CUDA graphs (and compiled, with --compiled);
  decode     bf16, batch 1 and 8, the 135M and 1.7B shapes: the time of one
             decode STEP (prefill excluded: the engine is stepped by hand and
             only decode steps are timed), the bandwidth bound (weight bytes /
             measured bandwidth), the fraction of it reached, and the kernel
             launches per step (torch.profiler's cudaLaunchKernel, cudaGraphLaunch
             and the like; copies not counted). Modes: eager, graphs (CUDA
             graphs, enforce_eager=False), compiled (torch.compile without graphs,
             135M only, with --compiled: 1.5-2.5 minutes of compiling) and
             transformers (its eager model, stepped with its KV cache);
  notebooks  every solutions/*.ipynb executed top to bottom (lax: values may
             differ from the CPU recording; a cell that raises fails it), with
             its time.

The weights. A GPU machine may have no network and no copy of the model, and
one call to it carries at most 64 MiB (the default model's converted folder is
538 MB). So the weights are random, seeded, in the real shapes; only the
tokenizer files (and the default model's config.json) travel, 4 MB:
  - engine: models in the shapes of SmolLM2-135M and SmolLM2-1.7B are made
    here (the vocabulary and tokenizer are SmolLM2's, so one tokenizer serves both);
  - notebooks: TINYINFER_RANDOM_WEIGHTS=1 makes the default model load as
    seeded random weights in its real shape with the real tokenizer
    (weights.random_weights_model). The notebooks' text is then noise, and a
    check of a value may print a cross; no cell may raise.
--tokenizer-dir names a folder with config.json, tokenizer.json,
tokenizer_config.json and chat_template.jinja (default: the packaged model's folder).

Packages. The engine command needs torch, transformers and safetensors (and
tinyinfer: PYTHONPATH=src). The notebooks also need nbclient, nbformat and
ipykernel (with jupyter_client, pyzmq, tornado, traitlets), matplotlib, numpy,
and what the labs import (fastapi, uvicorn, httpx, aiohttp for the serving
labs). Where the GPU machine lacks some, bring them as wheels: on a machine
with the network,
    pip download -d wheels --only-binary=:all: --python-version 3.X nbclient ipykernel ...
then carry `wheels/` (under 64 MiB) and pass --wheels wheels: the command
installs them first with pip --no-index. The command lists what is missing
before it runs anything.

--device cpu --sizes tiny runs the same code on a CPU in seconds: a smoke test
of this script (there, "graphs" is the CPU stand-in of cuda_graphs.py, and
the numbers mean nothing). The README's "On a GPU" section says how to run it.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ROOT = Path(__file__).resolve().parents[1]
REPORT = "gpu_check.json"

# The shapes (from each model's config.json on the Hub); vocabulary and
# tokenizer are SmolLM2's, so the same tokenizer files serve all.
SHAPES = {
    "135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3),
    "1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                 num_key_value_heads=32),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),  # --device cpu smoke runs
}
COMMON = dict(vocab_size=49152, max_position_embeddings=8192, rope_theta=130000.0, rms_norm_eps=1e-5,
              tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Here is a short poem about the sea:\n",
           "In one sentence, the lighthouse keeper's advice was"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# torch.profiler's names for the CUDA runtime and driver calls that launch work on the GPU.
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
            "cudaLaunchCooperativeKernel", "cudaGraphLaunch", "cuGraphLaunch")
# Several engines and a transformers model live side by side: each engine gets a
# fixed KV pool, not gpu_memory_utilization's share, which the first would take.
KV_POOL_BYTES = 4 * 2**30
DEVICE = "cuda"


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


@contextlib.contextmanager
def decode_mode(mode: str):
    """Build engines for `mode` inside this block. enforce_eager=False records
    CUDA graphs on a GPU; "compiled" asks for torch.compile without graphs (the
    CPU's path) by giving the runner no graph backend; on a CPU, "graphs" is
    the CPU stand-in (cuda_graphs.EagerStandIn)."""
    from tinyinfer import cuda_graphs

    real = cuda_graphs.default_graph_backend
    if mode == "compiled":
        cuda_graphs.default_graph_backend = lambda device: None
    elif mode == "graphs" and not is_cuda():
        cuda_graphs.default_graph_backend = lambda device: cuda_graphs.EagerStandIn()
    try:
        yield dict(enforce_eager=mode == "eager")
    finally:
        cuda_graphs.default_graph_backend = real


def engine(folder: Path, dtype: str, mode: str, max_num_seqs: int):
    from tinyinfer import LLM

    with decode_mode(mode) as kw:
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


def count_launches(step, steps: int) -> int | None:
    """Kernel launches per call of step(), counted by torch.profiler over `steps` calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not is_cuda():
        return None
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    launches = sum(e.count for e in prof.key_averages() if e.key in LAUNCHES)
    return round(launches / steps)


# ------------------------------------------------------------------ the engine command


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
    one warm-up step), then count the launches of a few more. Returns (ms per step, launches)."""
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
    launches = count_launches(engine_.step, 4)
    engine_.abort_request(list(engine_.requests))
    while engine_.has_unfinished_requests():
        engine_.step()
    return ms, launches


def transformers_steps(hf, ids: list[int], batch: int, steps: int):
    """The same for transformers: its prefill, then greedy steps on its KV cache."""
    import torch

    import inspect

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
        launches = count_launches(step, 4)
    return ms, launches


def decode_rows(folder: Path, shape: str, modes: list[str], bandwidth: float, steps: int) -> list[dict]:
    import torch

    rows = []
    hf = hf_model(folder, torch.bfloat16)
    nbytes = weight_bytes(hf)
    bound_ms = nbytes / bandwidth * 1e3
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(folder).encode(" ".join(PROMPTS))[:32]  # a 32-token prompt
    for mode in modes:
        llm = None if mode == "transformers" else engine(folder, "bfloat16", mode, max_num_seqs=8)
        for batch in (1, 8):
            if llm is None:
                ms, launches = transformers_steps(hf, ids, batch, steps)
            else:
                ms, launches = tinyinfer_steps(llm, ids, batch, steps)
            row = {"shape": shape, "weight_bytes": nbytes, "dtype": "bfloat16", "batch": batch, "mode": mode,
                   "step_ms": ms, "step_ms_includes_prefill": False, "bound_ms": bound_ms,
                   "fraction_of_bound": bound_ms / ms, "launches_per_step": launches}
            rows.append(row)
            print(f"  {shape:5} batch {batch} {mode:12} {ms:7.2f} ms/step  {row['fraction_of_bound']:6.1%} of the "
                  f"bound ({bound_ms:.3f} ms)  launches/step {launches}", flush=True)
        del llm
        free_memory()
    del hf
    free_memory()
    return rows


def engine_stamp() -> dict:
    """The stamp chapter 4 compares with today's engine: gpu_report's, so the two agree."""
    from tinyinfer.bench.gpu_report import engine_stamp as stamp

    return stamp()


def meta(command: str, bandwidth: float | None, launch_us: float | None) -> dict:
    import torch
    import transformers

    return {"date": datetime.date.today().isoformat(),
            "device": torch.cuda.get_device_name() if is_cuda() else "CPU",
            "torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
            "bandwidth_gbs": None if bandwidth is None else bandwidth / 1e9, "launch_us": launch_us,
            "weights": "random, seeded, in the real shapes", "command": command, "engine_stamp": engine_stamp()}


def run_engine(args, report: dict, tok_dir: Path) -> None:
    import torch

    from tinyinfer.hardware import measure_bandwidth

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 parity means fp32 products
    torch.backends.cudnn.allow_tf32 = False
    bandwidth = measure_bandwidth(torch.device(DEVICE), nbytes=None if is_cuda() else 2**26)
    report["meta"] = meta(args.command, bandwidth, launch_cost_us())
    print(f"{report['meta']['device']}, torch {torch.__version__}, read bandwidth {bandwidth / 1e9:.0f} GB/s, "
          f"launch {report['meta']['launch_us']} us", flush=True)
    sizes = args.sizes.split(",")
    small = sizes[0]
    root = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    report["parity"], report["decode"] = [], []
    try:
        f32 = make_model(small, torch.float32, tok_dir, root)
        for mode in ["eager", "graphs"] + (["compiled"] if args.compiled else []):
            section(f"parity {mode}", lambda: report["parity"].append(parity(f32, mode, args.parity_tokens)))
        shutil.rmtree(f32, ignore_errors=True)
        for shape in sizes:
            modes = ["eager", "graphs", "transformers"] + (["compiled"] if args.compiled and shape == small else [])
            folder = make_model(shape, torch.bfloat16, tok_dir, root)
            section(f"decode {shape}", lambda: report["decode"].extend(
                decode_rows(folder, shape, modes, bandwidth, args.steps)))
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def section(name: str, fn) -> None:
    """Run one part; a part that fails prints its error and the next runs."""
    print(f"\n== {name}", flush=True)
    start = time.perf_counter()
    try:
        fn()
    except Exception:  # noqa: BLE001 - one broken part must not hide the others
        traceback.print_exc()
    print(f"   ({time.perf_counter() - start:.0f} s)", flush=True)


# ------------------------------------------------------------------ the notebooks command

NOTEBOOK_MODULES = ("nbclient", "nbformat", "ipykernel", "matplotlib", "numpy")


def install_wheels(wheels: Path | None) -> None:
    """Install every wheel in `wheels` without the network, then say what is still missing."""
    if wheels is not None:
        names = sorted({w.name.split("-")[0] for w in wheels.glob("*.whl")})
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
                        str(wheels), *names], check=True)
    missing = [m for m in NOTEBOOK_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        sys.exit(f"gpu_check notebooks: missing Python packages {', '.join(missing)}; bring them as wheels "
                 "(see this script's docstring) and pass --wheels DIR")


def notebook_env(tok_dir: Path, home: Path) -> dict:
    """The kernels' environment: tinyinfer from this checkout, and the default
    model as random weights in its real shape, made from the tokenizer files."""
    (home / "smollm2-135m-instruct").mkdir(parents=True, exist_ok=True)
    for f in ("config.json", *TOKENIZER_FILES):
        if (tok_dir / f).exists():
            shutil.copy(tok_dir / f, home / "smollm2-135m-instruct" / f)
    env = {"TINYINFER_HOME": str(home), "TINYINFER_RANDOM_WEIGHTS": "1",
           "TINYINFER_MY_ENGINE": str(home / "my-engine"),  # shared in order: lab 4 loads what lab 3 kept
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
           "NO_COLOR": "1"}
    if not is_cuda():
        env["CUDA_VISIBLE_DEVICES"] = ""  # device="auto" picks the CPU
    return env


def run_notebook(path: Path, timeout_s: int) -> dict:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    error = None
    try:
        NotebookClient(nb, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
                       ).execute()
    except Exception as e:  # noqa: BLE001 - a failing cell: its error goes into the report
        lines = str(e).strip().splitlines()
        error = f"{type(e).__name__}: {lines[-1] if lines else ''}"[:500]
    seconds = time.perf_counter() - start
    print(f"  {path.stem:24} {seconds:7.1f} s  {'ok' if error is None else error}", flush=True)
    return {"name": path.stem, "seconds": seconds, "ok": error is None, "error": error}


def run_notebooks(args, report: dict, tok_dir: Path) -> None:
    install_wheels(Path(args.wheels) if args.wheels else None)
    home = Path(tempfile.mkdtemp(prefix="gpu_check_home_"))
    os.environ.update(notebook_env(tok_dir, home))  # the kernels inherit it
    from tinyinfer.weights import ensure_packaged_model

    ensure_packaged_model()  # the random weights, made once, before the clock of the first notebook
    paths = sorted((ROOT / "solutions").glob("*.ipynb"))
    if args.names:
        paths = [p for p in paths if any(p.stem.startswith(n) for n in args.names.split(","))]
    rows = {row["name"]: row for row in report.get("notebooks", [])}  # a second run adds to the first
    deadline = time.perf_counter() + args.budget_s
    for path in paths:
        if time.perf_counter() > deadline:
            print(f"  {path.stem}: not run, the budget of {args.budget_s} s is spent", flush=True)
            continue
        rows[path.stem] = run_notebook(path, args.cell_timeout_s)
    report["notebooks"] = sorted(rows.values(), key=lambda row: row["name"])
    if report.get("meta"):  # the engine command's report: say that this command added to it
        report["meta"]["command"] += f" && {args.command}"
    else:
        report["meta"] = meta(args.command, None, launch_cost_us())
    shutil.rmtree(home, ignore_errors=True)


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("engine", "notebooks"))
    ap.add_argument("--out", required=True, help=f"folder of the report ({REPORT}); an existing one is added to")
    ap.add_argument("--tokenizer-dir", default=None, help="config and tokenizer files (default: the packaged model's)")
    ap.add_argument("--sizes", default="135m,1.7b", help="engine: the shapes, the first also for parity")
    ap.add_argument("--steps", type=int, default=64, help="engine: decode steps timed per row")
    ap.add_argument("--parity-tokens", type=int, default=48, help="engine: greedy tokens per prompt")
    ap.add_argument("--compiled", action="store_true", help="engine: also torch.compile without graphs (135M)")
    ap.add_argument("--wheels", default=None, help="notebooks: a folder of wheels to install first, offline")
    ap.add_argument("--names", default=None, help="notebooks: only these (prefixes: 01,04-prefill)")
    ap.add_argument("--budget-s", type=int, default=270, help="notebooks: start no notebook after this many seconds")
    ap.add_argument("--cell-timeout-s", type=int, default=240, help="notebooks: the longest a cell may run")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: a smoke test of this script
    args = ap.parse_args(argv)
    args.command = "python benchmarks/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:])
    global DEVICE
    DEVICE = args.device
    import torch

    if is_cuda() and not torch.cuda.is_available():
        sys.exit("gpu_check: torch sees no CUDA device (--device cpu runs a smoke test)")
    if args.tokenizer_dir:
        tok_dir = Path(args.tokenizer_dir)
    else:
        from tinyinfer.weights import cache_dir

        tok_dir = cache_dir() / "smollm2-135m-instruct"
    if not (tok_dir / "tokenizer.json").exists():
        sys.exit(f"gpu_check: no tokenizer.json in {tok_dir}; pass --tokenizer-dir")
    out = Path(args.out) / REPORT
    report = json.loads(out.read_text()) if out.exists() else {}
    (run_engine if args.what == "engine" else run_notebooks)(args, report, tok_dir)
    report = {key: report.get(key, []) for key in ("meta", "parity", "decode", "notebooks")}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {out}", flush=True)


if __name__ == "__main__":
    main()
