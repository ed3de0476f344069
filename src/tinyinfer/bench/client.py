"""One streaming request to an OpenAI-compatible server, timed chunk by chunk.

With `"stream": true` the server answers with Server-Sent Events: lines of
`data: {json}` separated by blank lines, ending with `data: [DONE]`. Each JSON
chunk carries the next piece of text; with `stream_options.include_usage` a last
chunk reports the token counts. We note the clock when each piece arrives:
those timestamps are all the latency metrics need.
"""
from __future__ import annotations

import email.utils
import json
import time

import httpx

from ..metrics import RequestRecord

DONE = object()  # the end-of-stream marker `data: [DONE]`
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def endpoint_url(base_url: str, endpoint_type: str) -> str:
    """http://host:8000 (or .../v1) -> http://host:8000/v1/completions."""
    if endpoint_type not in ENDPOINTS:
        raise ValueError(f"endpoint_type must be one of {tuple(ENDPOINTS)}, got {endpoint_type!r}")
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
    base = base_url.rstrip("/")
    base = base[: -len("/v1")] if base.endswith("/v1") else base
    return base + ENDPOINTS[endpoint_type]


def build_payload(endpoint_type: str, model: str, prompt: str, max_tokens: int,
                  ignore_eos: bool = True, extra_body: dict | None = None) -> dict:
    """The request body. ignore_eos (a vLLM extension) makes the server produce
    exactly max_tokens tokens, so every run does the same amount of work."""
    payload = {"model": model, "max_tokens": max_tokens, "stream": True,
               "stream_options": {"include_usage": True}}
    if endpoint_type == "chat":
        payload["messages"] = [{"role": "user", "content": prompt}]
    else:
        payload["prompt"] = prompt
    if ignore_eos:
        payload["ignore_eos"] = True
    payload.update(extra_body or {})
    return payload


def parse_sse_line(line: str):
    """A dict for a `data: {json}` line, DONE for `data: [DONE]`, None for
    anything else (blank separators, `: keep-alive` comments, `event:` lines)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return DONE
    return json.loads(data) if data else None


def chunk_text(data: dict, endpoint_type: str) -> str:
    """The new text in one chunk ('' if none). Chat servers often open with a
    chunk holding only the role; it carries no token, so it must not count as
    the first token (that would make TTFT look better than what a user sees)."""
    choices = data.get("choices") or []
    if not choices:
        return ""
    if endpoint_type == "chat":
        return (choices[0].get("delta") or {}).get("content") or ""
    return choices[0].get("text") or ""


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After is either seconds or an HTTP date."""
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


async def send_request(client: httpx.AsyncClient, url: str, payload: dict, headers: dict,
                       record: RequestRecord, t0: float, endpoint_type: str = "completions") -> RequestRecord:
    """Send one request and fill `record` (times are seconds since t0, on
    time.perf_counter's clock). Never raises for a server or network error:
    a benchmark must count failures, not stop at the first one."""
    record.send_time = time.perf_counter() - t0
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as response:
            record.http_status = response.status_code
            if response.status_code != 200:
                body = (await response.aread()).decode("utf-8", errors="replace")
                record.status = "rejected" if response.status_code == 429 else "failed"
                record.retry_after = parse_retry_after(response.headers.get("retry-after"))
                record.error = f"HTTP {response.status_code}: {body[:300]}"
                return record
            async for line in response.aiter_lines():
                now = time.perf_counter() - t0
                data = parse_sse_line(line)
                if data is DONE:
                    break
                if data is not None and not _absorb(record, data, now, endpoint_type):
                    break
    except Exception as e:  # connection refused, timeout, bad JSON...: one failed request
        record.status, record.error = "failed", f"{type(e).__name__}: {e}"
        return record
    if record.status == "pending":
        record.status = "ok" if record.chunk_times else "failed"
        record.error = "" if record.chunk_times else "the stream held no content chunk"
    return record


def _absorb(record: RequestRecord, data: dict, now: float, endpoint_type: str) -> bool:
    """Take one JSON chunk into the record; False if the server sent an error."""
    if data.get("error"):
        err = data["error"]
        record.status = "failed"
        record.error = "stream error: " + str(err.get("message", err) if isinstance(err, dict) else err)
        return False
    text = chunk_text(data, endpoint_type)
    if text:
        record.chunk_times.append(now)
        record.text += text
    usage = data.get("usage")
    if usage:  # the last such report wins (some servers send running totals)
        record.prompt_tokens = usage.get("prompt_tokens", record.prompt_tokens)
        record.completion_tokens = usage.get("completion_tokens", record.completion_tokens)
    return True
