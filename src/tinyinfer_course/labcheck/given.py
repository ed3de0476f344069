"""Code the checks of labs 7 and 11 hand the learner's loop: the model step
and the sampler. Both are the engine's own, behind the lab's interface (lab
7's Request records and allocator instead of Sequences and a BlockManager)."""
from __future__ import annotations

import torch

from tinyinfer.model_runner import ModelRunner
from tinyinfer.scheduler import ScheduledSeq, SchedulerOutput


def make_execute_model(model, num_blocks: int, block_size: int):
    """execute_model(scheduled, allocator) -> {seq_id: logits [V]} for one step:
    the scheduled requests' new tokens packed into one row, run through `model`
    (a tinyinfer LlamaForCausalLM) by tinyinfer's ModelRunner, on its paged KV
    cache addressed through the allocator's block tables. Only requests that
    reach their last known token get logits (a prompt chunk that is not the
    last has nothing to sample)."""
    param = next(model.parameters())
    runner = ModelRunner(model, param.device, param.dtype, num_blocks, block_size)

    def execute_model(scheduled, allocator) -> dict:
        # A lab Request has what ModelRunner reads of a Sequence (token_ids); the
        # rest of each entry comes from the request's counters and the allocator.
        out = SchedulerOutput()
        for req, n in scheduled:
            last = req.num_computed + n == req.num_tokens  # it samples after this step
            out.scheduled.append(ScheduledSeq(req, req.num_computed, n, list(allocator.block_tables[req.seq_id]),
                                              samples=[req] if last else []))
        if not out.scheduled:
            return {}
        logits = runner.execute_model(out).logits
        return {req.seq_id: logits[i] for i, req in enumerate(out.sampling)}

    return execute_model


def greedy(logits: torch.Tensor, temperature: float = 0.0, generator=None) -> int:
    """The sampler the check hands run_engine: the highest score."""
    return int(logits.argmax())
