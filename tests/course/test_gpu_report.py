"""The GPU report (tinyinfer_course.reports.gpu): the stored seed from the README's
H200 run, and synthetic reports made so that each sentence has one right answer.
No GPU needed: these test the loading, the stamp and the rendering."""
from __future__ import annotations

import copy
import json

import pytest

from tinyinfer_course.reports import gpu as gpu_report
from tinyinfer.config import ModelConfig

DECODE_KEYS = {"shape", "weight_bytes", "dtype", "batch", "mode", "step_ms", "step_ms_includes_prefill", "bound_ms",
               "fraction_of_bound", "launches_per_step"}
META_KEYS = {"date", "device", "torch", "transformers", "cuda", "bandwidth_gbs", "launch_us", "weights", "command",
             "engine_stamp"}


def row(shape, weight_bytes, batch, mode, step_ms, launches=None, bandwidth_gbs=4000.0):
    bound = weight_bytes / (bandwidth_gbs * 1e9) * 1e3
    return {"shape": shape, "weight_bytes": weight_bytes, "dtype": "bfloat16", "batch": batch, "mode": mode,
            "step_ms": step_ms, "step_ms_includes_prefill": False, "bound_ms": bound,
            "fraction_of_bound": bound / step_ms, "launches_per_step": launches}


def graphs_report(stamp=None):
    """A run with graphs: the 1.7B step with graphs at 1.2 ms (70% of a 0.84 ms bound),
    eager launching 900 kernels at 5 us (4.5 ms of launching in a 6 ms step: launch-bound),
    graphs one launch per step; two notebooks, one failed."""
    meta = {"date": "2027-01-02", "device": "NVIDIA H200", "torch": "2.11", "transformers": "5.17", "cuda": "13",
            "bandwidth_gbs": 4000.0, "launch_us": 5.0, "weights": "random, seeded, in the real shapes",
            "command": "python benchmarks/gpu_check.py engine",
            "engine_stamp": stamp or {"engine_fingerprint": "unknown", "engine_commit": "unknown"}}
    decode = [row("135m", 269_030_016, 1, "eager", 6.0, launches=900),
              row("135m", 269_030_016, 1, "graphs", 0.5, launches=1),
              row("1.7b", 3_422_752_768, 1, "eager", 6.0, launches=800),
              row("1.7b", 3_422_752_768, 1, "graphs", 3_422_752_768 / 4e12 * 1e3 / 0.7, launches=1),
              row("1.7b", 3_422_752_768, 8, "graphs", 1.5, launches=1)]
    notebooks = [{"name": "04-prefill-decode", "seconds": 90.0, "ok": True, "error": None},
                 {"name": "07-batching", "seconds": 30.0, "ok": False, "error": "RuntimeError: boom"}]
    parity = [{"shape": "135m", "dtype": "float32", "mode": "graphs", "identical": 4, "of": 4,
               "max_logprob_diff": 2e-6}]
    return {"meta": meta, "parity": parity, "decode": decode, "notebooks": notebooks}


def saved(tmp_path, report):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(report))
    return gpu_report.load(path)


# --- the stored seed -----------------------------------------------------------------

def test_the_seed_is_the_readme_run_in_the_schema():
    report = gpu_report.load()
    assert report["stored"] and report["source"].endswith("gpu-2026-12-04-h200.json")
    m = report["meta"]
    assert META_KEYS <= set(m) and m["device"] == "NVIDIA H200" and m["bandwidth_gbs"] == 4079.0
    assert m["launch_us"] is None and m["engine_stamp"]["engine_fingerprint"] == "unknown"
    assert {(r["mode"], r["identical"], r["of"]) for r in report["parity"]} == {("eager", 4, 4), ("compiled", 4, 4)}
    assert len(report["decode"]) == 9 and all(DECODE_KEYS <= set(r) for r in report["decode"])
    assert not [r for r in report["decode"] if r["mode"] == "graphs"], "graphs did not exist on 2026-12-04"
    shapes = {"135m": (576, 1536, 30, 9, 3), "1.7b": (2048, 8192, 24, 32, 32)}
    for r in report["decode"]:
        h, i, layers, heads, kv = shapes[r["shape"]]
        config = ModelConfig(vocab_size=49152, hidden_size=h, intermediate_size=i, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=kv, head_dim=h // heads,
                             max_position_embeddings=8192, tie_word_embeddings=True)
        assert r["weight_bytes"] == config.num_parameters() * 2  # bf16
        assert r["bound_ms"] == pytest.approx(r["weight_bytes"] / 4079e9 * 1e3, rel=1e-4)
        assert r["fraction_of_bound"] == pytest.approx(r["bound_ms"] / r["step_ms"], rel=1e-4)
        assert r["step_ms_includes_prefill"] and r["launches_per_step"] is None
        if r["batch"] == 8:  # the README gives tok/s only: derived, and marked
            assert r["step_ms"] == pytest.approx(8 / r["tok_s"] * 1000, abs=1e-3) and r["step_ms_derived"]
    compiled_135m = next(r for r in report["decode"] if (r["shape"], r["batch"], r["mode"]) == ("135m", 1, "compiled"))
    assert compiled_135m["step_ms"] == 7.3  # the README's figure, as stated


def test_the_seed_renders_as_older_than_the_engine_and_without_graphs():
    text = gpu_report.render(gpu_report.load())
    assert "NVIDIA H200" in text and "4,079 GB/s" in text and "one kernel launch: not measured" in text
    assert "before tinyinfer captured decode steps as CUDA graphs" in text  # the stored note
    if gpu_report.changed_since("298d09d9dbc2") is None:  # a shallow clone: git cannot tell
        assert "is not known" in text
    else:
        assert "older than today's" in text  # computed by git from the stamped commit
    assert "no row with CUDA graphs" in text and "counted no kernel launches" in text
    assert "took 7.3 ms, 0.9% of the bound" in text and "took 6.3 ms, 13% of the bound" in text
    assert "12.7 times the bytes" in text and "waiting for the CPU to launch" in text
    assert "include the prefill" in text and "worked out from tokens per second" in text
    assert "holds no notebook runs" in text
    assert text.count("| 135M, 0.27 GB bfloat16 |") == 6 and text.count("| 1.7B, 3.42 GB bfloat16 |") == 3


def test_changed_since_asks_git_and_admits_when_it_cannot_tell():
    assert isinstance(gpu_report.changed_since("HEAD"), list)
    since_seed = gpu_report.changed_since("298d09d9dbc2")
    if since_seed is None:
        pytest.skip("this checkout does not hold commit 298d09d9dbc2 (a shallow clone)")
    assert "model_runner" in since_seed and "decode_batch" in since_seed  # both changed after the H200 run
    assert gpu_report.changed_since("unknown") is None
    assert gpu_report.changed_since("0000000000000000000000000000000000000bad") is None


# --- synthetic reports ----------------------------------------------------------------

def test_sentences_with_graphs_launches_and_notebooks(tmp_path):
    text = gpu_report.render(saved(tmp_path, graphs_report()))
    assert "With graphs it took 0.50 ms" in text and "12.0 times as fast" in text
    assert "With graphs it took 1.2 ms, 70% of the bound" in text
    assert "launched 900 kernels: at 5.0 µs each that is 4.50 ms of launching in a 6.00 ms step (75%), " \
           "launch-bound" in text
    assert "launched 1 kernels" in text and "(0%), not launch-bound" in text
    assert "one kernel launch: 5.0 µs" in text
    assert "1 of 2 solution notebooks ran on the GPU without an error, in 2.0 minutes" in text
    assert "failed: 07-batching" in text
    assert "no row with CUDA graphs" not in text and "counted no kernel launches" not in text


def test_missing_values_are_said_to_be_missing_not_filled_in(tmp_path):
    report = graphs_report()
    del report["meta"]["launch_us"], report["meta"]["bandwidth_gbs"], report["notebooks"], report["parity"]
    report["decode"][0].update(step_ms=None, bound_ms=None, fraction_of_bound=None)
    report["decode"][2]["launches_per_step"] = None
    text = gpu_report.render(saved(tmp_path, report))
    assert "Measured read bandwidth: not measured GB/s; one kernel launch: not measured" in text
    assert "| not measured | not known | not known | 900 |" in text
    assert "the cost of one launch was not measured" in text and "launch-bound" not in text
    assert "No parity rows" in text and "holds no notebook runs" in text
    bare = saved(tmp_path, {"meta": {}})
    assert "No decode rows" in gpu_report.render(bare) and "unknown GPU" in gpu_report.render(bare)


def test_the_page_says_the_same_code_or_an_older_one(tmp_path):
    today = gpu_report.REPORT.stamp()
    now = saved(tmp_path, graphs_report(stamp=today))
    assert "the same code that `LLM` runs today" in gpu_report.header(now)
    old_modules = dict(today["engine_modules"], **{"tinyinfer.model_runner": "00000000"})
    old = saved(tmp_path, graphs_report(stamp={"engine_fingerprint": "b" * 16, "engine_commit": "0ld0ld0",
                                               "engine_modules": old_modules}))
    note = gpu_report.engine_note(old, today)
    assert "older engine" in note and "1 of its modules: model_runner;" in note and "2027-01-02" in note
    assert "gpu_check.py engine` on a CUDA GPU measures today's" in note


def test_the_engine_stamp_covers_what_llm_runs_not_the_server():
    modules = gpu_report.engine_modules()
    assert "tinyinfer.llm" in modules and "tinyinfer.model_runner" in modules
    assert not [m for m in modules if m.startswith(("tinyinfer.server", "tinyinfer.bench"))]


def test_load_refuses_a_file_that_is_not_a_report(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"engines": {}}))
    with pytest.raises(ValueError, match="not a GPU report"):
        gpu_report.load(path)
    assert copy.deepcopy(graphs_report())["meta"]["launch_us"] == 5.0


# --- the sentences the chapter words: sizes, layers, graphs, the command ------------------

def test_the_layer_counts_are_the_benchmarks_shapes():
    import importlib.util
    from pathlib import Path

    from tinyinfer_course.analysis import memory

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check_shapes", path)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    assert gpu_report.SHAPE_LAYERS == {k: gpu_check.SHAPES[k]["num_hidden_layers"] for k in gpu_report.SHAPE_LAYERS}
    assert gpu_report.SHAPE_LAYERS["135m"] == memory.load_config("smollm2-135m-instruct").num_hidden_layers


def test_a_larger_model_with_a_shorter_step_is_explained_by_its_layers():
    text = gpu_report.size_sentence(gpu_report.load())  # the stored run: 1.7B 6.3 ms, 135M 7.3 ms
    assert "yet its step was shorter: 0.86 times as long" in text and "barely grew" not in text
    assert "24 layers against 30" in text and "about 0.80 times as many, against 0.86" in text
    assert "launch-bound" in text


def _two_shapes(ms_135m, ms_17b, layers=None):
    report = graphs_report()
    report["decode"] = [row("135m", 269_030_016, 1, "eager", ms_135m), row("1.7b", 3_422_752_768, 1, "eager", ms_17b)]
    if layers:
        for r, n in zip(report["decode"], layers):
            r["layers"] = n
    return report


def test_the_size_sentence_follows_the_numbers(tmp_path):
    grew = gpu_report.size_sentence(saved(tmp_path, _two_shapes(6.0, 9.0)))  # 1.5 times, under sqrt(12.7)
    assert "only 1.50 times as long: it barely grew with its bytes" in grew and "shorter" not in grew
    assert "It follows the number of kernels" not in grew  # 1.5 is far from 24/30
    assert "(It has 24 layers against 30, so 0.80 times as many kernels per step; the step times do not" in grew
    bytes_bound = gpu_report.size_sentence(saved(tmp_path, _two_shapes(1.0, 11.0)))
    assert "the bytes set much of its pace" in bytes_bound and "launch-bound" not in bytes_bound
    own = gpu_report.size_sentence(saved(tmp_path, _two_shapes(6.0, 5.0, layers=(12, 10))))  # a row's own count
    assert "10 layers against 12" in own and "about 0.83 times as many" in own


def test_the_graphs_sentence_says_what_the_run_measured(tmp_path):
    stored = gpu_report.graphs_sentence(gpu_report.load())
    assert stored.startswith("This run has no row with CUDA graphs and counted no kernel launches")
    measured = gpu_report.graphs_sentence(saved(tmp_path, graphs_report()))
    assert "no row with CUDA graphs" not in measured and "counted no kernel launches" not in measured
    assert ("with tinyinfer with CUDA graphs the 135M batch-1 step took 0.50 ms against 6.0 ms eager, "
            "12.0 times as fast") in measured
    assert "counted the kernel launches of 5 of its 5 steps" in measured
    no_counts = graphs_report()
    for r in no_counts["decode"]:
        r["launches_per_step"] = None
    text = gpu_report.graphs_sentence(saved(tmp_path, no_counts))
    assert text.startswith("This run measured CUDA graphs") and text.endswith("It counted no kernel launches.")


def test_the_header_names_todays_script_when_the_report_was_made_by_another():
    stored = gpu_report.header(gpu_report.load())
    assert "`python benchmarks/cuda_check.py --tokenizer-dir FOLDER`, an earlier script than today's GPU check, " \
           "`python benchmarks/gpu_check.py engine`." in stored
    assert gpu_report.command_note("python benchmarks/gpu_check.py engine --out x") == \
        "Command: `python benchmarks/gpu_check.py engine --out x`."
    assert gpu_report.command_note(None) == "Command: not stated."


def test_render_can_leave_a_sentence_to_the_page():
    report = gpu_report.load()
    assert "12.7 times the bytes" in gpu_report.render(report)
    assert "12.7 times the bytes" not in gpu_report.render(report, skip=("size",))


def test_mbu_and_mfu_against_the_datasheet_of_the_gpu_named():
    """The seed's 1.7B compiled step: 3.4228 GB in 6.3 ms over the H200's 4.8 TB/s is an
    MBU of 11.3%; 2 x 1.7114e9 FLOPs in 6.3 ms over 989 TFLOP/s an MFU of 0.0549%. The
    135M one: 0.269 GB in 7.3 ms, MBU 0.77%, MFU 0.0037%. A batch-1 step's MFU is
    capped at 1 / ridge = 4.8 / 989 = 0.485%."""
    report = gpu_report.load()
    assert gpu_report.datasheet_chip("NVIDIA H200").name == "H200 SXM"
    assert gpu_report.datasheet_chip("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert gpu_report.datasheet_chip("NVIDIA H100 PCIe") is None and gpu_report.datasheet_chip("Tesla T4") is None
    row = next(r for r in report["decode"] if (r["shape"], r["batch"], r["mode"]) == ("1.7b", 1, "compiled"))
    used_bytes, used_flops = gpu_report.utilisation(row, gpu_report.datasheet_chip("NVIDIA H200"))
    assert used_bytes == pytest.approx(0.11319, rel=1e-4) and used_flops == pytest.approx(5.4934e-4, rel=1e-4)
    text = gpu_report.render(report)
    assert "| MBU, datasheet | MFU, datasheet |" in text and "| 6.3¹ |" in text
    assert ("Against the H200 SXM datasheet, the fastest batch-1 step of the 135M shape (compiled) had an MBU of "
            "0.8% and an MFU of 0.0037%, and that of the 1.7B shape (compiled) had an MBU of 11% and an MFU of "
            "0.055%.") in text
    assert "could not pass 0.5% (1 over the ridge point, 206 FLOP per byte)" in text
    unknown = copy.deepcopy(gpu_report.load())
    unknown["meta"]["device"] = "Tesla T4"
    assert gpu_report.utilisation_sentence(unknown) == ""
    assert "no datasheet for this GPU" in gpu_report.decode_table(unknown)
