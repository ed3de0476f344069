"""The HTTP routes: OpenAI's /v1/completions and /v1/chat/completions (plain
JSON or streamed as server-sent events), /v1/models, /health, /get_load (for
vllm-router), /metrics and /debug/steps.

A handler validates the request, turns it into a prompt and SamplingParams,
hands it to the AsyncLLM and relays the RequestDeltas that come back. Every
error, from a malformed body to a failed engine step, is answered in OpenAI's
error shape {"error": {"message", "type", "param", "code"}}, so OpenAI clients
raise a readable exception instead of choking on an HTML page. Only a bad
request is a 400; a fault of the server or its engine is a 500, whose
traceback goes to the server's log and never to the client.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
from dataclasses import dataclass, field

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..checks import check_int
from . import protocol as P
from .async_llm import AsyncLLM, EngineError, EngineUnavailable, RequestStream
from .messages import Usage

log = logging.getLogger("tinyinfer.server")


def build_app(engine, api_key: str | None = None, max_waiting: int = 64, model_name: str | None = None,
              max_logprobs: int = 20) -> FastAPI:
    """The FastAPI app serving `engine`: an engine object (an LLMEngine, or any
    engine_protocol.ServableEngine; its core then runs in a thread of this
    process) or AsyncLLM.spawn(...) (in a process of its own). The core starts
    with the app (uvicorn's lifespan) and stops with it. Clients send
    `model_name` as "model" (default: the engine's model_name). At most
    `max_waiting` accepted requests may wait for a place in the batch; more get
    429. A request may ask for at most `max_logprobs` alternatives per token."""
    check_int("max_waiting", max_waiting, 1)
    check_int("max_logprobs", max_logprobs, 0)
    client = engine if isinstance(engine, AsyncLLM) else AsyncLLM(engine)
    if model_name is not None:
        client.served_model_name = model_name

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await client.start()  # returns once the engine is loaded
        yield
        client.shutdown()

    app = FastAPI(title="tinyinfer", lifespan=lifespan)
    app.state.server = ServerState(client, api_key, max_waiting, max_logprobs)
    app.include_router(routes)
    app.include_router(v1, prefix="/v1", dependencies=[Depends(check_key)])
    add_error_handlers(app)
    return app


class APIError(Exception):
    """Raised anywhere in a handler; answered as an OpenAI-style error."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        body = P.error_body(self.message, self.type, self.param, self.code)
        return JSONResponse(body, status_code=self.status, headers=self.headers)


@dataclass
class ServerState:
    """What every handler reads (app.state.server)."""

    client: AsyncLLM
    api_key: str | None
    max_waiting: int
    max_logprobs: int

    @property
    def model(self) -> str:
        return self.client.served_model_name

    def check(self, body, logprobs_param: str, logprobs: int | None) -> None:
        """The checks every generation request passes before it reaches the engine."""
        if body.model is not None and body.model != self.model:
            raise APIError(404, f"The model '{body.model}' does not exist; this server serves '{self.model}'.",
                           param="model", code="model_not_found")
        problem = body.unsupported()
        if problem:
            raise APIError(400, problem[1], param=problem[0])
        # Each alternative costs a sort and a detokenization per token; vLLM caps them the same way.
        if logprobs is not None and logprobs > self.max_logprobs:
            raise APIError(400, f"{logprobs_param}={logprobs} is invalid: at most {self.max_logprobs} per token "
                                f"(the server's --max-logprobs)", param=logprobs_param)

    def admit(self) -> None:
        """The bounded waiting queue. A request is "waiting" from its arrival until
        the engine schedules it; when max_waiting are already waiting, a new one is
        refused with 429 rather than queued without limit. No await lies between
        this check and add_request's count, and the event loop runs one handler at
        a time, so two requests cannot both slip in."""
        waiting = self.client.num_waiting
        if waiting >= self.max_waiting:
            raise APIError(429, f"The server is busy: {waiting} requests are already waiting "
                                f"(--max-waiting {self.max_waiting}). Retry shortly.",
                           "rate_limit_error", code="queue_full", headers={"Retry-After": "1"})


def _server(request: Request) -> ServerState:
    return request.app.state.server


def check_key(request: Request) -> None:
    api_key = _server(request).api_key
    if api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
        raise APIError(401, "Invalid or missing API key: send 'Authorization: Bearer <key>'.", code="invalid_api_key")


routes, v1 = APIRouter(), APIRouter()  # v1's routes need the API key, when the server has one


@routes.get("/health")
async def health(request: Request):
    client = _server(request).client
    if not client.is_alive:
        raise APIError(503, f"the engine loop is not running: {client.fatal_error or 'it has stopped'}",
                       "server_error")
    return {"status": "ok"}


@routes.get("/get_load")
async def get_load(request: Request):
    """What vllm-router's power_of_two policy polls (every few seconds): {"load": N},
    the requests this replica holds, running or waiting. Requests, not tokens: the
    router compares two replicas' numbers and sends to the smaller."""
    client = _server(request).client
    return {"load": client.stats.num_requests_running + client.num_waiting}


@routes.get("/metrics")
async def metrics(request: Request):
    return Response(generate_latest(_server(request).client.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@routes.get("/debug/steps")
async def steps(request: Request):
    """The last busy steps of the engine (up to 10,000): prompt tokens and decode
    sequences each carried, the seconds inside step(), and the seconds of the whole
    turn of the core's loop. benchmarks/fleet_vs_server.py fits the simulator's
    step-cost model to them, so the simulator runs on this server's own clock."""
    return {"steps": [{"prefill_tokens": s.prefill_tokens, "decode_seqs": s.decode_seqs,
                       "step_s": round(s.step_s, 6), "turn_s": round(s.turn_s, 6)}
                      for s in list(_server(request).client.metrics.recent_steps)]}


@v1.get("/models")
async def models(request: Request):
    server = _server(request)
    return {"object": "list", "data": [{"id": server.model, "object": "model", "created": 0, "owned_by": "tinyinfer",
                                       "max_model_len": server.client.max_model_len}]}


@v1.post("/completions")
async def completions(body: P.CompletionRequest, request: Request):
    server = _server(request)
    server.check(body, "logprobs", body.logprobs)
    if body.echo:
        raise APIError(400, "echo is not supported by this server", param="echo")
    prompt = _as_400(body.engine_prompt, "prompt")
    max_tokens = 16 if body.max_tokens is None else body.max_tokens  # OpenAI's default for completions
    params = _as_400(lambda: body.sampling_params(max_tokens, body.logprobs))
    job = _Job(P.new_id("cmpl"), server.model, False, body.logprobs, body.include_usage)
    return await _serve(server, job, prompt, params, body.stream, request)


@v1.post("/chat/completions")
async def chat_completions(body: P.ChatCompletionRequest, request: Request):
    server = _server(request)
    server.check(body, "top_logprobs", body.top_logprobs)
    prompt = _as_400(body.engine_prompt, "messages")
    # No max_tokens: OpenAI's default, as many as the context window and KV cache
    # leave after the prompt; the core, which tokenizes the chat, works it out.
    from_room = body.requested_max_tokens is None
    params = _as_400(lambda: body.sampling_params(1 if from_room else body.requested_max_tokens, body.top_n))
    job = _Job(P.new_id("chatcmpl"), server.model, True, body.top_n, body.include_usage)
    return await _serve(server, job, prompt, params, body.stream, request, from_room)


@dataclass
class _Job:
    """What a handler needs to format one request's answer."""

    rid: str
    model: str
    chat: bool
    top_n: int | None  # alternatives per token, None for no logprobs
    include_usage: bool
    created: int = field(default_factory=P.now)

    @property
    def param(self) -> str:
        return "messages" if self.chat else "prompt"


async def _serve(server: ServerState, job: _Job, prompt, params, stream: bool, request: Request,
                 max_tokens_from_room: bool = False):
    server.admit()
    try:
        handle = await server.client.add_request(prompt, params, max_tokens_from_room)
    except ValueError as e:  # the engine's own validation, e.g. the prompt is over the context window
        raise APIError(400, str(e), param=_param(str(e), job.param)) from None
    except EngineUnavailable as e:
        raise APIError(503, str(e), "server_error") from None
    except EngineError as e:  # the engine failed on it; the core logged why
        raise APIError(500, str(e), "server_error") from None
    deltas = _deltas(server.client, handle)
    if stream:
        return _SSEResponse(_sse(job, deltas), on_close=lambda: server.client.release(handle))
    return await _whole(job, deltas, request)


class _SSEResponse(StreamingResponse):
    """A server-sent-events response that releases its request however it ends,
    even if the client left before the body began (the generator never ran)."""

    def __init__(self, content, on_close):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


async def _deltas(client: AsyncLLM, handle: RequestStream):
    """The request's RequestDeltas as the core sends them. However the consumer
    stops (finished, client gone, error), the request leaves the engine."""
    try:
        while True:
            item = await handle.queue.get()
            if isinstance(item, BaseException):
                handle.finished = True  # the core has already dropped it
                raise item
            handle.finished = item.usage is not None  # the request's last delta carries its usage
            yield item
            if handle.finished:
                return
    finally:
        client.release(handle)


async def _whole(job: _Job, deltas, request: Request) -> JSONResponse:
    """Non-streaming: gather the deltas until the request ends, unless the client hangs up first."""
    task = asyncio.ensure_future(_gather(deltas))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()  # runs _deltas' finally: the request is aborted
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return JSONResponse({}, status_code=499)  # nobody reads this: the client has gone
    try:
        choices, usage = task.result()
    except EngineError as e:
        raise APIError(500, str(e), "server_error") from None
    build = P.chat_response if job.chat else P.completion_response
    return JSONResponse(build(job.rid, job.model, job.created, choices, usage, job.top_n))


async def _gather(deltas) -> tuple[list[P.Choice], Usage]:
    choices: dict[int, P.Choice] = {}
    async for d in deltas:
        choices.setdefault(d.index, P.Choice(d.index)).add(d)
        usage = d.usage  # set on the last one
    return sorted(choices.values(), key=lambda c: c.index), usage


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _sse(job: _Job, deltas):
    """Streaming: one `data: {json}` event per delta that added text (or
    logprobs, or a finish), then a usage event if asked for, then `data: [DONE]`."""
    obj = "chat.completion.chunk" if job.chat else "text_completion"
    as_choice = P.chat_chunk_choice if job.chat else P.completion_chunk_choice

    def chunk(choice: dict | None, usage: dict | None = None) -> str:
        body = {"id": job.rid, "object": obj, "created": job.created, "model": job.model,
                "choices": [choice] if choice else []}
        if job.include_usage:
            body["usage"] = usage  # null on every chunk but the last, as OpenAI does
        return f"data: {json.dumps(body)}\n\n"

    usage, announced = None, {0}  # the choices whose role was sent (chat, n > 1)
    try:
        if job.chat:
            yield chunk(P.role_chunk_choice(0))
        async for d in deltas:
            usage = d.usage or usage
            if job.chat and d.index not in announced:
                announced.add(d.index)
                yield chunk(P.role_chunk_choice(d.index))
            if d.text_delta or d.finish_reason or (job.top_n is not None and d.new_token_ids):
                yield chunk(as_choice(d, job.top_n))
    except Exception as e:  # headers are sent already: report in-band, as vLLM does
        message = str(e)
        if not isinstance(e, EngineError):  # a bug of this server's, not the engine's
            log.exception("streaming %s failed", job.rid)
            message = f"internal error while streaming ({type(e).__name__}); the server's log has the traceback"
        yield f"data: {json.dumps(P.error_body(message, 'server_error', code=500))}\n\n"
        yield "data: [DONE]\n\n"
        return
    if job.include_usage and usage is not None:
        yield chunk(None, P.usage(usage))
    yield "data: [DONE]\n\n"


def _as_400(fn, param: str | None = None):
    """Run fn; a ValueError (which names the field) becomes a 400 for that field."""
    try:
        return fn()
    except ValueError as e:
        raise APIError(400, str(e), param=_param(str(e), param)) from None


def _param(message: str, default: str | None) -> str | None:
    named = (re.match(r"SamplingParams\.(\w+)", message)
             or re.match(r"(structured_outputs|response_format)\b", message))
    return named.group(1) if named else default


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request, exc: RequestValidationError):
        # FastAPI answers 422 with its own shape; OpenAI clients expect 400 and an "error" object.
        err = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in err.get("loc", ()) if p != "body" and not isinstance(p, int)]
        param = loc[0] if loc else None
        if err.get("type") == "json_invalid":
            message = f"The request body is not valid JSON: {err.get('msg')}"
        else:
            message = f"{'.'.join(loc) or 'body'}: {err.get('msg', 'invalid request')}"
        return APIError(400, message, param=param).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        return APIError(exc.status_code, str(exc.detail), "invalid_request_error" if exc.status_code < 500
                        else "server_error").response()

    @app.exception_handler(Exception)
    async def unexpected(request, exc: Exception):
        # A bug here, not the client's fault: a 500 that says so, the traceback in the log.
        log.error("internal error answering %s %s", request.method, request.url.path, exc_info=exc)
        return APIError(500, f"internal error ({type(exc).__name__}); the server's log has the traceback",
                        "server_error").response()
