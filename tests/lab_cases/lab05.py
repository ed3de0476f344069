"""Lab 5 (the KV cache): wrong implementations each check must reject, and the
reference each must accept. Collected by tests/test_labs.py."""
import torch

from tinyinfer import labcheck


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


WRONG = {
    "check_update_kv_cache": [_writes_at_zero, _returns_only_new, _returns_whole_cache, _not_in_place,
                              _off_by_one, _swaps_k_and_v, _values_are_keys],
    "check_kv_bytes_per_token": [
        lambda L, H, D, b: L * H * D * b,  # forgets that K and V are both stored
        lambda L, H, D, b: 2 * L * H * D * b / 1024,  # KiB, not bytes
        lambda L, H, D, b: 2 * H * D * b,  # one layer only
        lambda L, H, D, b: 2 * L * H * D * b * 8,  # bits, not bytes
        lambda L, H, D, b: 2 * L * 4 * H * D * b,  # counts query heads (here 4 per KV head) instead of KV heads
    ],
    "check_tokens_processed": [
        lambda p, n, cached: n if cached else sum(p + i for i in range(n)),  # forgets the prefill
        lambda p, n, cached: p + n - 1 if cached else sum(p + i for i in range(1, n + 1)),  # one token too many
        lambda p, n, cached: p + n - 1 if cached else n * (p + n - 1),  # every pass as long as the last
        lambda p, n, cached: p + n - 1,  # no difference without a cache
        lambda p, n, cached: p + n - 1 if cached else n * p,  # forgets the tokens already generated
    ],
}
REFERENCE = {
    "check_update_kv_cache": lambda: labcheck.reference_update_kv_cache,
    "check_kv_bytes_per_token": lambda: __import__("tinyinfer.memory", fromlist=["x"]).kv_bytes_per_token,
    "check_tokens_processed": lambda: labcheck.reference_tokens_processed,
}
