"""Engine settings that depend on the device, checked on a CPU by faking what a
GPU would report: the dtype "auto" picks, and the KV pool's size from the GPU's
memory (vLLM's gpu_memory_utilization). Nothing here needs a GPU or loads a model."""
import argparse
import math

import pytest
import torch

from tinyinfer.config import EngineConfig, resolve_dtype
from tinyinfer.kv_pool import CPU_KV_CACHE_BYTES, kv_pool_blocks

GPU = torch.device("cuda")  # a device object only: building it touches no GPU
GIB = 2**30


@pytest.fixture
def capability(monkeypatch):
    """Fake torch.cuda.get_device_capability; returns a setter, and the calls it saw."""
    calls = []

    def set_to(cap):
        def fake(device=None):
            calls.append(device)
            return cap
        monkeypatch.setattr(torch.cuda, "get_device_capability", fake)
        return calls

    return set_to


# --- dtype="auto" ---------------------------------------------------------------------


@pytest.mark.parametrize("cap, want", [((7, 5), torch.float16), ((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16)])
def test_auto_dtype_on_a_gpu_is_bf16_only_from_compute_capability_8(capability, cap, want):
    """A T4 (7.5, the free Colab GPU) has no bf16 units: fp16. An A100 (8.0) and an H100 (9.0): bf16."""
    calls = capability(cap)
    assert resolve_dtype("auto", GPU) is want
    assert calls == [GPU]  # it asked about this device


def test_auto_dtype_on_a_cpu_is_fp32_and_asks_no_gpu(capability):
    calls = capability((9, 0))
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32
    assert resolve_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16
    assert calls == []


def test_bf16_on_a_gpu_without_bf16_units_is_refused_with_the_way_out(capability):
    capability((7, 5))
    with pytest.raises(ValueError, match=r"dtype='bfloat16' is invalid on cuda: .*capability is 7\.5.*"
                                         r"8\.0 or above; use dtype='float16'"):
        resolve_dtype("bfloat16", GPU)
    assert resolve_dtype("float16", GPU) is torch.float16  # the other choices stand
    assert resolve_dtype("float32", GPU) is torch.float32
    capability((8, 6))
    assert resolve_dtype("bfloat16", GPU) is torch.bfloat16


# --- the KV pool's size ---------------------------------------------------------------

BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 2  # the default model in bf16: 30 layers, 3 KV heads of 64
BLOCK = 16 * BYTES_PER_TOKEN


def reading(free, total, used):
    """A fake cuda_memory: (free, total, used by this process), and a check that it is asked about the device."""
    def read(device):
        assert device == GPU
        return free, total, used
    return read


def no_reading(device):
    raise AssertionError("the GPU's memory was read, though the pool's size was given")


def test_gpu_pool_is_total_times_utilization_less_what_the_process_holds():
    # 80 GiB card, the weights hold 10 GiB, nothing else runs: 0.9 x 80 - 10 = 62 GiB of blocks
    read = reading(free=69 * GIB, total=80 * GIB, used=10 * GIB)
    assert kv_pool_blocks(EngineConfig(), GPU, BYTES_PER_TOKEN, read) == (72 * GIB - 10 * GIB) // BLOCK
    half = kv_pool_blocks(EngineConfig(gpu_memory_utilization=0.5), GPU, BYTES_PER_TOKEN, read)
    assert half == (40 * GIB - 10 * GIB) // BLOCK
    assert kv_pool_blocks(EngineConfig(block_size=32), GPU, BYTES_PER_TOKEN, read) == 62 * GIB // (2 * BLOCK)


def test_default_reading_counts_the_processs_live_tensors_and_its_cache_as_free(monkeypatch):
    """40 GiB card: the driver sees 26 GiB free; torch holds 10 GiB, of which 6 GiB
    are live weights and 4 GiB the cached pool of an engine dropped earlier."""
    seen = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: seen.append(device) or (26 * GIB, 40 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: seen.append(device) or 6 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: seen.append(device) or 10 * GIB)
    assert kv_pool_blocks(EngineConfig(), GPU, BYTES_PER_TOKEN) == (36 * GIB - 6 * GIB) // BLOCK
    assert seen == [GPU, GPU, GPU]
    # the same card with 30 GiB of live tensors of a second engine still alive: 0.9 x 40 cannot be had
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 36 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 36 * GIB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (3 * GIB, 40 * GIB))
    with pytest.raises(ValueError, match="gpu_memory_utilization=0.9 leaves no room"):
        kv_pool_blocks(EngineConfig(), GPU, BYTES_PER_TOKEN)


def test_a_size_given_is_kept_and_the_cpu_keeps_its_fixed_default():
    assert kv_pool_blocks(EngineConfig(num_kv_blocks=7), GPU, BYTES_PER_TOKEN, no_reading) == 7
    assert kv_pool_blocks(EngineConfig(kv_cache_memory_bytes=GIB), GPU, BYTES_PER_TOKEN, no_reading) == GIB // BLOCK
    assert kv_pool_blocks(EngineConfig(kv_cache_memory_bytes=1), GPU, BYTES_PER_TOKEN, no_reading) == 1
    cpu = torch.device("cpu")
    assert kv_pool_blocks(EngineConfig(), cpu, BYTES_PER_TOKEN, no_reading) == CPU_KV_CACHE_BYTES // BLOCK


def test_a_model_that_leaves_no_room_for_the_pool_is_refused():
    # 16 GiB card (a T4), 0.9 of it is 14.4 GiB, and the weights already hold 15 GiB
    read = reading(free=0.5 * GIB, total=16 * GIB, used=15 * GIB)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.9 leaves no room for the KV pool: it allows "
                                         r"14.40 GiB of the GPU's 16.00 GiB, and this process already holds 15.00 GiB"):
        kv_pool_blocks(EngineConfig(), GPU, BYTES_PER_TOKEN, read)
    # room for all but one byte of a block: 0 blocks, refused too, not rounded up
    read = reading(free=GIB, total=10 * GIB, used=5 * GIB - BLOCK + 1)
    with pytest.raises(ValueError, match="leaves no room"):
        kv_pool_blocks(EngineConfig(gpu_memory_utilization=0.5), GPU, BYTES_PER_TOKEN, read)
    assert kv_pool_blocks(EngineConfig(gpu_memory_utilization=0.5), GPU, BYTES_PER_TOKEN,
                          reading(free=GIB, total=10 * GIB, used=5 * GIB - BLOCK)) == 1


def test_memory_held_by_other_processes_is_not_taken():
    # 80 GiB card; another process holds 40 GiB, so 0.9 x 80 cannot be had
    read = reading(free=30 * GIB, total=80 * GIB, used=10 * GIB)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.9 asks for 72.00 GiB of the GPU's 80.00 GiB, "
                                         r"but this process can have at most 40.00 GiB"):
        kv_pool_blocks(EngineConfig(), GPU, BYTES_PER_TOKEN, read)
    assert kv_pool_blocks(EngineConfig(gpu_memory_utilization=0.5), GPU, BYTES_PER_TOKEN, read) == 30 * GIB // BLOCK


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.01, 2, "0.9", None, True, math.nan])
def test_gpu_memory_utilization_must_be_a_fraction(bad):
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=.* is invalid: must be a number in \(0, 1\]"):
        EngineConfig(gpu_memory_utilization=bad)


def test_gpu_memory_utilization_is_a_float_flag():
    parser = argparse.ArgumentParser()
    EngineConfig.add_cli_args(parser)
    assert parser.parse_args([]).gpu_memory_utilization == 0.9
    args = parser.parse_args(["--gpu-memory-utilization", "0.5"])
    assert EngineConfig.from_cli_args(args).gpu_memory_utilization == 0.5
    assert EngineConfig(gpu_memory_utilization=1).gpu_memory_utilization == 1  # the whole GPU is allowed
