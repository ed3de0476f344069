"""Lab 5 (the KV cache): checks for writing one layer's cache (update_kv_cache)
and for a whole KV cache the model runs on (KVCache), both against the engine's
own tinyinfer.kv_cache.KVCache, which they refuse to be given."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tinyinfer.config import ModelConfig
from tinyinfer.kv_cache import KVCache
from tinyinfer.kv_cache import AttentionMetadata
from tinyinfer.paged_kv_cache import PagedKVCache
from .attention import reference_causal_gqa_attention
from .core import Case, first_difference, run_check
from .fixtures import tiny_model
from .registry import Lab
from .watch import pausing

# ---------------------------------------------------------------- exercise 1: one layer's update


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


def _where_update(got, expected) -> str | None:
    """The first of keys, values and the two caches that differs, and where."""
    if not isinstance(got, _Outcome):
        return None
    for name in ("keys", "values", "k_cache", "v_cache"):
        mine, theirs = getattr(got, name), getattr(expected, name)
        diff = first_difference(mine, theirs, ("batch", "KV head", "position", "element"), atol=0, rtol=0)
        if diff:
            return f"{'returned ' if name in ('keys', 'values') else 'after the call, '}{name}: {diff}"
    return None


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
    return run_check("update_kv_cache", _run_update(fn), _update_cases,
                     forbidden=(reference_update_kv_cache, KVCache), keep=("update_kv_cache", fn),
                     explain=_where_update)


# ---------------------------------------------------------------- exercise 2: the whole cache


class ReferenceKVCache:
    """The course's answer to lab 5's KVCache exercise."""

    # Lab 2's attention and lab 5's update, as functions. The lab sets its
    # learner's own where kept (my_engine.load); these are the course's.
    attention = staticmethod(reference_causal_gqa_attention)
    update_kv_cache = staticmethod(reference_update_kv_cache)

    def __init__(self, config, batch_size: int, max_len: int, dtype, device):
        shape = (config.num_hidden_layers, batch_size, config.num_key_value_heads, max_len, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len

    def visible_length(self, positions: torch.Tensor) -> int:
        n = int(positions.max()) + 1
        if n > self.max_len:
            raise ValueError(f"position {n - 1} is past the cache's {self.max_len} slots")
        return n

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta) -> torch.Tensor:
        B = q.shape[0]
        start = int(meta.positions[0, 0])  # every sequence in the batch writes the same positions
        keys, values = self.update_kv_cache(self.k[layer, :B], self.v[layer, :B], k.transpose(1, 2),
                                            v.transpose(1, 2), start)  # [B, Hkv, start + T, D]
        out = self.attention(q.transpose(1, 2), keys, values)  # [B, H, T, D]
        return out.transpose(1, 2).flatten(2)  # [B, T, H*D]


BF16_ATOL = 0.05  # logits of a bfloat16 run: the engine's fused attention and the given one round differently


class _Run:
    """What a cache did in one scenario: the logits of every step, the cache's
    keys and values over the written positions, and what visible_length said
    for each step's positions, at the last slot and just past the end."""

    def __init__(self, logits, k, v, past_end, lengths=(), shapes=None, written=None, atol=1e-4):
        self.logits, self.k, self.v, self.past_end = logits, k, v, past_end
        self.atol = atol  # bfloat16 runs: the engine's fused attention and the given one round differently
        self.dtypes = tuple(str(t.dtype).removeprefix("torch.") if isinstance(t, torch.Tensor) else None
                            for t in (k, v))
        self.lengths = list(lengths)  # visible_length(each step's positions), then at the last slot
        # For the messages only: the slabs' whole shapes (k, v), and how many positions were written (compared)
        self.shapes, self.written = shapes or (None, None), written

    def __eq__(self, other):
        tol = max(self.atol, getattr(other, "atol", 0.0))

        def close(a, b):
            return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                    and a.dtype == b.dtype and torch.allclose(a, b, atol=tol, rtol=tol))
        return (isinstance(other, _Run) and self.dtypes == other.dtypes and len(self.logits) == len(other.logits)
                and all(close(a, b) for a, b in zip(self.logits, other.logits))
                and close(self.k, other.k) and close(self.v, other.v) and self.past_end == other.past_end
                and self.lengths == other.lengths)

    def __repr__(self):
        def numbers(t, index, n):
            if not isinstance(t, torch.Tensor):
                return f"{type(t).__name__} (not a tensor)"
            return " ".join(f"{x:.2f}" for x in t[index].flatten()[:n].tolist())
        steps = " | ".join(numbers(t, (0, -1), 2) for t in self.logits)
        k_shape, v_shape = self.shapes
        slabs = (f"cache.k {k_shape if k_shape is not None else '-'}, "
                 f"cache.v {v_shape if v_shape is not None else '-'}"
                 f" (compared over the {self.written} positions written); " if self.written is not None else "")
        return (f"{slabs}visible_length per step, then at the last slot: {self.lengths}; past the end: "
                f"{self.past_end}; logits per step (2 numbers each): {steps}; "
                f"cache.k [0, 0, 0, :3, 0] = {numbers(self.k, (0, 0, 0, slice(0, 3), 0), 3)}, "
                f"cache.v [0, 0, 0, :3, 0] = {numbers(self.v, (0, 0, 0, slice(0, 3), 0), 3)}")


@torch.inference_mode()
def _play(cache_class, seed, batch, max_len, steps, dtype=torch.float32) -> _Run:
    """Run the scenario's steps (token counts, uniform metadata or not) on a fresh cache,
    the model and the cache in `dtype`."""
    model = tiny_model(seed, init_std=0.3, max_position_embeddings=64).to(dtype)
    cache = cache_class(model.config, batch, max_len, dtype, torch.device("cpu"))
    slabs = getattr(cache, "k", None), getattr(cache, "v", None)
    if all(isinstance(t, torch.Tensor) for t in slabs) and any(t.dtype != dtype for t in slabs):  # nothing to play
        return _Run([], *slabs, f"not played: the slabs are not {dtype}", shapes=tuple(list(t.shape) for t in slabs),
                    written=0)
    g = torch.Generator().manual_seed(seed)
    start, logits, lengths = 0, [], []
    for T, uniform in steps:
        ids = torch.randint(model.config.vocab_size, (batch, T), generator=g)
        positions = torch.arange(start, start + T).expand(batch, T)
        lengths.append(_length(cache, positions))  # what the model would be told for this step
        meta = AttentionMetadata.uniform(positions, start) if uniform else None  # None: the model asks the cache
        logits.append(model.compute_logits(model(ids, positions, cache, meta)).clone())
        start += T
    lengths.append(_length(cache, torch.tensor([[max_len - 1]])))  # the last slot still fits
    try:
        past_end = f"returned {cache.visible_length(torch.tensor([[max_len]]))!r}"
    except ValueError:
        past_end = "raised ValueError"
    k, v = getattr(cache, "k", None), getattr(cache, "v", None)
    shapes = tuple(list(t.shape) if isinstance(t, torch.Tensor) else None for t in (k, v))
    k = k[:, :, :, :start].clone() if isinstance(k, torch.Tensor) and k.dim() == 5 else k
    v = v[:, :, :, :start].clone() if isinstance(v, torch.Tensor) and v.dim() == 5 else v
    return _Run(logits, k, v, past_end, lengths, shapes=shapes, written=start,
                atol=BF16_ATOL if dtype == torch.bfloat16 else 1e-4)


def _length(cache, positions):
    """visible_length's answer, or what it raised, as something to compare."""
    try:
        n = cache.visible_length(positions.clone())
    except ValueError as e:
        return f"ValueError ({e})"
    return n if isinstance(n, int) and not isinstance(n, bool) else f"{n!r} (a {type(n).__name__}, not an int)"


def _where(got, expected) -> str | None:
    """The first step whose logits, or visible_length, differ."""
    if not isinstance(got, _Run):
        return None
    if got.dtypes != expected.dtypes and all(isinstance(t, torch.Tensor) for t in (got.k, got.v)):
        return (f"the slabs' dtype differs: cache.k and cache.v are {got.dtypes[0]} and {got.dtypes[1]}, expected "
                f"{expected.dtypes[0]}, the dtype __init__ was given")
    for i, (a, b) in enumerate(zip(got.lengths, expected.lengths)):
        if a != b:
            which = f"step {i}'s positions" if i < len(expected.logits) else "the last slot"
            return f"visible_length for {which}: expected {b!r}, got {a!r}"
    if got.past_end != expected.past_end:
        return (f"visible_length past the end (a position at max_len): expected it {expected.past_end}, "
                f"it {got.past_end}")
    for i, (a, b) in enumerate(zip(got.logits, expected.logits)):
        diff = first_difference(a, b, ("sequence", "position", "token"), atol=expected.atol, rtol=expected.atol)
        if diff:
            return f"step {i}'s logits: {diff}"
    return _where_slabs(got, expected)


def _where_slabs(got: _Run, expected: _Run) -> str | None:
    """The first of cache.k and cache.v that has the wrong type or shape, or
    holds other numbers in the positions written."""
    layout = "[layers, batch, KV heads, max_len, head_dim]"
    for name, mine, theirs, shape, expected_shape in (("k", got.k, expected.k, got.shapes[0], expected.shapes[0]),
                                                      ("v", got.v, expected.v, got.shapes[1], expected.shapes[1])):
        if not isinstance(mine, torch.Tensor):
            return f"cache.{name} differs: it is a {type(mine).__name__}, not a tensor {layout}"
        if shape != expected_shape:
            return (f"cache.{name} differs in shape: {shape}, expected {expected_shape}, that is {layout}. "
                    f"(The check compares only the {expected.written} positions written so far.)")
        diff = first_difference(mine, theirs, ("layer", "sequence", "KV head", "position", "element"))
        if diff:
            return f"cache.{name} over the positions written: {diff}"
    return None


def _cache_cases() -> list[Case]:
    rows = [  # seed, batch, max_len, steps [(new tokens, uniform metadata?)], what
        (0, 1, 12, [(5, False)] + [(1, False)] * 4,
         "a prefill of 5 tokens, then 4 decode steps (metadata from the cache)"),
        (1, 1, 10, [(4, True)] + [(1, True)] * 3, "a prefill of 4 tokens, then 3 decode steps (uniform metadata)"),
        (2, 2, 8, [(3, True)] + [(1, False)] * 3, "batch 2: a prefill of 3 tokens each, then 3 decode steps"),
        (3, 1, 12, [(4, False), (3, False), (1, False), (1, False)],
         "a prompt in two chunks (4 tokens, then 3 at positions 4..6), then 2 decode steps"),
    ]
    cases = []
    for seed, batch, max_len, steps, what in rows:
        expected = _play(KVCache, seed, batch, max_len, steps)
        show = (f"the tiny model (2 layers, 4 query heads, 2 KV heads of 16), batch_size={batch}, max_len={max_len}: "
                f"{what}")
        cases.append(Case((seed, batch, max_len, steps), expected, show))
    # Issue 56: the model and the cache in bfloat16, as the engine runs on most GPUs; a cache that
    # allocates float32 whatever it is given fails here.
    steps = [(4, False)] + [(1, False)] * 2
    cases.append(Case((4, 1, 8, steps, torch.bfloat16), _play(KVCache, 4, 1, 8, steps, torch.bfloat16),
                      "the tiny model in bfloat16, dtype=torch.bfloat16, batch_size=1, max_len=8: a prefill of 4 "
                      f"tokens, then 2 decode steps (logits compared within {BF16_ATOL}: bfloat16 keeps 3 digits)"))
    return cases


# What the check hands the learner's cache: the course's attention and update,
# run with the watch paused (they are the course's answers to other exercises),
# so the check tests the cache alone.
_GIVEN = {"attention": staticmethod(pausing(reference_causal_gqa_attention)),
          "update_kv_cache": staticmethod(pausing(reference_update_kv_cache))}


def _run_cache(cls):
    def run(seed, batch, max_len, steps, dtype=torch.float32):
        checked = type(cls.__name__, (cls,), dict(_GIVEN)) if isinstance(cls, type) else cls
        return _play(checked, seed, batch, max_len, steps, dtype)
    return run


def check_kv_cache(cls) -> bool:
    """cls(config, batch_size, max_len, dtype, device): a KV cache the model runs
    on. It keeps k and v [layers, batch, KV heads, max_len, head_dim], answers
    visible_length(positions), and attend(layer, q, k, v, meta) writes this
    step's keys and values at their positions and attends over the visible ones
    with self.attention. Against the engine's KVCache, on a tiny random model."""
    forbidden = (KVCache, PagedKVCache, ReferenceKVCache, reference_update_kv_cache, reference_causal_gqa_attention,
                 F.scaled_dot_product_attention)
    return run_check("kv_cache", _run_cache(cls), _cache_cases, forbidden=forbidden, keep=("KVCache", cls),
                     explain=_where)


LAB = Lab(5, "the KV cache",
          exports=("check_update_kv_cache", "check_kv_cache", "reference_update_kv_cache", "ReferenceKVCache"),
          pieces={"update_kv_cache": "reference_update_kv_cache", "KVCache": "ReferenceKVCache"},
          fallbacks={"check_update_kv_cache": reference_update_kv_cache, "check_kv_cache": ReferenceKVCache})
