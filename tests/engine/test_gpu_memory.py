"""Engines on a GPU's memory, proven on a CPU with a faked GPU: the default
pool is capped at what the engine can use, so a second engine in one process
(labs 6 and 7 keep two alive) finds room on an 80 GB card and on a 16 GB T4;
the pool leaves room for a step's working memory, measured by a warm-up step;
lab 6 asks for no dtype a T4 lacks; and the notebooks and benchmarks that keep
several engines alive give each a pool of fixed size."""
import ast
from pathlib import Path

import nbformat
import pytest
import torch

from tinyinfer import kv_pool
from tinyinfer.config import EngineConfig, ModelConfig, half_dtype, resolve_dtype
from tinyinfer.kv_pool import PREFIX_CACHE_MARGIN, cuda_memory, kv_pool_blocks

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30
GPU = torch.device("cuda")


class FakeGPU:
    """What torch.cuda reports about one GPU to a process that is alone on it:
    the driver's free memory and this process's live and cached bytes. The
    CUDA context takes its share of the card before anything is allocated."""

    def __init__(self, monkeypatch, total: int, capability: tuple[int, int], context: int = GIB // 2):
        self.total, self.allocated = total, 0
        self.context = context
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (self.free(), self.total))
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: self.allocated)
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: self.allocated)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)

    def free(self) -> int:
        return self.total - self.context - self.allocated

    def allocate(self, nbytes: int) -> None:
        assert nbytes <= self.free(), "out of memory"
        self.allocated += nbytes


@pytest.fixture(scope="module")
def default_config(default_model_dir) -> ModelConfig:
    return ModelConfig.from_json(Path(default_model_dir) / "config.json")


def start_engine(gpu: FakeGPU, model: ModelConfig, cfg: EngineConfig, working: int, rule=kv_pool_blocks) -> int:
    """What LLMEngine does with a GPU's memory, in its order: load the weights,
    measure a step's working memory (here, given), size the pool from what
    cuda_memory reads, and allocate it. Returns the pool's blocks."""
    dtype = resolve_dtype(cfg.dtype, GPU)
    gpu.allocate(model.num_parameters() * dtype.itemsize)
    per_token = int(model.kv_bytes_per_token(dtype.itemsize))
    blocks = rule(cfg, GPU, per_token, cuda_memory, max_model_len=model.max_position_embeddings,
                  working_bytes=working)
    gpu.allocate(blocks * per_token * cfg.block_size)
    return blocks


@pytest.mark.parametrize("card, total, capability", [("H100", 80 * GIB, (9, 0)), ("T4", 15 * GIB, (7, 5))])
@pytest.mark.parametrize("dtype", ["auto", "float32"])
def test_two_default_engines_fit_on_one_gpu(monkeypatch, default_config, card, total, capability, dtype):
    """Two engines of the default model with every default setting, one after
    the other in one process: each pool holds max_num_seqs full windows twice
    over (16 x 8,192 tokens x 2), and the second still fits. (A T4 has 15 GiB
    that a process can use; in fp32 each pool is 11.25 GiB there, so the cap
    leaves the second engine what 0.9 x 15 GiB allows, less than its cap.)"""
    gpu = FakeGPU(monkeypatch, total, capability)
    cfg = EngineConfig(dtype=dtype)
    cap = cfg.max_num_seqs * default_config.max_position_embeddings * PREFIX_CACHE_MARGIN // cfg.block_size
    first = start_engine(gpu, default_config, cfg, working=GIB // 4)
    second = start_engine(gpu, default_config, cfg, working=GIB // 4)
    assert first == cap
    big_enough = card == "H100" or resolve_dtype(dtype, GPU).itemsize == 2
    assert second == cap if big_enough else 0 < second < cap
    assert gpu.allocated <= cfg.gpu_memory_utilization * total


def test_without_the_cap_the_second_engine_finds_no_room(monkeypatch, default_config):
    """The rule the engine had: the first engine took 0.9 of the card, and the
    second was refused (the error labs 6 and 7 met on every GPU)."""
    def uncapped(cfg, device, per_token, gpu_memory, max_model_len, working_bytes):
        return kv_pool_blocks(cfg, device, per_token, gpu_memory, working_bytes=working_bytes)

    gpu = FakeGPU(monkeypatch, 80 * GIB, (9, 0))
    start_engine(gpu, default_config, EngineConfig(), working=GIB // 4, rule=uncapped)
    with pytest.raises(ValueError, match="gpu_memory_utilization=0.9 leaves no room for the KV pool"):
        start_engine(gpu, default_config, EngineConfig(), working=GIB // 4, rule=uncapped)


def test_the_pool_leaves_room_for_a_steps_working_memory():
    per_token, block = 23040, 16 * 23040
    read = lambda device: (70 * GIB, 80 * GIB, 2 * GIB)  # noqa: E731 - free, total, used by the weights
    without = kv_pool_blocks(EngineConfig(), GPU, per_token, read)
    with_working = kv_pool_blocks(EngineConfig(), GPU, per_token, read, working_bytes=3 * GIB)
    assert without == (72 * GIB - 2 * GIB) // block and with_working == (69 * GIB - 2 * GIB) // block
    with pytest.raises(ValueError, match="and a step needs 71.00 GiB of working memory"):
        kv_pool_blocks(EngineConfig(), GPU, per_token, read, working_bytes=71 * GIB)


def test_a_pool_that_fits_the_cap_is_not_refused_for_other_processes():
    """Another process (a second replica) holds 60 of the 80 GiB: 0.9 of the
    card cannot be had, but the capped pool fits in what is free."""
    per_token = 23040
    read = lambda device: (19 * GIB, 80 * GIB, GIB // 2)  # noqa: E731
    blocks = kv_pool_blocks(EngineConfig(max_num_seqs=4), GPU, per_token, read, max_model_len=8192)
    assert blocks == 4 * 8192 * PREFIX_CACHE_MARGIN // 16
    with pytest.raises(ValueError, match="but this process can have at most 19.50 GiB"):
        kv_pool_blocks(EngineConfig(max_num_seqs=64), GPU, per_token, read, max_model_len=8192)


def test_working_memory_is_the_peak_of_the_largest_step(monkeypatch, tiny_dir):
    """peak_memory: what the GPU's allocator saw at its peak during the step,
    beyond what was allocated before it. largest_step runs on any device: a
    full budget of prompt tokens at the end of the window, every position's logits."""
    from tinyinfer.weights import load_model

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 5 * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 7 * GIB)
    ran = []
    assert kv_pool.peak_memory(lambda: ran.append(1), GPU) == 2 * GIB
    assert calls == ["sync", "reset", "sync"] and ran == [1]

    model = load_model(Path(tiny_dir), torch.float32, torch.device("cpu"))
    logits = []
    monkeypatch.setattr(model, "compute_logits", lambda hidden: logits.append(hidden.shape))
    kv_pool.largest_step(model, num_tokens=48, context=100, block_size=16, dtype=torch.float32,
                              device=torch.device("cpu"))()
    assert logits == [torch.Size([48, 64])]  # 48 new tokens after 52 cached, each one's logits


def test_working_memory_is_measured_only_where_a_gpu_sizes_the_pool(tiny_dir):
    from tinyinfer.weights import load_model

    model = load_model(Path(tiny_dir), torch.float32, torch.device("cpu"))
    assert kv_pool.working_memory(model, EngineConfig(), 1024, torch.float32, torch.device("cpu")) == 0
    for given in (dict(kv_cache_memory_bytes=GIB), dict(num_kv_blocks=8)):
        assert kv_pool.working_memory(model, EngineConfig(**given), 1024, torch.float32, GPU) == 0
    # the graphs' reserve: twice one layer's K and V gathered for 16 rows of the window
    assert kv_pool.graph_memory(model.config, 16, 8192, torch.bfloat16) == 2 * 16 * 8192 * (2 * 2 * 16 * 2)


def test_half_dtype_is_what_the_device_has(monkeypatch):
    assert half_dtype(torch.device("cpu")) == "bfloat16"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # a T4
    assert half_dtype(GPU) == "float16"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert half_dtype(GPU) == "bfloat16"


# --- the notebooks and benchmarks that keep several engines alive ---------------------


def engine_calls(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("LLM", "LLMEngine")]


def sized(call: ast.Call, tree: ast.AST) -> bool:
    """Does the call give the pool's size, directly or through a **dict built with it?"""
    names = {"kv_cache_memory_bytes", "num_kv_blocks"}
    if any(k.arg in names for k in call.keywords):
        return True
    splats = {k.value.id for k in call.keywords if k.arg is None and isinstance(k.value, ast.Name)}
    return any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) in splats for t in node.targets)
               and names & {n.arg for n in ast.walk(node.value) if isinstance(n, ast.keyword)}
               for node in ast.walk(tree))


def notebook_tree(path: Path) -> ast.AST:
    nb = nbformat.read(path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code" and not c.source.startswith(("!", "%")))
    return ast.parse(code)


@pytest.mark.parametrize("name", ["06-quantization", "07-batching"])
def test_labs_with_two_engines_give_each_a_fixed_pool(name):
    for folder in ("solutions", "labs"):
        tree = notebook_tree(ROOT / folder / f"{name}.ipynb")
        calls = engine_calls(tree)
        assert len(calls) >= 2 and all(sized(call, tree) for call in calls), (folder, name)


@pytest.mark.parametrize("name", ["decode", "quant", "quant_decode", "preemption", "throughput"])
def test_benchmarks_with_several_engines_give_each_a_fixed_pool(name):
    tree = ast.parse((ROOT / "benchmarks" / f"{name}.py").read_text())
    calls = engine_calls(tree)
    assert calls and all(sized(call, tree) for call in calls), name


def test_lab_6_names_no_dtype_a_t4_lacks():
    """Colab's free GPU, a T4, refuses bf16: lab 6 asks the device which 16-bit type it has."""
    for folder in ("solutions", "labs"):
        tree = notebook_tree(ROOT / folder / "06-quantization.ipynb")
        for call in engine_calls(tree):
            dtype = next((k.value for k in call.keywords if k.arg == "dtype"), None)
            assert not (isinstance(dtype, ast.Constant) and dtype.value in ("bfloat16", "float16")), folder
        assert any(isinstance(k.value, ast.Call) and getattr(k.value.func, "id", None) == "half_dtype"
                   for call in engine_calls(tree) for k in call.keywords if k.arg == "dtype"), folder
