"""Run the server inside this Python process, in a background thread.

For tests and benchmarks that want a real HTTP server next to their own code
(the lab starts `tinyinfer serve` as a separate process instead, as a reader
would). We bind the socket ourselves on port 0, so the OS picks a free port and
nothing races for it.

    with BackgroundServer(build_app(engine)) as server:
        run_benchmark(server.url, ...)
"""
from __future__ import annotations

import socket
import threading
import time

import httpx
import uvicorn


def free_port() -> int:
    """A port no one listens on now (the OS picks it), for a server in another
    process, which must bind it itself: another program could take it in between,
    which on one machine is rare enough. A server in this process binds port 0
    directly instead (BackgroundServer), so nothing races."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BackgroundServer:
    def __init__(self, app, host: str = "127.0.0.1", startup_timeout_s: float = 30.0):
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.startup_timeout_s = startup_timeout_s

    def __enter__(self) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.__exit__()
        raise RuntimeError(f"the server at {self.url} did not come up within {self.startup_timeout_s:.0f} s")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
