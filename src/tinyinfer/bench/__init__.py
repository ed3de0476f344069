"""A load generator for any OpenAI-compatible server (tinyinfer's, vLLM's, ...).

    from tinyinfer.bench import run_benchmark
    res = run_benchmark("http://127.0.0.1:8000", "smollm2-135m-instruct",
                        num_prompts=64, request_rate=4, max_concurrency=16,
                        input_len=128, output_len=64, goodput={"ttft": 500})
    print(res.table()); res.to_dict()

One concept per file:
    prompts.py   what to send: synthetic prompts of chosen lengths (when to send,
                 and the length distributions: tinyinfer.workload)
    client.py    one streaming request, timed chunk by chunk (SSE parsing)
    results.py   per-request records and the vLLM-style metrics over them
    runner.py    the open-loop driver: arrivals, concurrency cap, the sync wrapper
    command.py   `tinyinfer bench` (add_arguments, run)
"""
from .command import add_arguments, run
from .results import BenchResult, Latency, RequestRecord, calculate_metrics, parse_goodput
from .runner import benchmark, run_benchmark
from ..workload import arrival_times, parse_length, sample_lengths
from .prompts import make_requests, synthetic_prompt

__all__ = ["run_benchmark", "benchmark", "BenchResult", "Latency", "RequestRecord", "calculate_metrics",
           "parse_goodput", "arrival_times", "make_requests", "parse_length", "sample_lengths",
           "synthetic_prompt", "add_arguments", "run"]
