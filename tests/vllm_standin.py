"""A stand-in for a vLLM server: it replays what a real vLLM 0.32 CPU server sent.

tests/data/vllm-0.32-openai.json holds the real server's answers, byte for
byte (recorded by benchmarks/record_vllm_format.py): /health, /v1/models,
/metrics, completions and chat completions, each plain and streamed (with and
without the usage chunk), and two errors. This app answers each request with
the recorded answer of the same kind, streamed events spaced by `gap_s`, so
clients can be tested against vLLM's exact wire format without a 3.4 GB
install. It does not generate: every completion is the recorded one.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

FIXTURE = Path(__file__).parent / "data" / "vllm-0.32-openai.json"


def load_fixture(path: Path = FIXTURE) -> dict:
    data = json.loads(path.read_text())
    data["by_name"] = {e["name"]: e for e in data["exchanges"]}
    return data


def sse_events(body: str) -> list[str]:
    """The `data: ...` payloads of a recorded event stream, in order."""
    return [block[len("data: "):] for block in body.split("\n\n") if block.startswith("data: ")]


def build_standin(fixture: dict | None = None, gap_s: float = 0.002) -> FastAPI:
    fixture = fixture or load_fixture()
    rec = fixture["by_name"]
    app = FastAPI()

    def replay(name: str) -> Response:
        e = rec[name]
        return Response(e["body"], status_code=e["status"], media_type=e["content_type"])

    @app.get("/health")
    async def health():
        return replay("health")

    @app.get("/v1/models")
    async def models():
        return replay("models")

    @app.get("/metrics")
    async def metrics():
        return replay("metrics")

    async def generate(request: Request, kind: str):
        body = await request.json()
        if body.get("model") not in (None, fixture["model"]):
            return replay("error_unknown_model")
        if not body.get("stream"):
            return replay(kind)
        usage = (body.get("stream_options") or {}).get("include_usage")
        e = rec[f"{kind}_stream_usage" if usage else f"{kind}_stream"]

        async def events():
            for block in e["body"].split("\n\n"):
                if block:
                    await asyncio.sleep(gap_s)  # one decode step apart, as a real server sends them
                    yield block + "\n\n"

        return StreamingResponse(events(), status_code=e["status"], media_type=e["content_type"].split(";")[0])

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, "completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await generate(request, "chat")

    return app
