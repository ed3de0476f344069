"""Lab 5 (the KV cache): wrong implementations each check must reject, a
correct implementation written here (independently of labcheck and the
engine) that each must accept, and the course's own answers each must refuse.
Collected by tests/course/test_labs.py."""
import torch

from tinyinfer_course import labcheck
from tinyinfer.kv_cache import KVCache
from tinyinfer.kv_cache import AttentionMetadata

# ---------------------------------------------------------------- update_kv_cache


def _writes_at_zero(kc, vc, k, v, start):
    # ignores start: every step overwrites the first positions
    T = k.shape[2]
    kc[:, :, :T], vc[:, :, :T] = k, v
    return kc[:, :, : start + T], vc[:, :, : start + T]


def _returns_only_new(kc, vc, k, v, start):
    # writes correctly, but attention would see the new tokens only: no context
    T = k.shape[2]
    kc[:, :, start : start + T], vc[:, :, start : start + T] = k, v
    return k, v


def _returns_whole_cache(kc, vc, k, v, start):
    # attention would also read the slots not written yet
    T = k.shape[2]
    kc[:, :, start : start + T], vc[:, :, start : start + T] = k, v
    return kc, vc


def _not_in_place(kc, vc, k, v, start):
    # the right answer this step, but the cache never keeps it for the next one
    return torch.cat([kc[:, :, :start], k], dim=2), torch.cat([vc[:, :, :start], v], dim=2)


def _off_by_one(kc, vc, k, v, start):
    # writes one slot too late (positions are 0-based)
    T = k.shape[2]
    end = min(start + 1 + T, kc.shape[2])
    kc[:, :, start + 1 : end], vc[:, :, start + 1 : end] = k[:, :, : end - start - 1], v[:, :, : end - start - 1]
    return kc[:, :, : start + T], vc[:, :, : start + T]


def _swaps_k_and_v(kc, vc, k, v, start):
    T = k.shape[2]
    kc[:, :, start : start + T], vc[:, :, start : start + T] = k, v
    return vc[:, :, : start + T], kc[:, :, : start + T]


def _values_are_keys(kc, vc, k, v, start):
    T = k.shape[2]
    kc[:, :, start : start + T] = k
    vc[:, :, start : start + T] = k  # copy-paste slip: the keys written as values
    return kc[:, :, : start + T], vc[:, :, : start + T]


def _update_by_index_copy(kc, vc, k, v, start):
    # Correct, and unlike the course's answer: index_copy_ along the position axis.
    where = torch.arange(start, start + k.shape[2])
    kc.index_copy_(2, where, k)
    vc.index_copy_(2, where, v)
    return kc.narrow(2, 0, start + k.shape[2]), vc.narrow(2, 0, start + k.shape[2])


def _engine_update(kc, vc, k, v, start):
    # The engine's KVCache.update, called the way a learner might.
    B, H, max_len, D = kc.shape
    cache = KVCache.__new__(KVCache)
    cache.k, cache.v, cache.max_len = kc[None], vc[None], max_len
    positions = torch.arange(start, start + k.shape[2]).expand(B, -1)
    return cache.update(0, k, v, AttentionMetadata.uniform(positions, start))


# ---------------------------------------------------------------- KVCache


class _Cache:
    """A KV cache with one of several realistic mistakes switched on."""

    attention = update_kv_cache = None  # the check sets both
    mistake = None

    def __init__(self, config, batch_size, max_len, dtype, device):
        L, Hkv, D = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
        if self.mistake in ("float32_slabs", "float32_cast"):  # issue 56: float32 whatever dtype it is given
            dtype = torch.float32
        self.k = torch.zeros(L, batch_size, Hkv, max_len, D, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.max_len = max_len

    def visible_length(self, positions):
        n = int(positions.max()) + 1
        if self.mistake == "no_bound_check":
            return n
        if self.mistake == "visible_is_count":  # the number of new tokens, not the last position + 1
            n = positions.shape[1]
        if self.mistake == "last_slot_refused" and n >= self.max_len:  # `>=`: the last slot never used
            raise ValueError("past the end")
        if n > self.max_len:
            raise ValueError("past the end")
        if self.mistake == "count_checked":  # bounds checked right, but the count of new tokens returned
            return positions.shape[1]
        if self.mistake == "last_position":  # the last position, not how many positions: one key short
            return n - 1
        return n

    def attend(self, layer, q, k, v, meta):
        B, T = q.shape[:2]
        start = int(meta.positions[0, 0])
        if self.mistake == "one_layer":  # every layer writes into the same slab
            layer = 0
        if self.mistake == "start_at_zero":  # forgets where this step's tokens go
            start = 0
        kc, vc = self.k[layer, :B], self.v[layer, :B]
        keys, values = self.update_kv_cache(kc, vc, k.transpose(1, 2), v.transpose(1, 2), start)
        if self.mistake == "whole_slab":  # attends over unwritten slots too
            keys, values = kc, vc
        if self.mistake == "new_only":  # no past: as if there were no cache
            keys, values = k.transpose(1, 2), v.transpose(1, 2)
        if self.mistake == "float32_cast":  # cast back for attention: right numbers, twice the bytes in bf16
            keys, values = keys.to(q.dtype), values.to(q.dtype)
        out = self.attention(q.transpose(1, 2), keys, values)
        if self.mistake == "heads_tangled":  # [B, H, T, D] flattened without moving T forward first
            return out.reshape(B, T, -1)
        return out.transpose(1, 2).flatten(2)


def _cache_with(mistake):
    return type("KVCache", (_Cache,), {"mistake": mistake})


class _LoopCache:
    # Correct, and unlike the course's answer: a list of per-layer (k, v) slabs,
    # written with index_copy_, the heads kept in the model's token-major order.

    attention = update_kv_cache = None

    def __init__(self, config, batch_size, max_len, dtype, device):
        shape = (batch_size, config.num_key_value_heads, max_len, config.head_dim)
        self.slabs = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                      for _ in range(config.num_hidden_layers)]
        self.size = max_len

    @property
    def k(self):
        return torch.stack([k for k, _ in self.slabs])

    @property
    def v(self):
        return torch.stack([v for _, v in self.slabs])

    def visible_length(self, positions):
        last = int(positions.amax().item())
        if last >= self.size:
            raise ValueError(f"position {last} does not fit in {self.size} slots")
        return last + 1

    def attend(self, layer, q, k, v, meta):
        kc, vc = self.slabs[layer]
        kc, vc = kc[: q.shape[0]], vc[: q.shape[0]]
        where = meta.positions[0]
        kc.index_copy_(2, where, k.permute(0, 2, 1, 3))
        vc.index_copy_(2, where, v.permute(0, 2, 1, 3))
        seen = int(where[-1]) + 1
        out = self.attention(q.permute(0, 2, 1, 3), kc[:, :, :seen], vc[:, :, :seen])
        return out.permute(0, 2, 1, 3).reshape(q.shape[0], q.shape[1], -1)


WRONG = {
    "check_update_kv_cache": [_writes_at_zero, _returns_only_new, _returns_whole_cache, _not_in_place,
                              _off_by_one, _swaps_k_and_v, _values_are_keys],
    "check_kv_cache": [_cache_with(m) for m in ("no_bound_check", "visible_is_count", "one_layer", "start_at_zero",
                                                "whole_slab", "new_only", "heads_tangled", "last_slot_refused",
                                                "count_checked", "last_position", "float32_slabs", "float32_cast")],
}
REFERENCE = {
    "check_update_kv_cache": lambda: _update_by_index_copy,
    "check_kv_cache": lambda: _LoopCache,
}
ANSWERS = {
    "check_update_kv_cache": [labcheck.reference_update_kv_cache, _engine_update],
    "check_kv_cache": [labcheck.ReferenceKVCache, KVCache],
}
