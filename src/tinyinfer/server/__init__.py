r"""`tinyinfer serve`: an OpenAI-compatible HTTP server on LLMEngine.

    tinyinfer serve --port 8000
    curl localhost:8000/v1/completions -H 'Content-Type: application/json' \
         -d '{"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}'

Any OpenAI client works against it (base_url="http://127.0.0.1:8000/v1").
The pieces, one concept per file:
  protocol.py      the OpenAI request/response shapes
  async_engine.py  the engine loop in its own thread, feeding asyncio handlers
  api.py           the routes: completions, chat, models, health
  prometheus.py    GET /metrics in Prometheus text format
"""
from __future__ import annotations

import argparse

from ..config import EngineConfig
from .api import build_app

__all__ = ["build_app", "add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="if set, /v1 routes require 'Authorization: Bearer KEY'")
    p.add_argument("--max-waiting", type=int, default=64,
                   help="requests allowed to wait for a batch slot; beyond that the server answers 429")
    p.add_argument("--served-model-name", default=None, help="the model name clients send (default: --model)")
    EngineConfig.add_cli_args(p)  # every engine setting, with the engine's own defaults
    p.add_argument("--log-level", default="info")


def run(args) -> int:
    import uvicorn

    from ..llm_engine import LLMEngine

    if not (1 <= args.port <= 65535):
        raise ValueError(f"--port={args.port} is invalid: must be in [1, 65535]")
    engine = LLMEngine(config=EngineConfig.from_cli_args(args))
    app = build_app(engine, api_key=args.api_key, max_waiting=args.max_waiting,
                    model_name=args.served_model_name or args.model)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
