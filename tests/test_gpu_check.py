"""benchmarks/gpu_check.py on a CPU: its report has the schema the book's
renderer reads, and the random-weights switch that its notebooks command uses
loads the default model's shape and tokenizer with no weights on disk.
(The numbers of a CPU smoke run mean nothing; only a GPU run is ever stored.)"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
META = {"date", "device", "torch", "transformers", "cuda", "bandwidth_gbs", "launch_us", "weights", "command",
        "engine_stamp"}
PARITY = {"shape", "dtype", "mode", "identical", "of", "max_logprob_diff"}
DECODE = {"shape", "weight_bytes", "dtype", "batch", "mode", "step_ms", "step_ms_includes_prefill", "bound_ms",
          "fraction_of_bound", "launches_per_step"}


@pytest.mark.slow
def test_the_engine_commands_smoke_run_writes_a_report_in_the_schema(tmp_path, default_model_dir):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "benchmarks/gpu_check.py", "engine", "--device", "cpu", "--sizes", "tiny", "--steps", "2",
           "--parity-tokens", "4", "--out", str(tmp_path), "--tokenizer-dir", str(default_model_dir)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]  # no part failed
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(report) == {"meta", "parity", "decode", "notebooks"}
    meta = report["meta"]
    assert set(meta) == META and meta["launch_us"] is None and meta["bandwidth_gbs"] > 0
    assert meta["engine_stamp"]["engine_fingerprint"] and "tinyinfer.cuda_graphs" in meta["engine_stamp"]["engine_modules"]
    assert meta["weights"] == "random, seeded, in the real shapes" and "--sizes tiny" in meta["command"]
    assert [(r["mode"], set(r)) for r in report["parity"]] == [("eager", PARITY), ("graphs", PARITY)]
    assert all(r["identical"] == r["of"] == 4 and r["max_logprob_diff"] < 1e-4 for r in report["parity"])
    assert [(r["mode"], r["batch"]) for r in report["decode"]] == [
        (mode, batch) for mode in ("eager", "graphs", "transformers") for batch in (1, 8)]
    for row in report["decode"]:
        assert set(row) == DECODE and row["step_ms_includes_prefill"] is False
        assert row["fraction_of_bound"] == pytest.approx(row["bound_ms"] / row["step_ms"])
        assert row["launches_per_step"] is None  # counted on a GPU only
    assert report["notebooks"] == []


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
    import shutil

    shutil.rmtree(folder)
    assert weights.ensure_packaged_model() == folder and (folder / "model.safetensors").read_bytes() == again  # seeded
