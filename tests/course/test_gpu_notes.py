"""The labs' GPU notes (tinyinfer_course.notebook.gpu_notes): on a CPU every note is empty, so labs
4, 7 and 11 print nothing new there; on "cuda" the note is computed from the numbers
it is given. No GPU needed: the numbers are made up, and passed in."""
from __future__ import annotations

import pytest
import torch

from tinyinfer_course.notebook import gpu_notes
from tinyinfer.config import ModelConfig
from tinyinfer_course.analysis.replay import ReplayResult, StepRecord

CPU_CALLS = [
    lambda d: gpu_notes.decode_note(d, 0.02, 0.001, run=lambda n: 1 / 0),  # must not even run the step
    lambda d: gpu_notes.batch_note(d, {1: 0.006, 8: 0.007}, {1: 0.0001, 8: 0.0001}),
    lambda d: gpu_notes.replay_batch_note(d, {}, None),
    lambda d: gpu_notes.your_engine_note(d, 10.0, 20.0, 0.8, 0.5),
]


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
@pytest.mark.parametrize("call", CPU_CALLS)
def test_a_cpu_gets_no_note_and_measures_nothing(device, call):
    assert call(device) == ""


def test_lab4_note_on_cuda_a_launch_bound_step():
    # 7 ms step, 0.13 ms bound; 700 kernels at 8 us = 5.6 ms of launching: 80% of the step
    note = gpu_notes.decode_note("cuda", 0.007, 0.00013, launches=700, launch_us=8.0, name="NVIDIA T4")
    assert note.startswith("On this GPU (NVIDIA T4) a decode step took 7.00 ms against a bound of 0.13 ms: 2% ")
    assert "700 kernels" in note and "5.60 ms, 80% of the step" in note and "is launch-bound" in note


def test_lab4_note_on_cuda_a_step_that_is_not_launch_bound():
    note = gpu_notes.decode_note("cuda:0", 0.012, 0.006, launches=700, launch_us=8.0, name="GPU")
    assert "50% of the bound" in note and "(a one-number add" in note
    assert "5.60 ms, 47% of the step" in note and "not launch-bound" in note
    assert "were not counted" in gpu_notes.decode_note("cuda", 0.012, 0.006, launch_us=8.0, name="GPU")


def test_lab7_note_compares_batch_8_with_batch_1():
    note = gpu_notes.batch_note("cuda", {1: 0.0060, 8: 0.0066}, {1: 0.00013, 8: 0.00014}, name="H200")
    assert "of 8 sequences took 6.60 ms against 6.00 ms for 1 (1.10 times as long, for 8 times the tokens)" in note
    assert "2% of the step at batch 8 and 2% at batch 1" in note and "hardly grew" in note
    slow = gpu_notes.batch_note("cuda", {1: 0.006, 8: 0.024}, {1: 0.003, 8: 0.003}, name="H200")
    assert "4.00 times as long" in slow and "12% of the step at batch 8 and 50% at batch 1" in slow
    assert "hardly grew" not in slow
    assert "not two batch sizes" in gpu_notes.batch_note("cuda", {1: 0.006}, {1: 0.001}, name="H200")


def step(duration, prefill, decode):
    return StepRecord(0.0, duration, decode, 0, prefill, decode, 0, 0)


def test_lab7_note_from_replays_uses_decode_only_steps():
    config = ModelConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128)
    one = ReplayResult([], [step(0.050, 30, 1), step(0.004, 0, 1), step(0.006, 0, 1), step(0.005, 0, 1)], 1.0)
    eight = ReplayResult([], [step(0.090, 200, 3), step(0.006, 0, 8), step(0.007, 0, 8), step(0.003, 0, 2)], 1.0)
    note = gpu_notes.replay_batch_note("cuda", {1: one, 8: eight}, config, bandwidth=1e12, name="H200")
    # medians of the decode-only steps: 5 ms at batch 1, 6.5 ms at batch 8 (prefill steps left out)
    assert "of 8 sequences took 6.50 ms against 5.00 ms for 1 (1.30 times as long" in note


def test_lab11_note_puts_the_learners_engine_beside_tinyinfer():
    note = gpu_notes.your_engine_note("cuda", 12.5, 50.0, 0.9, 0.4, name="H200")
    assert "your engine wrote 12.5 tokens per second against tinyinfer's 50.0: 0.25 of its rate" in note
    assert "your engine spent 90% of its time, tinyinfer 40%" in note and "the CPU's side" in note
    assert "Outside" not in gpu_notes.your_engine_note("cuda", 12.5, 50.0, name="H200")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="measures a real GPU")
def test_the_measuring_helpers_on_a_gpu():
    assert 0 < gpu_notes.launch_cost_us("cuda", launches=200) < 1000
    x = torch.ones(16, device="cuda")
    assert gpu_notes.launches_per_step(lambda n: [x.add_(1) for _ in range(3 * n)]) == 3


def test_auto_is_the_engines_default_device():
    assert gpu_notes.is_cuda("auto") == torch.cuda.is_available()
    if not torch.cuda.is_available():
        assert gpu_notes.replay_batch_note("auto", {}) == ""


@pytest.mark.parametrize("lab", ["04-prefill-decode", "07-batching", "11-your-engine"])
def test_the_labs_print_their_note_only_when_there_is_one(lab):
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parents[2] / "solutions" / f"{lab}.ipynb").read_text())
    cells = ["".join(c["source"]) for c in nb["cells"]
             if c["cell_type"] == "code" and "gpu_notes." in "".join(c["source"])]
    assert len(cells) == 1, f"{lab}: one cell with a GPU note"
    assert "\nif note:\n    print(note)" in cells[0]
