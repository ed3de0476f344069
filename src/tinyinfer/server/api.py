"""The HTTP routes: OpenAI's /v1/completions and /v1/chat/completions (plain
JSON or streamed as server-sent events), /v1/models, /health and /metrics.

A handler validates the request, turns it into a prompt and SamplingParams,
hands it to the AsyncEngine and relays what comes back. Every error, from a
malformed body to a failed engine step, is answered in OpenAI's error shape
{"error": {"message", "type", "param", "code"}}, so OpenAI clients raise a
readable exception instead of choking on an HTML page.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import protocol as P
from .async_engine import AsyncEngine, EngineError
from .prometheus import prometheus_text


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


def build_app(engine, api_key: str | None = None, max_waiting: int = 64, model_name: str | None = None,
              max_logprobs: int = 20) -> FastAPI:
    """The FastAPI app serving `engine`: an LLMEngine (its core then runs in a
    thread of this process) or AsyncEngine.spawn(...) (in a process of its own).
    The core starts with the app (uvicorn's lifespan) and stops with it. At most
    `max_waiting` accepted requests may wait for a place in the batch; more get
    429. A request may ask for at most `max_logprobs` alternatives per token."""
    if not (isinstance(max_waiting, int) and max_waiting >= 1):
        raise ValueError(f"max_waiting={max_waiting!r} is invalid: must be an integer >= 1")
    if not (isinstance(max_logprobs, int) and max_logprobs >= 0):
        raise ValueError(f"max_logprobs={max_logprobs!r} is invalid: must be an integer >= 0")
    aeng = engine if isinstance(engine, AsyncEngine) else AsyncEngine(engine)
    served = model_name or aeng.model_name or (aeng.engine_kwargs or {}).get("model") or "tinyinfer"

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await aeng.start()  # returns once the engine is loaded
        yield
        aeng.shutdown()

    app = FastAPI(title="tinyinfer", lifespan=lifespan)
    app.state.async_engine = aeng
    app.state.served_model = served
    admission = _Admission(aeng, max_waiting)
    _add_error_handlers(app)

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "Invalid or missing API key: send 'Authorization: Bearer <key>'.",
                           code="invalid_api_key")

    def check_logprobs(param: str, n: int | None) -> None:
        # Each alternative costs a sort and a detokenization per token; vLLM caps them the same way.
        if n is not None and n > max_logprobs:
            raise APIError(400, f"{param}={n} is invalid: at most {max_logprobs} per token "
                                f"(the server's --max-logprobs)", param=param)

    def check_model(name: str | None) -> None:
        if name is not None and name != served:
            raise APIError(404, f"The model '{name}' does not exist; this server serves '{served}'.",
                           param="model", code="model_not_found")

    auth = [Depends(check_key)]

    @app.get("/health")
    async def health():
        if not aeng.is_alive:
            raise APIError(503, f"the engine loop is not running: {aeng.fatal_error!r}", "server_error")
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=auth)
    async def models():
        return {"object": "list", "data": [{"id": served, "object": "model", "created": 0, "owned_by": "tinyinfer",
                                           "max_model_len": aeng.max_model_len}]}

    @app.get("/debug/steps")
    async def steps():
        """The last busy steps of the engine (up to 10,000): prompt tokens and decode
        sequences each carried, the seconds inside step(), and the seconds of the whole
        turn of the core's loop. benchmarks/fleet_vs_server.py fits the simulator's
        step-cost model to them, so the simulator runs on this server's own clock."""
        keys = ("prefill_tokens", "decode_seqs", "step_s", "turn_s")
        return {"steps": [dict(zip(keys, row)) for row in list(aeng.recent_steps)]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(prometheus_text(aeng), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions", dependencies=auth)
    async def completions(body: P.CompletionRequest, request: Request):
        check_model(body.model)
        _check_supported(body)
        if body.echo:
            raise APIError(400, "echo is not supported by this server", param="echo")
        check_logprobs("logprobs", body.logprobs)
        prompt = _value_error_as_400(body.engine_prompt, "prompt")
        max_tokens = 16 if body.max_tokens is None else body.max_tokens  # OpenAI's default for completions
        params = _value_error_as_400(lambda: body.sampling_params(max_tokens, body.logprobs))
        job = _Job(P.new_id("cmpl"), served, "text_completion", body.logprobs, body.include_usage)
        return await _serve(aeng, admission, job, prompt, params, body.stream, request)

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat_completions(body: P.ChatCompletionRequest, request: Request):
        check_model(body.model)
        _check_supported(body)
        if not body.messages:
            raise APIError(400, "messages: expected at least one message", param="messages")
        check_logprobs("top_logprobs", body.top_logprobs)
        tok = aeng.tokenizer
        ids = _value_error_as_400(lambda: tok.apply_chat_template([m.as_dict() for m in body.messages]), "messages")
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        if max_tokens is None:  # OpenAI's default: as many as the context window (and KV cache) leave
            room = aeng.max_model_len or len(ids) + 16
            stats = aeng.stats
            if stats is not None and getattr(stats, "kv_blocks_total", 0):
                room = min(room, stats.kv_blocks_total * stats.block_size)
            max_tokens = max(1, room - len(ids))
        top_n = (body.top_logprobs or 0) if body.logprobs else None
        params = _value_error_as_400(lambda: body.sampling_params(max_tokens, top_n))
        job = _Job(P.new_id("chatcmpl"), served, "chat.completion", top_n, body.include_usage)
        return await _serve(aeng, admission, job, {"prompt_token_ids": ids}, params, body.stream, request)

    return app


class _Admission:
    """The bounded waiting queue. A request is "waiting" from its arrival until
    the engine schedules it; when max_waiting are already waiting, a new one is
    refused with 429 rather than queued without limit."""

    def __init__(self, aeng: AsyncEngine, max_waiting: int):
        self.aeng, self.max_waiting = aeng, max_waiting

    def check(self) -> None:
        # No await between this check and add_request's count, and the event
        # loop runs one handler at a time, so two requests cannot both slip in.
        waiting = self.aeng.num_waiting
        if waiting >= self.max_waiting:
            raise APIError(429, f"The server is busy: {waiting} requests are already waiting "
                                f"(--max-waiting {self.max_waiting}). Retry shortly.",
                           "rate_limit_error", code="queue_full", headers={"Retry-After": "1"})


class _Job:
    """What a handler needs to format one request's answer."""

    def __init__(self, rid: str, model: str, kind: str, top_n: int | None, include_usage: bool):
        self.rid, self.model, self.kind, self.top_n, self.include_usage = rid, model, kind, top_n, include_usage
        self.created = P.now()
        self.chat = kind == "chat.completion"


async def _serve(aeng, admission, job: _Job, prompt, params, stream: bool, request: Request):
    admission.check()
    try:
        handle = await aeng.add_request(prompt, params)
    except ValueError as e:  # the engine's own validation, e.g. the prompt is over the context window
        raise APIError(400, str(e), param="messages" if job.chat else "prompt") from None
    except EngineError as e:
        raise APIError(503, str(e), "server_error") from None
    outputs = _outputs(aeng, handle)
    if stream:
        return _SSEResponse(_sse(job, outputs), on_close=lambda: _release(aeng, handle))
    return await _whole(job, outputs, request)


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


def _release(aeng: AsyncEngine, handle) -> None:
    """Take an unfinished request out of the engine: its batch slot and KV blocks are freed."""
    if not handle.finished:
        handle.finished = True
        aeng.abort(handle.request_id)


async def _outputs(aeng: AsyncEngine, handle):
    """The engine's RequestOutputs for one request. However the consumer stops
    (finished, client gone, error), the request leaves the engine."""
    try:
        while True:
            item = await handle.queue.get()
            if isinstance(item, BaseException):
                handle.finished = True  # the engine thread has already dropped it
                raise item
            handle.finished = item.finished
            yield item
            if item.finished:
                return
    finally:
        _release(aeng, handle)


async def _whole(job: _Job, outputs, request: Request) -> JSONResponse:
    """Non-streaming: wait for the final output, unless the client hangs up first."""
    async def last():
        out = None
        async for out in outputs:
            pass
        return out

    task = asyncio.ensure_future(last())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()  # runs _outputs' finally: the request is aborted
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if not task.done() or task.cancelled():
        return JSONResponse({}, status_code=499)  # nobody reads this: the client has gone
    try:
        out = task.result()
    except EngineError as e:
        raise APIError(500, str(e), "server_error") from None
    build = P.chat_response if job.chat else P.completion_response
    return JSONResponse(build(job.rid, job.model, job.created, out, job.top_n))


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _sse(job: _Job, outputs):
    """Streaming: one `data: {json}` event per step that added text, then a
    usage event if asked for, then `data: [DONE]`."""
    obj = "chat.completion.chunk" if job.chat else "text_completion"

    def chunk(choice: dict | None, usage: dict | None = None) -> str:
        body = {"id": job.rid, "object": obj, "created": job.created, "model": job.model,
                "choices": [choice] if choice else []}
        if job.include_usage:
            body["usage"] = usage  # null on every chunk but the last, as OpenAI does
        return f"data: {json.dumps(body)}\n\n"

    sent_text, sent_tokens, out = {0: 0}, {0: 0}, None  # per choice (n > 1: one per parallel sample)
    ended = set()
    try:
        if job.chat:  # OpenAI's first chat chunk announces the role
            yield chunk(_role(0))
        async for out in outputs:
            for c in out.outputs:
                if c.index in ended:
                    continue
                if c.index not in sent_text:
                    sent_text[c.index] = sent_tokens[c.index] = 0
                    if job.chat:
                        yield chunk(_role(c.index))
                text = c.text[sent_text[c.index]:]
                new_ids, new_lps = c.token_ids[sent_tokens[c.index]:], (c.logprobs or [])[sent_tokens[c.index]:]
                if not text and not c.finish_reason and not (job.top_n is not None and new_ids):
                    continue
                lps = None
                if job.top_n is not None:
                    lps = (P.chat_logprobs(new_lps, new_ids, job.top_n) if job.chat
                           else P.completion_logprobs(new_lps, new_ids, job.top_n, offset=sent_text[c.index]))
                if job.chat:
                    yield chunk({"index": c.index, "delta": {"content": text} if text else {}, "logprobs": lps,
                                 "finish_reason": c.finish_reason})
                else:
                    yield chunk({"index": c.index, "text": text, "logprobs": lps, "finish_reason": c.finish_reason})
                sent_text[c.index], sent_tokens[c.index] = len(c.text), len(c.token_ids)
                if c.finish_reason:
                    ended.add(c.index)
    except EngineError as e:  # headers are sent already: report in-band, as vLLM does
        yield f"data: {json.dumps(P.error_body(str(e), 'server_error', code=500))}\n\n"
        yield "data: [DONE]\n\n"
        return
    if job.include_usage and out is not None:
        yield chunk(None, P.usage(out))
    yield "data: [DONE]\n\n"


def _role(index: int) -> dict:
    return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}


def _check_supported(body) -> None:
    problem = body.unsupported()
    if problem:
        raise APIError(400, problem[1], param=problem[0])


def _value_error_as_400(fn, param: str | None = None):
    """Run fn; a ValueError (which names the field) becomes a 400 for that field."""
    try:
        return fn()
    except ValueError as e:
        named = re.match(r"SamplingParams\.(\w+)", str(e))
        raise APIError(400, str(e), param=named.group(1) if named else param) from None


def _add_error_handlers(app: FastAPI) -> None:
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
        return APIError(500, f"internal error: {exc!r}", "server_error").response()
