"""The packed CPU linear (cpu_linear.py): the same product as F.linear, remade
when the weight changes, and never used where it cannot serve."""
import pytest
import torch
import torch.nn.functional as F

from tinyinfer import cpu_linear
from tinyinfer.model import Linear

needs_packing = pytest.mark.skipif(not cpu_linear.PACKED_DTYPES, reason="PyTorch built without oneDNN")


def _linear(dtype, out_features=96, in_features=80):
    torch.manual_seed(0)
    layer = Linear(in_features, out_features, bias=False).to(dtype)
    layer.weight.requires_grad_(False)
    return layer


@needs_packing
@pytest.mark.parametrize("dtype", cpu_linear.PACKED_DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (3, 5)])
def test_packed_equals_f_linear(dtype, shape):
    layer = _linear(dtype)
    x = torch.randn(*shape, 80, dtype=dtype)
    assert cpu_linear.use_packed(x, layer.weight, None)
    got, want = layer(x), F.linear(x, layer.weight)
    assert got.shape == want.shape and got.dtype == want.dtype
    # Both accumulate in fp32; only the order of the additions may differ.
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    assert hasattr(layer.weight, "_tinyinfer_packed")  # the packed path really ran


@needs_packing
def test_a_changed_weight_is_packed_again():
    layer = _linear(torch.float32)
    x = torch.randn(2, 80)
    before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)  # in place: same memory, new version
    torch.testing.assert_close(layer(x), 2 * before, rtol=1e-5, atol=1e-5)
    layer.weight.data = torch.randn(96, 80)  # new memory
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)


@needs_packing
def test_gradients_and_other_dtypes_take_the_plain_path():
    layer = Linear(80, 96, bias=False)  # requires_grad, as after construction
    x = torch.randn(2, 80)
    assert not cpu_linear.use_packed(x, layer.weight, None)
    layer(x).sum().backward()
    assert layer.weight.grad is not None
    with torch.no_grad():
        assert cpu_linear.use_packed(x, layer.weight, None)
    half = Linear(80, 96, bias=False).half()
    assert not cpu_linear.use_packed(torch.randn(2, 80).half(), half.weight, None)
    assert not cpu_linear.use_packed(x.double(), layer.weight.double(), None)


@needs_packing
def test_the_operator_traces_under_torch_compile():
    """The custom operator's fake implementation gives torch.compile the output
    shape, so the packed kernel runs inside a compiled graph (eager backend: no C++ compiler needed)."""
    layer = _linear(torch.float32)
    x = torch.randn(3, 4, 80)
    with torch.no_grad():
        compiled = torch.compile(layer, backend="eager", fullgraph=True)
        torch.testing.assert_close(compiled(x), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)


@needs_packing
def test_a_weight_made_in_inference_mode_takes_the_plain_path():
    with torch.inference_mode():
        layer = _linear(torch.float32)
        x = torch.randn(2, 80)
        assert layer.weight.is_inference()
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight))
        assert not hasattr(layer.weight, "_tinyinfer_packed")
        layer.weight.mul_(2)  # no version counter to see this: which is why it must not be packed
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight))


@needs_packing
def test_a_used_layer_can_still_be_saved_and_copied():
    import copy
    import io

    layer = _linear(torch.float32)
    x = torch.randn(2, 80)
    want = layer(x)  # packs
    buf = io.BytesIO()
    torch.save(layer, buf)  # the packed copy (not saveable) is left behind
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    torch.testing.assert_close(loaded(x), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(copy.deepcopy(layer)(x), want, rtol=1e-5, atol=1e-5)
