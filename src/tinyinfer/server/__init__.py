r"""`tinyinfer serve`: an OpenAI-compatible HTTP server on LLMEngine, or on your own engine.

    tinyinfer serve --port 8000
    curl localhost:8000/v1/completions -H 'Content-Type: application/json' \
         -d '{"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}'

Any OpenAI client works against it (base_url="http://127.0.0.1:8000/v1").

To serve an engine you assembled yourself, name a function that builds it:

    tinyinfer serve --engine my_engine:build          # my_engine.py in this folder, or any module
    tinyinfer serve --engine path/to/engine.py:build

The function is called with no arguments and returns the engine: an object
with LLMEngine's add_request, step, abort_request and has_unfinished_requests,
its tokenizer, model_name and max_model_len (tinyinfer/server/engine_protocol.py
says exactly what, and what is optional). The server around it stays the same.

The pieces, one concept per file:
  protocol.py         the OpenAI request/response shapes
  messages.py         what the API server and the engine core send each other
  engine_protocol.py  what the server needs from an engine, and --engine's factory
  engine_core.py      the engine's step loop, alone in a process of its own (vLLM's "engine core")
  async_llm.py        the API server's client of the core: requests out, deltas in, over a pipe
  api.py              the routes: completions, chat, models, health, metrics
  prometheus.py       GET /metrics through prometheus_client, with vLLM's metric names
"""
from __future__ import annotations

import argparse
import dataclasses
import functools

from ..checks import require
from ..config import EngineConfig
from .api import build_app
from .engine_protocol import build_engine, check_engine_spec

__all__ = ["build_app", "add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.split("The pieces")[0]  # how to run it, and how to serve your own engine
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="if set, /v1 routes require 'Authorization: Bearer KEY'")
    p.add_argument("--max-waiting", type=int, default=64,
                   help="requests allowed to wait for a batch slot; beyond that the server answers 429")
    p.add_argument("--served-model-name", default=None,
                   help="the model name clients send (default: the engine's model_name, i.e. --model)")
    p.add_argument("--max-logprobs", type=int, default=20,
                   help="most logprobs / top_logprobs a request may ask for (default 20, as vLLM)")
    p.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                   help="run the engine's step loop in a process of its own (default), as vLLM's V1 engine "
                        "core does; --no-engine-process runs it in a thread of the HTTP server's process, where "
                        "its steps are slower (benchmarks/engine_thread.py)")
    p.add_argument("--engine", default=None, metavar="MODULE:FUNCTION",
                   help="serve the engine that FUNCTION() returns instead of an LLMEngine: 'module:function' "
                        "or 'path/to/file.py:function' (see above); the engine flags below are then unused")
    EngineConfig.add_cli_args(p)  # every engine setting, with the engine's own defaults
    p.add_argument("--log-level", default="info")


def run(args) -> int:
    import torch
    import uvicorn

    from ..llm_engine import LLMEngine
    from .async_llm import AsyncLLM

    require(1 <= args.port <= 65535, "--port", args.port, "in [1, 65535]")
    if args.engine is not None:
        check_engine_spec(args.engine)  # here, at once; the factory itself runs where the engine will
        build = functools.partial(build_engine, args.engine)
    else:
        # Plain keyword arguments (not the dataclass) so they travel to the core's process as they are.
        build = functools.partial(LLMEngine, **dataclasses.asdict(EngineConfig.from_cli_args(args)))
    # The engine is built in the core's process, and this one serves HTTP; or both in this one.
    client = AsyncLLM.spawn(build, torch_threads=torch.get_num_threads()) if args.engine_process else AsyncLLM(build())
    app = build_app(client, api_key=args.api_key, max_waiting=args.max_waiting, model_name=args.served_model_name,
                    max_logprobs=args.max_logprobs)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
