"""AsyncEngine: the engine loop in a background thread, fed by asyncio handlers.

An HTTP server handles many requests at once, each in its own coroutine, but
LLMEngine is not thread-safe and its step() blocks for a whole forward pass.
So exactly one thread owns the engine. Handlers never touch it: they put
commands ("add", "abort") on a thread-safe queue and read results from their
own asyncio.Queue, which the engine thread fills with
loop.call_soon_threadsafe (asyncio queues may only be touched from their loop).

    handler --add/abort--> [command queue] --> engine thread: step(), step(), ...
    handler <--RequestOutput-- [per-request asyncio.Queue] <--'

While requests are unfinished the thread steps without pause; each step
serves every running request at once (continuous batching). With no work it
sleeps on the command queue, so an idle server uses no CPU.
"""
from __future__ import annotations

import asyncio
import collections
import copy
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger("tinyinfer.server")


class EngineError(RuntimeError):
    """The engine failed while serving this request (answered as HTTP 500)."""


@dataclass
class RequestStream:
    """What a handler holds for one request: its id and its private queue."""

    request_id: str
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    finished: bool = False

    def put(self, item) -> None:
        """Called from the engine thread: hand `item` to the handler's loop."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop has closed (server shutting down): nobody is listening
            pass


class AsyncEngine:
    def __init__(self, engine, rate_window_s: float = 10.0):
        self.engine = engine
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[str, RequestStream] = {}  # engine thread only
        self._sent_tokens: dict[str, int] = {}  # engine thread only: tokens counted so far per request
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # Read by /metrics and the admission check from the event loop. Each is
        # replaced whole by the engine thread, never mutated, so a reader sees a
        # consistent snapshot without a lock.
        self.stats = copy.copy(getattr(engine, "stats", None))
        self.generation_tokens_total = 0
        self.prompt_tokens_total = 0
        self.num_step_errors = 0
        self.fatal_error: BaseException | None = None
        # Requests sent but not yet taken by the engine thread, and those it
        # holds that are not in the running batch: together, the waiting queue.
        self._lock = threading.Lock()
        self._pending = 0
        self._engine_waiting = 0
        self._recent: collections.deque = collections.deque()  # (time, tokens) of recent steps
        self._rate_window_s = rate_window_s

    # --- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="tinyinfer-engine", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._commands.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.fatal_error is None

    # --- called from handlers (the event loop) ---------------------------------------

    async def add_request(self, prompt, params) -> RequestStream:
        """Queue a request and wait until the engine has accepted it. A prompt
        the engine rejects (too long, bad token ids) raises its ValueError here,
        before any response has started, so the handler can answer 400."""
        if not self.is_alive:
            raise EngineError("the engine loop is not running")
        loop = asyncio.get_running_loop()
        stream = RequestStream(f"req-{next(self._ids)}", loop)
        accepted = loop.create_future()
        with self._lock:
            self._pending += 1
        self._commands.put(("add", stream, prompt, params, accepted))
        try:
            await accepted  # raises the engine's ValueError, if any
        except asyncio.CancelledError:  # the client left before the engine took it
            self.abort(stream.request_id)
            raise
        return stream

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    @property
    def num_waiting(self) -> int:
        return self._pending + self._engine_waiting

    @property
    def num_running(self) -> int:
        return getattr(self.stats, "num_running", 0) or 0

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        recent = [(t, n) for t, n in list(self._recent) if now - t <= self._rate_window_s]
        return sum(n for _, n in recent) / self._rate_window_s

    # --- the engine thread ----------------------------------------------------

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                busy = self.engine.has_unfinished_requests()
                self._run_commands(block=not busy)
                if self.engine.has_unfinished_requests():
                    self._step()
        except BaseException as e:  # a bug in this loop: make it visible (/health turns 503)
            log.exception("engine loop died")
            self.fatal_error = e
            self._fail_all(EngineError(f"the engine loop died: {e!r}"))

    def _run_commands(self, block: bool) -> None:
        """Apply every queued command; with no work to do, wait for one first."""
        try:
            cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(cmd)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                self._snapshot()
                return

    def _apply(self, cmd) -> None:
        if cmd[0] == "add":
            _, stream, prompt, params, accepted = cmd
            with self._lock:
                self._pending -= 1
            try:
                self.engine.add_request(prompt, params, request_id=stream.request_id)
            except Exception as e:  # validation: the engine is unchanged, the handler answers 400
                _resolve(stream.loop, accepted, error=e)
                return
            self._streams[stream.request_id] = stream
            self._sent_tokens[stream.request_id] = 0
            _resolve(stream.loop, accepted)
        elif cmd[0] == "abort":
            if self._streams.pop(cmd[1], None) is not None:
                self._sent_tokens.pop(cmd[1], None)
                try:
                    self.engine.abort_request(cmd[1])  # frees its KV blocks
                except Exception:
                    log.exception("abort_request(%s) failed", cmd[1])

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:
            # Every request in the engine may be in a half-updated state: fail
            # them all with a 500, drop them from the engine, and keep serving.
            log.exception("engine step failed")
            self.num_step_errors += 1
            self._fail_all(EngineError(f"the engine failed while generating: {e!r}"))
            return
        new_tokens = 0
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:  # aborted meanwhile
                continue
            n = len(out.outputs[0].token_ids)
            if self._sent_tokens[out.request_id] == 0 and n:
                self.prompt_tokens_total += len(out.prompt_token_ids)
            new_tokens += n - self._sent_tokens[out.request_id]
            self._sent_tokens[out.request_id] = n
            stream.put(out)
            if out.finished:
                del self._streams[out.request_id], self._sent_tokens[out.request_id]
        self._record(new_tokens)

    def _record(self, new_tokens: int) -> None:
        now = time.monotonic()
        self.generation_tokens_total += new_tokens
        self._recent.append((now, new_tokens))
        while self._recent and now - self._recent[0][0] > self._rate_window_s:
            self._recent.popleft()
        self._snapshot()

    def _snapshot(self) -> None:
        """Publish the engine's numbers for the event loop to read."""
        stats = copy.copy(getattr(self.engine, "stats", None))
        # engine.stats describes the batch *during* the last step; requests that
        # finished in it, or were aborted since, have already left. Correct for
        # that, or an idle server would report a running request forever.
        if stats is not None:
            stats.num_running = min(stats.num_running, self.engine.get_num_unfinished_requests())
            block_manager = getattr(self.engine, "block_manager", None)
            if block_manager is not None:
                stats.kv_blocks_used = block_manager.num_used_blocks
        self.stats = stats
        self._engine_waiting = max(0, len(self._streams) - self.num_running)

    def _fail_all(self, error: EngineError) -> None:
        ids = list(self._streams)
        for rid in ids:
            self._streams.pop(rid).put(error)
            self._sent_tokens.pop(rid, None)
        try:
            self.engine.abort_request(ids)
        except Exception:
            log.exception("abort after an engine failure also failed")
        self._snapshot()


def _resolve(loop, future: asyncio.Future, error: BaseException | None = None) -> None:
    def settle():
        if not future.done():  # the handler may have been cancelled meanwhile
            future.set_exception(error) if error else future.set_result(None)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:
        pass
