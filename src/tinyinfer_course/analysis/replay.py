"""Replay a workload through a real LLMEngine, as an open-loop client would.

    from tinyinfer import LLMEngine
    from tinyinfer_course.fleet import make_workload
    from tinyinfer_course.analysis.replay import replay

    engine = LLMEngine(max_num_seqs=4, enable_prefix_caching=False)
    run = replay(engine, make_workload(12, rate=6, prompt_len=(8, 64), output_len=(4, 20)))
    print(run.throughput, run.latency(95))

Each request of the workload (tinyinfer_course.fleet.SimRequest: arrival time, prompt
and output lengths) is added to the engine when its arrival time comes, whatever
the engine is doing: open loop, like independent users. A request that arrives
during a step is added after that step, and the wait counts in its latency,
because its arrival time is the scheduled one, not the moment we got to it.
Prompts are random token ids (seeded), and every request runs greedy with
ignore_eos for exactly output_len tokens, so every configuration does the same
work.

The result keeps one record per request (a metrics.RequestRecord, the same
kind tinyinfer bench keeps: when it arrived and when each token came) and one
per engine step (what ran, what waited, and the KV cache
reserved against the KV cache holding real tokens), enough to plot throughput,
latency percentiles, a timeline of the batch and the memory it wasted.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from tinyinfer.metrics import RequestRecord, percentile
from tinyinfer.sampling import SamplingParams


@dataclass(frozen=True)
class StepRecord:
    """One engine step: when it ended, how long it took, and the state after it."""

    end: float  # seconds since the replay started
    duration: float
    num_running: int
    num_waiting: int
    num_prefill_tokens: int
    num_decode_tokens: int
    kv_bytes_reserved: int  # cache set aside for the running requests
    kv_bytes_used: int  # of it, bytes holding real tokens' keys and values


@dataclass
class ReplayResult:
    requests: list[RequestRecord]
    steps: list[StepRecord]
    duration: float  # first arrival to last token, seconds

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)

    @property
    def throughput(self) -> float:
        """Output tokens per second over the whole run."""
        return self.output_tokens / self.duration

    def latency(self, q: float) -> float:
        """The q-th percentile of end-to-end latency, in seconds."""
        return percentile([r.e2el for r in self.requests], q)

    def kv_waste(self) -> float:
        """Share of the reserved KV bytes that held no token, over all steps."""
        reserved = sum(s.kv_bytes_reserved for s in self.steps)
        return 1 - sum(s.kv_bytes_used for s in self.steps) / reserved if reserved else 0.0


def prompt_ids(prompt_len: int, vocab_size: int, seed: int) -> list[int]:
    """A random prompt: different requests share no prefix, so the prefix cache
    cannot skip any prefill and flatter one configuration over another."""
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(100, vocab_size, size=prompt_len)]


def replay(engine, workload, seed: int = 0) -> ReplayResult:
    """Run `workload` (SimRequests sorted by arrival) through `engine` until all
    requests finish. The engine must be idle when called."""
    if engine.has_unfinished_requests():
        raise ValueError("engine: has unfinished requests; replay needs an idle engine")
    pending = sorted(workload, key=lambda r: r.arrival_time)
    vocab = engine.model_config.vocab_size
    start = time.perf_counter()
    records, steps = {}, []
    i = 0
    while i < len(pending) or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        if not engine.has_unfinished_requests() and pending[i].arrival_time > now:
            time.sleep(pending[i].arrival_time - now)  # idle: wait for the next user
            now = pending[i].arrival_time
        while i < len(pending) and pending[i].arrival_time <= now:
            r = pending[i]
            params = SamplingParams(max_tokens=r.output_len, temperature=0.0, ignore_eos=True)
            rid = engine.add_request({"prompt_token_ids": prompt_ids(r.prompt_len, vocab, seed * 100_003 + i)},
                                     params, request_id=f"r{r.request_id}", arrival_time=start + r.arrival_time)
            # Sent the moment it arrives (no client-side cap), so latency counts from the arrival.
            records[rid] = RequestRecord(i, r.prompt_len, r.output_len, arrival_time=r.arrival_time,
                                         send_time=r.arrival_time, completion_tokens=r.output_len, status="ok")
            i += 1
        outputs = engine.step()
        end = time.perf_counter() - start
        for out in outputs:  # one output per request that got a token this step
            records[out.request_id].chunk_times.append(end)
        steps.append(_step_record(engine, end))
    requests = list(records.values())
    t0 = min(r.arrival_time for r in requests)
    return ReplayResult(requests, steps, max(r.finish for r in requests) - t0)


def _step_record(engine, end: float) -> StepRecord:
    st = engine.stats  # filled after the step, once finished requests freed their cache
    return StepRecord(end, st.step_time_s, st.num_running, st.num_waiting, st.num_prefill_tokens,
                      st.num_decode_tokens, st.kv_bytes_reserved, st.kv_bytes_used)
