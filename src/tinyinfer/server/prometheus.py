"""GET /metrics: the server's numbers in Prometheus' text format, so a
Prometheus server (or `curl`) can scrape them. The format is simple enough to
write by hand: '# HELP' and '# TYPE' lines, then 'name value'."""
from __future__ import annotations


def prometheus_text(aeng) -> str:
    """The Prometheus text exposition format, written by hand: it is just
    '# HELP', '# TYPE' and 'name value' lines. Names follow vLLM's vllm:*."""
    stats = aeng.stats
    rows = [
        ("num_requests_running", "gauge", "Requests in the running batch.", aeng.num_running),
        ("num_requests_waiting", "gauge", "Requests accepted but not yet scheduled.", aeng.num_waiting),
        ("kv_cache_blocks_used", "gauge", "KV-cache blocks in use.", getattr(stats, "kv_blocks_used", 0)),
        ("kv_cache_blocks_total", "gauge", "KV-cache blocks in the pool.", getattr(stats, "kv_blocks_total", 0)),
        ("prompt_tokens_total", "counter", "Prompt tokens of requests that started generating.",
         aeng.prompt_tokens_total),
        ("generation_tokens_total", "counter", "Tokens generated since the server started.",
         aeng.generation_tokens_total),
        ("generation_tokens_per_second", "gauge", "Tokens generated per second over the last 10 s.",
         round(aeng.tokens_per_second(), 3)),
        ("num_preemptions_total", "counter", "Requests preempted to free KV blocks.",
         getattr(stats, "num_preemptions", 0)),
        ("engine_step_errors_total", "counter", "Engine steps that raised (their requests got 500).",
         aeng.num_step_errors),
        # Time inside engine.step() against time between streamed chunks: what serving adds.
        ("engine_steps_total", "counter", "Engine steps run.", aeng.engine_steps_total),
        ("engine_step_seconds_total", "counter", "Seconds spent inside engine steps.",
         round(aeng.engine_step_seconds_total, 6)),
    ]
    lines = []
    for name, kind, help_, value in rows:
        lines += [f"# HELP tinyinfer:{name} {help_}", f"# TYPE tinyinfer:{name} {kind}", f"tinyinfer:{name} {value}"]
    return "\n".join(lines) + "\n"
