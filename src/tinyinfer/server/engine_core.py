"""EngineCore: the engine's step loop, fed through a pipe, alone in its process.

The HTTP side of a server (parsing JSON, writing server-sent events) and the
engine's step loop both run Python. In one process they share one interpreter
lock: every time a handler runs, the engine waits for the lock, and every torch
call the engine makes hands the lock back and has to win it again. On a small
machine that costs the engine a good part of every step. vLLM's V1 engine
therefore runs its "engine core" in a process of its own, and so do we:

    API server process                          engine core process
    handlers --AddRequest | Abort--pipe--->     while True:
                                                    take every waiting command
                                                    step()            (busy loop)
    handlers <--one StepReport per step--pipe--     send what is new since the last step

The core never waits for the HTTP side: while requests are unfinished it steps
without pause, and after each step it sends one StepReport (messages.py): which
requests it accepted or refused, each sample's new tokens and text, and the
engine's numbers. The engine returns cumulative RequestOutputs; the core keeps,
per sample, how much it has already sent, and sends only the rest, so the
pipe carries a few bytes per token whatever the length of the context. With
no work it sleeps on the pipe, so an idle server uses no CPU.

The same loop also runs in a thread (EngineCore(engine, ...).run()), for tests
and notebooks that build the engine themselves; the messages are the same.
"""
from __future__ import annotations

import dataclasses
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable

from ..outputs import RequestOutput
from .engine_protocol import ServableEngine, engine_stats, kv_capacity_tokens, step_work
from .messages import (Abort, AddRequest, ChatPrompt, Command, Fatal, Ready, Refused, RequestDelta, RequestMetrics,
                       Shutdown, StepReport, StepStats, Usage)

log = logging.getLogger("tinyinfer.server")


class RequestProgress:
    """One live request, kept by the core: per sample, how many tokens and
    characters of text the API server has been sent, and when its tokens came."""

    def __init__(self, now: float):
        self.arrival_time = now
        self.first_token_time: float | None = None
        self.last_token_time = now
        self.sent: dict[int, tuple[int, int]] = {}  # sample index -> (tokens, characters) sent
        self.done: set[int] = set()  # samples whose finish was sent

    def deltas(self, out: RequestOutput) -> list[RequestDelta]:
        """What `out` (everything so far, as the engine reports it) holds that has not been sent yet."""
        deltas = []
        for c in out.outputs:
            tokens, chars = self.sent.get(c.index, (0, 0))
            n, finishing = len(c.token_ids), c.finish_reason is not None and c.index not in self.done
            if n == tokens and len(c.text) == chars and not finishing:
                continue  # nothing new (a finished sample, or text held back)
            new_lps = None if c.logprobs is None else c.logprobs[tokens:n]
            # Read the new ids one by one: a list and tinyinfer's TokenIds view both do that in O(1).
            deltas.append(RequestDelta(out.request_id, c.index, [c.token_ids[j] for j in range(tokens, n)], new_lps,
                                       c.text[chars:], chars, c.finish_reason if finishing else None))
            self.sent[c.index] = (n, len(c.text))
            if finishing:
                self.done.add(c.index)
        return deltas

    def tokens_arrived(self, now: float) -> float | None:
        """Note a step that brought tokens; the gap since the last such step (None for the first)."""
        gap = None if self.first_token_time is None else now - self.last_token_time
        self.first_token_time = self.first_token_time or now
        self.last_token_time = now
        return gap

    def finish(self, out: RequestOutput, deltas: list[RequestDelta], now: float) -> None:
        """The request's last delta carries its usage and its latency."""
        if not deltas:  # every sample had already ended: the request's end still needs a message
            last = out.outputs[-1]
            deltas.append(RequestDelta(out.request_id, last.index, [], None, "", self.sent.get(last.index, (0, 0))[1]))
        longest, first = max(len(c.token_ids) for c in out.outputs), self.first_token_time
        deltas[-1].usage = Usage(len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs))
        deltas[-1].metrics = RequestMetrics(
            ttft_s=None if first is None else first - self.arrival_time,
            tpot_s=(self.last_token_time - first) / (longest - 1) if first is not None and longest > 1 else None,
            e2e_s=now - self.arrival_time)


class _Stop(Exception):
    """Shutdown was asked for, or the API server closed its end."""


class EngineCore:
    """Owns the engine; talks to the API server only through two connections."""

    def __init__(self, engine: ServableEngine, commands, results):
        self.engine = engine
        self.commands = commands  # Connection: AddRequest | Abort | Shutdown
        self.results = results  # Connection: one StepReport per loop turn that changed something
        self.live: dict[str, RequestProgress] = {}  # requests in the engine that the API server waits for
        # A small thread empties the command pipe into this queue at once, so the
        # API server never blocks writing to a full pipe while the core is busy
        # (vLLM's core has the same input thread).
        self.inbox: queue.Queue[Command] = queue.Queue()

    def _read_commands(self) -> None:
        try:
            while True:
                self.inbox.put(self.commands.recv())
        except (EOFError, OSError):  # the API server closed its end: stop
            self.inbox.put(Shutdown())

    def run(self) -> None:
        """The busy loop. Returns on Shutdown or when the API server's end of
        the pipe closes (it exited); a bug in the loop itself is reported first."""
        threading.Thread(target=self._read_commands, name="tinyinfer-core-input", daemon=True).start()
        try:
            while True:
                busy = self.engine.has_unfinished_requests()
                turn_start, report = time.perf_counter(), StepReport()
                changed = self._take_commands(report, block=not busy)
                if self.engine.has_unfinished_requests():
                    self._step(report, turn_start if busy else None)
                if changed or report.step is not None or report.failed:  # else the API server's view is current
                    started = sum(p.first_token_time is not None for p in self.live.values())
                    report.stats = engine_stats(self.engine, len(self.live), started)
                    self.results.send(report)
        except (_Stop, EOFError, OSError, KeyboardInterrupt):  # the API server went away: nobody to serve
            return
        except BaseException as e:
            log.exception("the engine core loop died")
            try:
                self.results.send(Fatal(f"the engine loop died ({type(e).__name__}); the server's log has why"))
            except OSError:
                pass

    def _take_commands(self, report: StepReport, block: bool) -> bool:
        """Apply every queued command (with no work, wait for the first); True if any was."""
        changed = False
        while True:
            try:
                cmd = self.inbox.get() if block else self.inbox.get_nowait()  # idle: sleep until one comes
            except queue.Empty:
                return changed
            block, changed = False, True
            match cmd:
                case AddRequest():
                    self._add(cmd, report)
                case Abort(request_id=rid) if rid in self.live:
                    del self.live[rid]  # the stats sent with the report show the freed blocks
                    try:
                        self.engine.abort_request(rid)  # frees its batch slot and KV blocks
                    except Exception:
                        log.exception("abort_request(%s) failed", rid)
                case Shutdown():
                    raise _Stop

    def _add(self, cmd: AddRequest, report: StepReport) -> None:
        try:
            prompt, params = cmd.prompt, cmd.params
            if isinstance(prompt, ChatPrompt):  # the engine's own tokenizer: one process tokenizes
                prompt = {"prompt_token_ids": self.engine.tokenizer.apply_chat_template(prompt.messages)}
            if cmd.max_tokens_from_room:
                room = kv_capacity_tokens(self.engine) - len(prompt["prompt_token_ids"])
                params = dataclasses.replace(params, max_tokens=max(1, room))
            self.engine.add_request(prompt, params, request_id=cmd.request_id)
        except ValueError as e:  # the request's fault, and the engine is unchanged: the handler answers 400
            report.refused.append(Refused(cmd.request_id, str(e), invalid=True))
            return
        except Exception as e:  # the engine's fault: 500, with the traceback in this process's log
            log.exception("add_request(%s) failed", cmd.request_id)
            report.refused.append(Refused(cmd.request_id, _internal("adding the request", e), invalid=False))
            return
        self.live[cmd.request_id] = RequestProgress(time.perf_counter())
        report.accepted.append(cmd.request_id)

    def _step(self, report: StepReport, turn_start: float | None) -> None:
        t0 = time.perf_counter()
        try:
            outputs = self.engine.step()
            now = time.perf_counter()
            deltas, prompt_tokens, gaps, finished = [], 0, [], []
            for out in outputs:
                progress = self.live.get(out.request_id)
                if progress is None:  # aborted: nobody is listening
                    continue
                new = progress.deltas(out)
                if any(d.new_token_ids for d in new):
                    gap = progress.tokens_arrived(now)
                    if gap is None:  # its first token: its prompt is done
                        prompt_tokens += len(out.prompt_token_ids)
                    else:
                        gaps.append(gap)
                if out.finished:
                    progress.finish(out, new, now)
                    finished.append(out.request_id)
                deltas += new
        except Exception as e:
            # Every request in the engine may be half-updated: fail them all
            # (the handlers answer 500), drop them from the engine, keep serving.
            log.exception("engine step failed")
            report.error, report.failed = _internal("generating", e), list(self.live)
            for rid in report.failed:
                try:
                    self.engine.abort_request(rid)
                except Exception:
                    log.exception("abort_request(%s) after a failed step also failed", rid)
            self.live.clear()
            return
        for rid in finished:  # only now: had the loop above raised, they would have been failed too
            del self.live[rid]
        report.deltas = deltas
        report.step = StepStats(prompt_tokens, sum(len(d.new_token_ids) for d in deltas), gaps,
                                *step_work(self.engine), step_s=now - t0,
                                turn_s=None if turn_start is None else time.perf_counter() - turn_start)


def _internal(doing: str, e: Exception) -> str:
    """What a client is told of an internal error: its kind, not its text (that is in the log)."""
    return f"internal error: the engine failed while {doing} ({type(e).__name__}); the server's log has the traceback"


def ready(engine: ServableEngine) -> Ready:
    """What the API server needs to know about the engine, sent once at start-up."""
    return Ready(engine.model_name, engine.max_model_len, engine_stats(engine, 0, 0))


def run_engine_core(build: Callable[[], ServableEngine], torch_threads: int | None, commands, results) -> None:
    """The engine core process's entry point: build the engine, say so, serve.

    Ctrl-C in a terminal reaches every process of the group; the core ignores it
    and stops when the API server closes the pipe (or asks it to), so a request
    is never cut off by the core alone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(format="%(levelname)s:     engine core: %(message)s")  # tracebacks reach the terminal
    try:
        import torch

        if torch_threads:
            torch.set_num_threads(torch_threads)
        engine = build()
    except BaseException as e:  # a bad model name, out of memory...: tell the API server why
        results.send(Fatal(f"the engine could not start: {type(e).__name__}: {e}"))
        return
    results.send(ready(engine))
    EngineCore(engine, commands, results).run()
