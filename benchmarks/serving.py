"""Start and stop local inference servers for the benchmarks, and never leave one behind.

Each server runs in a process group of its own (start_new_session), so
stopping it stops every process it started too (vLLM's engine core,
tinyinfer's engine core). `serve(...)` is a context manager: the group is
stopped when the block ends, however it ends: normally, on an exception, on
Ctrl-C, or on SIGTERM (install_signal_handlers turns SIGTERM into
KeyboardInterrupt, so the same `finally` runs).

Only loopback addresses: every server binds 127.0.0.1 on a port the OS picked.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx

from tinyinfer.server.background import free_port


def install_signal_handlers() -> None:
    """SIGTERM (and SIGHUP) raise KeyboardInterrupt, so cleanup runs as on Ctrl-C."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


def stop_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM to the server's whole process group, then SIGKILL if it lingers."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    # Whatever the leader did, no member of its group may outlive it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


@contextlib.contextmanager
def serve(cmd: list[str], port: int, env: dict | None = None, startup_timeout_s: float = 600.0,
          name: str = "server"):
    """Run `cmd` (which must listen on 127.0.0.1:port) until /health answers 200;
    yield its base URL; stop its process group on the way out. Its output goes to
    a temporary file, shown if it fails to start."""
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with code {proc.returncode} before it was ready:\n{tail}")
            try:
                if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} was not ready after {startup_timeout_s:.0f} s")
            time.sleep(0.5)
        yield url
    finally:
        stop_group(proc)
        log.close()


def serve_tinyinfer(model: str, dtype: str, threads: int, extra: list[str] = (), pythonpath: str | None = None,
                    max_num_seqs: int = 16, max_num_batched_tokens: int = 512, max_waiting: int = 10_000):
    """`tinyinfer serve` as a reader starts it, with torch using `threads` threads."""
    port = free_port()
    cmd = [sys.executable, "-m", "tinyinfer", "serve", "--port", str(port), "--model", model, "--dtype", dtype,
           "--device", "cpu", "--max-num-seqs", str(max_num_seqs), "--max-num-batched-tokens",
           str(max_num_batched_tokens), "--max-waiting", str(max_waiting), "--log-level", "warning", *extra]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    return serve(cmd, port, env, name="tinyinfer serve " + " ".join(extra))
