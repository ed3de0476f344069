"""A Llama-style decoder in plain PyTorch: embedding, RMSNorm, RoPE,
grouped-query attention, SwiGLU, and a (possibly tied) LM head.

Module and parameter names copy Hugging Face's `LlamaForCausalLM`
(`model.layers.0.self_attn.o_proj.weight`, ...), so a learner can hold this file
next to transformers' and compare. Two differences, both from vLLM: q/k/v_proj
are stacked into `qkv_proj`, and gate/up_proj into `gate_up_proj` (weights.py
stacks the checkpoint's tensors while loading). Everything is written from scratch.

Shapes, used in every comment below:
  B batch, T new tokens this step, S cached positions visible to attention,
  H query heads, Hkv key/value heads, D head_dim, C hidden_size.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import cpu_linear
from .config import ModelConfig
from .kv_cache import KVCache


class RMSNorm(nn.Module):
    """x / rms(x) * weight. Computed in fp32 even for bf16 models, because the
    mean of squares is exactly where low precision loses digits."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()  # no copy when x is already fp32
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if x.dtype == torch.float32:
            return h * self.weight
        return self.weight * h.to(x.dtype)  # rounded to x.dtype first, as transformers does


class Linear(nn.Linear):
    """nn.Linear, except on a CPU: there the weight is packed once for oneDNN's
    fast kernels and every call reads the packed copy (cpu_linear.py explains
    why, and measures it). Same product, same dtype, read faster."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if cpu_linear.use_packed(x, self.weight, self.bias):
            if torch.compiler.is_compiling():  # one opaque kernel inside the compiled graph
                return torch.ops.tinyinfer.linear(x, self.weight)
            return cpu_linear.linear_packed(x, self.weight)  # eager: skip the operator's dispatch
        return super().forward(x)


def rope_tables(config: ModelConfig, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for every position up to the context window, shape [P, D].

    Pair i of each head is rotated by angle position * theta**(-2i/D): low pairs
    spin fast (fine position), high pairs slowly (coarse position)."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
    positions = torch.arange(config.max_position_embeddings, device=device).float()
    angles = torch.outer(positions, inv_freq)  # [P, D/2]
    angles = torch.cat([angles, angles], dim=-1)  # [P, D]: HF's "rotate half" layout
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate query or key vectors x [..., D] by their positions' angles.

    cos and sin [..., D] must broadcast against x: e.g. x [B, T, heads, D] with
    cos [B, T, 1, D] (the engine's layout), or x [heads, T, D] with cos [T, D]."""
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        c, d = config.hidden_size, config.head_dim
        # GQA: fewer key/value heads than query heads; each K/V head serves a group
        # of query heads. Fewer K/V heads means a proportionally smaller KV cache.
        self.q_size, self.kv_size = self.num_heads * d, self.num_kv_heads * d
        # Q, K and V projections stacked into one matrix (as vLLM does): one
        # matmul reads the same bytes as three but pays the per-call cost once.
        self.qkv_proj = Linear(c, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = Linear(self.q_size, c, bias=False)

    def forward(self, x, cos, sin, cache: KVCache, meta: AttentionMetadata):
        B, T, _ = x.shape
        H, Hkv = self.num_heads, self.num_kv_heads
        # [B, T, H + 2*Hkv, D]: every token's query heads, then key heads, then
        # value heads. Kept token-major, the layout the projection produces and
        # the paged cache stores, so nothing is reshuffled on the way there.
        qkv = self.qkv_proj(x).view(B, T, H + 2 * Hkv, self.head_dim)
        # Queries and keys sit side by side, so one RoPE call rotates both.
        qk = apply_rope(qkv[:, :, : H + Hkv], cos, sin)
        q, k = qk.split([H, Hkv], dim=2)  # [B, T, H, D], [B, T, Hkv, D]
        v = qkv[:, :, H + Hkv :]
        # Store this step's keys and values, then attend over everything cached so
        # far. Old positions are never recomputed: that is the whole point of the cache.
        # The cache does both (kv_cache.KVCache or paged_kv_cache.PagedKVCache).
        out = cache.attend(self.layer_idx, q, k, v, meta)  # [B, T, H*D]
        return self.o_proj(out)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), applied to each position on its own.
    The gate and up projections are stacked into one matrix, one matmul."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        c, i = config.hidden_size, config.intermediate_size
        self.gate_up_proj = Linear(c, 2 * i, bias=False)
        self.down_proj = Linear(i, c, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, cache, meta):
        # Pre-norm residual blocks: each sublayer adds a correction to the stream.
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        cos, sin = rope_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                meta: AttentionMetadata | None = None, num_layers: int | None = None) -> torch.Tensor:
        """Run T new tokens per sequence through the stack; return hidden states [B, T, C].

        `positions` [B, T] are absolute positions; sequences in a batch may sit at
        different positions (prompts of unequal length, right-padded). `meta`
        lets the caller, who knows the positions as plain ints, pick cheaper
        attention paths; without it the general masked path is used.
        num_layers stops after the first num_layers layers, then applies the final
        norm: speculative decoding's early-exit draft (speculative/drafts.py)."""
        if meta is None:
            meta = AttentionMetadata.general(positions, cache)
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rope_at(positions, x.dtype)
        layers = self.model.layers if num_layers is None else self.model.layers[:num_layers]
        for layer in layers:
            x = layer(x, cos, sin, cache, meta)
        return self.model.norm(x)

    def rope_at(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [B, T, 1, D] for positions [B, T], shared by every layer and head.
        The tables are fp32; they are cast to the model dtype, as transformers does."""
        return self.rope_cos[positions].unsqueeze(2).to(dtype), self.rope_sin[positions].unsqueeze(2).to(dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Scores for every vocabulary entry, in fp32 so sampling sees full precision."""
        return self.lm_head(hidden).float()


@dataclass
class AttentionMetadata:
    """What every layer's attention needs to know about this step (vLLM's name).

    The general case is a boolean mask by absolute position. Two common cases
    need no mask tensor at all, which saves work in every layer:
      - a prefill from position 0: plain causal attention (is_causal);
      - all sequences at the same position: each query may see every visible key.
    When all sequences write the same positions, `start` lets the cache write a
    slice instead of scattering."""

    positions: torch.Tensor  # [B, T]
    num_keys: int  # S: cache columns visible to this step
    mask: torch.Tensor | None = None  # [B, 1, T, S] boolean, or None
    is_causal: bool = False
    start: int | None = None  # first position written, if the same for every sequence

    @classmethod
    def general(cls, positions: torch.Tensor, cache: KVCache) -> "AttentionMetadata":
        num_keys = cache.visible_length(positions)
        return cls(positions, num_keys, mask=causal_mask(positions, num_keys))

    @classmethod
    def uniform(cls, positions: torch.Tensor, start: int) -> "AttentionMetadata":
        """Every sequence writes positions start..start+T-1."""
        T = positions.shape[1]
        return cls(positions, num_keys=start + T, is_causal=start == 0 and T > 1, start=start)


def causal_mask(positions: torch.Tensor, num_keys: int) -> torch.Tensor:
    """[B, 1, T, S] boolean: query at position p may see key positions 0..p only.

    Because every sequence's keys live at their absolute positions in the cache,
    "causal" is all the mask needs to say; slots past a sequence's end are never
    visible, since they lie in its future."""
    keys = torch.arange(num_keys, device=positions.device)
    return (keys[None, None, :] <= positions[:, :, None]).unsqueeze(1)
