"""How many blocks the paged KV pool holds.

On a CPU the pool has a fixed size (512 MiB unless told otherwise). On a GPU it
is sized once the model is loaded, from what the GPU has left, and capped at what
the engine can ever fill (kv_pool_blocks). What a step needs beside the pool, its
working memory, is measured first by running the largest step the engine can be
given (working_memory: nano-vllm's order, warm up, then size the pool).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .decode_batch import capture_sizes
from .paged_kv_cache import PagedAttentionMetadata, PagedKVCache

if TYPE_CHECKING:
    from .config import EngineConfig


# The KV pool on a CPU when no size is given: plenty for the course's workloads,
# small enough for a laptop.
CPU_KV_CACHE_BYTES = 512 * 2**20
# A GPU's default pool holds at most this many full windows per sequence slot:
# one for the sequences running, one for the prefixes the cache keeps after them.
PREFIX_CACHE_MARGIN = 2


def kv_pool_blocks(cfg: EngineConfig, device: torch.device, kv_bytes_per_token: int,
                   gpu_memory: Callable[[torch.device], tuple[int, int, int]] | None = None,
                   max_model_len: int | None = None, working_bytes: int = 0) -> int:
    """How many KV blocks the pool holds: num_kv_blocks if set, else
    kv_cache_memory_bytes in blocks. Without either, a CPU gets 512 MiB, and a
    GPU, once the model is loaded, the smaller of two sizes:
      - what gpu_memory_utilization leaves (vLLM's rule, the ceiling): total x
        utilization - what this process already holds (the weights, any other
        engine alive in it) - working_bytes, the working memory a step needs
        beside the pool (activations, logits, workspaces, CUDA graphs; measured
        by a warm-up step, working_memory below). The other
        1 - utilization is for the CUDA context and other processes;
      - what the engine can ever fill: max_num_seqs sequences of max_model_len
        tokens, PREFIX_CACHE_MARGIN times over. Without this cap the first
        engine of a process takes 90% of the GPU, and a second one (a lab
        comparing two) finds no room. max_model_len=None: no cap.
    `gpu_memory(device)` returns (free, total, used) in bytes, as cuda_memory
    does; a test passes its own."""
    block_bytes = kv_bytes_per_token * cfg.block_size
    if cfg.num_kv_blocks is not None:
        return cfg.num_kv_blocks
    if cfg.kv_cache_memory_bytes is not None or device.type != "cuda":
        return max(1, (cfg.kv_cache_memory_bytes or CPU_KV_CACHE_BYTES) // block_bytes)
    free, total, used = (gpu_memory or cuda_memory)(device)
    budget, util, gib = int(total * cfg.gpu_memory_utilization), cfg.gpu_memory_utilization, 2**30
    blocks = (budget - used - working_bytes) // block_bytes
    if blocks <= 0:
        working = f" and a step needs {working_bytes / gib:.2f} GiB of working memory" if working_bytes else ""
        raise ValueError(f"gpu_memory_utilization={util} leaves no room for the KV pool: it allows "
                         f"{budget / gib:.2f} GiB of the GPU's {total / gib:.2f} GiB, and this process already holds "
                         f"{used / gib:.2f} GiB (the weights, and any other engine still alive in it){working}; "
                         f"raise gpu_memory_utilization, drop the other engine, or set kv_cache_memory_bytes")
    if max_model_len is not None:
        blocks = min(blocks, -(-cfg.max_num_seqs * max_model_len * PREFIX_CACHE_MARGIN // cfg.block_size))
    wanted = used + working_bytes + blocks * block_bytes
    if wanted > free + used:  # the pool would not fit: vLLM refuses too, rather than fail at the first step
        raise ValueError(f"gpu_memory_utilization={util} asks for {wanted / gib:.2f} GiB of the GPU's "
                         f"{total / gib:.2f} GiB, but this process can have at most {(free + used) / gib:.2f} GiB "
                         f"(other processes and the CUDA context hold the rest); lower gpu_memory_utilization "
                         f"or set kv_cache_memory_bytes")
    return blocks


def cuda_memory(device: torch.device) -> tuple[int, int, int]:
    """(free, total, used) in bytes on a CUDA device. used: this process's live
    tensors (the weights). free: what it can still get, the driver's free memory
    and what torch's allocator keeps cached for reuse, such as the pool of an
    engine dropped earlier in this process."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    used, cached = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    return free + cached - used, total, used


def working_memory(model, cfg, max_model_len: int, dtype: torch.dtype, device: torch.device) -> int:
    """Bytes a step needs on a GPU beside the weights and the pool, which
    kv_pool_blocks keeps free: the peak of the largest step the engine can be
    given, measured by running it once (nano-vllm's order: warm up, then size
    the pool), plus room for the CUDA graphs' own memory when they are
    recorded. 0 where nothing is measured: on a CPU, or when the pool's size is
    given (kv_cache_memory_bytes, num_kv_blocks)."""
    if device.type != "cuda" or cfg.num_kv_blocks is not None or cfg.kv_cache_memory_bytes is not None:
        return 0
    num_tokens = min(cfg.max_num_batched_tokens, max_model_len)
    step = largest_step(model, num_tokens, max_model_len, cfg.block_size, dtype, device)
    graphs = 0 if cfg.enforce_eager else graph_memory(model.config, capture_sizes(cfg.max_num_seqs)[-1],
                                                      max_model_len, dtype)
    return peak_memory(step, device) + graphs


def largest_step(model, num_tokens: int, context: int, block_size: int, dtype, device) -> Callable[[], None]:
    """The step that needs the most working memory: a prompt chunk of
    num_tokens at the end of a full context window (its attention reads the
    whole window), with the logits of every position (a request for prompt
    logprobs asks for them all). Run on a pool just big enough for it; the
    pool is made here, before peak_memory starts counting."""
    num_blocks = -(-context // block_size)
    cache = PagedKVCache(model.config, num_blocks, block_size, dtype, device)
    meta = PagedAttentionMetadata.build([num_tokens], [context], [list(range(num_blocks))], block_size, device)
    input_ids = torch.zeros(1, num_tokens, dtype=torch.long, device=device)

    @torch.inference_mode()
    def step():
        hidden = model(input_ids, meta.positions, cache, meta)[0]
        model.compute_logits(hidden)

    return step


def peak_memory(step: Callable[[], None], device: torch.device) -> int:
    """Bytes step() allocates on the GPU at its peak, beyond what was allocated before it."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def graph_memory(config, max_size: int, max_len: int, dtype: torch.dtype) -> int:
    """Room for the CUDA graphs' pool: the largest recorded step gathers one
    layer's keys and values for max_size rows of max_len positions; twice that
    covers the attention's other temporaries (review estimate, to be measured)."""
    one_layer = 2 * config.num_key_value_heads * config.head_dim * dtype.itemsize  # K and V, one position
    return 2 * max_size * max_len * one_layer
