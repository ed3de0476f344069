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

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


class StepMetadata(Protocol):
    """What a cache's attention needs to know about one step. Each cache has its
    own kind (kv_cache.AttentionMetadata, paged_kv_cache.PagedAttentionMetadata);
    the model only passes it along."""

    positions: torch.Tensor  # absolute position of every new token


class KVCacheLike(Protocol):
    """The cache the model is handed: the contiguous kv_cache.KVCache, the paged
    paged_kv_cache.PagedKVCache, or lab 5's own. The model never looks inside it."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               meta: StepMetadata) -> torch.Tensor:
        """Store this step's k, v [B, T, Hkv, D]; attend q [B, T, H, D]; return [B, T, H*D]."""
        ...

    def visible_length(self, positions: torch.Tensor) -> int:
        """How many positions attention must read (used when no metadata is passed)."""
        ...


class RMSNorm(nn.Module):
    """x / rms(x) * weight. Computed in fp32 even for bf16 models, because the
    mean of squares is exactly where low precision loses digits."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda or x.dtype == torch.float32:
            # PyTorch's own RMSNorm: one fused kernel on a GPU, where the eight
            # small steps below would be eight launches. In fp32 on a CPU it runs
            # those very steps, bit for bit. (In bf16 it multiplies by the weight
            # before rounding, once: at most one unit in the last place from
            # transformers, whose rounding the lines below copy.)
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)  # rounded to x.dtype first, as transformers does


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


def swap_halves(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x2, x1], dim=-1)


def apply_rope_signed(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """apply_rope with rotate_half's minus sign moved into the table:
    rotate_half(x) * sin == swap_halves(x) * signed_sin, where signed_sin is sin
    negated in its first half (signed_rope_sin). The same numbers, bit for bit;
    the model's layers use it because the sign is then applied once, to the
    table, instead of once per layer and step (one GPU kernel fewer each)."""
    return x * cos + swap_halves(x) * signed_sin


def signed_rope_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin [..., D] with its first half negated: apply_rope_signed's table."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


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
        self.qkv_proj = nn.Linear(c, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, c, bias=False)

    def forward(self, x, cos, sin, cache: KVCacheLike, meta: StepMetadata):
        B, T, _ = x.shape
        H, Hkv = self.num_heads, self.num_kv_heads
        # [B, T, H + 2*Hkv, D]: every token's query heads, then key heads, then
        # value heads. Kept token-major, the layout the projection produces and
        # the paged cache stores, so nothing is reshuffled on the way there.
        qkv = self.qkv_proj(x).view(B, T, H + 2 * Hkv, self.head_dim)
        # Queries and keys sit side by side, so one RoPE call rotates both
        # (sin is the model's signed table: LlamaForCausalLM.rope_at).
        qk = apply_rope_signed(qkv[:, :, : H + Hkv], cos, sin)
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
        self.gate_up_proj = nn.Linear(c, 2 * i, bias=False)
        self.down_proj = nn.Linear(i, c, bias=False)

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
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # On the CPU even when the model is built on the meta device (weights.load_model):
        # arithmetic on meta tensors runs torch's Python reference kernels, whose first
        # use imports torch.compile's machinery (seconds). .to() moves them with the model.
        cos, sin = rope_tables(config, device="cpu")
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.register_buffer("rope_sin_signed", signed_rope_sin(sin), persistent=False)  # what the layers read

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCacheLike,
                meta: StepMetadata | None = None, num_layers: int | None = None) -> torch.Tensor:
        """Run T new tokens per sequence through the stack; return hidden states [B, T, C].

        `positions` [B, T] are absolute positions; sequences in a batch may sit at
        different positions (prompts of unequal length, right-padded). `meta`
        lets the caller, who knows the positions as plain ints, pick cheaper
        attention paths; without it the general masked path is used.
        num_layers stops after the first num_layers layers, then applies the final
        norm: speculative decoding's early-exit draft (tinyinfer_course/speculative/drafts.py)."""
        if meta is None:
            meta = general_metadata(positions, cache)
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rope_at(positions, x.dtype)
        layers = self.model.layers if num_layers is None else self.model.layers[:num_layers]
        for layer in layers:
            x = layer(x, cos, sin, cache, meta)
        return self.model.norm(x)

    def rope_at(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and the signed sin (apply_rope_signed) [B, T, 1, D] for positions
        [B, T], shared by every layer and head. The tables are fp32; they are cast
        to the model dtype, as transformers does."""
        cos, sin = self.rope_cos[positions], self.rope_sin_signed[positions]
        return cos.unsqueeze(2).to(dtype), sin.unsqueeze(2).to(dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Scores for every vocabulary entry, in fp32 so sampling sees full precision."""
        return self.lm_head(hidden).float()


def general_metadata(positions: torch.Tensor, cache: KVCacheLike) -> StepMetadata:
    """The general case, for callers that pass no metadata: a mask by position,
    sized by the cache's visible_length. (kv_cache.py defines the metadata, next
    to the cache that reads it; it is imported here, not at the top, so that this
    file depends on nothing but torch and the config.)"""
    from .kv_cache import AttentionMetadata

    return AttentionMetadata.general(positions, cache)
