"""Drive the load: release requests on the workload's clock, cap how many are
in flight, collect the records, add them up.

An open-loop benchmark: requests arrive when the arrival process says, whether
or not earlier ones have finished, as real users do. If the server falls
behind, queues grow and TTFT climbs; a closed loop (send the next when one
finishes) would hide that. `max_concurrency` caps requests in flight on the
client side, the way a gateway or a fixed pool of callers would.
"""
from __future__ import annotations

import asyncio
import contextlib
import math
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from tqdm import tqdm

from ..metrics import RequestRecord
from ..workload import arrival_times
from .client import build_payload, endpoint_url, send_request
from .prompts import load_tokenizer, make_requests
from .results import BenchResult, calculate_metrics, parse_goodput


async def benchmark(base_url: str, model: str, num_prompts: int = 64, request_rate: float = math.inf,
                    max_concurrency: int | None = None, input_len=128, output_len=64, *,
                    endpoint_type: str = "completions", arrival: str = "poisson", goodput=None,
                    percentiles=(50, 95, 99), tokenizer=None, api_key: str | None = None, seed: int = 0,
                    ignore_eos: bool = True, extra_body: dict | None = None, timeout: float = 600.0,
                    progress: bool = False) -> BenchResult:
    """The benchmark as a coroutine (`await benchmark(...)` inside a running loop).
    Arguments as run_benchmark."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1 or None (no cap), got {max_concurrency}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    url = endpoint_url(base_url, endpoint_type)
    slos = parse_goodput(goodput)  # bad SLOs fail now, not after the run
    specs = make_requests(num_prompts, input_len, output_len, seed, load_tokenizer(tokenizer))
    arrivals = arrival_times(num_prompts, request_rate, arrival, seed=[seed, 1])  # a stream of its own
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    records = [RequestRecord(i, s.prompt_len, s.max_tokens) for i, s in enumerate(specs)]
    # One pool of connections for the run, sized to the cap. pool=None: a request
    # waiting for a free connection is the cap working, not a timeout.
    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
    # trust_env=False: no proxy from the environment sits between us and the server.
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, pool=None), limits=limits,
                                 trust_env=False) as client:
        cap = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
        bar = tqdm(total=num_prompts, desc="bench", unit="req", disable=not progress)
        t0 = time.perf_counter()

        async def one(spec, record, at):
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            record.arrival_time = time.perf_counter() - t0
            async with cap:  # FIFO: requests are served in arrival order
                payload = build_payload(endpoint_type, model, spec.prompt, spec.max_tokens, ignore_eos, extra_body)
                await send_request(client, url, payload, headers, record, t0, endpoint_type)
            bar.update(1)

        await asyncio.gather(*(one(s, r, float(a)) for s, r, a in zip(specs, records, arrivals)))
        duration = time.perf_counter() - t0
        bar.close()
    config = dict(base_url=base_url, endpoint=url, model=model, num_prompts=num_prompts, request_rate=request_rate,
                  arrival=arrival, max_concurrency=max_concurrency, input_len=_jsonable(input_len),
                  output_len=_jsonable(output_len), seed=seed, ignore_eos=ignore_eos,
                  tokenizer=tokenizer if isinstance(tokenizer, str) else None)
    return calculate_metrics(records, duration, percentiles, slos, config)


def run_benchmark(base_url: str, model: str, num_prompts: int = 64, request_rate: float = math.inf,
                  max_concurrency: int | None = None, input_len=128, output_len=64, *,
                  endpoint_type: str = "completions", arrival: str = "poisson", goodput=None,
                  percentiles=(50, 95, 99), tokenizer=None, api_key: str | None = None, seed: int = 0,
                  ignore_eos: bool = True, extra_body: dict | None = None, timeout: float = 600.0,
                  progress: bool = False) -> BenchResult:
    """Load-test an OpenAI-compatible server from ordinary (synchronous) code.

    base_url        e.g. "http://127.0.0.1:8000" (a trailing /v1 is fine)
    request_rate    requests/s; inf sends everything at once
    arrival         "poisson" (exponential gaps, seeded) or "fixed" (gaps of 1/rate)
    max_concurrency most requests in flight at once (None: no cap)
    input_len, output_len  N, (LO, HI) uniform, or a list to draw from; "N", "LO:HI", "N1,N2" too
    goodput         SLOs in ms, {"ttft": 500, "tpot": 50} or ["ttft:500", "tpot:50"]
    tokenizer       None (about one token per word), "cl100k_base", a model name or folder,
                    or a tokenizer object: prompts then have exactly input_len tokens
    endpoint_type   "completions" or "chat"
    """
    return run_sync(benchmark(base_url, model, num_prompts, request_rate, max_concurrency, input_len, output_len,
                              endpoint_type=endpoint_type, arrival=arrival, goodput=goodput,
                              percentiles=percentiles, tokenizer=tokenizer, api_key=api_key, seed=seed,
                              ignore_eos=ignore_eos, extra_body=extra_body, timeout=timeout, progress=progress))


def run_sync(coro):
    """Run a coroutine to its end from ordinary code and return its result, also where
    an event loop already runs in this thread (Jupyter's kernel runs one): asyncio.run
    refuses to nest, so there it runs on a fresh loop in a helper thread. For
    run_benchmark, and for any caller that replays requests from a notebook."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _jsonable(length_spec):
    return list(length_spec) if isinstance(length_spec, tuple) else length_spec
