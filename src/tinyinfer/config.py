"""The two configs: what shape the model has (ModelConfig) and how the engine
runs it (EngineConfig).

Every other module reads its sizes from ModelConfig, never from a Hugging Face
object, so a learner can see in one screen what defines a Llama-style decoder.
EngineConfig holds every engine setting with its default and its check, and
builds the command-line flags of `tinyinfer generate/chat/serve` (as vLLM's
EngineArgs does), so a default is written exactly once.
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from .checks import check_choice, check_int, is_int, is_number, require

if TYPE_CHECKING:
    import torch

DEFAULT_MODEL = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """Where packaged models and measured choices are kept: $TINYINFER_HOME, else ~/.cache/tinyinfer."""
    return Path(os.environ.get("TINYINFER_HOME") or Path.home() / ".cache" / "tinyinfer")


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

    def kv_bytes_per_token(self, bytes_per_value: float) -> float:
        """What one token adds to the KV cache (see kv_bytes_per_token below)."""
        return kv_bytes_per_token(self, bytes_per_value)


def kv_bytes_per_token(shape, bytes_per_value: float = 2) -> float:
    """Bytes the KV cache holds for one token of one sequence: a key and a value
    vector of `head_dim` numbers per KV head, in every layer. `shape` is a
    ModelConfig or anything with its three fields (memory.KVShape). Query heads
    do not appear: with grouped-query attention several share one KV head, and
    only KV heads are cached. The one home of this formula: the engine sizes its
    pool with it, hardware and memory compute with it."""
    return 2 * shape.num_hidden_layers * shape.num_key_value_heads * shape.head_dim * bytes_per_value


# --- the engine's settings ------------------------------------------------------------


# Weight-only quantization's choices. They live here, not in quant.py, so that
# checking a setting imports no kernel code: EngineConfig is checked before
# anything loads. quant.py reads them from here.
QUANT_METHODS = ("int8", "int4")
GROUP_SIZES = (32, 64, 128)
# The engine offers the head in INT8 only, the format llama.cpp reads this
# model's head in (Q8_0); quant.quantize_model(lm_head=...) also takes "int4".
LM_HEAD_QUANTIZATIONS = (None, "int8")


# The KV pool's storage (kv_quant.py): "auto", the model's dtype, or "int8" with
# one float32 scale per token and KV head. vLLM's option of the same name takes
# "auto", "fp8", ...
KV_CACHE_DTYPES = ("auto", "int8")
KV_SCALE_BYTES = 4  # one float32 scale per head_dim numbers, for K and for V


def kv_cache_bytes_per_value(kv_cache_dtype: str, dtype_bytes: float, head_dim: int) -> float:
    """Bytes the pool spends per cached number: the model's dtype_bytes with
    "auto"; with "int8", 1 byte plus a share of the vector's scale. Times
    kv_bytes_per_token's count of numbers, that is the pool's bytes per token,
    scales included (2 x layers x KV heads x (head_dim + 4) for int8)."""
    check_choice("kv_cache_dtype", kv_cache_dtype, KV_CACHE_DTYPES)
    return dtype_bytes if kv_cache_dtype == "auto" else 1 + KV_SCALE_BYTES / head_dim


def check_quantization(method, group_size) -> None:
    """Refuse a quantization method or group size, naming the field and its allowed values."""
    if method not in QUANT_METHODS:
        raise ValueError(f"quantization={method!r} is invalid: must be None or one of "
                         f"{', '.join(map(repr, QUANT_METHODS))}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size={group_size!r} is invalid: must be one of {', '.join(map(str, GROUP_SIZES))}")


def _opt(default, help: str, cli: bool = True):
    return field(default=default, metadata={"help": help, "cli": cli})


@dataclass
class EngineConfig:
    """Every LLMEngine setting (vLLM's names), checked before anything loads."""

    model: str = _opt(DEFAULT_MODEL, "a packaged model name, a local folder or a Hub id")
    dtype: str = _opt("auto", "auto (fp32 on CPU; on a GPU bf16, or fp16 below compute capability 8.0), "
                              "float32, bfloat16 or float16")
    device: str = _opt("auto", "auto, cpu, cuda or cuda:N")
    max_model_len: int | None = _opt(None, "context window (default: the model's)")
    max_num_seqs: int = _opt(16, "most sequences in one batch")
    max_num_batched_tokens: int = _opt(512, "most tokens in one step (the token budget)")
    block_size: int = _opt(16, "tokens per KV block")
    kv_cache_memory_bytes: int | None = _opt(None, "KV pool size in bytes (default: 512 MiB on CPU; on a GPU, "
                                                   "room for --max-num-seqs full windows twice over, within what "
                                                   "--gpu-memory-utilization leaves)")
    num_kv_blocks: int | None = _opt(None, "KV pool size in blocks (overrides --kv-cache-memory-bytes)")
    gpu_memory_utilization: float = _opt(0.9, "share of the GPU's memory the engine may use at most, weights, "
                                              "KV pool and a step's working memory together")
    enable_prefix_caching: bool = _opt(True, "reuse the KV blocks of a prompt prefix seen before")
    enable_chunked_prefill: bool = _opt(True, "cut a long prompt into chunks that fit the token budget")
    preemption_mode: str = _opt("recompute", "what a preempted sequence does with its cache: recompute or swap")
    scheduling: str = _opt("continuous", "continuous, or static (chapter 7's baseline)")
    seed: int | None = _opt(None, "seed torch's global random stream (unseeded requests draw from it)")
    quantization: str | None = _opt(None, "weight-only quantization: int8, int4 (default: none)")
    group_size: int = _opt(128, "weights per scale for int4")
    lm_head_quantization: str | None = _opt(None, "the LM head in int8, a copy beside the tied embedding (as GGUF "
                                                  "files keep it, in Q8_0): one sequence's decode step reads it in "
                                                  "1 byte per weight (default: the model's dtype)")
    kv_cache_dtype: str = _opt("auto", "the KV pool's storage: auto (the model's dtype) or int8 (one scale per "
                                       "token and KV head; about twice a bf16 pool's tokens in the same memory)")
    enforce_eager: bool = _opt(True, "--no-enforce-eager compiles decode steps with torch.compile (on a CUDA "
                                     "GPU: records them as CUDA graphs): faster steps, after a minute or two of "
                                     "compiling when the engine starts (seconds of recording on a GPU)")
    one_row_kernel: str = _opt("auto", "on a CPU, the kernel of one-row products (a batch-1 decode step): auto "
                                       "(the faster here, measured once per CPU), packed (oneDNN's layout) or plain "
                                       "(F.linear); TINYINFER_ONE_ROW_KERNEL overrides auto")
    compiled_cuda_graphs: bool = _opt(False, "with --no-enforce-eager on a CUDA GPU: torch.compile the decode "
                                             "step, then record the compiled step as CUDA graphs (gpt-fast's "
                                             "recipe): fewer, fused kernels per step, after a minute or two of "
                                             "compiling when the engine starts")

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            check_int(name, getattr(self, name), 1)
        for name in ("kv_cache_memory_bytes", "num_kv_blocks", "max_model_len"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1)
        require(is_number(self.gpu_memory_utilization) and 0 < self.gpu_memory_utilization <= 1,
                "gpu_memory_utilization", self.gpu_memory_utilization, "a number in (0, 1]")
        check_choice("dtype", self.dtype, ("auto", *DTYPE_NAMES))
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device={self.device!r} is invalid: must be 'auto', 'cpu' or 'cuda[:N]'")
        check_choice("preemption_mode", self.preemption_mode, ("recompute", "swap"))
        check_choice("scheduling", self.scheduling, ("continuous", "static"))
        for name in ("enable_prefix_caching", "enable_chunked_prefill", "enforce_eager", "compiled_cuda_graphs"):
            require(isinstance(getattr(self, name), bool), name, getattr(self, name), "True or False")
        require(self.seed is None or is_int(self.seed), "seed", self.seed, "None or an integer")
        if self.quantization is not None or self.group_size != 128:
            check_quantization(self.quantization or "int4", self.group_size)
        check_choice("lm_head_quantization", self.lm_head_quantization, LM_HEAD_QUANTIZATIONS)
        check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        check_choice("one_row_kernel", self.one_row_kernel, ("auto", "packed", "plain"))
        if self.kv_cache_dtype != "auto" and self.scheduling == "static":  # its contiguous cache has one format
            raise ValueError(f"kv_cache_dtype={self.kv_cache_dtype!r} is invalid with scheduling='static': the "
                             "quantized cache is the paged pool's; use scheduling='continuous'")
        if self.compiled_cuda_graphs and self.enforce_eager:
            raise ValueError("compiled_cuda_graphs=True is invalid with enforce_eager=True: it compiles the steps "
                             "that CUDA graphs record; set enforce_eager=False too")
        if not self.enforce_eager and self.scheduling == "static":  # the baseline stays as chapter 7 measures it
            raise ValueError("enforce_eager=False is invalid with scheduling='static': compiled decode steps "
                             "run on the paged cache; use scheduling='continuous'")

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser, names: tuple[str, ...] | None = None) -> None:
        """One --flag per field (or per field in `names`), with its default and help."""
        for f in fields(cls):
            if names is not None and f.name not in names:
                continue
            flag = "--" + f.name.replace("_", "-")
            if f.type in ("bool", bool):
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default,
                                    help=f.metadata["help"])
            else:
                kind = float if str(f.type) == "float" else int if "int" in str(f.type) else str
                parser.add_argument(flag, type=kind, default=f.default, help=f.metadata["help"])

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineConfig":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


def engine_config(model: str | None, config: EngineConfig | None, engine_args: dict) -> EngineConfig:
    """The one EngineConfig from LLMEngine's arguments: a config, or keyword
    settings (and the model's name) to build one from; never both."""
    if config is not None and engine_args:
        raise ValueError(f"config: pass the settings either in config or as keyword arguments, not both "
                         f"(got config and {', '.join(sorted(engine_args))})")
    if config is not None and model is not None and model != config.model:
        raise ValueError(f"model={model!r} disagrees with config.model={config.model!r}; give it once")
    return config or EngineConfig(**engine_args, **({} if model is None else {"model": model}))


def context_window(cfg: EngineConfig, model_config: ModelConfig) -> int:
    """max_model_len, or the model's own window when unset; never past the model's."""
    window = model_config.max_position_embeddings
    if cfg.max_model_len is not None and cfg.max_model_len > window:
        raise ValueError(f"max_model_len={cfg.max_model_len!r} is invalid: must be in [1, {window}]")
    return cfg.max_model_len or window


DTYPE_NAMES = ("float32", "bfloat16", "float16")


def resolve_device(device: str):
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for, but torch sees no CUDA device; use 'cpu' or 'auto'")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The torch dtype for the `dtype` setting on `device`. "auto" is fp32 on a
    CPU (exact, and fast on every CPU). On a GPU it is bf16 where the GPU has bf16
    units (compute capability 8.0, Ampere, or above), else fp16: a T4, the free
    Colab GPU, is 7.5. As in vLLM, bf16 is refused on such a GPU."""
    import torch

    if device.type != "cuda":
        return torch.float32 if dtype == "auto" else getattr(torch, dtype)
    capability = torch.cuda.get_device_capability(device)
    has_bf16 = tuple(capability) >= (8, 0)
    if dtype == "auto":
        return torch.bfloat16 if has_bf16 else torch.float16
    if dtype == "bfloat16" and not has_bf16:
        raise ValueError(f"dtype='bfloat16' is invalid on {device}: its compute capability is "
                         f"{capability[0]}.{capability[1]}, and bf16 needs 8.0 or above; use dtype='float16'")
    return getattr(torch, dtype)


def half_dtype(device: torch.device) -> str:
    """The 16-bit dtype `device` computes in: "bfloat16" on a CPU (emulated where
    it has no BF16 units, but always accepted) and on a GPU with bf16 units,
    "float16" on an older GPU (a T4, the free Colab GPU), which refuses bf16."""
    import torch

    if device.type == "cuda" and resolve_dtype("auto", device) is torch.float16:
        return "float16"
    return "bfloat16"
