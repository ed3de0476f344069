"""The one-row route is measured once per CPU and remembered (kernel_choice.py).
Timings here come from a scripted clock: no test times the real kernels."""
import itertools
import json

import pytest
import torch

from tinyinfer import kernel_choice
from tinyinfer.cpu_linear import PackedLinear, pack_weight


def scripted_clock(packed_s: float, plain_s: float):
    """A clock under which every packed pass takes packed_s and every plain pass plain_s
    (time_routes reads it twice per pass, packed first, then plain)."""
    steps = itertools.cycle([0.0, packed_s, 0.0, plain_s])
    now = [0.0]

    def clock():
        now[0] += next(steps)
        return now[0]

    return clock


@pytest.fixture
def weights():
    torch.manual_seed(0)
    ws = [torch.randn(64, 32), torch.randn(32, 64)]
    return ws, [pack_weight(w) for w in ws]


def test_plain_is_chosen_only_when_clearly_faster(weights, tmp_path, monkeypatch):
    monkeypatch.delenv(kernel_choice.ENV, raising=False)
    for packed_s, plain_s, want in [(1.0, 0.5, "plain"), (1.0, 0.96, "packed"), (1.0, 2.0, "packed")]:
        store = tmp_path / f"{packed_s}-{plain_s}.json"
        got = kernel_choice.one_row_kernel(*weights, store=store, clock=scripted_clock(packed_s, plain_s))
        assert got == want, (packed_s, plain_s)
        saved = json.loads(store.read_text())
        (entry,) = saved.values()
        assert entry == {"kernel": want, "ms": {"packed": packed_s * 1e3, "plain": plain_s * 1e3}}


def test_the_answer_is_read_back_not_measured_again(weights, tmp_path, monkeypatch):
    monkeypatch.delenv(kernel_choice.ENV, raising=False)
    store = tmp_path / "kernels.json"
    assert kernel_choice.one_row_kernel(*weights, store=store, clock=scripted_clock(1.0, 0.5)) == "plain"

    def no_clock():
        raise AssertionError("measured again")

    assert kernel_choice.one_row_kernel(*weights, store=store, clock=no_clock) == "plain"
    monkeypatch.setattr(kernel_choice, "cpu_key", lambda dtype: "another CPU")  # another key: measured
    assert kernel_choice.one_row_kernel(*weights, store=store, clock=scripted_clock(1, 2)) == "packed"
    assert len(json.loads(store.read_text())) == 2


def test_the_environment_decides_when_set(weights, tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_choice.ENV, "plain")
    assert kernel_choice.one_row_kernel(*weights, store=tmp_path / "k.json", clock=scripted_clock(1, 2)) == "plain"
    assert not (tmp_path / "k.json").exists()
    monkeypatch.setenv(kernel_choice.ENV, "fast")
    invalid = "TINYINFER_ONE_ROW_KERNEL='fast' is invalid: must be one of 'packed', 'plain'"
    with pytest.raises(ValueError, match=invalid):
        kernel_choice.one_row_kernel(*weights, store=tmp_path / "k.json")


def test_an_emulated_cpu_is_measured_apart(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    native = kernel_choice.cpu_key(torch.float32)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert kernel_choice.cpu_key(torch.float32) != native
    assert kernel_choice.cpu_key(torch.float32) != kernel_choice.cpu_key(torch.bfloat16)


def test_a_plain_one_row_route_gives_the_same_product_by_f_linear(monkeypatch):
    torch.manual_seed(0)
    layer = PackedLinear.from_linear(torch.nn.Linear(32, 48, bias=False))
    if layer.packed_weight is None:
        pytest.skip("oneDNN does not pack fp32 here")
    calls = []
    real = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: calls.append(a[0].shape) or real(*a))
    x1, x4 = torch.randn(1, 1, 32), torch.randn(1, 4, 32)
    with torch.inference_mode():
        want1, want4 = layer(x1), layer(x4)  # the packed route
        assert calls == []
        layer.one_row = "plain"
        got1, got4 = layer(x1), layer(x4)
    assert calls == [x1.shape]  # one row by F.linear; four still by the packed kernel
    torch.testing.assert_close(got1, want1, rtol=1e-5, atol=1e-5)
    assert torch.equal(got4, want4)


def test_the_one_row_route_is_a_setting_and_the_stats_say_which_ran(tiny_dir, monkeypatch):
    """EngineConfig.one_row_kernel picks the route by hand ("auto": measured once
    per CPU, kernel_choice.py); the engine's stats say which route its one-row
    products take, so a change in the order of additions is never a mystery."""
    from tinyinfer import LLM
    from tinyinfer.cpu_linear import PackedLinear

    monkeypatch.delenv("TINYINFER_ONE_ROW_KERNEL", raising=False)
    for route in ("packed", "plain"):
        llm = LLM(tiny_dir, dtype="float32", device="cpu", num_kv_blocks=8, one_row_kernel=route)
        assert llm.llm_engine.stats.one_row_kernel == route
        assert {m.one_row for m in llm.model.modules() if isinstance(m, PackedLinear) and m.packed_weight is not None} \
            == {route}
    with pytest.raises(ValueError, match="one_row_kernel='fastest' is invalid"):
        LLM(tiny_dir, dtype="float32", device="cpu", num_kv_blocks=8, one_row_kernel="fastest")
