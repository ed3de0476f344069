"""AsyncEngine: the API server's handle on the engine core (engine_core.py).

An HTTP server handles many requests at once, each in its own coroutine, but
LLMEngine is not thread-safe and its step() blocks for a whole forward pass.
So the engine lives in an EngineCore, which owns it alone: by default in a
process of its own (AsyncEngine.spawn, what `tinyinfer serve` uses), or in a
thread of this process (AsyncEngine(engine), for tests and notebooks that
built the engine themselves). Handlers never touch the engine:

    handler --add/abort--> [command pipe] --> core: step(), step(), ...
    handler <--RequestOutput-- [its asyncio.Queue] <-- reader <-- [result pipe]

The event loop watches the result pipe (loop.add_reader): when the core has
sent a step's outputs, the loop wakes, and puts each output on its request's
queue. No thread of this process runs the model, so nothing here competes with
the engine for an interpreter lock.

If the core dies (a crash, the out-of-memory killer), its end of the pipe
closes: every waiting request gets an EngineError at once and /health turns
503, so nothing hangs and no accepted request is silently lost.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import multiprocessing
import threading
import time
from dataclasses import dataclass, field

from .engine_core import EngineCore, info, run_engine_core

log = logging.getLogger("tinyinfer.server")


class EngineError(RuntimeError):
    """The engine failed while serving this request (answered as HTTP 500)."""


@dataclass
class RequestStream:
    """What a handler holds for one request: its id and its private queue."""

    request_id: str
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    finished: bool = False
    num_tokens: int = 0  # tokens received so far (for the metrics)


class AsyncEngine:
    def __init__(self, engine=None, *, engine_kwargs: dict | None = None, rate_window_s: float = 10.0):
        """AsyncEngine(engine) runs the core in a thread on an engine you built;
        AsyncEngine.spawn(**kwargs) builds it in a process of its own."""
        if (engine is None) == (engine_kwargs is None):
            raise ValueError("give either an LLMEngine or engine_kwargs, not both")
        self.engine, self.engine_kwargs = engine, engine_kwargs
        self._tokenizer = getattr(engine, "tokenizer", None)
        self._info = info(engine) if engine is not None else {}
        self.stats = self._info.get("stats")  # the engine's numbers at its last step (a copy)
        self._streams: dict[str, RequestStream] = {}  # every accepted or arriving request, until it ends
        self._accepting: dict[str, asyncio.Future] = {}  # sent to the core, not yet accepted or refused
        self._ids = itertools.count()
        self._commands = self._results = None
        self._thread: threading.Thread | None = None
        self._process = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future | None = None
        self._closing = False
        self.generation_tokens_total = 0
        self.prompt_tokens_total = 0
        self.num_step_errors = 0
        self.engine_steps_total = 0
        self.engine_step_seconds_total = 0.0
        self.recent_steps: collections.deque = collections.deque(maxlen=10_000)
        self.fatal_error: BaseException | None = None
        self._recent: collections.deque = collections.deque()  # (time, tokens) of recent steps
        self._rate_window_s = rate_window_s

    @classmethod
    def spawn(cls, **engine_kwargs) -> "AsyncEngine":
        """The engine is built in, and runs in, a process of its own
        (LLMEngine's keyword arguments, plus torch_threads for its torch)."""
        return cls(engine_kwargs=engine_kwargs)

    # --- what the handlers read -------------------------------------------------

    @property
    def tokenizer(self):
        if self._tokenizer is None:  # a spawned core: this process tokenizes chats itself
            from ..config import DEFAULT_MODEL
            from ..tokenizer import Tokenizer
            from ..weights import resolve_model

            self._tokenizer = Tokenizer(resolve_model(self.engine_kwargs.get("model", DEFAULT_MODEL)))
        return self._tokenizer

    @property
    def max_model_len(self) -> int | None:
        return self._info.get("max_model_len")

    @property
    def model_name(self) -> str | None:
        return self._info.get("model_name")

    @property
    def pid(self) -> int | None:
        """The engine core's process id (None when it runs in a thread)."""
        return self._process.pid if self._process is not None else None

    @property
    def is_alive(self) -> bool:
        if self.fatal_error is not None or self._closing or self._results is None:
            return False
        worker = self._process or self._thread
        return worker is not None and worker.is_alive()

    @property
    def num_running(self) -> int:
        return getattr(self.stats, "num_running", 0) or 0

    @property
    def num_waiting(self) -> int:
        """Requests accepted (or on their way to the core) that are not in the running batch."""
        return max(0, len(self._streams) - self.num_running)

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        recent = [(t, n) for t, n in list(self._recent) if now - t <= self._rate_window_s]
        return sum(n for _, n in recent) / self._rate_window_s

    # --- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """Start the core and wait until its engine is loaded (raises EngineError if it cannot start)."""
        self._loop = asyncio.get_running_loop()
        self._ready = self._loop.create_future()
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads or locks copied by fork
        core_commands, self._commands = ctx.Pipe(duplex=False)
        self._results, core_results = ctx.Pipe(duplex=False)
        if self.engine is not None:
            self._thread = threading.Thread(target=self._run_core_thread, args=(core_commands, core_results),
                                            name="tinyinfer-engine-core", daemon=True)
            self._thread.start()
        else:
            self._process = ctx.Process(target=run_engine_core, args=(dict(self.engine_kwargs), core_commands,
                                                                      core_results),
                                        name="tinyinfer-engine-core", daemon=True)
            self._process.start()
            # Keep no copy of the core's ends here: when the core exits, its end
            # closes for good and the reader sees end-of-file at once.
            core_commands.close()
            core_results.close()
            self.tokenizer  # noqa: B018  load it while the core loads the model
        self._loop.add_reader(self._results.fileno(), self._on_results)
        await self._ready

    def _run_core_thread(self, commands, results) -> None:
        try:
            results.send({"ready": info(self.engine)})
            EngineCore(self.engine, commands, results).run()
        finally:
            results.close()  # the API server sees end-of-file, as if a process had exited

    def shutdown(self, timeout: float = 10.0) -> None:
        self._closing = True
        if self._loop is not None and self._results is not None:
            self._loop.remove_reader(self._results.fileno())
        try:
            self._commands.send(("shutdown",))
        except (OSError, AttributeError):
            pass
        if self._thread is not None:
            self._thread.join(timeout)
        if self._process is not None:
            self._process.join(timeout)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5)
        self._fail_all("the server is shutting down")
        for conn in (self._commands, self._results):
            if conn is not None:
                conn.close()

    # --- called from handlers (the event loop) ---------------------------------------

    async def add_request(self, prompt, params) -> RequestStream:
        """Send a request to the core and wait until it has accepted it. A prompt
        the engine rejects (too long, bad token ids) raises its ValueError here,
        before any response has started, so the handler can answer 400."""
        if not self.is_alive:
            raise EngineError(f"the engine is not running: {self.fatal_error or 'it has stopped'}")
        rid = f"req-{next(self._ids)}"
        stream, accepted = RequestStream(rid), self._loop.create_future()
        self._streams[rid], self._accepting[rid] = stream, accepted  # counted as waiting from now on
        try:
            self._commands.send(("add", rid, prompt, params))
        except OSError as e:  # the core has gone; the reader will say so to everyone else
            self._streams.pop(rid, None), self._accepting.pop(rid, None)
            raise EngineError(f"the engine is not running: {e!r}") from None
        try:
            await accepted  # raises the engine's ValueError, or EngineError if the core died
        except asyncio.CancelledError:  # the client left before the engine took it
            self.abort(rid)
            raise
        return stream

    def abort(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._accepting.pop(request_id, None)
        if self.is_alive:
            try:
                self._commands.send(("abort", request_id))
            except OSError:
                pass

    # --- the reader: the event loop calls it when the core has written ----------

    def _on_results(self) -> None:
        try:
            while self._results.poll():
                self._handle(self._results.recv())
        except (EOFError, OSError):
            self._loop.remove_reader(self._results.fileno())
            if not self._closing:
                code = self._process.exitcode if self._process is not None else None
                self._die(f"the engine core stopped (exit code {code})" if self._process is not None
                          else "the engine core thread stopped")

    def _handle(self, msg: dict) -> None:
        if "ready" in msg:
            self._info = msg["ready"]
            self.stats = self._info.get("stats")
            if not self._ready.done():
                self._ready.set_result(None)
            return
        if "fatal" in msg:
            self._die(msg["fatal"])
            return
        for rid, error in msg["accepted"]:
            fut = self._accepting.pop(rid, None)
            if error is not None:
                self._streams.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_exception(ValueError(error)) if error is not None else fut.set_result(None)
        new_tokens = 0
        for out in msg["outputs"]:
            stream = self._streams.get(out.request_id)
            if stream is None:  # aborted meanwhile
                continue
            n = len(out.outputs[0].token_ids)
            if stream.num_tokens == 0 and n:
                self.prompt_tokens_total += len(out.prompt_token_ids)
            new_tokens += n - stream.num_tokens
            stream.num_tokens = n
            stream.queue.put_nowait(out)
            if out.finished:
                del self._streams[out.request_id]
        for rid, error in msg["failed"]:
            stream = self._streams.pop(rid, None)
            if stream is not None:
                stream.queue.put_nowait(EngineError(error))
        self.num_step_errors += bool(msg.get("step_error"))
        self.stats = msg["stats"]
        if msg.get("steps") and self.stats is not None:  # time inside engine.step(), as the core measured it
            self.engine_steps_total += 1
            self.engine_step_seconds_total += getattr(self.stats, "step_time_s", 0.0)
            if msg.get("turn_s"):  # for GET /debug/steps: what each step carried and how long it took
                self.recent_steps.append((self.stats.num_prefill_tokens, self.stats.num_decode_tokens,
                                          round(self.stats.step_time_s, 6), round(msg["turn_s"], 6)))
        self._record(new_tokens)

    def _record(self, new_tokens: int) -> None:
        now = time.monotonic()
        self.generation_tokens_total += new_tokens
        self._recent.append((now, new_tokens))
        while self._recent and now - self._recent[0][0] > self._rate_window_s:
            self._recent.popleft()

    def _die(self, reason: str) -> None:
        log.error("engine core: %s", reason)
        self.fatal_error = EngineError(reason)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(EngineError(reason))
        self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        """Answer every request still waiting: none is left hanging."""
        for fut in self._accepting.values():
            if not fut.done():
                fut.set_exception(EngineError(reason))
        for stream in self._streams.values():
            stream.queue.put_nowait(EngineError(reason))
        self._accepting.clear()
        self._streams.clear()
        if self.stats is not None:
            self.stats.num_running = 0
