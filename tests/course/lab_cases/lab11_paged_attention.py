"""Lab 11 (your engine): wrong implementations of paged attention the check
must reject, a correct one written here (independently of labcheck and the
engine) that it must accept, and the course's own answers it must refuse.
Collected by tests/course/test_labs.py."""
import math

import torch

from tinyinfer_course import labcheck
from tinyinfer_course.labcheck.paged_attention import _engine


def _paged(q, k, v, k_pool, v_pool, batch, block_size, attention, *, slot="paged", write=True, new_at="end",
           keys="all", values_from="v"):
    """Paged attention with one plausible mistake switched on at a time."""
    out, start = [], 0
    for num_new, context_len, table in batch:
        pos = list(range(context_len))
        if slot == "paged":
            slots = [table[p // block_size] * block_size + p % block_size for p in pos]
        elif slot == "no_scale":  # forgets that a block holds block_size slots
            slots = [table[p // block_size] + p % block_size for p in pos]
        else:  # "contiguous": ignores the block table, as if the pool were one sequence's
            slots = pos
        slots = torch.tensor(slots)
        new = slots[context_len - num_new:] if new_at == "end" else slots[:num_new]
        if write:
            k_pool.index_copy_(0, new, k[start:start + num_new])
            v_pool.index_copy_(0, new, (v if values_from == "v" else k)[start:start + num_new])
        read = slots if keys == "all" else new
        out.append(attention(q[start:start + num_new].transpose(0, 1)[None],
                             k_pool[read].transpose(0, 1)[None], v_pool[read].transpose(0, 1)[None])[0].transpose(0, 1))
        start += num_new
    return torch.cat(out)


def _wrong(**mistake):
    return lambda *args: _paged(*args, **mistake)


def _independent(q, k, v, k_pool, v_pool, batch, block_size, attention):
    """Correct, written another way: one pass to write every new token, then
    one to attend, with the slots of a block built as a range."""
    slot_lists, start = [], 0
    for num_new, context_len, table in batch:
        slots = torch.cat([torch.arange(b * block_size, (b + 1) * block_size) for b in table])[:context_len]
        for i in range(num_new):
            s = slots[context_len - num_new + i]
            k_pool[s], v_pool[s] = k[start + i], v[start + i]
        slot_lists.append((slots, start, num_new))
        start += num_new
    pieces = [attention(q[a:a + n].permute(1, 0, 2).unsqueeze(0), k_pool[s].permute(1, 0, 2).unsqueeze(0),
                        v_pool[s].permute(1, 0, 2).unsqueeze(0)).squeeze(0).permute(1, 0, 2)
              for s, a, n in slot_lists]
    return torch.cat(pieces)


def _through_the_engine(q, k, v, k_pool, v_pool, batch, block_size, attention):
    out, k_new, v_new = _engine(q, k, v, k_pool, v_pool, batch, block_size)
    k_pool.copy_(k_new)
    v_pool.copy_(v_new)
    return out


def _through_sdpa(q, k, v, k_pool, v_pool, batch, block_size, attention):
    from torch.nn.functional import scaled_dot_product_attention

    def fused(qq, kk, vv):
        Tq, Tk = qq.shape[2], kk.shape[2]
        mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)
        return scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, enable_gqa=True)

    return _paged(q, k, v, k_pool, v_pool, batch, block_size, fused)


WRONG = {
    "check_paged_attention": [
        _wrong(write=False),  # reads the pool without writing this step's keys: stale keys
        _wrong(slot="no_scale"),  # block id + offset, not block id * block_size + offset
        _wrong(slot="contiguous"),  # ignores the block tables
        _wrong(new_at="start"),  # writes the new tokens over the sequence's first positions
        _wrong(keys="new"),  # attends over this step's tokens only: forgets the cached context
        _wrong(values_from="k"),  # stores the keys in the value pool too
    ],
}
REFERENCE = {"check_paged_attention": lambda: _independent}
ANSWERS = {"check_paged_attention": [labcheck.reference_paged_attention, _through_the_engine, _through_sdpa]}


# ---------------------------------------------------------------- grouped decodes


def _grouped(q, k, v, k_pool, v_pool, batch, block_size, attention, *, mask="strict", heads="grouped",
             scale=True, write_first=True, decodes_through_attention=False):
    """Decodes in one padded, masked computation, prompt chunks through attention;
    one plausible mistake switched on at a time (all defaults: correct)."""
    H, Hkv, D = q.shape[1], k.shape[1], q.shape[2]
    table_slots = [torch.cat([torch.arange(b * block_size, (b + 1) * block_size) for b in t])[:c] for _, c, t in batch]
    firsts = [sum(n for n, _, _ in batch[:i]) for i in range(len(batch))]

    def write():
        for (n, c, _), s, a in zip(batch, table_slots, firsts):
            k_pool[s[c - n:]], v_pool[s[c - n:]] = k[a:a + n], v[a:a + n]

    if write_first:
        write()
    out = torch.zeros_like(q)
    grouped = []
    for (n, c, _), s, a in zip(batch, table_slots, firsts):
        if n > 1 or decodes_through_attention:
            out[a:a + n] = attention(q[a:a + n].permute(1, 0, 2)[None], k_pool[s].permute(1, 0, 2)[None],
                                     v_pool[s].permute(1, 0, 2)[None])[0].permute(1, 0, 2)
        else:
            grouped.append((a, c, s))
    if grouped:
        L = max(c for _, c, _ in grouped)
        keys = torch.zeros(len(grouped), L, Hkv, D)
        values = torch.zeros(len(grouped), L, Hkv, D)
        for i, (_, c, s) in enumerate(grouped):  # padded with zeros past each context
            keys[i, :c], values[i, :c] = k_pool[s], v_pool[s]
        rep = H // Hkv
        if heads == "grouped":
            keys, values = keys.repeat_interleave(rep, 2), values.repeat_interleave(rep, 2)
        else:  # query head h reads K/V head h % Hkv
            keys, values = keys.repeat(1, 1, rep, 1), values.repeat(1, 1, rep, 1)
        qs = q[[a for a, _, _ in grouped]]  # [B, H, D]
        scores = torch.einsum("bhd,blhd->bhl", qs, keys) / (math.sqrt(D) if scale else 1.0)
        lens = torch.tensor([c for _, c, _ in grouped])
        if mask != "none":
            cut = lens[:, None] + (1 if mask == "off_by_one" else 0)
            scores = scores.masked_fill((torch.arange(L)[None] >= cut)[:, None, :], float("-inf"))
        o = torch.einsum("bhl,blhd->bhd", scores.softmax(-1), values)
        for i, (a, _, _) in enumerate(grouped):
            out[a] = o[i]
    if not write_first:  # the step's keys written after reading: a decode misses its own key
        write()
    return out


def _grouped_wrong(**mistake):
    return lambda *args: _grouped(*args, **mistake)


def _grouped_with_the_engines_cache(q, k, v, k_pool, v_pool, batch, block_size, attention):
    return _through_the_engine(q, k, v, k_pool, v_pool, batch, block_size, attention)


WRONG["check_grouped_paged_attention"] = [
    _grouped_wrong(mask="none"),  # the padding past a shorter context is attended (zeros score 0, not -inf)
    _grouped_wrong(mask="off_by_one"),  # one padded slot too many is attended
    _grouped_wrong(heads="modulo"),  # query head h reads K/V head h % Hkv, not h // group
    _grouped_wrong(scale=False),  # no 1/sqrt(D)
    _grouped_wrong(write_first=False),  # reads the pool before writing this step's keys
    _grouped_wrong(decodes_through_attention=True),  # correct numbers, but one attention call per decode
    _independent,  # lab 11's first exercise, per request: correct numbers, not grouped
]
REFERENCE["check_grouped_paged_attention"] = lambda: _grouped
ANSWERS["check_grouped_paged_attention"] = [labcheck.reference_grouped_paged_attention,
                                            labcheck.reference_paged_attention,
                                            _grouped_with_the_engines_cache, _through_sdpa]
