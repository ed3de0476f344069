"""`tinyinfer serve --engine module:function`: the server around an engine the
learner assembled (server/engine_protocol.py).

- a file's factory, run as a reader runs it (the CLI in a subprocess, the engine
  in its own core process), serves chat and completions, streamed through the
  official openai client, equal to the offline engine; the engine exposes only
  the required calls, so /metrics counts its requests without engine stats;
- a module's factory that returns an LLMEngine subclass, in a thread of the
  server's process, with the optional stats;
- a bad --engine is refused at once, naming the flag; the help says how.
"""
import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from tinyinfer import LLM, SamplingParams  # noqa: E402
from tinyinfer.server import build_app  # noqa: E402
from tinyinfer.server.background import BackgroundServer, free_port  # noqa: E402
from tinyinfer.server.engine_protocol import build_engine, check_engine_spec  # noqa: E402
from tiny_model import TOKENIZER_FILES, save_tiny_llama  # noqa: E402 (tests/ is on sys.path)

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]

# An engine of one's own, cut down to what the server needs: it forwards to an
# LLMEngine and keeps none of its stats (the optional part of the protocol).
ENGINE_FILE = '''
import os

from tinyinfer import LLMEngine


class MyEngine:
    def __init__(self, inner):
        self.inner, self.tokenizer, self.max_model_len = inner, inner.tokenizer, inner.max_model_len
        self.model_name = "my-engine"

    def add_request(self, prompt, params, request_id):
        return self.inner.add_request(prompt, params, request_id=request_id)

    def step(self):
        return self.inner.step()

    def abort_request(self, request_id):
        self.inner.abort_request(request_id)

    def has_unfinished_requests(self):
        return self.inner.has_unfinished_requests()


def build():
    return MyEngine(LLMEngine(os.environ["TINY_ENGINE_DIR"], dtype="float32", device="cpu", num_kv_blocks=64))
'''

SUBCLASS_MODULE = '''
import os

from tinyinfer import LLMEngine


class CountingEngine(LLMEngine):
    steps = 0

    def step(self):
        self.steps += 1
        return super().step()


def make():
    return CountingEngine(os.environ["TINY_ENGINE_DIR"], dtype="float32", device="cpu", num_kv_blocks=64)
'''


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, default_model_dir):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-served"), default_model_dir,
                           files=(*TOKENIZER_FILES, "chat_template.jinja"))


@pytest.fixture(scope="module")
def offline(tiny_dir):
    return LLM(tiny_dir, dtype="float32", device="cpu", num_kv_blocks=64)


def metrics(url: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if "le" not in s.labels}


def test_serve_runs_an_engine_from_a_file_in_its_own_process(tmp_path, tiny_dir, offline):
    (tmp_path / "my_engine.py").write_text(ENGINE_FILE)
    port = free_port()
    env = dict(os.environ, TINY_ENGINE_DIR=tiny_dir, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "tinyinfer", "serve", "--engine", "my_engine.py:build", "--port", str(port),
           "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):  # not up yet
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read()
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == ["my-engine"]  # the engine's own model_name
        want = offline.chat(MESSAGES, SamplingParams(max_tokens=8, temperature=0))[0].outputs[0]
        chunks = list(client.chat.completions.create(model="my-engine", messages=MESSAGES, max_tokens=8,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
        assert chunks[-1].usage.completion_tokens == len(want.token_ids)
        plain = offline.generate("Once upon a time", SamplingParams(max_tokens=6, temperature=0))[0].outputs[0]
        got = client.completions.create(model="my-engine", prompt="Once upon a time", max_tokens=6, temperature=0)
        assert got.choices[0].text == plain.text
        m = metrics(url)  # no engine stats: requests counted by the core, no KV numbers
        assert m["vllm:generation_tokens_total"] == len(want.token_ids) + len(plain.token_ids)
        assert m["vllm:num_requests_running"] == m["vllm:num_requests_waiting"] == 0
        assert m["tinyinfer:kv_cache_blocks_total"] == 0 and m["vllm:request_success_total"] == 2
    finally:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: the server stops its engine core and exits
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0


def test_build_app_serves_a_module_factory_in_a_thread(tmp_path, monkeypatch, tiny_dir, offline):
    (tmp_path / "served_subclass.py").write_text(SUBCLASS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TINY_ENGINE_DIR", tiny_dir)
    engine = build_engine("served_subclass:make")
    want = offline.generate("Once upon a time", SamplingParams(max_tokens=6, temperature=0))[0].outputs[0]
    with BackgroundServer(build_app(engine, model_name="counting")) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        stream = client.completions.create(model="counting", prompt="Once upon a time", max_tokens=6, temperature=0,
                                           stream=True)
        assert "".join(c.choices[0].text for c in stream) == want.text
        assert engine.steps >= 6  # the subclass's step() ran
        assert metrics(server.url)["tinyinfer:kv_cache_blocks_total"] == 64  # its stats reach /metrics


def test_a_bad_engine_spec_is_refused_naming_the_flag(tmp_path, capsys):
    from tinyinfer.cli import main

    (tmp_path / "nothing_here.py").write_text("x = 1\n")
    for spec in ("no_colon", "mod:not-a-name", str(tmp_path / "missing.py") + ":build"):
        with pytest.raises(ValueError, match="--engine"):
            check_engine_spec(spec)
    with pytest.raises(ValueError, match="has no function 'build'"):
        build_engine(str(tmp_path / "nothing_here.py") + ":build")
    assert main(["serve", "--engine", "no_colon"]) == 2
    assert "--engine='no_colon' is invalid" in capsys.readouterr().err


def test_serve_help_documents_the_hook(capsys):
    from tinyinfer.cli import main

    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert "--engine MODULE:FUNCTION" in out and "path/to/engine.py:build" in out and "engine_protocol.py" in out


def test_the_readme_documents_the_hook():
    text = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md"), encoding="utf-8").read()
    assert "tinyinfer serve --engine" in text and "engine_protocol.py" in text


def _your_engine(tiny_dir, num_blocks=32, block_size=4):
    """Lab 11's YourEngine over the course's pieces, on the tiny model's weights."""
    from tinyinfer import LLMEngine
    from tinyinfer_course import labcheck

    loaded = LLMEngine(tiny_dir, dtype="float32", device="cpu", num_kv_blocks=1, block_size=block_size)
    execute = labcheck.reference_make_execute_model(loaded.model, num_blocks, block_size, labcheck.reference_rope,
                                                    labcheck.reference_grouped_paged_attention,
                                                    labcheck.reference_causal_gqa_attention)
    allocator = labcheck.ReferenceBlockAllocator(num_blocks, block_size)
    return labcheck.YourEngine("your-engine", loaded.tokenizer, allocator,
                               labcheck.reference_schedule, execute, labcheck.reference_sample, 16, 4,
                               loaded.eos_token_ids, loaded.max_model_len)


def test_lab_11s_engine_serves_the_offline_engines_tokens(tiny_dir, offline):
    """YourEngine (labcheck/serving.py) behind the server: chat streamed and
    completions equal to LLM's, greedy and seeded; a setting it lacks is a 400
    naming the field, and it serves on afterwards."""
    engine = _your_engine(tiny_dir)
    assert engine.max_model_len == 32 * 4  # the pool's size bounds a request, so none waits forever
    prompts = ["Once upon a time", "The capital of France is", "1, 2, 3,"]
    greedy = SamplingParams(max_tokens=7, temperature=0)
    seeded = [SamplingParams(max_tokens=6, temperature=0.9, seed=s) for s in (1, 2, 3)]
    with BackgroundServer(build_app(engine)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        want = offline.chat(MESSAGES, SamplingParams(max_tokens=8, temperature=0))[0].outputs[0]
        chunks = list(client.chat.completions.create(model="your-engine", messages=MESSAGES, max_tokens=8,
                                                     temperature=0, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
        for params in [greedy] * 3 + seeded:
            for prompt in prompts:
                plain = offline.generate(prompt, params)[0].outputs[0]
                got = client.completions.create(model="your-engine", prompt=prompt, max_tokens=params.max_tokens,
                                                temperature=params.temperature, seed=params.seed)
                assert got.choices[0].text == plain.text, (prompt, params)
        with pytest.raises(openai.BadRequestError, match="top_p"):
            client.completions.create(model="your-engine", prompt="hi", max_tokens=4, top_p=0.5)
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="your-engine", prompt="hi", max_tokens=4 * 32 * 4)
        again = client.completions.create(model="your-engine", prompt=prompts[0], max_tokens=7, temperature=0)
        assert again.choices[0].text == offline.generate(prompts[0], greedy)[0].outputs[0].text
    assert not engine.has_unfinished_requests() and len(engine.allocator.free_blocks) == 32


def test_lab_11s_engine_aborts_and_frees_its_blocks(tiny_dir):
    engine = _your_engine(tiny_dir)
    engine.add_request({"prompt_token_ids": [1, 2, 3, 4, 5]}, SamplingParams(max_tokens=20, temperature=0), "a")
    engine.add_request("Once upon a time", SamplingParams(max_tokens=20, temperature=0), "b")
    engine.step()
    assert len(engine.allocator.free_blocks) < 32
    engine.abort_request("a")
    engine.abort_request("b")
    engine.abort_request("never-seen")  # ignored
    assert not engine.has_unfinished_requests() and len(engine.allocator.free_blocks) == 32
    with pytest.raises(ValueError, match="prompt"):
        engine.add_request(42, SamplingParams(), "c")
    with pytest.raises(ValueError, match="n=2"):
        engine.add_request("hi", SamplingParams(n=2), "d")
    with pytest.raises(ValueError, match="every id must be an integer"):
        engine.add_request({"prompt_token_ids": [1, 10**6]}, SamplingParams(), "e")
    with pytest.raises(ValueError, match="context window"):
        engine.add_request("hi", SamplingParams(max_tokens=32 * 4), "f")
    assert not engine.has_unfinished_requests()
