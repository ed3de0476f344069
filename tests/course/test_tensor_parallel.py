"""Tensor parallelism with torch.distributed (gloo, CPU): the split MLPs give
the outputs of one process; the ring fit inverts the ring model; the pipeline
bubble. Two processes of the tiny model: a few seconds."""
import math

import numpy as np
import pytest
import torch

from tinyinfer_course.analysis.hardware import Link, allreduce_time, pipeline_bubble
from tinyinfer.model import MLP
from tinyinfer_course.fleet.tensor_parallel import ParallelMLP, fit_ring, hidden_states, run_ranks


def test_two_processes_give_the_hidden_states_of_one(tiny_dir):
    ids = list(range(5, 40))
    (alone,) = run_ranks(hidden_states, world=1, args=(tiny_dir, ids))
    split = run_ranks(hidden_states, world=2, args=(tiny_dir, ids))
    for rank_out in split:  # every rank ends with the same, full result
        np.testing.assert_allclose(rank_out, alone, rtol=1e-5, atol=1e-5)
    assert np.abs(alone).max() > 0.1  # a real signal, not two zeros agreeing


def _mlp():
    from types import SimpleNamespace

    torch.manual_seed(0)
    return MLP(SimpleNamespace(hidden_size=8, intermediate_size=12)).eval()


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_shards_sum_to_the_whole_mlp(world):
    """Without a process group, each shard returns its partial output: the
    partials must add up to the unsplit MLP (and no column may be lost or doubled)."""
    mlp, x = _mlp(), torch.randn(3, 8)
    with torch.no_grad():
        total = sum(ParallelMLP(mlp, r, world)(x) for r in range(world))
        torch.testing.assert_close(total, mlp(x), rtol=1e-5, atol=1e-6)
        # Taking the same half twice (a wrong slice) would not add up:
        assert not torch.allclose(2 * ParallelMLP(mlp, 0, 2)(x), mlp(x), atol=1e-4)


def test_an_uneven_split_is_refused():
    with pytest.raises(ValueError, match="world=5"):
        ParallelMLP(_mlp(), 0, 5)


@pytest.mark.parametrize("n", [2, 4])
def test_fit_ring_recovers_the_link_the_ring_model_used(n):
    link = Link("made up", bandwidth=2e9, latency=40e-6)
    sizes = [4 * 4 ** k for k in range(10)]
    fitted = fit_ring(sizes, [allreduce_time(s, n, link) for s in sizes], n)
    assert math.isclose(fitted.latency, link.latency, rel_tol=1e-6)
    assert math.isclose(fitted.bandwidth, link.bandwidth, rel_tol=1e-6)


def test_fit_ring_refuses_one_size():
    with pytest.raises(ValueError, match="two different"):
        fit_ring([64, 64], [1e-5, 1e-5], 2)


@pytest.mark.parametrize("p, m, expected", [(1, 1, 0.0), (4, 1, 3 / 4), (4, 4, 3 / 7), (2, 8, 1 / 9), (8, 32, 7 / 39)])
def test_pipeline_bubble(p, m, expected):
    assert pipeline_bubble(p, m) == pytest.approx(expected)


@pytest.mark.parametrize("p, m", [(0, 1), (2, 0), (2.5, 4)])
def test_pipeline_bubble_refuses_bad_counts(p, m):
    with pytest.raises(ValueError, match="stages|micro_batches"):
        pipeline_bubble(p, m)


# --- the stored report and its sentences ------------------------------------------------


def _report(two_ms=(90.0, 400.0), one_ms=(45.0, 430.0), allreduce_s=0.01):
    from tinyinfer_course.reports import tp_gloo as tp_report

    steps = [{"tokens": t, "one_process_2_threads_s": o / 2e3, "one_process_1_thread_s": o / 1e3,
              "mlp_1_thread_s": o / 2e3, "two_processes_s": w / 1e3, "two_processes_allreduce_s": allreduce_s,
              "predicted_two_processes_s": 0.75 * o / 1e3, "predicted_communication_s": 0.005}
             for t, w, o in zip((1, 256), two_ms, one_ms)]
    return {"meta": {"date": "2026-12-05 05:30 UTC", "cpu": "Some CPU", "cores": 2,
                     "engine_stamp": tp_report.REPORT.stamp(), "load_average_before": [1.5, 1, 1],
                     "load_average_after": [2.0, 1, 1]},
            "model": {"name": "smollm2-135m-instruct", "dtype": "float32", "hidden_size": 576, "layers": 30,
                      "intermediate_size": 1536},
            "allreduce": {"nbytes": [4, 4096], "seconds": [1e-4, 1.1e-4],
                          "fit": {"alpha_s": 5e-5, "bandwidth_bytes_per_s": 1.5e9}},
            "steps": steps}


def test_explain_says_where_two_processes_lose_to_one_core():
    from tinyinfer_course.reports import tp_gloo as tp_report

    text = tp_report.explain(_report())
    assert "alpha = 50 µs" in text and "1.5 GB/s" in text
    assert "two processes took 90.0 ms, one process on both cores 22.5 ms, and one process on one core 45.0 ms" in text
    assert "slower than one process on both cores at every size measured (1.9 to 4.0 times as long)" in text
    assert "slower than one core at 1 token per step." in text
    never = tp_report.explain(_report(two_ms=(40.0, 400.0)))
    assert "slower than one core at no size measured" in never
    assert "load average was 1.5" in tp_report.load_sentence(_report())


def test_engine_note_tells_todays_code_from_an_older_one():
    from tinyinfer_course.reports import tp_gloo as tp_report

    report = _report()
    assert tp_report.engine_note(report).endswith("the same code as today's.")
    stamp = report["meta"]["engine_stamp"]
    old = dict(stamp, engine_fingerprint="0" * 16,
               engine_modules=dict(stamp["engine_modules"], **{"tinyinfer_course.fleet.tensor_parallel": "deadbeef"}))
    report["meta"]["engine_stamp"] = old
    assert "has changed since (tinyinfer_course.fleet.tensor_parallel)" in tp_report.engine_note(report)


def test_the_stored_report_loads_and_renders(monkeypatch, tmp_path):
    from tinyinfer_course.reports import tp_gloo as tp_report

    monkeypatch.delenv("TINYINFER_TP_JSON", raising=False)
    monkeypatch.chdir(tmp_path)  # no _build/tp-gloo.json here: the stored copy
    report = tp_report.load()
    assert report["stored"]
    assert report["meta"]["cpu"] and report["meta"]["engine_stamp"]["engine_fingerprint"]
    assert report["max_abs_difference"] < 1e-3  # the stored run's split also matched one process
    assert len(report["steps"]) >= 2 and tp_report.explain(report) and tp_report.table(report)


# --- what the split shares out, and chapter 8's sentences about it -------------------------


def test_split_work_counts_what_each_process_still_multiplies():
    from tinyinfer_course.analysis.memory import load_config
    from tinyinfer_course.fleet.tensor_parallel import split_work

    config = load_config("smollm2-135m-instruct")
    work = split_work(config)
    assert work["mlp_share_of_layer"] == pytest.approx(0.75)  # not two thirds
    assert work["mlp_share_of_model"] == pytest.approx(30 * 3 * 576 * 1536 / 134_515_008)  # 59%
    assert round(work["per_process"] / 1e6, 1) == 94.7 and round(work["pair_over_one"], 2) == 1.41
    timed = split_work(config, lm_head=False)  # the benchmark's steps stop at the last hidden state
    assert timed["pair_over_one"] == pytest.approx(1.25)
    assert split_work(config, world=1)["pair_over_one"] == 1.0
    with pytest.raises(ValueError, match="world"):
        split_work(config, world=0)


def test_step_sentences_follow_the_numbers():
    from tinyinfer_course.reports import tp_gloo as tp_report

    slow = tp_report.step_sentences(_report(), 1.25)  # two processes lose at every size
    assert "slower than one process on both cores at every size measured" in slow["verdict"]
    assert "the section's lesson measured" in slow["verdict"]
    assert "4.0 times as long as the process on both cores" in slow["step"]
    assert "multiply 1.25 times the weights one process does" in slow["verdict"]
    assert "explains only part of the cost" in slow["allreduce"] and "waits for the slower" in slow["allreduce"]
    win = tp_report.step_sentences(_report(two_ms=(20.0, 150.0)), 1.25)  # faster than one on both cores
    assert "faster than one process on both cores at every size measured" in win["verdict"]
    assert "slower" not in win["verdict"] and "lesson" not in win["verdict"]
    assert "0.89 times as long as the process on both cores" in win["step"]
    mixed = tp_report.step_sentences(_report(two_ms=(30.0, 150.0)), 1.25)
    assert "slower than one process on both cores at 1 token per step, and faster at 256 tokens per step: " \
           "the 30 synchronizations weigh most where the step is shortest" in mixed["verdict"]


def test_step_sentences_when_the_ring_model_is_right():
    from tinyinfer_course.reports import tp_gloo as tp_report

    agree = tp_report.step_sentences(_report(two_ms=(30.0, 150.0), allreduce_s=0.0052), 1.25)["allreduce"]
    assert "close to what the ring predicts" in agree
    assert "explains only part" not in agree and "waits for the slower" not in agree
    assert "longer than the measured one" in agree and "extra wait" not in agree  # 33.75 ms predicted, 30 measured
    assert "-" not in agree.replace("all-reduces", "")  # no negative time


def test_the_chapters_tensor_parallel_prose_renders_from_a_synthetic_report(tmp_path, monkeypatch):
    """Chapter 8's cell that loads the report, run on a report in which two processes win and the
    ring model is right: the section's prose, its glues filled in, says so and nothing else."""
    import json
    import re
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tinyinfer_course.analysis.hardware import LINKS

    report = _report(two_ms=(20.0, 150.0), allreduce_s=0.005)
    path = tmp_path / "tp.json"
    path.write_text(json.dumps(report))
    monkeypatch.setenv("TINYINFER_TP_JSON", str(path))
    page = (Path(__file__).resolve().parents[2] / "chapters" / "08-fleets.md").read_text()
    start = page.index("### Measured: two processes, one model")
    section = page[start:page.index("\n## ", start)]  # to the next section
    (cell,) = [c for c in re.findall(r"```\{code-cell\}[^\n]*\n(.*?)```", section, re.S) if "tp_report.load()" in c]
    glued = {}
    namespace = {"np": np, "plt": plt, "LINKS": LINKS,
                 "glue": lambda name, value, display=True: glued.__setitem__(name, value)}
    exec("\n".join(line for line in cell.splitlines() if not line.startswith(":")), namespace)
    plt.close("all")
    assert namespace["tp"]["source"] == str(path)

    def fill(match):
        value, spec = glued[match.group(1)], match.group(2)
        return format(value, spec) if spec else str(value)

    prose = re.sub(r"```.*?```", "", section, flags=re.S)
    text = re.sub(r"\{glue:text\}`(\w+)(?::([^`]*))?`", fill, prose)
    assert "{glue" not in text
    assert "faster than one process on both cores at every size measured" in text
    for false in ("slower than one process on both cores", "lesson measured", "explains only part",
                  "waits for the slower", "extra wait", "two-core", "the same work"):
        assert false not in text, false
    assert "1.25 times the work of one" in text and "75% of a layer's weights" in text
