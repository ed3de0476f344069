"""tinyinfer_course.notebook.inspect: what it captures is what the engine computed.

Each layer is recomputed by hand, from the captured input and the layer's own
weights, and must give the next captured input; the recomputed attention
probabilities, times V and through o_proj, must give the attention block's
real output."""
import math

import pytest
import torch
import torch.nn.functional as F

from tinyinfer_course.notebook.inspect import attention_weights, hidden_states, layer_inputs, token_ids
from tinyinfer.model import apply_rope

TEXT = "const user = getUser(); console.log(user.email);"


@pytest.fixture(scope="module")
def stream(llm):
    return layer_inputs(llm, TEXT)


@pytest.fixture(scope="module")
def probs(llm):
    return attention_weights(llm, TEXT)


def _qkv(model, layer, x):
    """q [H, T, D], k and v [Hkv, T, D] of one layer, from its input x [T, C]."""
    attn, T = layer.self_attn, x.shape[0]
    q, k, v = attn.qkv_proj(layer.input_layernorm(x)).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    q = q.view(T, -1, attn.head_dim).transpose(0, 1)
    k = k.view(T, -1, attn.head_dim).transpose(0, 1)
    v = v.view(T, -1, attn.head_dim).transpose(0, 1)
    cos, sin = model.rope_cos[:T], model.rope_sin[:T]
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def _recompute_layer(model, i, x):
    """Layer i by hand: x + attention(norm(x)), then + mlp(norm(.))."""
    layer = model.model.layers[i]
    q, k, v = _qkv(model, layer, x)
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, enable_gqa=True)[0]
    x = x + layer.self_attn.o_proj(out.transpose(0, 1).reshape(x.shape[0], -1))
    return x + layer.mlp(layer.post_attention_layernorm(x))


def test_layer_inputs_shapes(llm, stream):
    config = llm.model.config
    T = len(token_ids(llm, TEXT))
    assert len(stream) == config.num_hidden_layers + 1
    assert all(h.shape == (T, config.hidden_size) for h in stream)


@torch.no_grad()
@pytest.mark.parametrize("i", [0, 1, 14, 29])
def test_recomputing_a_layer_from_its_input_gives_the_next(llm, stream, i):
    got = _recompute_layer(llm.model, i, stream[i])
    scale = stream[i + 1].abs().max()  # the stream grows with depth; compare relative to it
    assert (got - stream[i + 1]).abs().max() <= 1e-5 * max(1.0, float(scale))


@torch.no_grad()
def test_final_norm_of_the_last_entry_is_the_output(llm, stream):
    assert torch.allclose(llm.model.model.norm(stream[-1]), hidden_states(llm, TEXT), atol=1e-5)


def test_hooks_are_removed(llm, stream, probs):
    for layer in llm.model.model.layers:
        assert not layer._forward_pre_hooks and not layer.input_layernorm._forward_hooks
    assert not llm.model.model.norm._forward_pre_hooks


def test_attention_rows_sum_to_one_and_ignore_the_future(llm, probs):
    config = llm.model.config
    T = len(token_ids(llm, TEXT))
    assert probs.shape == (config.num_hidden_layers, config.num_attention_heads, T, T)
    assert torch.allclose(probs.sum(-1), torch.ones(()), atol=1e-5)
    assert probs.triu(1).max() == 0.0  # exactly zero, not merely small
    assert probs.min() >= 0.0


def test_one_layer_equals_the_same_layer_from_all(llm, probs):
    assert torch.equal(attention_weights(llm, TEXT, 7), probs[7])


@torch.no_grad()
@pytest.mark.parametrize("i", [0, 14, 29])
def test_weights_times_values_give_the_attention_output(llm, stream, probs, i):
    """The probabilities are the ones the engine's fused kernel used: P @ V,
    through o_proj, equals the attention block's contribution to the stream."""
    model, layer = llm.model, llm.model.model.layers[i]
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    q, k, v = _qkv(model, layer, stream[i])
    out = probs[i] @ v.repeat_interleave(group, dim=0)  # [H, T, D]
    mine = layer.self_attn.o_proj(out.transpose(0, 1).reshape(q.shape[1], -1))
    engine = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, enable_gqa=True)[0]
    engine = layer.self_attn.o_proj(engine.transpose(0, 1).reshape(q.shape[1], -1))
    assert torch.allclose(mine, engine, atol=1e-5 * max(1.0, float(engine.abs().max())))
    # ... and the hand-made scores agree with softmax(q k^T / sqrt(D)) for one head.
    h = 4
    scores = q[h] @ k[h // group].T / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.allclose(scores.softmax(-1), probs[i, h], atol=1e-6)


def test_token_ids_accepts_ids(llm):
    assert token_ids(llm, [5, 6, 7]) == [5, 6, 7]
    assert token_ids(llm, TEXT) == llm.tokenizer.encode(TEXT)
