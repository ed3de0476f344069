"""`tinyinfer bench`: the command line over run_benchmark.

    tinyinfer bench --base-url http://127.0.0.1:8000 --model smollm2-135m-instruct \\
        --num-prompts 64 --request-rate 4 --max-concurrency 16 --input-len 128 --output-len 64 \\
        --goodput ttft:500 tpot:50 --save-result out.json

The flags follow `vllm bench serve` where the two overlap, so the same command
line (with `vllm bench serve` in front) can be pointed at a vLLM server.
"""
from __future__ import annotations

import argparse
import json
import os

from .runner import run_benchmark


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (a trailing /v1 is fine)")
    p.add_argument("--endpoint-type", choices=("completions", "chat"), default="completions",
                   help="/v1/completions or /v1/chat/completions")
    p.add_argument("--model", default="smollm2-135m-instruct", help="the model name the server serves")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second; inf (default) sends all at once")
    p.add_argument("--arrival", choices=("poisson", "fixed"), default="poisson",
                   help="gaps between requests: exponential (Poisson process) or exactly 1/rate")
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight at once")
    p.add_argument("--input-len", default="128", help="prompt tokens: N, LO:HI (uniform) or N1,N2,... (drawn)")
    p.add_argument("--output-len", default="64", help="max_tokens: N, LO:HI (uniform) or N1,N2,... (drawn)")
    p.add_argument("--tokenizer", default=None,
                   help="cut prompts to exact token counts with this tokenizer (cl100k_base, a model name or folder)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                   help="sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="ask the server to generate exactly max_tokens tokens (default: on)")
    p.add_argument("--goodput", nargs="+", default=None, metavar="METRIC:MS",
                   help="SLOs for goodput, e.g. ttft:500 tpot:50 e2el:5000 (milliseconds)")
    p.add_argument("--percentiles", default="50,95,99", help="comma-separated percentiles to report")
    p.add_argument("--extra-body", default=None, help='JSON merged into every request, e.g. \'{"temperature": 0}\'')
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait on a silent connection")
    p.add_argument("--save-result", default=None, metavar="PATH",
                   help="write the summary and per-request arrays as JSON")
    p.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


def run(args) -> int:
    try:
        percentiles = [float(q) for q in args.percentiles.split(",") if q.strip()]
    except ValueError:
        raise ValueError(f"--percentiles: {args.percentiles!r} is not a comma-separated list of numbers") from None
    try:
        extra_body = json.loads(args.extra_body) if args.extra_body else None
    except json.JSONDecodeError as e:
        raise ValueError(f"--extra-body is not valid JSON: {e}") from None
    result = run_benchmark(
        args.base_url, args.model, args.num_prompts, args.request_rate, args.max_concurrency,
        args.input_len, args.output_len, endpoint_type=args.endpoint_type, arrival=args.arrival,
        goodput=args.goodput, percentiles=percentiles, tokenizer=args.tokenizer, api_key=args.api_key,
        seed=args.seed, ignore_eos=args.ignore_eos, extra_body=extra_body, timeout=args.timeout,
        progress=not args.disable_tqdm)
    print(result.table())
    errors = [r.error for r in result.records if r.error]
    for e in errors[:5]:  # a few examples say more than a count
        print("error:", e)
    if args.save_result:
        with open(args.save_result, "w") as f:
            json.dump(result.to_dict(), f, indent=1)
        print("saved", args.save_result)
    return 0 if result.completed else 1
