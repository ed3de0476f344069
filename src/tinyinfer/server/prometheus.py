"""GET /metrics: the server's numbers for Prometheus, through prometheus_client.

The names, labels (model_name, engine) and histogram buckets are vLLM's
(as vLLM 0.32 serves them: tests/data/vllm-0.32-openai.json) wherever vLLM has
the same number, so a dashboard or an alert written for a vLLM server reads
this one unchanged:

    vllm:num_requests_running / _waiting       gauges, in requests (n samples count once)
    vllm:kv_cache_usage_perc                   gauge, the fraction of KV blocks in use (0-1)
    vllm:prompt_tokens_total                   prompt tokens of requests that got their first token
    vllm:generation_tokens_total               tokens generated, over every sample
    vllm:prefix_cache_hits_total               prompt tokens read from the prefix cache
    vllm:num_preemptions_total                 requests preempted to free KV blocks
    vllm:request_success_total                 finished requests, by finished_reason
    vllm:time_to_first_token_seconds           histograms, timed by the engine core from the
    vllm:inter_token_latency_seconds             moment a request reaches the engine: TTFT and
    vllm:request_time_per_output_token_seconds   end to end per request, the gap between a
    vllm:e2e_request_latency_seconds             request's tokens, and its mean TPOT

(vLLM up to 0.10 called the per-token gap vllm:time_per_output_token_seconds.)
tinyinfer's own, where vLLM has no such number: the KV blocks in use and in the
pool, and the engine's steps (how many, the seconds inside step(), how many
raised), which benchmarks/server_overhead.py compares with the time between
streamed chunks. Every app gets a registry of its own (no global default
registry), so one process can hold many servers, as the tests do.
"""
from __future__ import annotations

import collections

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .messages import RequestMetrics, StepReport, StepStats

LABELS = ("model_name", "engine")  # vLLM's; one engine core here, so engine="0"
# vLLM's buckets for the same histograms.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class ServerMetrics:
    """Every series /metrics shows, for one served model. `client` is the
    AsyncLLM whose numbers the gauges read whenever they are scraped."""

    def __init__(self, model_name: str, client):
        self.registry = CollectorRegistry()  # this app's own
        self.model_name = model_name

        def series(kind, name: str, help_: str, labels: tuple = (), **kw):
            family = kind(name, help_, LABELS + labels, registry=self.registry, **kw)
            return family if labels else family.labels(model_name, "0")

        # Gauges read the client's numbers when scraped: client.stats is the engine
        # as the core last reported it, client.num_waiting adds requests on their way.
        series(Gauge, "vllm:num_requests_running", "Requests in the running batch.").set_function(
            lambda: client.stats.num_requests_running)
        series(Gauge, "vllm:num_requests_waiting", "Requests accepted and not in the running batch.").set_function(
            lambda: client.num_waiting)
        series(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.").set_function(
            lambda: client.stats.kv_blocks_used / max(1, client.stats.kv_blocks_total))
        series(Gauge, "tinyinfer:kv_cache_blocks_used", "KV-cache blocks in use.").set_function(
            lambda: client.stats.kv_blocks_used)
        series(Gauge, "tinyinfer:kv_cache_blocks_total", "KV-cache blocks in the pool.").set_function(
            lambda: client.stats.kv_blocks_total)
        self.prompt_tokens = series(Counter, "vllm:prompt_tokens", "Prompt tokens of requests that got their "
                                    "first token.")
        self.generation_tokens = series(Counter, "vllm:generation_tokens", "Tokens generated, over every sample.")
        self.prefix_hits = series(Counter, "vllm:prefix_cache_hits", "Prompt tokens read from the prefix cache.")
        self.preemptions = series(Counter, "vllm:num_preemptions", "Requests preempted to free KV blocks.")
        self.steps = series(Counter, "tinyinfer:engine_steps", "Engine steps run.")
        self.step_seconds = series(Counter, "tinyinfer:engine_step_seconds", "Seconds spent inside engine steps.")
        self.step_errors = series(Counter, "tinyinfer:engine_step_errors", "Engine steps that raised (their "
                                  "requests got 500).")
        self.success = series(Counter, "vllm:request_success", "Count of successfully processed requests.",
                              labels=("finished_reason",))
        for reason in ("stop", "length"):  # shown from the start, at 0, as vLLM does
            self.success.labels(model_name, "0", reason)
        self.ttft = series(Histogram, "vllm:time_to_first_token_seconds",
                           "Histogram of time to first token in seconds.", buckets=TTFT_BUCKETS)
        self.itl = series(Histogram, "vllm:inter_token_latency_seconds",
                          "Histogram of inter-token latency in seconds.", buckets=ITL_BUCKETS)
        self.tpot = series(Histogram, "vllm:request_time_per_output_token_seconds",
                           "Histogram of time_per_output_token_seconds per request.", buckets=ITL_BUCKETS)
        self.e2e = series(Histogram, "vllm:e2e_request_latency_seconds",
                          "Histogram of e2e request latency in seconds.", buckets=E2E_BUCKETS)
        # The engine keeps these two as running totals; a counter is given what is new.
        self._preemptions = self._prefix_hits = 0
        # The last busy steps (GET /debug/steps): what each carried and how long it took.
        self.recent_steps: collections.deque[StepStats] = collections.deque(maxlen=10_000)
        self.record(StepReport(stats=client.stats))  # the counts the engine started with

    def record(self, report: StepReport) -> None:
        """Add what one report of the engine core says."""
        st = report.stats
        self.preemptions.inc(max(0, st.num_preemptions - self._preemptions))
        self.prefix_hits.inc(max(0, st.prefix_cache_hit_tokens - self._prefix_hits))
        self._preemptions, self._prefix_hits = st.num_preemptions, st.prefix_cache_hit_tokens
        if report.error is not None:
            self.step_errors.inc()
        if report.step is not None:
            step = report.step
            self.prompt_tokens.inc(step.num_prompt_tokens)
            self.generation_tokens.inc(step.num_generation_tokens)
            self.steps.inc()
            self.step_seconds.inc(step.step_s)
            for gap in step.inter_token_s:
                self.itl.observe(gap)
            if step.turn_s is not None:
                self.recent_steps.append(step)
        for delta in report.deltas:
            if delta.metrics is not None:  # a request finished (with n > 1: as its last sample did)
                self.success.labels(self.model_name, "0", delta.finish_reason or "stop").inc()
                self.observe(delta.metrics)

    def observe(self, t: RequestMetrics) -> None:
        if t.ttft_s is not None:
            self.ttft.observe(t.ttft_s)
        if t.tpot_s is not None:
            self.tpot.observe(t.tpot_s)
        self.e2e.observe(t.e2e_s)
