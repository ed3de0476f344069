"""tinyinfer.bench against a fake OpenAI-compatible server whose timing we know.

The fake (stdlib http.server in a thread, 127.0.0.1 only) streams one chunk per
token: the first after FIRST_DELAY, then one every GAP. So the client must
measure TTFT >= FIRST_DELAY and end-to-end >= FIRST_DELAY + (n-1) GAP (sleeps
never end early). TPOT alone can dip below GAP when the first chunk is read
late, since it is last-minus-first over n-1. No upper bound on a time is
asserted: the test machine is shared, and a busy one only makes times longer.
The metric arithmetic is checked exactly on hand-made records, without any clock.
"""
from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from tinyinfer.bench import (RequestRecord, arrival_times, calculate_metrics, make_requests, parse_goodput,
                             parse_length, run_benchmark, sample_lengths)
from tinyinfer.bench.client import DONE, chunk_text, parse_retry_after, parse_sse_line

FIRST_DELAY, GAP = 0.20, 0.05


class FakeOpenAI(BaseHTTPRequestHandler):
    """Behaviour chosen by the model name: "fake" streams normally, "fake-nousage"
    omits the usage chunk, "fake-double" sends two tokens per chunk, "fake-429"
    rejects, "fake-500" fails."""

    def setup(self):
        super().setup()
        # Send each small chunk at once (Nagle's algorithm would hold it back).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_POST(self):
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with srv.lock:
            srv.requests.append((self.path, dict(self.headers), body))
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
        self.counted = True
        try:
            self._answer(body)
        finally:
            self._leave()

    def _leave(self):
        """The request stops counting as in flight, once, just before its last bytes
        are written: the client may send its next request as soon as it reads them,
        before this thread runs again (on a busy machine, long before)."""
        if self.counted:
            self.counted = False
            with self.server.lock:
                self.server.in_flight -= 1

    def _answer(self, body):
        model = body["model"]
        if model == "fake-429":
            return self._error(429, {"Retry-After": "3"})
        if model == "fake-500":
            return self._error(500, {})
        chat = self.path.endswith("/chat/completions")
        n, per_chunk = body["max_tokens"], 2 if model == "fake-double" else 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes
        if chat:  # as real servers do: a role-only opening chunk, no token in it
            self._send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        self.wfile.write(b": keep-alive comment\n\n")
        for i in range(n // per_chunk):
            srv_sleep(FIRST_DELAY if i == 0 else GAP)
            piece = " tok" * per_chunk
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            self._send({"choices": [choice]})
        if model != "fake-nousage" and body.get("stream_options", {}).get("include_usage"):
            self._send({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": n + 7}})
        self._leave()
        self.wfile.write(b"data: [DONE]\n\n")

    def _send(self, obj):
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def _error(self, code, headers):
        payload = json.dumps({"error": {"message": f"fake {code}"}}).encode()
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self._leave()
        self.wfile.write(payload)


def srv_sleep(s):
    threading.Event().wait(s)


@pytest.fixture
def fake_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    srv.daemon_threads = True
    srv.lock, srv.requests, srv.in_flight, srv.max_in_flight = threading.Lock(), [], 0, 0
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()
    srv.server_close()


# --- the metric arithmetic, exactly -------------------------------------------------

def _rec(i, send, chunks, completion=None, prompt=None, status="ok"):
    return RequestRecord(index=i, prompt_len=10, max_tokens=8, send_time=send, chunk_times=list(chunks),
                         completion_tokens=completion, prompt_tokens=prompt, status=status)


def test_metrics_on_hand_made_records():
    records = [
        _rec(0, 0.0, [0.1, 0.2, 0.3, 0.4, 0.5], completion=5, prompt=12),  # ttft .1, e2el .5, tpot .1
        _rec(1, 1.0, [1.3, 1.35, 1.4], completion=5),  # 2 tokens bundled: tpot (.4-.3)/4 = .025
        _rec(2, 2.0, [2.2]),  # one chunk, no usage: 1 token, no tpot
        _rec(3, 3.0, [], status="failed"),
        _rec(4, 3.0, [], status="rejected"),
    ]
    res = calculate_metrics(records, duration=4.0, percentiles=(50, 90), goodput={"ttft": 250, "tpot": 50})
    assert (res.completed, res.failed, res.rejected) == (3, 1, 1)
    assert res.total_output_tokens == 5 + 5 + 1
    assert res.total_input_tokens == 12 + 10 + 10  # usage wins, else the requested length
    assert res.request_throughput == pytest.approx(3 / 4.0)
    assert res.output_throughput == pytest.approx(11 / 4.0)
    assert res.total_token_throughput == pytest.approx(43 / 4.0)
    assert res.ttft.mean_ms == pytest.approx((100 + 300 + 200) / 3)
    assert res.ttft.median_ms == pytest.approx(200)
    assert res.ttft.p(90) == pytest.approx(np.percentile([100, 300, 200], 90))
    assert res.tpot.count == 2 and res.tpot.mean_ms == pytest.approx((100 + 25) / 2)
    assert res.e2el.mean_ms == pytest.approx((500 + 400 + 200) / 3)
    assert res.itl.count == 4 + 2 and res.itl.mean_ms == pytest.approx((4 * 100 + 2 * 50) / 6)
    # ttft <= 250 ms: records 0 and 2; tpot <= 50 ms: record 1 and 2 (a 1-token reply counts as tpot 0)
    assert res.request_goodput == pytest.approx(1 / 4.0)
    assert calculate_metrics(records, 4.0, goodput={"e2el": 450}).request_goodput == pytest.approx(2 / 4.0)
    assert calculate_metrics(records, 4.0).request_goodput is None


def test_slo_boundary_is_inclusive_and_parsing():
    recs = [_rec(0, 0.0, [0.5, 1.0], completion=2)]
    assert calculate_metrics(recs, 1.0, goodput=["ttft:500"]).request_goodput == 1.0
    assert calculate_metrics(recs, 1.0, goodput=["ttft:499"]).request_goodput == 0.0
    assert parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    assert parse_goodput("e2el:1000") == {"e2el": 1000.0}
    with pytest.raises(ValueError, match="itl"):
        parse_goodput(["itl:10"])
    with pytest.raises(ValueError, match="METRIC:MS"):
        parse_goodput(["ttft500"])
    with pytest.raises(ValueError, match="duration"):
        calculate_metrics(recs, 0.0)


def test_empty_and_all_failed_runs_report_nan_not_crash():
    res = calculate_metrics([_rec(0, 0.0, [], status="failed")], 1.0)
    assert res.completed == 0 and res.failed == 1 and math.isnan(res.ttft.mean_ms)
    d = res.to_dict()
    assert d["mean_ttft_ms"] is None and json.dumps(d)  # NaN is written as null: valid JSON
    assert "Failed requests:" in res.table()


# --- the workload -------------------------------------------------------------------

def test_poisson_arrivals_are_seeded_with_the_right_mean():
    a = arrival_times(20001, request_rate=4.0, arrival="poisson", seed=3)
    assert np.array_equal(a, arrival_times(20001, 4.0, "poisson", seed=3))
    assert not np.array_equal(a, arrival_times(20001, 4.0, "poisson", seed=4))
    gaps = np.diff(a)
    assert a[0] == 0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)  # the sd of the mean is 0.7% here
    assert gaps.std() == pytest.approx(0.25, rel=0.05)  # exponential: sd equals the mean
    assert np.allclose(np.diff(arrival_times(5, 4.0, "fixed")), 0.25)
    assert not arrival_times(5, math.inf).any()
    with pytest.raises(ValueError, match="request_rate"):
        arrival_times(5, 0.0)
    with pytest.raises(ValueError, match="arrival"):
        arrival_times(5, 1.0, "gamma")


def test_length_distributions():
    rng = np.random.default_rng(0)
    assert sample_lengths(64, 3, rng) == [64, 64, 64]
    uni = sample_lengths("10:13", 2000, rng)
    assert set(uni) == {10, 11, 12, 13}
    picks = sample_lengths("5,50,500", 300, rng)
    assert set(picks) == {5, 50, 500}
    assert parse_length((3, 9)) == (3, 9) and parse_length([1, 2]) == [1, 2]
    for bad in ("0", "9:3", "a", "", -1, [0, 4]):
        with pytest.raises(ValueError, match="input_len"):
            parse_length(bad, "input_len")


def test_prompts_are_deterministic_distinct_and_sized():
    a, b = make_requests(3, "20:30", 8, seed=1), make_requests(3, "20:30", 8, seed=1)
    assert a == b and a != make_requests(3, "20:30", 8, seed=2)
    assert len({tuple(r.prompt.split()[:4]) for r in a}) == 3  # different from the first words on
    for r in a:
        assert 20 <= r.prompt_len <= 30 and len(r.prompt.split()) == r.prompt_len and r.max_tokens == 8


def test_prompts_with_a_tokenizer_have_the_exact_token_count():
    from tinyinfer.tokenizer import TiktokenTokenizer

    tok = TiktokenTokenizer("cl100k_base")
    for r in make_requests(4, [17, 64, 128], 4, seed=0, tokenizer=tok):
        assert len(tok.encode(r.prompt)) == r.prompt_len
        assert r.prompt_len in (17, 64, 128)


def test_sse_line_parsing():
    assert parse_sse_line("") is None and parse_sse_line(": ping") is None and parse_sse_line("event: x") is None
    assert parse_sse_line("data: [DONE]") is DONE and parse_sse_line("data:[DONE]") is DONE
    assert parse_sse_line('data: {"a": 1}') == {"a": 1}
    assert chunk_text({"choices": [{"text": "hi"}]}, "completions") == "hi"
    assert chunk_text({"choices": [{"delta": {"role": "assistant"}}]}, "chat") == ""
    assert chunk_text({"choices": [], "usage": {}}, "chat") == ""
    assert parse_retry_after("7") == 7.0 and parse_retry_after(None) is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past


# --- against the fake server --------------------------------------------------------

def test_timings_usage_and_payload_against_the_fake(fake_server):
    res = run_benchmark(fake_server.url, "fake", num_prompts=3, request_rate=math.inf, max_concurrency=3,
                        input_len=16, output_len=5, api_key="sk-test", goodput={"ttft": 60_000})
    assert (res.completed, res.failed, res.rejected) == (3, 0, 0)
    assert res.total_output_tokens == 15 and res.total_input_tokens == 3 * 7  # from the usage chunk
    # Only bounds that a busy machine cannot break: sleeps never end early, so each
    # time is at least what the fake slept; which chunk each metric is timed from is
    # checked against the record's own chunk times, not against a clock.
    for r in res.records:
        assert len(r.chunk_times) == 5 and r.chunk_times == sorted(r.chunk_times)
        assert r.ttft == pytest.approx(r.chunk_times[0] - r.send_time) and r.ttft >= FIRST_DELAY  # the first token
        assert r.e2el == pytest.approx(r.chunk_times[-1] - r.send_time) and r.e2el >= FIRST_DELAY + 4 * GAP
        assert r.tpot == pytest.approx((r.e2el - r.ttft) / 4)
        assert r.itl == pytest.approx(list(np.diff(r.chunk_times)))
    assert res.ttft.mean_ms / 1e3 == pytest.approx(np.mean([r.ttft for r in res.records]))
    assert res.itl.count == 3 * 4
    assert res.request_goodput == pytest.approx(3 / res.duration)
    path, headers, body = fake_server.requests[0]
    assert path == "/v1/completions" and headers["Authorization"] == "Bearer sk-test"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 5 and body["ignore_eos"] is True and len(body["prompt"].split()) == 16


def test_bundled_tokens_use_usage_and_missing_usage_counts_chunks(fake_server):
    double = run_benchmark(fake_server.url, "fake-double", num_prompts=1, input_len=4, output_len=6)
    r = double.records[0]
    assert len(r.chunk_times) == 3 and r.output_tokens == 6  # 3 chunks of 2 tokens, usage says 6
    assert r.tpot == pytest.approx((r.e2el - r.ttft) / 5)
    bare = run_benchmark(fake_server.url + "/v1/", "fake-nousage", num_prompts=1, input_len=4, output_len=4)
    assert bare.records[0].completion_tokens is None and bare.total_output_tokens == 4


def test_chat_endpoint_ignores_the_role_only_chunk(fake_server):
    res = run_benchmark(fake_server.url, "fake", num_prompts=2, input_len=8, output_len=3, endpoint_type="chat")
    assert res.completed == 2 and res.total_output_tokens == 6
    assert res.ttft.mean_ms / 1e3 >= FIRST_DELAY  # the opening role chunk came at once, not counted
    path, _, body = fake_server.requests[0]
    assert path == "/v1/chat/completions" and body["messages"][0]["role"] == "user"
    assert res.records[0].text == " tok tok tok"


def test_429_is_rejected_and_500_is_failed(fake_server):
    res = run_benchmark(fake_server.url, "fake-429", num_prompts=2, input_len=4, output_len=2)
    assert (res.completed, res.failed, res.rejected) == (0, 0, 2)
    assert res.records[0].http_status == 429 and res.records[0].retry_after == 3.0
    res = run_benchmark(fake_server.url, "fake-500", num_prompts=2, input_len=4, output_len=2)
    assert (res.completed, res.failed, res.rejected) == (0, 2, 0)
    assert res.records[1].http_status == 500 and "fake 500" in res.records[1].error


def test_connection_refused_is_a_failure_not_a_crash():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = run_benchmark(f"http://127.0.0.1:{port}", "x", num_prompts=2, input_len=2, output_len=2)
    assert res.failed == 2 and res.records[0].http_status is None and "Connect" in res.records[0].error


def test_max_concurrency_caps_requests_in_flight(fake_server):
    res = run_benchmark(fake_server.url, "fake", num_prompts=6, max_concurrency=2, input_len=4, output_len=2)
    assert res.completed == 6 and fake_server.max_in_flight == 2
    # the cap holds requests back: later ones are sent after they arrived
    assert max(r.send_time - r.arrival_time for r in res.records) >= FIRST_DELAY


def test_runs_from_inside_a_running_event_loop(fake_server):
    async def notebook_cell():  # Jupyter runs cells while its own loop is running
        return run_benchmark(fake_server.url, "fake", num_prompts=1, input_len=4, output_len=2)

    assert asyncio.run(notebook_cell()).completed == 1


def test_bad_arguments_name_the_field(fake_server):
    for kwargs, field in [({"max_concurrency": 0}, "max_concurrency"), ({"endpoint_type": "embed"}, "endpoint_type"),
                          ({"goodput": ["ttfb:1"]}, "goodput"), ({"output_len": "0"}, "output_len"),
                          ({"num_prompts": 0}, "num_prompts")]:
        with pytest.raises(ValueError, match=field):
            run_benchmark(fake_server.url, "fake", **{"num_prompts": 1, **kwargs})
    assert not fake_server.requests  # validation happens before anything is sent


def test_cli_prints_the_table_and_saves_json(fake_server, tmp_path, capsys):
    from tinyinfer.cli import main

    out = tmp_path / "out.json"
    rc = main(["bench", "--base-url", fake_server.url, "--model", "fake", "--num-prompts", "4",
               "--request-rate", "50", "--arrival", "fixed", "--max-concurrency", "4", "--input-len", "8:12",
               "--output-len", "3", "--goodput", "ttft:60000", "tpot:60000", "--percentiles", "50,99",
               "--disable-tqdm", "--save-result", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "Serving Benchmark Result" in text and "P99 TTFT (ms):" in text and "Request goodput" in text
    d = json.loads(out.read_text())
    assert d["completed"] == 4 and d["request_goodput"] == pytest.approx(4 / d["duration"])
    assert len(d["ttfts"]) == len(d["itls"]) == len(d["output_lens"]) == 4 and d["output_lens"] == [3] * 4
    assert all(len(g) == 2 for g in d["itls"]) and "p99_tpot_ms" in d
    # fixed gaps of 1/50 s: request i is released no earlier than i/50 s (later if the machine is busy)
    assert all(t >= i * 0.02 - 0.002 for i, t in enumerate(d["arrival_times"]))
    assert main(["bench", "--base-url", fake_server.url, "--model", "fake", "--goodput", "oops"]) == 2
