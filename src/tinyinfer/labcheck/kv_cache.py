"""Lab 5 (the KV cache): checks for writing one layer's cache, the cache's size
per token, and the work of decoding with and without a cache."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from .core import Case, _report

# ---------------------------------------------------------------- exercise 1: the cache update


def reference_update_kv_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor,
                              v_new: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The course's answer to lab 5's update_kv_cache exercise."""
    end = start + k_new.shape[2]
    k_cache[:, :, start:end] = k_new
    v_cache[:, :, start:end] = v_new
    return k_cache[:, :, :end], v_cache[:, :, :end]


@dataclass
class _Outcome:
    """What an update did: the keys and values it returned and the caches after
    it. Equal when every tensor is; its repr says what a human needs to see."""

    keys: object
    values: object
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    written: list[int]  # cache positions whose keys changed

    def __eq__(self, other) -> bool:
        return isinstance(other, _Outcome) and all(
            isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
            for a, b in [(self.keys, other.keys), (self.values, other.values),
                         (self.k_cache, other.k_cache), (self.v_cache, other.v_cache)])

    def __repr__(self) -> str:
        def show(t):
            if not isinstance(t, torch.Tensor):
                return f"{type(t).__name__} (not a tensor)"
            if t.dim() != 4:
                return f"shape {list(t.shape)}"
            first = ", ".join(f"{x:.2f}" for x in t[0, 0, :6, 0].tolist())
            return f"shape {list(t.shape)}, [0, 0, :6, 0] = [{first}{', ...' if t.shape[2] > 6 else ''}]"

        span = f"{self.written[0]}..{self.written[-1]}" if self.written else "none"
        return (f"returned keys {show(self.keys)}; values {show(self.values)}; "
                f"cache positions written: {span}")


def _written(before: torch.Tensor, after: torch.Tensor) -> list[int]:
    return torch.nonzero((before != after).any(dim=(0, 1, 3))).flatten().tolist()


def _run_update(fn):
    """Call fn on copies of the case's caches, so the original stays to compare with."""
    def run(k_cache, v_cache, k_new, v_new, start):
        k_c, v_c = k_cache.clone(), v_cache.clone()
        result = fn(k_c, v_c, k_new.clone(), v_new.clone(), start)
        keys, values = result if isinstance(result, (tuple, list)) and len(result) == 2 else (result, None)
        return _Outcome(keys, values, k_c, v_c, _written(k_cache, k_c))
    return run


def _engine_update(k_cache, v_cache, k_new, v_new, start) -> _Outcome:
    """The expected outcome, from the engine's own KVCache.update."""
    from ..config import ModelConfig
    from ..kv_cache import KVCache
    from ..model import AttentionMetadata

    B, H, max_len, D = k_cache.shape
    T = k_new.shape[2]
    config = ModelConfig(vocab_size=1, hidden_size=H * D, intermediate_size=1, num_hidden_layers=1,
                         num_attention_heads=H, num_key_value_heads=H, head_dim=D, max_position_embeddings=max_len)
    cache = KVCache(config, B, max_len, k_cache.dtype, k_cache.device)
    cache.k[0].copy_(k_cache)
    cache.v[0].copy_(v_cache)
    positions = torch.arange(start, start + T).expand(B, T)
    keys, values = cache.update(0, k_new, v_new, AttentionMetadata.uniform(positions, start))
    return _Outcome(keys.clone(), values.clone(), cache.k[0].clone(), cache.v[0].clone(), _written(k_cache, cache.k[0]))


def _update_cases() -> list[Case]:
    g = torch.Generator().manual_seed(5)
    shapes = [  # B, Hkv, max_len, D, T, start, what it is
        (1, 2, 8, 4, 5, 0, "a prefill: 5 prompt tokens into an empty cache"),
        (1, 2, 8, 4, 1, 5, "a decode step: 1 token after 5 cached ones"),
        (1, 2, 8, 4, 1, 7, "a decode step into the cache's last slot"),
        (3, 3, 16, 8, 4, 6, "batch 3: a chunk of 4 tokens after 6 cached ones"),
        (2, 3, 32, 64, 1, 17, "SmolLM2's shape (3 KV heads of 64): decode at position 17"),
    ]
    cases = []
    for B, H, max_len, D, T, start, note in shapes:
        # Random numbers everywhere, also in slots not yet written: a real cache may
        # hold another request's leftovers there, and nobody may read them.
        k_cache, v_cache = torch.randn(B, H, max_len, D, generator=g), torch.randn(B, H, max_len, D, generator=g)
        k_new, v_new = torch.randn(B, H, T, D, generator=g), torch.randn(B, H, T, D, generator=g)
        args = (k_cache, v_cache, k_new, v_new, start)
        cases.append(Case(args, _engine_update(*args),
                          f"k_cache, v_cache [{B}, {H}, {max_len}, {D}], k_new, v_new [{B}, {H}, {T}, {D}], "
                          f"start={start}  ({note})"))
    return cases


def check_update_kv_cache(fn) -> bool:
    """fn(k_cache, v_cache, k_new, v_new, start) writes the new keys and values
    at positions start.. in place and returns the visible (keys, values)."""
    return _report("update_kv_cache", _run_update(fn), _update_cases)


# ---------------------------------------------------------------- exercise 2: bytes per token


def reference_kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_value: float) -> float:
    """The course's answer to lab 5's kv_bytes_per_token exercise."""
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_value


def _close(got, expected) -> bool:
    return (isinstance(got, numbers.Real) and not isinstance(got, bool)
            and math.isclose(float(got), expected, rel_tol=1e-9))


def _kv_bytes_cases() -> list[Case]:
    rows = [  # layers, KV heads, head dim, bytes per value, expected (None: from the formula), what
        (32, 8, 128, 2, 131_072, "the explainer's 7B example in FP16: 128 KiB"),
        (80, 8, 128, 2, 327_680, "a Llama-3-70B shape in FP16: Inference 101's 'about 320 KB'"),
        (30, 3, 64, 4, None, "SmolLM2-135M, float32"),
        (30, 3, 64, 2, None, "SmolLM2-135M, bfloat16"),
        (32, 32, 128, 2, None, "a 7B model without GQA: one KV head per query head"),
        (1, 1, 1, 1, None, "one layer, one head, one number, one byte"),
        (40, 8, 128, 1, None, "an 8-bit (fp8) cache"),
    ]
    return [Case((L, H, D, b), reference_kv_bytes_per_token(L, H, D, b) if want is None else want,
                 f"num_layers={L}, num_kv_heads={H}, head_dim={D}, bytes_per_value={b}  ({note})")
            for L, H, D, b, want, note in rows]


def check_kv_bytes_per_token(fn) -> bool:
    """fn(num_layers, num_kv_heads, head_dim, bytes_per_value) -> bytes per cached token."""
    return _report("kv_bytes_per_token", fn, _kv_bytes_cases, same=_close)


# ---------------------------------------------------------------- exercise 3: work with and without the cache


def reference_tokens_processed(prompt_len: int, new_tokens: int, use_cache: bool) -> int:
    """The course's answer to lab 5's tokens_processed exercise."""
    if use_cache:
        return prompt_len + (new_tokens - 1)  # the prompt once, then one token per further step
    # without a cache, the pass for output token i (0-based) re-reads prompt + i tokens
    return sum(prompt_len + i for i in range(new_tokens))


def _tokens_cases() -> list[Case]:
    rows = [(32, 1, "one new token: prefill only, the cache has not helped yet"),
            (100, 10, "a 100-token prompt, 10 new tokens"),
            (1, 512, "a 1-token prompt, 512 new tokens"),
            (512, 64, "a 512-token prompt, 64 new tokens"),
            (7, 2, "small enough to count by hand")]
    return [Case((p, n, cached), reference_tokens_processed(p, n, cached),
                 f"prompt_len={p}, new_tokens={n}, use_cache={cached}  ({note})")
            for p, n, note in rows for cached in (True, False)]


def check_tokens_processed(fn) -> bool:
    """fn(prompt_len, new_tokens, use_cache) -> token positions pushed through the model."""
    return _report("tokens_processed", fn, _tokens_cases,
                   same=lambda got, want: isinstance(got, numbers.Integral) and not isinstance(got, bool)
                   and got == want)
