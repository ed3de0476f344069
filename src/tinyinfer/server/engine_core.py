"""EngineCore: the engine's step loop, fed through a pipe, alone in its process.

The HTTP side of a server (parsing JSON, writing server-sent events) and the
engine's step loop both run Python. In one process they share one interpreter
lock: every time a handler runs, the engine waits for the lock, and every torch
call the engine makes hands the lock back and has to win it again. On a small
machine that costs the engine a good part of every step. vLLM's V1 engine
therefore runs its "engine core" in a process of its own, and so do we:

    API server process                       engine core process
    handlers --("add" | "abort")----pipe--->  while True:
                                                 take every waiting command
                                                 step()            (busy loop)
    handlers <--one message per step--pipe---   send that step's outputs

The core never waits for the HTTP side: while requests are unfinished it steps
without pause, and it sends one message per step holding every request's new
output, which requests it accepted or refused, and the engine's numbers. With
no work it sleeps on the pipe, so an idle server uses no CPU.

The same loop also runs in a thread (EngineCore(engine, ...).run()), for tests
and notebooks that build the LLMEngine themselves; the messages are the same.
"""
from __future__ import annotations

import copy
import logging
import os
import queue
import signal
import threading
import time

log = logging.getLogger("tinyinfer.server")


class EngineCore:
    """Owns the LLMEngine; talks to the API server only through two connections."""

    def __init__(self, engine, commands, results):
        self.engine = engine
        self.commands = commands  # Connection: ("add", id, prompt, params) | ("abort", id) | ("shutdown",)
        self.results = results  # Connection: one dict per loop turn (see _send)
        self.live: set[str] = set()  # requests in the engine that the API server still waits for
        # A small thread empties the command pipe into this queue at once, so the
        # API server never blocks writing to a full pipe while the core is busy
        # (vLLM's core has the same input thread).
        self.inbox: queue.Queue = queue.Queue()

    def _read_commands(self) -> None:
        try:
            while True:
                self.inbox.put(self.commands.recv())
        except (EOFError, OSError):  # the API server closed its end: stop
            self.inbox.put(("shutdown",))

    def run(self) -> None:
        """The busy loop. Returns on "shutdown" or when the API server's end of
        the pipe closes (it exited); a bug in the loop itself is reported first."""
        threading.Thread(target=self._read_commands, name="tinyinfer-core-input", daemon=True).start()
        try:
            while True:
                busy = self.engine.has_unfinished_requests()
                report = {"accepted": [], "aborted": [], "outputs": [], "failed": []}
                turn_start = time.perf_counter()
                if not self._take_commands(report, block=not busy):
                    return
                if self.engine.has_unfinished_requests():
                    self._step(report)
                    if busy:  # a whole turn of the busy loop: the step plus what the loop adds to it
                        report["turn_s"] = time.perf_counter() - turn_start
                if any(report.values()):  # else nothing changed: the API server's view is current
                    self._send(report)
        except (EOFError, OSError, KeyboardInterrupt):  # the API server went away: nobody to serve
            return
        except BaseException as e:
            log.exception("the engine core loop died")
            try:
                self.results.send({"fatal": f"the engine loop died: {e!r}"})
            except OSError:
                pass

    def _take_commands(self, report: dict, block: bool) -> bool:
        """Apply every queued command (with no work, wait for the first). False on shutdown."""
        while True:
            try:
                cmd = self.inbox.get() if block else self.inbox.get_nowait()  # idle: sleep until one comes
            except queue.Empty:
                return True
            block = False
            if cmd[0] == "add":
                _, rid, prompt, params = cmd
                try:
                    self.engine.add_request(prompt, params, request_id=rid)
                except Exception as e:  # validation: the engine is unchanged; the handler answers 400
                    report["accepted"].append((rid, f"{type(e).__name__}: {e}" if not isinstance(e, ValueError)
                                               else str(e)))
                    continue
                self.live.add(rid)
                report["accepted"].append((rid, None))
            elif cmd[0] == "abort":
                if cmd[1] in self.live:
                    self.live.discard(cmd[1])
                    report["aborted"].append(cmd[1])  # the numbers sent with the report show the freed blocks
                    try:
                        self.engine.abort_request(cmd[1])  # frees its batch slot and KV blocks
                    except Exception:
                        log.exception("abort_request(%s) failed", cmd[1])
            elif cmd[0] == "shutdown":
                return False

    def _step(self, report: dict) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:
            # Every request in the engine may be half-updated: fail them all
            # (the handlers answer 500), drop them from the engine, keep serving.
            log.exception("engine step failed")
            report["step_error"] = True
            report["failed"] = [(rid, f"the engine failed while generating: {e!r}") for rid in self.live]
            try:
                self.engine.abort_request(list(self.live))
            except Exception:
                log.exception("abort after an engine failure also failed")
            self.live.clear()
            return
        report["steps"] = 1  # every step is reported: /metrics counts the engine's time in steps
        for out in outputs:
            if out.request_id in self.live:  # else aborted meanwhile: nobody is listening
                report["outputs"].append(out)
                if out.finished:
                    self.live.discard(out.request_id)

    def _send(self, report: dict) -> None:
        """One message per loop turn: fewer wake-ups of the API server than one per request."""
        stats = copy.copy(getattr(self.engine, "stats", None))
        if stats is not None:
            # engine.stats describes the batch *during* the last step; requests that
            # finished in it, or were aborted since, have already left.
            stats.num_running = min(stats.num_running, len(self.live))
        report["stats"] = stats
        self.results.send(report)


def info(engine) -> dict:
    """What the API server needs to know about the engine, sent once at start-up."""
    return {"max_model_len": getattr(engine, "max_model_len", None),
            "model_name": getattr(engine, "model_name", None),
            "stats": copy.copy(getattr(engine, "stats", None))}


def run_engine_core(engine_kwargs: dict, commands, results) -> None:
    """The engine core process's entry point: load the engine, say so, serve.

    Ctrl-C in a terminal reaches every process of the group; the core ignores it
    and stops when the API server closes the pipe (or asks it to), so a request
    is never cut off by the core alone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threads = engine_kwargs.pop("torch_threads", None)
    try:
        import torch

        if threads:
            torch.set_num_threads(threads)
        from .. import LLMEngine

        engine = LLMEngine(**engine_kwargs)
    except BaseException as e:  # a bad model name, out of memory...: tell the API server why
        results.send({"fatal": f"the engine could not start: {type(e).__name__}: {e}"})
        return
    results.send({"ready": info(engine), "pid": os.getpid()})
    EngineCore(engine, commands, results).run()
