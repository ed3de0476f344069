"""The explicit packing pass (cpu_linear.py): pack_for_cpu swaps in modules that
own their kernel layouts, the product equals F.linear, edits need repack (and
in-place ones are refused until then), gradients never reach a kernel without
a backward, and saving, copying and moving carry the weights, not the layout."""
import copy
import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tinyinfer import cpu_linear
from tinyinfer.cpu_linear import PackedLinear, check_layouts, pack_for_cpu, repack
from tinyinfer.quant import Int4Linear, Int8Linear, kernel_available

needs_packing = pytest.mark.skipif(not cpu_linear.PACKED_DTYPES, reason="PyTorch built without oneDNN")


def _model(dtype=torch.float32, out_features=96, in_features=80):
    """Two linears in a container, frozen as the engine's are, then packed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(in_features, out_features, bias=False),
                          nn.Linear(out_features, in_features, bias=False)).to(dtype)
    model.requires_grad_(False)
    return pack_for_cpu(model)


def test_model_py_is_plain_pytorch():
    """The model file builds plain nn.Linear layers and imports nothing from the kernels."""
    import inspect

    from tinyinfer import model as model_py

    source = inspect.getsource(model_py)
    imports = [line.strip() for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert imports == ["from __future__ import annotations", "from typing import Protocol", "import torch",
                       "import torch.nn.functional as F", "from torch import nn", "from .config import ModelConfig"]
    assert "cpu_linear" not in source and "_tinyinfer_packed" not in source


@needs_packing
@pytest.mark.parametrize("dtype", cpu_linear.PACKED_DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (3, 5)])
def test_packed_equals_f_linear(dtype, shape):
    model = _model(dtype)
    layer = model[0]
    assert type(layer) is PackedLinear and layer.packed_weight is not None
    x = torch.randn(*shape, 80, dtype=dtype)
    got, want = layer(x), F.linear(x, layer.weight)
    assert got.shape == want.shape and got.dtype == want.dtype
    # Both accumulate in fp32; only the order of the additions may differ.
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * float(want.abs().max()))


def _without_bf16_units(monkeypatch):
    """Make this CPU look like one without bf16 units (an AVX2 laptop), whatever it has."""
    monkeypatch.setattr(cpu_linear, "PACKED_DTYPES", (torch.float32,))
    monkeypatch.setattr(cpu_linear, "UPCAST_DTYPES", (torch.bfloat16,))


def test_bf16_without_bf16_units_multiplies_several_rows_in_fp32(monkeypatch):
    """No bf16 units (forced here, so it runs on every CPU): a prompt's rows go
    through one fp32 product (same numbers as bf16 F.linear up to the order of
    additions), a decode row stays bf16."""
    _without_bf16_units(monkeypatch)
    layer = _model(torch.bfloat16)[0]
    assert type(layer) is PackedLinear and layer.packed_weight is None
    rows = torch.randn(cpu_linear.UPCAST_MIN_ROWS + 3, 80, dtype=torch.bfloat16)
    got = layer(rows)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, F.linear(rows.float(), layer.weight.float()).bfloat16())  # the fp32 path ran
    want = F.linear(rows, layer.weight)
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2 * float(want.abs().max()))
    one = rows[:1]
    assert torch.equal(layer(one), F.linear(one, layer.weight))  # decode: bf16 as it was


def test_the_fp32_path_converts_a_large_weight_in_blocks_with_the_same_numbers():
    """upcast_linear converts UPCAST_BLOCK output rows at a time (the LM head
    converted whole costs page faults, not arithmetic); a short last block too."""
    rows = cpu_linear.UPCAST_BLOCK * 2 + 37
    weight = torch.randn(rows, 64).bfloat16()
    x = torch.randn(5, 64).bfloat16()
    got = cpu_linear.upcast_linear(x, weight)
    assert got.shape == (5, rows) and got.dtype == torch.bfloat16
    # bf16 tolerances: a last-bit rounding may differ by CPU
    torch.testing.assert_close(got, F.linear(x.float(), weight.float()).bfloat16())


@needs_packing
def test_the_kernel_reads_the_layout_not_the_weight():
    """Proof that the packed path runs: zero the layout's source behind its back."""
    layer = _model()[0]
    x = torch.randn(2, 80)
    want = F.linear(x, layer.weight)
    layer.weight.data.zero_()  # through .data: invisible to the version counter (rule 4)
    torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)  # still the old weights
    repack(layer)
    assert layer(x).abs().max() == 0


@needs_packing
def test_a_data_edit_then_repack_changes_the_output():
    model = _model()
    x = torch.randn(3, 80)
    before = model(x)
    model[0].weight.data.mul_(2)
    torch.testing.assert_close(model(x), before)  # documented: the kernel keeps the old layout
    repack(model)
    torch.testing.assert_close(model(x), 2 * before, rtol=1e-5, atol=1e-5)


@needs_packing
def test_an_in_place_edit_is_refused_until_repack():
    model = _model()
    x = torch.randn(3, 80)
    before = model(x)
    with torch.no_grad():
        model[0].weight.mul_(2)  # bumps the weight's version counter
    with pytest.raises(RuntimeError, match=r"PackedLinear: .*changed in place.*repack"):
        check_layouts(model)  # what the engine runs before each step (prepare.PreparedModel.check_current)
    repack(model)
    check_layouts(model)
    torch.testing.assert_close(model(x), 2 * before, rtol=1e-5, atol=1e-5)


@needs_packing
def test_load_state_dict_repacks():
    model = _model()
    x = torch.randn(2, 80)
    other = {k: 3 * v for k, v in model.state_dict().items()}
    model.load_state_dict(other)
    torch.testing.assert_close(model(x), F.linear(F.linear(x, other["0.weight"]), other["1.weight"]),
                               rtol=1e-4, atol=1e-4)


@needs_packing
def test_an_input_that_needs_a_gradient_gets_one():
    """Frozen weights, an input that wants a gradient (a saliency map): the plain
    path runs, and the gradient equals the unpacked model's."""
    model = _model()
    plain = nn.Sequential(nn.Linear(80, 96, bias=False), nn.Linear(96, 80, bias=False))
    plain.load_state_dict(model.state_dict())
    x = torch.randn(2, 80, requires_grad=True)
    model(x).square().sum().backward()
    x2 = x.detach().clone().requires_grad_(True)
    plain(x2).square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


@needs_packing
def test_trainable_weights_get_their_gradients():
    model = pack_for_cpu(nn.Sequential(nn.Linear(80, 96, bias=False)))  # requires_grad, as after construction
    x = torch.randn(2, 80)
    model(x).sum().backward()
    torch.testing.assert_close(model[0].weight.grad, x.sum(0).expand(96, 80))


@needs_packing
def test_unpackable_layers_are_left_plain():
    with_bias = pack_for_cpu(nn.Sequential(nn.Linear(80, 96)))
    assert type(with_bias[0]) is nn.Linear  # oneDNN's packed path here takes no bias
    half = pack_for_cpu(nn.Sequential(nn.Linear(80, 96, bias=False).half()))
    assert type(half[0]) is nn.Linear


@needs_packing
def test_names_and_tied_weights_survive_the_pass(llm):
    model = llm.model
    assert type(model.model.layers[0].self_attn.qkv_proj) is PackedLinear
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still one tensor
    assert not any("packed" in k for k in model.state_dict())  # state_dict: weights only


@needs_packing
def test_save_load_and_deepcopy_carry_weights_not_layouts():
    model = _model()
    x = torch.randn(2, 80)
    want = model(x)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    assert list(torch.load(io.BytesIO(buf.getvalue()))) == ["0.weight", "1.weight"]
    buf = io.BytesIO()
    torch.save(model, buf)  # the whole module: pickled without its layout, rebuilt on load
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert loaded[0].packed_weight is not None
    torch.testing.assert_close(loaded(x), want)
    twin = copy.deepcopy(model)
    assert twin[0].packed_weight is not None and twin[0].packed_weight is not model[0].packed_weight
    torch.testing.assert_close(twin(x), want)


@needs_packing
def test_a_move_or_cast_keeps_no_stale_copy():
    """module.to(...) makes the layout again for the new weights, or drops it
    where no kernel serves them (a move to a GPU works the same way)."""
    model = _model()
    x = torch.randn(2, 80)
    model.to(torch.float16)  # no packed fp16 kernel: the layout is dropped, not kept beside the weight
    assert model[0].packed_weight is None and model[0].weight.dtype == torch.float16
    model.to(torch.float32)
    assert model[0].packed_weight is not None
    torch.testing.assert_close(model(x), F.linear(F.linear(x, model[0].weight), model[1].weight))
    model.to("meta")  # stands in for another device: nothing stays on the host
    assert model[0].packed_weight is None


@needs_packing
def test_the_operator_traces_under_torch_compile():
    """The custom operator's fake implementation gives torch.compile the output
    shape, so the packed kernel runs inside a compiled graph (eager backend: no C++ compiler needed)."""
    layer = _model()[0]
    x = torch.randn(3, 4, 80)
    with torch.no_grad():
        compiled = torch.compile(layer, backend="eager", fullgraph=True)
        torch.testing.assert_close(compiled(x), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [Int8Linear, Int4Linear])
def test_quantized_layers_follow_the_same_rule(cls):
    """Int8Linear and Int4Linear keep their kernel layouts the same way: built
    when made, not saved, refused after an in-place edit, rebuilt by repack."""
    kind = "int8" if cls is Int8Linear else "int4"
    if not kernel_available(kind, "cpu", torch.float32):
        pytest.skip(f"torch has no {kind} packed kernel here")
    w = torch.randn(48, 256, generator=torch.Generator().manual_seed(0))
    layer = cls.from_weight(w)
    assert layer.has_layout()
    assert set(layer.state_dict()) == ({"weight", "scales"} if kind == "int8" else {"weight", "scales", "zeros"})
    x = torch.randn(2, 256)
    want = layer(x)
    torch.testing.assert_close(copy.deepcopy(layer)(x), want)
    with torch.no_grad():  # w = scale * q (+ zero): doubling them doubles w
        layer.scales.mul_(2)
        if kind == "int4":
            layer.zeros.mul_(2)
    with pytest.raises(RuntimeError, match="repack"):
        check_layouts(layer)
    repack(layer)
    torch.testing.assert_close(layer(x), 2 * want, rtol=1e-3, atol=1e-3)


@needs_packing
def test_pack_for_cpu_makes_each_layout_once(monkeypatch):
    """Every weight is packed once by pack_for_cpu (twice doubled LLM()'s load
    time), quantized layers keep the layout they were made with, and a layer
    whose weight was edited in place since is packed again."""
    calls = []
    pack = cpu_linear.pack_weight
    monkeypatch.setattr(cpu_linear, "pack_weight", lambda w: calls.append(w.shape) or pack(w))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(80, 96, bias=False), nn.Linear(96, 80, bias=False),
                          Int8Linear.from_weight(torch.randn(64, 80))).requires_grad_(False)
    made = model[2].kernel_scales
    pack_for_cpu(model)
    assert calls == [(96, 80), (80, 96)]
    assert model[2].kernel_scales is made  # built by from_weight for this dtype: kept
    model[0].weight.mul_(2)  # an in-place edit: its layout is stale now
    pack_for_cpu(model)
    assert calls == [(96, 80), (80, 96), (96, 80)]
    assert torch.allclose(model[0](torch.ones(1, 80)), F.linear(torch.ones(1, 80), model[0].weight), atol=1e-4)


@pytest.mark.slow
def test_loading_the_model_does_not_import_torch_compile(tiny_dir):
    """LLM() builds its skeleton on the meta device; torch's reference kernels
    for meta tensors import torch._dynamo (seconds) on first use, which the
    loader avoids: a notebook or server that never compiles never pays for it."""
    import subprocess
    import sys

    code = ("import sys; from tinyinfer import LLM, SamplingParams; "
            f"llm = LLM({str(tiny_dir)!r}, dtype='float32', device='cpu'); "
            "llm.generate(['Hello'], SamplingParams(max_tokens=2, temperature=0)); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_skipping_the_embeddings_init_touches_no_other_thread():
    """The skeleton's nn.Embedding skips its random init through a process-wide
    swap: another thread's embedding, made meanwhile, must still be initialised,
    and torch's own method must come back, however the builds interleave."""
    import threading

    from tinyinfer import weights

    original = nn.Embedding.reset_parameters
    made = {}
    with weights._embedding_init_skipped():
        other = threading.Thread(target=lambda: made.setdefault("other", nn.Embedding(1000, 8)))
        other.start()
        other.join()

    def build():
        with weights._embedding_init_skipped():
            nn.Embedding(10, 4, device="meta")

    builds = [threading.Thread(target=build) for _ in range(4)]  # skeletons built at the same time
    for b in builds:
        b.start()
    for b in builds:
        b.join()
    assert nn.Embedding.reset_parameters is original
    assert 0.8 < made["other"].weight.std().item() < 1.2  # N(0, 1): its init ran


def test_no_forward_in_the_kernel_layer_checks_freshness(monkeypatch):
    """Rule 4 is checked once per step, by the engine, not inside 121 forward calls
    (a packed linear's forward is one decision and one call)."""
    def refuse(self):
        raise AssertionError(f"{type(self).__name__}.forward called check_layout")

    monkeypatch.setattr(cpu_linear.PackedModule, "check_layout", refuse)
    x32, x16 = torch.randn(1, 128), torch.randn(5, 128).bfloat16()
    layers = [pack_for_cpu(nn.Sequential(nn.Linear(128, 64, bias=False)))[0]]
    layers += [pack_for_cpu(nn.Sequential(nn.Linear(128, 64, bias=False).bfloat16()))[0]]
    w = torch.randn(64, 128)
    layers += [Int8Linear.from_weight(w), Int4Linear.from_weight(w, 32)]
    with torch.inference_mode():
        for layer in layers:
            for x in (x32, x16):
                layer(x.to(layer.weight.dtype) if layer.weight.is_floating_point() else x)
