"""The server with its engine core in a process of its own (what `tinyinfer serve`
runs by default): the same answers as the offline engine, requests aborted when
their client leaves, and a clear error, not a hang, when the core process dies.

tests/engine/test_server.py covers the rest of the API on the in-thread core, which
runs the same EngineCore loop and the same message handling."""
import concurrent.futures as cf
import json
import os
import signal
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from tinyinfer import SamplingParams  # noqa: E402
from tinyinfer.server import build_app  # noqa: E402
from tinyinfer.server.async_llm import AsyncLLM  # noqa: E402
from tinyinfer.server.background import BackgroundServer  # noqa: E402

MODEL = "smollm2-135m-instruct"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def spawned():
    client = AsyncLLM.spawn(model=MODEL, dtype="float32", device="cpu", max_num_seqs=4, torch_threads=1)
    with BackgroundServer(build_app(client), startup_timeout_s=300) as server:
        server.client = client
        yield server


def metrics(server) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics").text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if "le" not in s.labels}


def complete(server, prompt, n, stream=False, **kw):
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": stream, **kw}
    if not stream:
        return httpx.post(server.url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    return "".join(c["choices"][0]["text"] for c in chunks)


def test_core_runs_in_another_process(spawned):
    assert spawned.client.pid is not None and spawned.client.pid != os.getpid()


def test_concurrent_requests_equal_the_offline_engine(spawned, llm):
    prompts = [f"Fact number {i}: the sun" for i in range(6)]
    want = [o.outputs[0].text for o in llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0))]
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda i: complete(spawned, prompts[i], 6, stream=bool(i % 2)), range(len(prompts))))
    assert got == want


def test_bad_prompt_is_400_and_the_core_keeps_serving(spawned):
    r = httpx.post(spawned.url + "/v1/completions", json={"prompt": [10**9], "max_tokens": 2}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert complete(spawned, PROMPT, 2)


def test_client_disconnect_aborts_in_the_core(spawned):
    before = metrics(spawned)["vllm:generation_tokens_total"]
    body = {"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", spawned.url + "/v1/completions", json=body, timeout=60) as r:
        for i, _ in enumerate(line for line in r.iter_lines() if line.startswith("data: ")):
            if i == 1:
                break  # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = metrics(spawned)
        if m["vllm:num_requests_running"] == 0 and m["tinyinfer:kv_cache_blocks_used"] == 0:
            break
        time.sleep(0.1)
    m = metrics(spawned)
    assert m["vllm:num_requests_running"] == 0 and m["tinyinfer:kv_cache_blocks_used"] == 0
    assert 0 < m["vllm:generation_tokens_total"] - before < 400  # stopped early: aborted


def test_core_process_death_is_a_clear_error_not_a_hang(spawned):
    """Last in this module: it kills the engine core."""
    body = {"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
    events = []
    with httpx.stream("POST", spawned.url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 2:
                    os.kill(spawned.client.pid, signal.SIGKILL)  # as the out-of-memory killer would
    # the stream ended by itself, well before 400 tokens (a hang would hit the client's 60 s timeout);
    # counted in events, not seconds, so a busy machine cannot fail it
    assert len(events) < 100, len(events)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "engine core stopped" in error["message"]
    health = httpx.get(spawned.url + "/health", timeout=10)
    assert health.status_code == 503 and "engine core stopped" in health.json()["error"]["message"]
    r = httpx.post(spawned.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
