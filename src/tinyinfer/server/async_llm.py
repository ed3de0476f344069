"""AsyncLLM: the API server's client of the engine core (engine_core.py).

An HTTP server handles many requests at once, each in its own coroutine, but
an engine is not thread-safe and its step() blocks for a whole forward pass.
So the engine lives in an EngineCore, which owns it alone: by default in a
process of its own (AsyncLLM.spawn, what `tinyinfer serve` uses), or in a
thread of this process (AsyncLLM(engine), for tests and notebooks that built
the engine themselves). Handlers never touch the engine (vLLM's AsyncLLM sits
over its engine core the same way):

    handler --AddRequest/Abort--> [command pipe] --> core: step(), step(), ...
    handler <--RequestDelta-- [its asyncio.Queue] <-- reader <-- [report pipe]

The event loop watches the report pipe (loop.add_reader): when the core has
sent a step's report, the loop wakes and puts each delta on its request's
queue. No thread of this process runs the model, so nothing here competes with
the engine for an interpreter lock.

If the core dies (a crash, the out-of-memory killer), its end of the pipe
closes: every waiting request gets an EngineUnavailable at once and /health
turns 503, so nothing hangs and no accepted request is silently lost.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import multiprocessing
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ..sampling import SamplingParams
from .engine_core import EngineCore, ready, run_engine_core
from .engine_protocol import ServableEngine
from .messages import Abort, AddRequest, EngineStats, Fatal, Ready, Report, RequestDelta, Shutdown, StepReport
from .prometheus import ServerMetrics

log = logging.getLogger("tinyinfer.server")


class EngineError(RuntimeError):
    """The engine failed while serving this request (answered as HTTP 500)."""


class EngineUnavailable(EngineError):
    """The engine is not running (answered as HTTP 503)."""


@dataclass
class RequestStream:
    """What a handler holds for one request: its id and its private queue of
    RequestDeltas (or the error that ended it)."""

    request_id: str
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    finished: bool = False


class AsyncLLM:
    def __init__(self, engine: ServableEngine | None = None, *, build: Callable[[], ServableEngine] | None = None,
                 torch_threads: int | None = None):
        """AsyncLLM(engine) runs the core in a thread on an engine you built;
        AsyncLLM.spawn(...) builds one in a process of its own."""
        if (engine is None) == (build is None):
            raise ValueError("give either an engine or a build function, not both")
        self.engine, self.build, self.torch_threads = engine, build, torch_threads
        self.served_model_name: str | None = None  # what clients send as "model" (default: the engine's name)
        self.max_model_len: int | None = None  # both known once the core is Ready
        self.stats = EngineStats()  # the engine's numbers at the core's last report
        # /metrics; made when the core is Ready (its labels need the model's name)
        self.metrics: ServerMetrics | None = None
        self.fatal_error: EngineUnavailable | None = None
        self._streams: dict[str, RequestStream] = {}  # every accepted or arriving request, until it ends
        self._accepting: dict[str, asyncio.Future] = {}  # sent to the core, not yet accepted or refused
        self._ids = itertools.count()
        self._commands = self._reports = self._worker = self._loop = self._ready = None
        self._closing = False

    @classmethod
    def spawn(cls, build: Callable[[], ServableEngine] | None = None, *, torch_threads: int | None = None,
              **engine_kwargs) -> "AsyncLLM":
        """The engine that build() returns (by default LLMEngine(**engine_kwargs)),
        built in, and run in, a process of its own whose torch uses torch_threads.
        build must pickle: a module-level function or a functools.partial of one."""
        if build is None:
            from ..llm_engine import LLMEngine

            build = functools.partial(LLMEngine, **engine_kwargs)
        elif engine_kwargs:
            raise ValueError(f"give engine settings to your build function, not here: {sorted(engine_kwargs)}")
        return cls(build=build, torch_threads=torch_threads)

    # --- what the handlers read -------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The engine core's process id (None when it runs in a thread)."""
        return self._worker.pid if self.build is not None and self._worker is not None else None

    @property
    def is_alive(self) -> bool:
        if self.fatal_error is not None or self._closing or self._worker is None:
            return False
        return self._worker.is_alive()

    @property
    def num_waiting(self) -> int:
        """Requests on their way to the engine, or in it but not in the running batch."""
        return len(self._accepting) + self.stats.num_requests_waiting

    # --- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """Start the core and wait until its engine is loaded (raises EngineUnavailable if it cannot start)."""
        self._loop = asyncio.get_running_loop()
        self._ready = self._loop.create_future()
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads or locks copied by fork
        core_commands, self._commands = ctx.Pipe(duplex=False)
        self._reports, core_reports = ctx.Pipe(duplex=False)
        if self.engine is not None:
            self._worker = threading.Thread(target=self._run_core_thread, args=(core_commands, core_reports),
                                            name="tinyinfer-engine-core", daemon=True)
            self._worker.start()
        else:
            self._worker = ctx.Process(target=run_engine_core, name="tinyinfer-engine-core", daemon=True,
                                       args=(self.build, self.torch_threads, core_commands, core_reports))
            self._worker.start()
            # Keep no copy of the core's ends here: when the core exits, its end
            # closes for good and the reader sees end-of-file at once.
            core_commands.close()
            core_reports.close()
        self._loop.add_reader(self._reports.fileno(), self._on_reports)
        await self._ready

    def _run_core_thread(self, commands, reports) -> None:
        try:
            reports.send(ready(self.engine))
            EngineCore(self.engine, commands, reports).run()
        finally:
            reports.close()  # the API server sees end-of-file, as if a process had exited

    def shutdown(self, timeout: float = 10.0) -> None:
        self._closing = True
        if self._reports is not None:
            self._loop.remove_reader(self._reports.fileno())
            try:
                self._commands.send(Shutdown())
            except OSError:
                pass
            self._worker.join(timeout)
        if self.pid is not None and self._worker.is_alive():
            self._worker.kill()
            self._worker.join(5)
        self._fail_all("the server is shutting down")
        for conn in (self._commands, self._reports):
            if conn is not None:
                conn.close()

    # --- called from handlers (the event loop) ---------------------------------------

    async def add_request(self, prompt, params: SamplingParams, max_tokens_from_room: bool = False) -> RequestStream:
        """Send a request to the core and wait until the engine has taken it. A
        request the engine refuses (too long, bad token ids) raises its ValueError
        here, before any response has started, so the handler can answer 400."""
        if not self.is_alive:
            raise EngineUnavailable(f"the engine is not running: {self.fatal_error or 'it has stopped'}")
        rid = f"req-{next(self._ids)}"
        stream, accepted = RequestStream(rid), self._loop.create_future()
        self._streams[rid], self._accepting[rid] = stream, accepted  # counted as waiting from now on
        try:
            self._commands.send(AddRequest(rid, prompt, params, max_tokens_from_room))
        except OSError as e:  # the core has gone; the reader will say so to everyone else
            del self._streams[rid], self._accepting[rid]
            raise EngineUnavailable(f"the engine is not running: {e}") from None
        try:
            await accepted  # raises the engine's ValueError, or an EngineError
        except asyncio.CancelledError:  # the client left before the engine took it
            self.abort(rid)
            raise
        return stream

    def abort(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._accepting.pop(request_id, None)
        if self.is_alive:
            try:
                self._commands.send(Abort(request_id))
            except OSError:
                pass

    def release(self, stream: RequestStream) -> None:
        """Take an unfinished request out of the engine: its batch slot and KV blocks are freed."""
        if not stream.finished:
            stream.finished = True
            self.abort(stream.request_id)

    # --- the reader: the event loop calls it when the core has written ----------

    def _on_reports(self) -> None:
        try:
            while self._reports.poll():
                self._handle(self._reports.recv())
        except (EOFError, OSError):
            self._loop.remove_reader(self._reports.fileno())
            if not self._closing:
                self._die("the engine core stopped" + (f" (exit code {self._worker.exitcode})" if self.pid else ""))

    def _handle(self, report: Report) -> None:
        match report:
            case Ready():
                self.served_model_name = self.served_model_name or report.model_name
                self.max_model_len, self.stats = report.max_model_len, report.stats
                self.metrics = ServerMetrics(self.served_model_name, self)
                self._ready.set_result(None)
            case Fatal():
                self._die(report.reason)
            case StepReport():
                self._on_step(report)

    def _on_step(self, report: StepReport) -> None:
        for rid in report.accepted:
            self._settle(rid, None)
        for r in report.refused:
            self._streams.pop(r.request_id, None)
            self._settle(r.request_id, ValueError(r.message) if r.invalid else EngineError(r.message))
        for delta in report.deltas:
            self._deliver(delta)
        for rid in report.failed:
            stream = self._streams.pop(rid, None)
            if stream is not None:
                stream.queue.put_nowait(EngineError(report.error))
        self.stats = report.stats
        self.metrics.record(report)

    def _settle(self, request_id: str, error: Exception | None) -> None:
        """The engine took the request (error None) or refused it: wake its handler."""
        accepted = self._accepting.pop(request_id, None)
        if accepted is None or accepted.done():  # its client left meanwhile: the core has its Abort too
            return
        if error is None:
            accepted.set_result(None)
        else:
            accepted.set_exception(error)

    def _deliver(self, delta: RequestDelta) -> None:
        stream = self._streams.get(delta.request_id)
        if stream is None:  # its client left: the core has an Abort on its way
            return
        stream.queue.put_nowait(delta)
        if delta.usage is not None:  # the request's last delta
            del self._streams[delta.request_id]

    def _die(self, reason: str) -> None:
        log.error("engine core: %s", reason)
        self.fatal_error = EngineUnavailable(reason)
        if not self._ready.done():
            self._ready.set_exception(EngineUnavailable(reason))
        self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        """Answer every request still waiting: none is left hanging."""
        for fut in self._accepting.values():
            if not fut.done():
                fut.set_exception(EngineUnavailable(reason))
        for stream in self._streams.values():
            stream.queue.put_nowait(EngineUnavailable(reason))
        self._accepting.clear()
        self._streams.clear()
        self.stats = EngineStats(kv_blocks_total=self.stats.kv_blocks_total)
