"""One policy measured on a real fleet, and the simulator's prediction of the same run.

    rows = measure_policy(fleet, turns, model)          # what the client and the replicas saw
    sim = simulate_policy(turns, rows, cost, "cache_aware", replicas=2)

measure_policy replays the session workload (sessions.py) through the router:
each turn is sent at its arrival time, whether or not earlier replies are done
(an open loop, as many independent users are), streamed, with `tinyinfer bench`'s
client, so TTFT is the client's: first content chunk minus send. Before and
after, it reads every replica's /metrics; the differences give each replica's
share of the requests and its prefix-cache hit rate (prompt tokens read from the
cache / prompt tokens). It also keeps the steps each replica ran (/debug/steps),
so the simulator can be run a second time on the step costs the replicas
really had while they shared the machine.

simulate_policy replays the same requests, sent at the same moments, through
fleet.simulate with the simulator's nearest policy (live_fleet.SIM_POLICY).
The fleet's processes themselves are started by live_fleet.py.
"""
from __future__ import annotations

import asyncio
import time

from tinyinfer.bench.runner import run_sync
from tinyinfer.metrics import RequestRecord, percentile
from .live_fleet import SIM_POLICY, Fleet
from .sim_replica import ReplicaConfig
from .sessions import Turn, to_sim_requests

WARMUP_PROMPT = "Warm-up request number"


def replay(url: str, turns: list[Turn], model: str, timeout_s: float = 300.0) -> list[RequestRecord]:
    """Send every turn through `url` at its arrival time; one RequestRecord each."""
    return run_sync(_replay(url, turns, model, timeout_s))  # also inside lab 8's running event loop


async def _replay(url: str, turns: list[Turn], model: str, timeout_s: float) -> list[RequestRecord]:
    import httpx

    from tinyinfer.bench.client import build_payload, endpoint_url, send_request

    endpoint = endpoint_url(url, "completions")
    limits = httpx.Limits(max_connections=len(turns), max_keepalive_connections=len(turns))
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits, trust_env=False) as client:
        t0 = time.perf_counter()

        async def one(turn: Turn) -> RequestRecord:
            await asyncio.sleep(max(0.0, turn.arrival_time - (time.perf_counter() - t0)))
            record = RequestRecord(turn.request_id, turn.prompt_len, turn.output_len, arrival_time=turn.arrival_time)
            payload = build_payload("completions", model, turn.prompt, turn.output_len,
                                    extra_body={"temperature": 0.0})
            return await send_request(client, endpoint, payload, {}, record, t0)

        return list(await asyncio.gather(*(one(t) for t in turns)))


def warm_up(fleet: Fleet, model: str) -> None:
    """One short request to each replica directly: the first request of a fresh
    process pays one-off costs (lazy imports, first kernels) that are not routing."""
    import httpx

    for i, url in enumerate(fleet.replica_urls):
        body = {"model": model, "prompt": f"{WARMUP_PROMPT} {i}", "max_tokens": 2, "temperature": 0}
        httpx.post(url + "/v1/completions", json=body, timeout=300, trust_env=False).raise_for_status()


def _steps(url: str) -> list[dict]:
    import httpx

    return httpx.get(url + "/debug/steps", timeout=30, trust_env=False).json()["steps"]


def measure_policy(fleet: Fleet, turns: list[Turn], model: str) -> dict:
    """Replay `turns` through the fleet's router; the row the report stores."""
    warm_up(fleet, model)
    before = fleet.metrics()
    steps_before = [len(_steps(u)) for u in fleet.replica_urls]
    records = replay(fleet.url, turns, model)
    after = fleet.metrics()
    steps = [_steps(u)[n:] for u, n in zip(fleet.replica_urls, steps_before)]

    def delta(name: str) -> list[int]:
        return [int(round(b.get(name, 0) - a.get(name, 0))) for a, b in zip(before, after)]

    ok = [r for r in records if r.ok]
    served, prompt, hits = delta("vllm:request_success_total"), delta("vllm:prompt_tokens_total"), \
        delta("vllm:prefix_cache_hits_total")
    ttft = [r.ttft for r in ok]
    return {
        "policy": fleet.policy,
        "completed": len(ok), "failed": len(records) - len(ok),
        "errors": sorted({r.error[:200] for r in records if not r.ok})[:3],
        "served": served,
        "share": [s / max(1, sum(served)) for s in served],
        "prompt_tokens": prompt, "prefix_hit_tokens": hits,
        "prefix_hit_rate": sum(hits) / max(1, sum(prompt)),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p95_s": percentile(ttft, 95),
        "e2e_p50_s": percentile([r.e2el for r in ok], 50), "e2e_p95_s": percentile([r.e2el for r in ok], 95),
        # when each request really left the client (later than planned if the loop was late)
        "send_times": [round(r.send_time, 4) for r in sorted(records, key=lambda r: r.index)],
        "steps": [[(s["prefill_tokens"], s["decode_seqs"], s["turn_s"]) for s in rs] for rs in steps],
    }


def simulate_policy(turns: list[Turn], row: dict, cost, policy: str, replicas: int, config: ReplicaConfig,
                    seed: int = 0) -> dict:
    """The simulator on the same requests, each arriving when the client really sent it."""
    from dataclasses import replace

    from .simulator import simulate

    reqs = to_sim_requests(turns)
    sends = row["send_times"]
    t0 = min(sends)
    reqs = [replace(r, arrival_time=sends[r.request_id] - t0) for r in reqs]
    rep = simulate(reqs, replicas=replicas, cost_model=cost, policy=SIM_POLICY[policy], replica_config=config,
                   seed=seed)
    done = [q for q in rep.requests if q.ttft is not None]
    served = [r.completed for r in rep.replicas]
    prompt_tokens = sum(r.prompt_len for r in reqs)
    return {
        "policy": SIM_POLICY[policy],
        "completed": rep.completed, "served": served,
        "share": [s / max(1, sum(served)) for s in served],
        "prefix_hit_tokens": [r.prefix_cache_hit_tokens for r in rep.replicas],
        "prefix_hit_rate": rep.prefix_cache_hit_tokens / max(1, prompt_tokens),
        "ttft_p50_s": percentile([q.ttft for q in done], 50), "ttft_p95_s": percentile([q.ttft for q in done], 95),
        "e2e_p50_s": percentile([q.e2e for q in done], 50), "e2e_p95_s": percentile([q.e2e for q in done], 95),
    }
