"""The two parts of an engine's step besides the sampler: the scheduler, which
decides what runs, and the model runner, which runs it. Each comes in two
kinds: continuous batching on a paged KV pool (scheduler.py, model_runner.py)
and chapter 7's static baseline on a contiguous cache (static_batching.py).
SchedulerLike and RunnerLike say what LLMEngine may use of either kind."""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from .block_manager import BlockManager
from .config import EngineConfig
from .kv_pool import kv_pool_blocks, working_memory
from .model_runner import ModelRunner
from .outputs import ModelOutput
from .sampling import SamplerOutput
from .scheduler import Scheduler, SchedulerConfig, SchedulerOutput, SchedulerStats

if TYPE_CHECKING:
    from .model import LlamaForCausalLM
    from .request import Request
    from .sequence import Sequence


class SchedulerLike(Protocol):
    """What the engine, and whoever reads engine.scheduler, may use of a scheduler:
    scheduler.Scheduler (continuous batching) or static_batching.StaticScheduler
    (chapter 7's baseline)."""

    running: list[Sequence]  # the sequences in the batch that have not finished, oldest first

    @property
    def block_manager(self) -> BlockManager | None: ...  # the KV blocks; None without a paged pool (static)

    def check_request(self, request: Request, where: str) -> None: ...  # refuse what could never run
    def add(self, request: Request) -> None: ...
    def schedule(self) -> SchedulerOutput: ...
    def update_from_output(self, out: SchedulerOutput, sampled: SamplerOutput) -> list[Sequence]: ...
    def finish(self, seq: Sequence) -> None: ...  # aborted: leave at once
    def record_stats(self, st: SchedulerStats, out: SchedulerOutput | None = None) -> None: ...


class RunnerLike(Protocol):
    """What the engine asks of a model runner: model_runner.ModelRunner (a paged
    cache) or static_batching.StaticModelRunner (a contiguous one)."""

    model: LlamaForCausalLM  # settable: chapter 6 swaps the model on a live engine
    eager_decode_reason: str | None  # why the last decode-only step did not run compiled

    def execute_model(self, out: SchedulerOutput) -> ModelOutput: ...


def make_scheduler_and_runner(cfg: EngineConfig, model: LlamaForCausalLM, device: torch.device, dtype: torch.dtype,
                              kv_bytes_per_token: int, max_model_len: int,
                              pad_token_id: int = 0) -> tuple[SchedulerLike, RunnerLike]:
    """The step's scheduler and runner for cfg.scheduling. Continuous batching
    gets a paged KV pool (kv_pool_blocks says how many blocks) and a
    BlockManager for it; static batching, chapter 7's baseline, allocates a
    contiguous cache for each batch instead, and has neither."""
    sched_config = SchedulerConfig(cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.enable_chunked_prefill,
                                   cfg.preemption_mode)
    if cfg.scheduling == "static":
        from .static_batching import StaticModelRunner, StaticScheduler

        return (StaticScheduler(sched_config, kv_bytes_per_token),
                StaticModelRunner(model, device, dtype, pad_token_id))
    # After loading, on a GPU: room for what the engine can use, within what the model and a step leave.
    working = working_memory(model, cfg, max_model_len, dtype, device)  # 0 but on a GPU sized from free memory
    num_blocks = kv_pool_blocks(cfg, device, kv_bytes_per_token, max_model_len=max_model_len, working_bytes=working)
    block_manager = BlockManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching)
    runner = ModelRunner(model, device, dtype, num_blocks, cfg.block_size, cfg.enforce_eager, cfg.max_num_seqs,
                         cfg.kv_cache_dtype, compiled_cuda_graphs=cfg.compiled_cuda_graphs)
    runner.compile_or_warm_up_model()  # enforce_eager=False: compile now, not mid-request
    return Scheduler(sched_config, block_manager, kv_bytes_per_token), runner
