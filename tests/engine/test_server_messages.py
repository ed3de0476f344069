"""The messages between the API server and its engine core (server/messages.py).

- a step report carries only what is new: its pickled size does not grow with
  the prompt, nor with the reply so far;
- the deltas, put back together, are exactly what the engine produced (text,
  token ids, logprobs, finish reasons, usage), for every one of n samples;
- the protocol is typed: no getattr(..., default) hedges and no message dict
  in the server's code, and every field of every message is read somewhere.
"""
import ast
import dataclasses
import multiprocessing
import pickle
import threading
from pathlib import Path

import pytest

from tinyinfer import LLM, LLMEngine, SamplingParams
from tinyinfer.server import messages
from tinyinfer.server.engine_core import EngineCore
from tinyinfer.server.messages import AddRequest, Shutdown, StepReport
from tiny_model import save_tiny_llama  # tests/ is on sys.path

SERVER = Path(__file__).resolve().parents[2] / "src" / "tinyinfer" / "server"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, default_model_dir):
    """A 2-layer random Llama with the default model's tokenizer and room for long prompts."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-long"), default_model_dir, max_position_embeddings=4096)


def core_reports(engine, requests: list[AddRequest]) -> list[StepReport]:
    """Run an EngineCore in a thread, as the server does, over real pipes; every report until all finish."""
    ctx = multiprocessing.get_context("spawn")
    core_commands, commands = ctx.Pipe(duplex=False)
    reports, core_reports_end = ctx.Pipe(duplex=False)
    core = threading.Thread(target=EngineCore(engine, core_commands, core_reports_end).run, daemon=True)
    core.start()
    for r in requests:
        commands.send(r)
    got, open_ids = [], {r.request_id for r in requests}
    while open_ids:
        assert reports.poll(120), "the core sent nothing for 2 minutes"
        got.append(reports.recv())
        open_ids -= {d.request_id for d in got[-1].deltas if d.usage is not None}
        open_ids -= {r.request_id for r in got[-1].refused}
    commands.send(Shutdown())
    core.join(10)
    assert not core.is_alive()
    return got


def token_step_reports(engine, prompt_ids, params) -> list[bytes]:
    """The pickled reports of the steps that brought the request a token, in order."""
    reports = core_reports(engine, [AddRequest("r", {"prompt_token_ids": prompt_ids}, params)])
    return [pickle.dumps(r) for r in reports if any(d.new_token_ids for d in r.deltas)]


def test_a_step_report_does_not_grow_with_the_prompt_or_the_reply(tiny_dir):
    engine = LLMEngine(tiny_dir, dtype="float32", device="cpu", num_kv_blocks=512, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    ids = engine.tokenizer.encode("The river runs past the old stone bridge and on to the sea. " * 200)
    short, long = token_step_reports(engine, ids[:10], params), token_step_reports(engine, ids[:2000], params)
    assert len(short) == len(long) == 60  # one token per step (the long prompt's chunks come before)
    for step in (0, 5, 30, 55):
        assert abs(len(long[step]) - len(short[step])) < 100, (step, len(long[step]), len(short[step]))
    # Nor with the reply so far: 50 more tokens (the last report also carries the usage).
    assert abs(len(long[55]) - len(long[5])) < 60, (len(long[55]), len(long[5]))
    # What cumulative outputs would cost: the prompt alone pickles to thousands of bytes.
    assert len(pickle.dumps(ids[:2000])) > 20 * 100


def test_deltas_add_up_to_what_the_engine_produced(tiny_dir):
    """n=2 samples with logprobs and a stop string: text, ids, logprobs and finish
    reasons put back together from the deltas equal LLM.generate's, and the usage
    and latency ride on each request's last delta only."""
    llm = LLM(tiny_dir, dtype="float32", device="cpu", num_kv_blocks=128)
    engine = LLMEngine(tiny_dir, dtype="float32", device="cpu", num_kv_blocks=128)
    cases = {"a": ("Once upon a time", SamplingParams(n=2, max_tokens=12, temperature=1.0, seed=5, logprobs=2,
                                                     stop=["e"])),
             "b": ("The sea", SamplingParams(max_tokens=7, temperature=0))}
    for rid, (prompt, params) in cases.items():  # one at a time: the same batches as generate's
        out = llm.generate(prompt, params)[0]
        reports = core_reports(engine, [AddRequest(rid, prompt, params)])
        assert [a for r in reports for a in r.accepted] == [rid]
        deltas = [d for r in reports for d in r.deltas]
        assert [d.usage is not None for d in deltas] == [False] * (len(deltas) - 1) + [True]
        assert deltas[-1].usage == messages.Usage(len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs))
        assert deltas[-1].metrics.e2e_s >= deltas[-1].metrics.ttft_s > 0
        for c in out.outputs:
            mine = [d for d in deltas if d.index == c.index]
            assert "".join(d.text_delta for d in mine) == c.text
            assert [t for d in mine for t in d.new_token_ids] == list(c.token_ids)
            assert [d.finish_reason for d in mine if d.finish_reason] == [c.finish_reason]
            assert all(d.text_offset == len("".join(e.text_delta for e in mine[:i])) for i, d in enumerate(mine))
            if c.logprobs is not None:
                assert [lp for d in mine for lp in d.new_logprobs] == c.logprobs
        steps = [r.step for r in reports if r.step is not None]
        assert sum(s.num_generation_tokens for s in steps) == sum(len(c.token_ids) for c in out.outputs)
        assert sum(s.num_prompt_tokens for s in steps) == len(out.prompt_token_ids)  # once, not once per sample


def test_a_refused_request_says_whose_fault_it_was(tiny_dir):
    engine = LLMEngine(tiny_dir, dtype="float32", device="cpu", num_kv_blocks=64)
    reports = core_reports(engine, [AddRequest("bad", {"prompt_token_ids": [10**9]}, SamplingParams())])
    (refused,) = [r for report in reports for r in report.refused]
    assert refused.invalid and "prompt_token_ids" in refused.message
    engine.add_request = lambda *a, **k: {}["boom"]  # a bug in the engine, not a bad request
    reports = core_reports(engine, [AddRequest("bug", "hello", SamplingParams())])
    (refused,) = [r for report in reports for r in report.refused]
    assert not refused.invalid and "KeyError" in refused.message and "boom" not in refused.message


def _server_sources() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text()) for p in SERVER.glob("*.py")}


def test_no_attribute_hedges_and_no_message_dicts():
    """The server talks to its engine and its core through declared types:
    no getattr(obj, name, default), and no message indexed by a string key."""
    for name, tree in _server_sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
                assert len(node.args) < 3, f"{name}:{node.lineno}: getattr with a default"
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in (
                    "msg", "report", "cmd", "message"):
                pytest.fail(f"{name}:{node.lineno}: a message read by key")


def test_every_field_of_every_message_is_read():
    """A field that is written and never read is dead weight on every step's pickle."""
    read = set()
    for name, tree in _server_sources().items():
        if name == "messages.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                read.add(node.attr)
            if isinstance(node, ast.MatchClass):
                read.update(node.kwd_attrs)
    for cls in vars(messages).values():
        if dataclasses.is_dataclass(cls) and cls.__module__ == messages.__name__:
            for f in dataclasses.fields(cls):
                assert f.name in read, f"{cls.__name__}.{f.name} is sent but never read"


def test_a_sample_that_finishes_first_is_reported_once():
    """n=2, and sample 0 stops two steps before sample 1. The core sends each
    sample's tokens once and its finish once: a finished sample sends nothing more
    while its sibling goes on (a client would otherwise see it finish again)."""
    from tinyinfer.outputs import CompletionOutput, RequestOutput
    from tinyinfer.server.engine_core import RequestProgress

    def out(s0, s1, reasons, finished=False):
        samples = [CompletionOutput(i, "".join(chr(96 + t) for t in ids), list(ids), None, None, r)
                   for i, (ids, r) in enumerate(zip((s0, s1), reasons))]
        return RequestOutput("r", "p", [1], None, samples, finished)

    steps = [out([1], [2], (None, None)),
             out([1, 3], [2, 4], ("stop", None)),
             out([1, 3], [2, 4, 5], ("stop", None)),
             out([1, 3], [2, 4, 5, 6], ("stop", "length"), finished=True)]
    progress = RequestProgress(now=0.0)
    sent = [progress.deltas(o) for o in steps]
    assert [[d.index for d in step] for step in sent] == [[0, 1], [0, 1], [1], [1]]
    for index, final in ((0, steps[-1].outputs[0]), (1, steps[-1].outputs[1])):
        mine = [d for step in sent for d in step if d.index == index]
        assert [t for d in mine for t in d.new_token_ids] == final.token_ids
        assert "".join(d.text_delta for d in mine) == final.text
        assert [d.finish_reason for d in mine if d.finish_reason] == [final.finish_reason]
