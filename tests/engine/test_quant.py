"""tinyinfer.quant: round trips, packing, byte accounting, kernels, whole models."""
import pytest
import torch

from tinyinfer.quant import (
    Int4Linear, Int8Linear, Int8LMHead, dequantize_int4, dequantize_int8, formula_bytes, ideal_bytes, kernel_available,
    model_bytes, pack_int4, quantize_int4, quantize_int8, quantize_model, set_use_kernel, unpack_int4,
)


def weights(out=48, inp=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=g) * 0.05
    w[3] *= 40  # one row with a much larger range than the others
    w[5, :32] += 1.0  # one group shifted far from zero: asymmetry matters there
    return w


def test_int8_round_trip_error_is_at_most_half_a_step_per_row():
    w = weights()
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (w.shape[0],)
    assert q.abs().max() <= 127
    err = (dequantize_int8(q, scale) - w).abs().amax(dim=1)
    assert torch.all(err <= scale / 2 * (1 + 1e-5))
    assert torch.equal(q.abs().amax(dim=1), torch.full((w.shape[0],), 127, dtype=torch.int8))  # full range used


def test_int8_handles_an_all_zero_row():
    w = weights()
    w[0] = 0
    q, scale = quantize_int8(w)
    assert torch.isfinite(scale).all() and torch.equal(dequantize_int8(q, scale)[0], torch.zeros(w.shape[1]))


def test_pack_and_unpack_are_inverse():
    codes = torch.randint(0, 16, (7, 64), dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (7, 32)
    assert torch.equal(unpack_int4(packed), codes)
    assert packed[0, 0] == codes[0, 0] | (codes[0, 1] << 4)  # low nibble first


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_round_trip_error_is_at_most_half_a_step_per_group(group_size):
    w = weights()
    packed, scales, zeros = quantize_int4(w, group_size)
    assert packed.shape == (w.shape[0], w.shape[1] // 2) and packed.dtype == torch.uint8
    assert scales.shape == zeros.shape == (w.shape[0], w.shape[1] // group_size)
    codes = unpack_int4(packed)
    assert int(codes.min()) >= 0 and int(codes.max()) <= 15
    err = (dequantize_int4(packed, scales, zeros, group_size) - w).abs()
    err = err.reshape(w.shape[0], -1, group_size).amax(-1)
    assert torch.all(err <= scales.float() / 2 * (1 + 1e-3) + 1e-7)


def test_int4_reproduces_a_4bit_grid_exactly_when_groups_align():
    # Weights that already lie on a Q4_1-like grid (16 levels per 32 weights,
    # fp16 scale and minimum) come back unchanged from INT4 with group size 32.
    g = torch.Generator().manual_seed(1)
    d = (torch.rand(8, 4, 1, generator=g) * 0.01 + 0.001).half().float()
    m = (-torch.rand(8, 4, 1, generator=g) * 0.05).half().float()
    q = torch.randint(0, 16, (8, 4, 32), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15  # each block uses its whole range, as Q4_1's do
    w = (q * d + m).reshape(8, 128)
    out = dequantize_int4(*quantize_int4(w, 32), 32)
    assert (out - w).abs().max() < 1e-6
    assert (dequantize_int4(*quantize_int4(w, 128), 128) - w).abs().max() > 1e-4  # mixed blocks: not exact


def test_a_short_last_group_gets_its_own_scale():
    # SmolLM2's hidden size 576 is 4.5 groups of 128.
    w = weights(inp=576)
    packed, scales, zeros = quantize_int4(w, 128)
    assert packed.shape == (48, 288) and scales.shape == (48, 5)
    err = (dequantize_int4(packed, scales, zeros, 128) - w).abs()
    assert torch.all(err[:, 512:].amax(1) <= scales[:, 4].float() / 2 * (1 + 1e-3) + 1e-7)
    last = w[:, 512:]
    assert torch.allclose(zeros[:, 4].float(), last.amin(1), atol=1e-3, rtol=1e-3)  # stats of the 64 real columns


def test_odd_input_dimension_is_rejected():
    with pytest.raises(ValueError, match="must be even"):
        quantize_int4(torch.zeros(4, 63), 32)


def require_kernel(kind, dtype):
    """Skip where this torch build has no packed kernel; FAIL where it has one that crashes."""
    from tinyinfer.quant import kernel_error

    if not kernel_available(kind, "cpu", dtype):
        error = kernel_error(kind, "cpu", dtype)
        if error is not None:
            pytest.fail(f"the {kind} packed kernel exists but failed: {error}")
        pytest.skip(f"torch has no {kind} packed kernel here")


def test_a_crashing_packed_kernel_fails_instead_of_skipping(monkeypatch):
    from tinyinfer import quant

    def crash(self, x):
        raise RuntimeError("a bug in the kernel path")

    monkeypatch.setattr(quant, "_KERNEL_OK", {})
    monkeypatch.setattr(quant, "_KERNEL_ERRORS", {})
    monkeypatch.setattr(Int8Linear, "_kernel_forward", crash)
    with pytest.raises(pytest.fail.Exception, match="exists but failed: RuntimeError: a bug in the kernel path"):
        require_kernel("int8", torch.float32)
    assert not quant.kernel_available("int8", "cpu", torch.float32)  # generation still falls back


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_kernel_equals_reference_path(dtype):
    require_kernel("int8", dtype)
    layer = Int8Linear.from_weight(weights())
    x = torch.randn(5, 256).to(dtype)
    fast = layer(x)
    layer.use_kernel = False
    ref = layer(x)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(fast.float(), ref.float(), rtol=tol, atol=tol * float(ref.abs().max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group_size,inp", [(32, 256), (128, 256), (128, 576)])
def test_int4_kernel_equals_reference_path(dtype, group_size, inp):
    require_kernel("int4", dtype)
    layer = Int4Linear.from_weight(weights(inp=inp), group_size, use_kernel=True)
    x = torch.randn(3, 1, inp).to(dtype)
    fast = layer(x)
    layer.use_kernel = False
    ref = layer(x)
    assert fast.shape == ref.shape == (3, 1, 48)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(fast.float(), ref.float(), rtol=tol, atol=tol * float(ref.abs().max()))


def test_int4_rows_the_kernel_cannot_pack_take_the_reference_path():
    """torch's int4 packing takes output rows in blocks of 16: a 10-row layer
    (a lab's small example) builds no kernel layout and still computes."""
    w = weights(out=10, inp=64)
    layer = Int4Linear.from_weight(w, 32)
    assert not layer.has_layout()
    x = torch.randn(2, 64)
    want = x @ dequantize_int4(layer.weight, layer.scales, layer.zeros, 32, torch.float32).T
    torch.testing.assert_close(layer(x), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_lm_head_one_row_through_the_kernel_more_through_the_dense_copy(monkeypatch, dtype):
    """Int8LMHead: one sequence's row takes the INT8 kernel; a batch takes the
    de-quantized copy of the same weights. Both give the reference path's
    numbers (de-quantize, then multiply), so a row's logits do not depend on
    how many rows share its step beyond rounding."""
    require_kernel("int8", dtype)
    w = weights(out=96, inp=64).to(dtype)
    head = Int8LMHead.from_weight(w)
    calls = []
    kernel = Int8LMHead._kernel_forward
    monkeypatch.setattr(Int8LMHead, "_kernel_forward", lambda self, x: calls.append(len(x)) or kernel(self, x))
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3)).to(dtype)
    alone = torch.cat([head(x[i:i + 1]) for i in range(5)])
    assert calls == [1] * 5  # each single row went through the kernel
    batch = head(x)
    assert calls == [1] * 5  # the batch did not
    want = (x.float() @ dequantize_int8(head.weight, head.scales, dtype).float().T)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for got in (alone, batch):
        assert got.dtype == dtype and got.shape == (5, 96)
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * float(want.abs().max()))
    assert head.dense_weight is not None or head.packed_weight is not None  # the batch's copy is a layout ...
    assert set(head.state_dict()) == {"weight", "scales"}  # ... not a stored weight


def test_llm_lm_head_quantization_argument(tiny_dir):
    from tinyinfer import LLM, SamplingParams

    with pytest.raises(ValueError, match="lm_head_quantization='int4' is invalid: must be one of None, 'int8'"):
        LLM(tiny_dir, lm_head_quantization="int4")
    plain = LLM(tiny_dir, dtype="float32")
    llm = LLM(tiny_dir, dtype="float32", lm_head_quantization="int8")
    assert isinstance(llm.model.lm_head, Int8LMHead)
    assert type(llm.model.model.layers[0].mlp.down_proj) is not Int8Linear  # the head only
    assert llm.model.model.embed_tokens.weight.dtype == torch.float32  # the embedding keeps its table
    bytes_ = model_bytes(llm.model)
    assert bytes_["packed_weights"] == 49152 * 64 and bytes_["scales"] == 4 * 49152  # the INT8 copy, counted
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    prompts = ["The capital of France is", "def fibonacci(n):"]
    assert [len(o.outputs[0].token_ids) for o in llm.generate(prompts, params)] == [6, 6]  # a batch, and alone:
    assert len(llm.generate(prompts[0], params)[0].outputs[0].token_ids) == 6  # both of the head's paths run
    logits = {}
    for name, engine in (("int8", llm), ("plain", plain)):
        tok = torch.tensor([engine.get_tokenizer().encode(prompts[0])])
        with torch.no_grad():
            hidden = engine.model.model.embed_tokens(tok)[0, -1:]
            logits[name] = engine.model.lm_head(hidden).float()
    rel = (logits["int8"] - logits["plain"]).norm() / logits["plain"].norm()
    assert 0 < rel < 0.01  # quantized, and close


def test_quantized_linear_is_close_to_the_original():
    w = weights()
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(0))  # seeded: no dependence on test order
    ref = x @ w.T
    for layer, tol in [(Int8Linear.from_weight(w), 0.01), (Int4Linear.from_weight(w, 32), 0.15)]:
        rel = (layer(x) - ref).norm() / ref.norm()
        assert rel < tol, (type(layer).__name__, float(rel))


# ------------------------------------------------------------------ whole model


@pytest.fixture(scope="module")
def fresh_llm():
    """A model of our own to quantize (the shared `llm` fixture must stay fp32)."""
    from tinyinfer import LLM

    def make():
        return LLM("smollm2-135m-instruct", dtype="float32", device="cpu")

    return make


def test_bad_method_and_group_size_are_rejected(llm):
    with pytest.raises(ValueError, match=r"quantization='int3' is invalid: must be None or one of 'int8', 'int4'"):
        quantize_model(llm.model, "int3")
    with pytest.raises(ValueError, match=r"group_size=100 is invalid: must be one of 32, 64, 128"):
        quantize_model(llm.model, "int4", group_size=100)
    assert isinstance(llm.model.model.layers[0].mlp.down_proj, torch.nn.Linear)  # nothing was changed


@pytest.mark.slow
@pytest.mark.parametrize("method,group_size", [("int8", 128), ("int4", 32), ("int4", 128)])
def test_byte_accounting_equals_the_formula(fresh_llm, method, group_size):
    llm = fresh_llm()
    before = model_bytes(llm.model)
    quantize_model(llm.model, method, group_size)
    got = model_bytes(llm.model)
    want = formula_bytes(llm.model.config, method, group_size)
    for key in ("packed_weights", "scales", "zeros"):
        assert got[key] == want[key], key
    assert got["quantized_params"] == want["params"]
    bits = 8 if method == "int8" else 4
    assert got["packed_weights"] == ideal_bytes(want["params"], bits)
    # What stayed unquantized: the embedding (tied LM head counted once) and the norms.
    cfg = llm.model.config
    norms = (2 * cfg.num_hidden_layers + 1) * cfg.hidden_size
    assert got["unquantized"] == 4 * (cfg.vocab_size * cfg.hidden_size + norms)
    assert got["unquantized"] + 4 * want["params"] == before["total"]
    if method == "int4":  # <= half a byte per weight + 2 fp16 numbers per group
        assert got["packed_weights"] + got["scales"] + got["zeros"] == want["params"] / 2 + 4 * want["groups"]


@pytest.mark.slow
@pytest.mark.parametrize("method,group_size", [("int8", 128), ("int4", 32)])
def test_quantized_model_still_answers_sensibly(fresh_llm, method, group_size):
    from tinyinfer import SamplingParams

    llm = fresh_llm()
    quantize_model(llm.model, method, group_size)
    assert isinstance(llm.model.model.layers[7].self_attn.qkv_proj, Int8Linear if method == "int8" else Int4Linear)
    assert isinstance(llm.model.lm_head, torch.nn.Linear)  # left alone by default
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(max_tokens=12, temperature=0))
    assert "Paris" in out[0].outputs[0].text
    set_use_kernel(llm.model, False)  # the reference path gives the same greedy answer
    again = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                     SamplingParams(max_tokens=12, temperature=0))
    assert again[0].outputs[0].text == out[0].outputs[0].text


@pytest.mark.slow
def test_lm_head_option(fresh_llm):
    llm = fresh_llm()
    with pytest.raises(ValueError, match=r"lm_head='int3' is invalid: must be None or one of 'int8', 'int4'"):
        quantize_model(llm.model, "int8", lm_head="int3")
    assert isinstance(llm.model.model.layers[0].mlp.down_proj, torch.nn.Linear)  # refused before any swap
    quantize_model(llm.model, "int8", lm_head="int8")
    assert isinstance(llm.model.lm_head, Int8LMHead)
    assert isinstance(llm.model.model.embed_tokens, torch.nn.Embedding)  # still the fp32 table
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model(llm.model, "int8")


def test_llm_quantization_argument():
    from tinyinfer import LLM, SamplingParams

    with pytest.raises(ValueError, match="quantization='int3'.*'int8', 'int4'"):
        LLM(quantization="int3")
    with pytest.raises(ValueError, match="group_size=100.*32, 64, 128"):
        LLM(quantization="int4", group_size=100)
    llm = LLM(dtype="float32", device="cpu", quantization="int8")
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=4, temperature=0))[0]
    assert "Paris" in out.outputs[0].text


@pytest.mark.slow
def test_quantized_perplexity_is_bounded_against_fp32(fresh_llm):
    """Perplexity on the same 256 tokens of English, fp32 against each format.

    int4 with groups of 32 is (almost) lossless here, and that is not a bug: the
    packaged weights were distributed as GGUF Q4_1, i.e. 4-bit codes with a scale
    and a minimum per block of 32 weights, and de-quantized to fp32. Every group
    of 32 therefore holds at most 16 evenly spaced values, which asymmetric int4
    with groups of 32 represents again exactly (up to fp16 scales). Larger groups
    mix two Q4_1 blocks with different grids and do lose information."""
    from tinyinfer_course.analysis.eval import eval_text, perplexity

    base = fresh_llm()
    ids = base.tokenizer.encode(eval_text())[:256]
    fp32 = perplexity(base, ids)
    assert 5 < fp32 < 100  # plain English on this model (shuffled tokens give ~1000)
    ppl = {}
    for method, group in (("int8", 128), ("int4", 32), ("int4", 128)):
        llm = fresh_llm()
        quantize_model(llm.model, method, group)
        ppl[method, group] = perplexity(llm, ids)
    assert ppl["int4", 32] == pytest.approx(fp32, rel=2e-3)  # lossless: see the docstring
    assert ppl["int8", 128] == pytest.approx(fp32, rel=0.03)  # 8 bits per weight: within 3%
    assert fp32 * 1.05 < ppl["int4", 128] < fp32 * 2  # real loss, but bounded


@pytest.mark.parametrize("kind,dtype,limit", [("int4", torch.bfloat16, 64), ("int8", torch.bfloat16, 16),
                                              ("int4", torch.float32, 4), ("int8", torch.float32, 4)])
def test_the_packed_kernel_serves_up_to_its_row_limit(kind, dtype, limit):
    """Decode-sized batches take the packed kernel; one row more takes the
    reference path (each limit is where the kernel stopped winning: quant.KERNEL_MAX_ROWS)."""
    from tinyinfer import quant

    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0)).to(dtype)
    layer = Int4Linear.from_weight(w, group_size=32) if kind == "int4" else Int8Linear.from_weight(w)
    if not layer.has_layout():
        pytest.skip(f"torch has no packed {kind} kernel for {dtype} here")
    assert quant.KERNEL_MAX_ROWS[kind, dtype] == limit
    assert quant._kernel_serves(torch.zeros(limit, 128, dtype=dtype), layer)
    assert quant._kernel_serves(torch.zeros(2, limit // 2, 128, dtype=dtype), layer)  # rows, whatever the shape
    assert not quant._kernel_serves(torch.zeros(limit + 1, 128, dtype=dtype), layer)


def test_kernel_decisions_are_per_device_and_an_old_gpu_takes_the_reference_path(monkeypatch):
    """Each GPU gets its own decision (an A100 beside a T4), and torch's CUDA INT4
    kernel is ruled out before any probe where it cannot run: below compute
    capability 8.0 (a T4 is 7.5), or with fp16 activations. That is a missing
    kernel, not an error, so INT4 still runs there, on the reference path."""
    from tinyinfer import quant

    assert quant.device_key("cpu") == "cpu"
    assert quant.device_key("cuda:0") != quant.device_key("cuda:1")
    monkeypatch.setattr(quant, "_KERNEL_OK", {})
    monkeypatch.setattr(quant, "_KERNEL_ERRORS", {})
    capabilities = {0: (7, 5), 1: (9, 0)}  # a T4, and an H100
    monkeypatch.setattr(quant, "cuda_capability", lambda device: capabilities[torch.device(device).index])
    assert "compute capability 8.0" in quant.kernel_missing("int4", "cuda:0", torch.bfloat16)
    assert "bf16 activations, not float16" in quant.kernel_missing("int4", "cuda:1", torch.float16)
    assert quant.kernel_missing("int4", "cuda:1", torch.bfloat16) is None  # the probe decides
    assert quant.kernel_missing("int8", "cuda:0", torch.float16) is None
    # Decided without a probe (this CPU machine has no GPU to run one on):
    assert not quant.kernel_available("int4", "cuda:0", torch.bfloat16)
    assert not quant.kernel_available("int4", "cuda:1", torch.float16)
    assert quant.kernel_error("int4", "cuda:0", torch.bfloat16) is None  # missing is not a failure
    assert ("int4", "cuda:0", torch.bfloat16) in quant._KERNEL_OK
    assert ("int4", "cuda:1", torch.bfloat16) not in quant._KERNEL_OK


def test_a_kernel_with_wrong_numbers_is_not_used_and_generation_takes_the_reference_path(monkeypatch):
    """The probe compares the kernel with the reference path: a kernel that runs
    but computes wrong numbers (as tinygemm would on a GPU it was not built for)
    is refused and reported, and a quantized layer built afterwards takes the
    reference path, with the reference's result."""
    from tinyinfer import quant

    monkeypatch.setattr(quant, "_KERNEL_OK", {})
    monkeypatch.setattr(quant, "_KERNEL_ERRORS", {})
    real = Int4Linear._kernel_forward
    monkeypatch.setattr(Int4Linear, "_kernel_forward", lambda self, x: 2 * real(self, x))
    assert not quant.kernel_available("int4", "cpu", torch.bfloat16)
    assert "differs from the reference path" in quant.kernel_error("int4", "cpu", torch.bfloat16)
    layer = Int4Linear.from_weight(weights().to(torch.bfloat16), 32)
    assert not layer.has_layout()
    x = torch.randn(2, 256).to(torch.bfloat16)
    got = layer(x)
    layer.use_kernel = False
    assert torch.equal(got, layer(x))


def test_cuda_int4_packing_puts_the_even_column_in_the_high_nibble():
    """torch's CUDA INT4 kernel reads two codes a byte, the first in the high
    nibble (pack_int4's order reversed); and it groups the input dimension in
    tiles of 16, 2, 4 or 8 side by side."""
    from tinyinfer.quant import cuda_int4_bytes, inner_k_tiles

    codes = torch.tensor([[1, 2, 15, 0], [7, 8, 3, 9]])
    assert cuda_int4_bytes(codes).tolist() == [[0x12, 0xF0], [0x78, 0x39]]
    assert cuda_int4_bytes(codes).dtype == torch.uint8
    assert [inner_k_tiles(k) for k in (640, 576, 32 * 18, 96)] == [8, 4, 4, 2]
