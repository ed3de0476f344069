"""ModelConfig: the one place that says what shape the model has.

Every other module reads its sizes from here, never from a Hugging Face object,
so a learner can see in one screen what defines a Llama-style decoder.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int  # width of the residual stream ("d_model")
    intermediate_size: int  # width of the SwiGLU feed-forward block
    num_hidden_layers: int
    num_attention_heads: int  # query heads
    num_key_value_heads: int  # < num_attention_heads means grouped-query attention
    head_dim: int
    max_position_embeddings: int  # the context window
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def eos_token_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return self.eos_token_id if isinstance(self.eos_token_id, list) else [self.eos_token_id]

    @classmethod
    def from_hf_dict(cls, d: dict) -> "ModelConfig":
        """Read a Hugging Face Llama-style config.json (4.x or 5.x layout)."""
        if d.get("model_type") not in (None, "llama", "mistral", "qwen2"):
            raise ValueError(f"model_type {d.get('model_type')!r} is not a Llama-style decoder")
        # transformers 5.x keeps rope settings in rope_parameters; 4.x at the top level.
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"rope_type {rope_type!r} is not supported (only 'default')")
        if d.get("attention_bias") or d.get("mlp_bias"):
            raise ValueError("biases in attention or MLP are not supported")
        heads = d["num_attention_heads"]
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            rms_norm_eps=d.get("rms_norm_eps", 1e-5),
            rope_theta=rope.get("rope_theta", d.get("rope_theta", 10000.0)),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id"),
        )

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        return cls.from_hf_dict(json.loads(Path(path).read_text()))

    def num_parameters(self) -> int:
        """Parameter count from the shapes alone (embedding counted once if tied)."""
        h, i, L = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return embed + L * per_layer + h + head

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
