"""The peers table (tinyinfer_course.reports.peers) on synthetic reports, and benchmarks/peers.py's
own logic against a fake server: no vLLM, no llama.cpp, nothing downloaded.

The synthetic reports are made so that each claim the chapter's sentences make has
one right answer: who wins at each concurrency and by how much, whether the fewest
bytes won, whether this CPU has BF16 units, and in which order the engines come.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tinyinfer_course import machine
from tinyinfer_course.reports import peers

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

FLAGS_LAPTOP = "flags\t\t: fpu vme sse sse2 avx f16c fma avx2 bmi2\n"
FLAGS_SERVER = "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni\n"


def summary(tps, ttft, tpot, tokens=64, chunks=64):
    return {"completed": 4, "failed": 0, "output_throughput": tps, "median_ttft_ms": ttft, "median_tpot_ms": tpot,
            "tokens_per_reply": [tokens, tokens], "chunks_per_reply": [chunks - 1, chunks]}


ENGINES = {
    "tinyinfer-bf16": {"engine": "tinyinfer", "label": "tinyinfer serve", "format": "bf16", "weight_bytes": 269e6},
    "tinyinfer-fp32": {"engine": "tinyinfer", "label": "tinyinfer serve", "format": "fp32", "weight_bytes": 538e6},
    "tinyinfer-int4": {"engine": "tinyinfer", "label": "tinyinfer serve", "format": "INT4 g32",
                       "weight_bytes": 120e6},
    "llama.cpp-q4_1": {"engine": "llama.cpp", "label": "llama.cpp llama-server", "format": "Q4_1 GGUF",
                       "weight_bytes": 90e6},
    "vllm-bf16": {"engine": "vllm", "label": "vLLM CPU 0.32", "format": "bf16", "weight_bytes": 269e6},
}


def laptop_report():
    """AVX2 only, no BF16 units: llama.cpp wins for one user, tinyinfer fp32 under load."""
    runs = {
        "tinyinfer-bf16": {1: summary(14.3, 1846, 48.6), 32: summary(44.9, 6726, 616)},
        "tinyinfer-fp32": {1: summary(13.3, 352, 69.3), 32: summary(106.1, 1776, 278)},
        "tinyinfer-int4": {1: summary(15.0, 1900, 45.0), 32: summary(40.0, 7000, 650)},
        "llama.cpp-q4_1": {1: summary(44.0, 571, 13.5), 32: summary(60.0, 900, 400)},
        "vllm-bf16": {1: summary(9.6, 3059, 56.7), 32: summary(12.3, 77076, 1422)},
    }
    meta = {"cpu": "AMD EPYC 7B13", "cores": 2, "threads": 2, "date": "2026-12-01 12:00 UTC",
            "vector_units": machine.vector_units(FLAGS_LAPTOP), "bandwidth_gb_s": 21.6, "input_len": 128,
            "output_len": 64, "baseline": "llama.cpp-q4_1"}
    return {"meta": meta, "engines": json.loads(json.dumps(ENGINES)), "runs": runs}


def server_report():
    """AVX-512 BF16: tinyinfer wins at every concurrency; INT4 has the shortest step
    though llama.cpp's Q4_1 reads fewer bytes."""
    runs = {
        "tinyinfer-bf16": {1: summary(63.0, 62, 15.1), 8: summary(311.6, 170, 21.8)},
        "tinyinfer-fp32": {1: summary(40.0, 90, 24.0), 8: summary(200.0, 250, 35.0)},
        "tinyinfer-int4": {1: summary(90.0, 70, 8.6), 8: summary(280.0, 200, 25.0)},
        "llama.cpp-q4_1": {1: summary(80.0, 100, 11.0), 8: summary(150.0, 600, 45.0)},
        "vllm-bf16": {1: summary(63.7, 91, 14.4), 8: summary(235.1, 584, 25.0)},
    }
    meta = {"cpu": "Intel Xeon", "cores": 2, "threads": 2, "date": "2026-12-01", "input_len": 128, "output_len": 64,
            "vector_units": machine.vector_units(FLAGS_SERVER), "bandwidth_gb_s": 33.0, "baseline": "vllm-bf16"}
    return {"meta": meta, "engines": json.loads(json.dumps(ENGINES)), "runs": runs}


# --- the machine ----------------------------------------------------------------------

def test_vector_units_come_from_the_cpu_flags():
    assert machine.vector_units(FLAGS_LAPTOP) == {"avx512_bf16": False, "amx_bf16": False, "avx512f": False,
                                                "avx2": True}
    assert machine.vector_units(FLAGS_SERVER) == {"avx512_bf16": True, "amx_bf16": False, "avx512f": True,
                                                "avx2": True}
    assert machine.vector_units("processor : 0\n") == {}  # no flags line: unknown, not "none"
    assert peers.units_text({"vector_units": machine.vector_units(FLAGS_LAPTOP)}) == \
        "AVX2 yes, AVX-512 no, AVX-512 BF16 no, AMX BF16 no"


def test_bf16_units_are_off_when_torch_is_kept_below_them():
    server = {"vector_units": machine.vector_units(FLAGS_SERVER)}
    assert peers.has_bf16_units(server) is True
    assert peers.has_bf16_units({"vector_units": machine.vector_units(FLAGS_LAPTOP)}) is False
    assert peers.has_bf16_units(dict(server, emulation={"ONEDNN_MAX_CPU_ISA": "AVX2"})) is False
    assert peers.has_bf16_units(dict(server, emulation={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"})) is True
    assert peers.has_bf16_units({}) is None
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in peers.units_text(dict(server, emulation={"ONEDNN_MAX_CPU_ISA": "AVX2"}))
    assert machine.emulated_isa({"ATEN_CPU_CAPABILITY": "avx2", "PATH": "/bin"}) == {"ATEN_CPU_CAPABILITY": "avx2"}


# --- counting the tokens of a run -----------------------------------------------------

def bench_json(tokens, chunks=None, failed=0):
    chunks = chunks or tokens
    n = len(tokens)
    return {"completed": n - failed, "failed": failed, "rejected": 0, "duration": 2.0, "output_throughput": 100.0,
            "total_input_tokens": 128 * n, "median_ttft_ms": 50.0, "median_tpot_ms": 10.0, "p99_ttft_ms": 60.0,
            "statuses": ["ok"] * (n - failed) + ["failed"] * failed, "errors": [""] * (n - failed) + ["boom"] * failed,
            "output_lens": tokens, "input_lens": [128] * n, "chunk_times": [[0.1] * c for c in chunks]}


def test_summarize_run_counts_every_reply():
    s = peers.summarize_run(bench_json([64, 64, 64], chunks=[64, 62, 64]), 64, 3)
    assert s["tokens_per_reply"] == [64, 64] and s["chunks_per_reply"] == [62, 64]
    assert s["prompt_tokens_per_reply"] == [128, 128] and s["output_throughput"] == 100.0


def test_summarize_run_rejects_a_server_that_stopped_at_eos():
    with pytest.raises(ValueError, match=r"2 of 3 replies did not have 64 output tokens \(counts seen: \[5, 9\]\)"):
        peers.summarize_run(bench_json([64, 5, 9]), 64, 3)


def test_summarize_run_rejects_failures_missing_requests_and_overclaimed_counts():
    with pytest.raises(ValueError, match="2 of 3 requests completed .*boom"):
        peers.summarize_run(bench_json([64, 64, 0], failed=1), 64, 3)
    with pytest.raises(ValueError, match="3 of 4 requests completed"):
        peers.summarize_run(bench_json([64, 64, 64]), 64, 4)
    with pytest.raises(ValueError, match="more chunks"):
        peers.summarize_run(bench_json([64, 64], chunks=[64, 67]), 64, 2)


# --- the table ------------------------------------------------------------------------

def test_table_has_ratios_against_the_baseline_and_names_the_vector_units():
    text = peers.table(laptop_report())
    assert "Vector units: AVX2 yes, AVX-512 no, AVX-512 BF16 no, AMX BF16 no." in text
    assert "AMD EPYC 7B13, 2 cores, 2 threads per server" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 10  # 5 engines x 2 concurrencies, c = 1 first
    assert rows[0].startswith("| tinyinfer, bf16 | 1 | 14.3 | 1,846 ms | 48.6 ms | 0.33x | 3.23x | 3.60x | 64 |")
    assert "| **llama.cpp, Q4_1 GGUF** | 1 | 44.0 | 571 ms | 13.5 ms | 1.00x | 1.00x | 1.00x |" in text
    assert "| vLLM CPU 0.32, bf16 | 32 | 12.3 | 77,076 ms | 1,422.0 ms | 0.21x | 85.64x | 3.56x | 64 |" in text
    assert "Baseline (bold): llama.cpp, Q4_1 GGUF." in text


def test_engine_names_are_short_and_hold_no_flags():
    """A table cell names the engine, not its command line: '--no-enforce-eager' in a
    Markdown cell printed as an en dash, 26 times on the site."""
    assert peers.short_label("tinyinfer serve --no-enforce-eager") == "tinyinfer compiled"
    assert peers.short_label("tinyinfer serve") == "tinyinfer"
    assert peers.short_label("llama.cpp abc1234 llama-server (AVX2 build)") == "llama.cpp abc1234 (AVX2 build)"
    stored = peers.load()
    assert not [k for k in stored["engines"] if "--" in peers.row_name(stored, k)]


def test_baseline_falls_back_when_its_row_did_not_run():
    r = laptop_report()
    del r["runs"]["llama.cpp-q4_1"]
    assert peers.baseline_key(r) == "vllm-bf16"
    r["meta"]["baseline"] = "tinyinfer-fp32"
    assert peers.baseline_key(r) == "tinyinfer-fp32"


# --- the sentences, both ways round ---------------------------------------------------

def test_sentences_on_a_laptop_where_llama_cpp_wins_for_one_user():
    text = peers.explain(laptop_report())
    assert ("For one user, llama.cpp, Q4_1 GGUF serves the most: 44.0 output tok/s, "
            "2.9 times tinyinfer's best (INT4 g32, 15.0 tok/s) and 4.6 times vLLM CPU's best "
            "(bf16, 9.6 tok/s).") in text
    assert ("For 32 users at once, tinyinfer, fp32 serves the most: 106.1 output tok/s, 1.8 times "
            "llama.cpp's best (Q4_1 GGUF, 60.0 tok/s) and 8.6 times vLLM CPU's best (bf16, 12.3 tok/s).") in text
    assert "The fewest bytes won: llama.cpp, Q4_1 GGUF has the shortest step." in text
    # MBU: 90 MB in 13.5 ms is 6.67 GB/s, 30.9% of the measured 21.6 GB/s
    assert "at the measured 21.6 GB/s, and MBU is the share of it a row used" in text
    assert "llama.cpp, Q4_1 GGUF reads 90 MB per token and reached 6.7 GB/s, an MBU of 31%" in text
    # no measured peak in this run: the FLOPs are given, MFU is said not to be computed
    assert ("Each token needs about 269 MFLOP (2 per parameter): at the shortest step (llama.cpp, Q4_1 GGUF) "
            "that is 19.9 GFLOP/s. This run did not measure the CPU's peak FLOP/s") in text
    assert "This CPU has no BF16 units" in text
    assert ("bf16's prefill (TTFT 1,846 ms) was 5.2 times slower than fp32's (352 ms), and its decode step "
            "(48.6 ms) 1.4 times faster than fp32's (69.3 ms)") in text
    assert "Prefill is arithmetic, and here bf16 arithmetic is the slow kind." in text
    assert "The winner changed with the load: llama.cpp for one user, tinyinfer for 32." in text
    assert "Every reply in every row had exactly 64 output tokens" in text


def test_sentences_on_a_bf16_server_where_tinyinfer_wins_everywhere():
    text = peers.explain(server_report())
    assert ("For one user, tinyinfer, INT4 g32 serves the most: 90.0 output tok/s, 1.1 times llama.cpp's "
            "best (Q4_1 GGUF, 80.0 tok/s) and 1.4 times vLLM CPU's best (bf16, 63.7 tok/s).") in text
    assert "For 8 users at once, tinyinfer, bf16 serves the most: 311.6" in text
    assert ("The fewest bytes did not win here: llama.cpp, Q4_1 GGUF reads the least, but its kernel "
            "streamed 8.2 GB/s against 14.0 GB/s for tinyinfer, INT4 g32") in text
    assert "This CPU multiplies bf16 numbers in hardware" in text
    assert "bf16's prefill (TTFT 62 ms) was 1.5 times faster than fp32's (90 ms)" in text
    assert "Prefill is arithmetic, and here bf16 arithmetic is the fast kind." in text
    assert "no BF16 units" not in text and "winner changed" not in text
    assert "The first token comes soonest from tinyinfer, bf16 (62 ms)" in text


def test_mfu_against_the_measured_peak_of_each_rows_format():
    """2 x 134.5M = 269 MFLOP per token (from the bf16 row's 269 MB). tinyinfer bf16:
    269e6 / 48.6 ms = 5.535 GFLOP/s over a 250 GFLOP/s bf16 peak = 2.2%; fp32: 269e6 /
    69.3 ms = 3.882 GFLOP/s over 500 = 0.8%. INT4 and Q4_1 have no peak of their own."""
    r = laptop_report()
    r["meta"]["peak_gflops"] = {"fp32": 500.0, "bf16": 250.0}
    text = peers.mfu_sentence(r)
    assert "tinyinfer, bf16 2.2%" in text and "tinyinfer, fp32 0.8%" in text and "vLLM CPU 0.32, bf16 1.9%" in text
    assert "Q4_1" not in text and "INT4" not in text and "not computed" not in text
    del r["runs"]["tinyinfer-fp32"][1]  # no single-user row in fp32: no fp32 figure, the others stay
    assert "fp32" not in peers.mfu_sentence(r) and "bf16 2.2%" in peers.mfu_sentence(r)


def test_sentences_say_when_replies_were_short():
    r = laptop_report()
    r["runs"]["vllm-bf16"][1]["tokens_per_reply"] = [12, 64]
    assert "Replies did not all have 64 tokens (seen: [12, 64])" in peers.explain(r)


# --- loading --------------------------------------------------------------------------

def test_load_prefers_this_machines_run_then_the_stored_copy(tmp_path, monkeypatch):
    monkeypatch.delenv("TINYINFER_PEERS_JSON", raising=False)
    (tmp_path / "_build").mkdir()
    (tmp_path / "chapters").mkdir()
    r = laptop_report()
    r["runs"] = {k: {str(c): s for c, s in v.items()} for k, v in r["runs"].items()}  # JSON's string keys
    (tmp_path / "_build" / "peers.json").write_text(json.dumps(r))
    monkeypatch.chdir(tmp_path / "chapters")  # the book runs a chapter in its own folder
    mine = peers.load()
    assert mine["source"] == str(tmp_path / "_build" / "peers.json") and not mine["stored"]
    assert sorted(mine["runs"]["vllm-bf16"]) == [1, 32]
    assert "this machine's `make peers`" in peers.table(mine)
    monkeypatch.setenv("TINYINFER_PEERS_JSON", str(tmp_path / "_build" / "peers.json"))
    monkeypatch.chdir(tmp_path.parent)
    assert peers.REPORT.find_saved() == tmp_path / "_build" / "peers.json"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"meta": {}}))
    with pytest.raises(ValueError, match="not a peers report"):
        peers.load(bad)


def test_the_stored_copy_follows_the_cpus_bf16_units():
    laptop = {"avx512_bf16": False, "amx_bf16": False, "avx512f": False, "avx2": True}
    assert peers.stored_for({"vector_units": laptop}) == peers.STORED_COPIES["avx2"] == peers.STORED
    assert peers.stored_for({}) == peers.STORED  # flags unknown: the laptop's copy
    for bf16 in ({**laptop, "avx512f": True, "avx512_bf16": True}, {**laptop, "amx_bf16": True}):
        assert peers.stored_for({"vector_units": bf16}) == peers.STORED_COPIES["avx512_bf16"]
        emulated = {"vector_units": bf16, "emulation": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}
        assert peers.stored_for(emulated) == peers.STORED  # torch kept below the BF16 units
    for kind, path in peers.STORED_COPIES.items():  # each copy was measured on the CPU it stands for
        assert peers.stored_for(peers.load(path)["meta"]) == path, kind
    avx2, bf16 = peers.STORED_COPIES["avx2"], peers.STORED_COPIES["avx512_bf16"]
    assert peers.other_class(peers.load(avx2)) == bf16 and peers.other_class(peers.load(bf16)) == avx2
    assert peers.other_class(laptop_report()) == bf16 and peers.other_class(server_report()) == avx2


@pytest.mark.parametrize("kind", ["avx2", "avx512_bf16"])
def test_the_stored_copy_is_a_complete_report(kind):
    r = peers.load(peers.STORED_COPIES[kind])
    assert r["stored"] and "stored copy" in peers.table(r)
    engines = {e["engine"] for e in r["engines"].values()}
    assert engines == {"tinyinfer", "llama.cpp", "vllm"}
    assert {e["format"] for k, e in r["engines"].items() if e["engine"] == "tinyinfer"} >= {"bf16", "fp32"}
    assert r["meta"]["vector_units"] and r["meta"]["date"]
    for runs in r["runs"].values():
        for s in runs.values():
            assert s["tokens_per_reply"] == [r["meta"]["output_len"]] * 2
    assert "Every reply in every row had exactly" in peers.explain(r)


# --- the stamp: which engine measured a report, and whether it is today's -----------------

@pytest.mark.parametrize("kind", ["avx2", "avx512_bf16"])
def test_the_stored_copy_carries_its_engine_and_its_configuration(kind):
    """Each stored copy names the fingerprint of the code `tinyinfer serve` ran (or says
    'unknown'), the modules it covers, and the settings that produced its numbers."""
    from tinyinfer_course import fingerprint

    meta = peers.load(peers.STORED_COPIES[kind])["meta"]
    stamp = meta["engine_stamp"]
    assert stamp["engine_commit"] and stamp["engine_fingerprint"]
    if stamp["engine_fingerprint"] != "unknown":
        assert fingerprint.fingerprint_of(stamp["engine_modules"]) == stamp["engine_fingerprint"]
        assert {"tinyinfer.cli", "tinyinfer.server.engine_core", "tinyinfer.model"} <= set(stamp["engine_modules"])
    for key in ("threads", "cores", "concurrency", "num_prompts", "input_len", "output_len", "vector_units",
                "torch_cpu_capability", "llama_cpp_build"):
        assert meta.get(key) is not None, key
    assert isinstance(meta["emulation"], dict)  # {} when torch ran the CPU's own instructions
    for key, e in peers.load(peers.STORED_COPIES[kind])["engines"].items():
        if e["engine"] == "tinyinfer":
            assert e["config"] == peers.serve_config(e["command"]), key
            assert {"dtype", "quantization", "lm_head_quantization", "enforce_eager"} <= set(e["config"]), key


def test_serve_config_spells_out_a_command_line():
    int4 = peers.serve_config("--dtype bfloat16 --quantization int4 --group-size 32 --lm-head-quantization int8 "
                              "--no-enforce-eager")
    assert int4 == {"dtype": "bfloat16", "quantization": "int4", "group_size": 32, "lm_head_quantization": "int8",
                    "enforce_eager": False}
    assert peers.serve_config("--dtype float32") == {"dtype": "float32", "quantization": None,
                                                     "lm_head_quantization": None, "enforce_eager": True}


def stamped(report, stamp):
    report["meta"]["engine_stamp"] = stamp
    return report


def test_the_page_says_when_the_engine_has_changed_since():
    """The header names the engine that measured the rows; when today's `tinyinfer serve`
    code differs, a computed sentence says the tinyinfer rows are an older engine's."""
    today = {"engine_fingerprint": "a" * 16, "engine_modules": {"tinyinfer.model": "11111111",
                                                               "tinyinfer.server.api": "22222222"}}
    current = stamped(laptop_report(), dict(today, engine_commit="abc1234"))
    note = peers.REPORT.note(current, today)
    assert "older engine" not in note and "the same code" in note and "abc1234" in note
    old = stamped(laptop_report(), {"engine_fingerprint": "b" * 16, "engine_commit": "0ld0ld0",
                                    "engine_modules": {"tinyinfer.model": "33333333",
                                                       "tinyinfer.server.api": "22222222"}})
    note = peers.REPORT.note(old, today)
    assert "older engine" in note and "1 of its modules: model;" in note and "0ld0ld0" in note
    assert "2026-12-01 12:00 UTC" in note  # the date it was measured
    unknown = stamped(laptop_report(), {"engine_fingerprint": "unknown", "engine_commit": "unknown"})
    assert "not known" in peers.REPORT.note(unknown, today)
    assert "not known" in peers.REPORT.note(laptop_report(), today)  # a report from before stamps
    # the real thing: a report stamped now is current, and the page (the header) says which
    now = stamped(laptop_report(), peers.REPORT.stamp())
    assert "the same code" in peers.header(now)
    assert now["meta"]["engine_stamp"]["engine_fingerprint"] in peers.table(now)


def test_the_stored_copies_are_named_as_older_engines_when_they_are():
    """Both stored copies were measured before today's engine: the pages that render them
    (chapters 6 and 8, through peers.table and peers.header) say so."""
    today = peers.REPORT.stamp()
    for path in peers.STORED_COPIES.values():
        report = peers.load(path)
        if report["meta"]["engine_stamp"]["engine_fingerprint"] != today["engine_fingerprint"]:
            assert "older engine" in peers.header(report) and "older engine" in peers.table(report)


def test_an_int4_row_without_an_int8_head_says_so():
    report = laptop_report()
    report["engines"]["tinyinfer-int4"]["config"] = peers.serve_config("--quantization int4 --group-size 32")
    assert peers.row_name(report, "tinyinfer-int4").endswith("LM head not quantized")
    report["engines"]["tinyinfer-int4"]["config"]["lm_head_quantization"] = "int8"
    assert "LM head" not in peers.row_name(report, "tinyinfer-int4")


# --- benchmarks/peers.py: arguments, builds, a run against a fake server ---------------

def test_engine_selection_and_arguments():
    import peer_servers
    import peers as script

    assert peer_servers.select("vllm,tinyinfer-bf16") == ["tinyinfer-bf16", "vllm-bf16", "vllm-fp32"]
    assert {"tinyinfer-bf16-compiled", "tinyinfer-int4-compiled"} <= set(peer_servers.select("all"))
    # tinyinfer's best rows (compiled INT4 for one user; compiled bf16 under load, or fp32 without bf16 units)
    assert {"tinyinfer-bf16-compiled", "tinyinfer-fp32-compiled", "tinyinfer-int4-compiled"} \
        <= set(peer_servers.select("tinyinfer"))
    assert peer_servers.select(peer_servers.DEFAULT_ENGINES) == peer_servers.select("all")
    with pytest.raises(ValueError, match="unknown engine 'llamacpp'"):
        peer_servers.select("llamacpp")
    args = script.parse_args(["--engines", "llama.cpp", "--concurrency", "1,8,4"])
    assert args.keys == ["llama.cpp-q4_1"] and args.num_prompts == [4, 16, 4]
    with pytest.raises(SystemExit):
        script.parse_args(["--concurrency", "1,8", "--num-prompts", "4"])


def test_server_commands_give_every_engine_the_same_threads_and_slots():
    import peer_servers

    cmd = peer_servers.llama_server_command(Path("llama-server"), Path("m.gguf"), "smollm2-135m-instruct",
                                            threads=2, port=8080, slots=32, slot_tokens=256)
    flags = dict(zip(cmd[1::2], cmd[2::2]))
    assert flags["--threads"] == flags["--threads-batch"] == "2" and flags["--parallel"] == "32"
    assert flags["--ctx-size"] == str(32 * 256)  # the context is shared by the slots: room for each
    assert flags["--n-gpu-layers"] == "0" and flags["--host"] == "127.0.0.1" and "--no-webui" in cmd
    assert peer_servers.vllm_cpu_bind(1) == "0" and peer_servers.vllm_cpu_bind(4) == "0-3"


@pytest.mark.parametrize("build, name", [("native", "llama.cpp abc1234 llama-server"),
                                         ("avx2", "llama.cpp abc1234 llama-server (AVX2 build)")])
def test_the_llama_cpp_row_names_an_avx2_build(monkeypatch, build, name):
    import llama_server
    import peer_servers

    monkeypatch.setattr(llama_server, "ensure_llama_server", lambda b: Path(f"/x/build-{b}/bin/llama-server"))
    monkeypatch.setattr(llama_server, "ensure_gguf", lambda: Path("/x/m.gguf"))
    monkeypatch.setattr(llama_server, "built", lambda b: {"commit": "abc1234", "build": b})
    monkeypatch.setattr(peer_servers, "gguf_tensor_bytes", lambda path: 1)
    monkeypatch.setattr(peer_servers, "serve", lambda cmd, port, env, **kw: cmd)
    ctx = peer_servers.Context(threads=2, max_concurrency=1, llama_cpp_build=build)
    cmd = peer_servers.serve_llama_server(ctx, "llama.cpp-q4_1")
    assert ctx.info["llama.cpp-q4_1"]["label"] == name and cmd[0] == f"/x/build-{build}/bin/llama-server"


def test_llama_cpp_builds_native_avx2_or_avx512_without_amx():
    import llama_server

    native = llama_server.cmake_command("native", Path("src"), Path("out"), "Ninja")
    avx2 = llama_server.cmake_command("avx2", Path("src"), Path("out"), None)
    avx512 = llama_server.cmake_command("avx512", Path("src"), Path("out"), None)
    assert "-DGGML_NATIVE=ON" in native and "-G" in native
    assert "-DGGML_NATIVE=OFF" in avx2 and "-DGGML_AVX2=ON" in avx2 and "-DGGML_AVX512=OFF" in avx2
    assert "-DGGML_NATIVE=OFF" in avx512 and "-DGGML_AVX512=ON" in avx512 and "-DGGML_AVX512_BF16=ON" in avx512
    for amx in ("-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"):
        assert amx in avx2 and amx in avx512
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in avx2  # no asset download at build time
    with pytest.raises(ValueError, match="build='avx10' is invalid: must be one of native, avx2, avx512"):
        llama_server.cmake_command("avx10", Path("src"), Path("out"), None)


def test_llama_cpp_build_says_what_it_needs(tmp_path, monkeypatch):
    import llama_server

    monkeypatch.delenv("CI", raising=False)
    assert llama_server.missing_tools(which=lambda name: None, env={}) == ["cmake", "a C++ compiler"]
    assert llama_server.missing_tools(which=lambda name: name == "cmake", env={"CXX": "clang++"}) == \
        ["a C++ compiler"]

    def never(*a, **k):
        raise AssertionError("the test tried to download or build llama.cpp")

    monkeypatch.setattr(llama_server, "fetch_sdist", never)  # whatever happens, nothing is built here
    monkeypatch.setattr(llama_server.subprocess, "run", never)
    monkeypatch.setattr(llama_server.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="cmake and a C\\+\\+ compiler not found: .*apt-get install cmake g\\+\\+"):
        llama_server.ensure_llama_server("native", root=tmp_path)
    monkeypatch.setenv("CI", "1")
    with pytest.raises(SystemExit, match="CI machine"):
        llama_server.ensure_llama_server("native", root=tmp_path)


def test_a_finished_build_is_found_without_cmake(tmp_path, monkeypatch):
    import llama_server

    out = llama_server.build_dir("native", tmp_path)
    (out / "bin").mkdir(parents=True)
    (out / "bin" / "llama-server").write_text("")
    (out / "built.json").write_text(json.dumps({"commit": "0c1e570", "llama_cpp_python": "0.3.36",
                                                "build": "native"}))
    monkeypatch.setattr(llama_server.shutil, "which", lambda name: None)  # no cmake: not needed any more
    assert llama_server.ensure_llama_server("native", root=tmp_path) == out / "bin" / "llama-server"
    assert llama_server.label(llama_server.built("native", tmp_path)) == \
        "llama.cpp 0c1e570 (llama-cpp-python 0.3.36 sdist, native)"
    readme = llama_server.write_readme(tmp_path / "llama.cpp")
    assert "llama-server" in readme.read_text()


def fake_peer(mode, pidfile):
    import peer_servers
    from serving import free_port, serve

    def start(ctx, key):
        port = free_port()
        return serve([sys.executable, str(ROOT / "tests" / "fake_peer_server.py"), str(port), mode, str(pidfile)],
                     port, dict(os.environ), startup_timeout_s=60, name=f"fake {mode}")
    return peer_servers.Peer("llama.cpp", "fake server", "Q4_1 GGUF", start)


def alive(pidfile) -> bool:
    try:
        os.kill(int(Path(pidfile).read_text()), 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["honest", "ignores-eos", "overclaims"])
def test_a_run_counts_tokens_and_stops_its_server(mode, tmp_path, default_model_dir):
    import peer_servers
    import peers as script

    args = script.parse_args(["--concurrency", "2", "--num-prompts", "3", "--input-len", "16",
                              "--output-len", "8"])
    ctx = peer_servers.Context(threads=1, max_concurrency=2, input_len=16, output_len=8)
    pidfile = tmp_path / "pid"
    if mode == "honest":
        summaries, raw = script.run_server("fake", fake_peer(mode, pidfile), ctx, args, tmp_path)
        assert summaries[2]["tokens_per_reply"] == [8, 8] and summaries[2]["completed"] == 3
        assert raw[2]["completed"] == 3
    else:
        match = "did not have 8 output tokens" if mode == "ignores-eos" else "more chunks"
        with pytest.raises(RuntimeError, match=f"fake at concurrency 2: .*{match}"):
            script.run_server("fake", fake_peer(mode, pidfile), ctx, args, tmp_path)
    deadline = time.monotonic() + 30  # a no-hang bound: the server exits within a second when told
    while alive(pidfile) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pidfile), "the server outlived the run"


@pytest.mark.slow
def test_an_engine_that_fails_leaves_its_row_out_and_the_others_in(tmp_path, monkeypatch, default_model_dir):
    """A server that dies or miscounts costs its own row, not the whole run: the
    others are measured and saved, and the run exits non-zero naming the failure."""
    import peer_servers
    import peers as script

    monkeypatch.setitem(peer_servers.PEERS, "fake-broken", fake_peer("ignores-eos", tmp_path / "pid1"))
    monkeypatch.setitem(peer_servers.PEERS, "fake-honest", fake_peer("honest", tmp_path / "pid2"))
    out = tmp_path / "peers.json"
    with pytest.raises(SystemExit, match=r"these engines failed and have no row: fake-broken \(fake-broken at "
                                         r"concurrency 2: .*did not have 8 output tokens"):
        script.main(["--engines", "fake-broken,fake-honest", "--concurrency", "2", "--num-prompts", "3",
                     "--input-len", "16", "--output-len", "8", "--threads", "1", "--save", str(out)])
    report = json.loads(out.read_text())
    assert list(report["runs"]) == ["fake-honest"] and report["runs"]["fake-honest"]["2"]["completed"] == 3
    assert report["meta"]["engine_stamp"]["engine_fingerprint"] == peers.REPORT.stamp()["engine_fingerprint"]
    assert list(report["failed"]) == ["fake-broken"]
