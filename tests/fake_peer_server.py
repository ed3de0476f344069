"""A stand-in for a peer server (llama-server, vLLM, tinyinfer serve) for the tests of
benchmarks/peers.py: run as its own process, so the benchmark starts and stops it
exactly as it does a real one.

    python tests/fake_peer_server.py PORT MODE PIDFILE

It answers /health with 503 for its first few polls (as llama-server does while
it loads the model), then 200. POST /v1/completions streams one chunk per token
and a usage chunk. MODE decides what it does with `ignore_eos`:
    honest       max_tokens tokens when ignore_eos is set, else it stops at 5 ("EOS")
    ignores-eos  always stops at 5 tokens, whatever the request says (llama_cpp.server did)
    overclaims   streams max_tokens + 3 chunks but reports max_tokens in its usage
It writes its pid to PIDFILE, so a test can check that it was stopped.
"""
from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

EOS_AFTER = 5


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/health":
            self.server.polls += 1
            code = 200 if self.server.polls > 3 else 503
            return self._json(code, {"status": "ok"} if code == 200 else {"error": {"message": "Loading model"}})
        self._json(404, {"error": {"message": "not found"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = body["max_tokens"]
        mode = self.server.mode
        if mode == "ignores-eos" or not body.get("ignore_eos"):
            n = min(n, EOS_AFTER)
        chunks = n + 3 if mode == "overclaims" else n
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(chunks):
            self._event({"choices": [{"index": 0, "text": " tok", "finish_reason": None}]})
        self._event({"choices": [], "usage": {"prompt_tokens": 128, "completion_tokens": n,
                                              "total_tokens": 128 + n}})
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, obj):
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()

    def _json(self, code, obj):
        payload = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


def main() -> None:
    port, mode, pidfile = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.daemon_threads = True
    srv.mode, srv.polls = mode, 0
    with open(pidfile, "w") as f:
        f.write(str(os.getpid()))
    srv.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
