"""LLM: the user-facing API, shaped like vLLM's.

    llm = LLM("smollm2-135m-instruct")
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8, temperature=0))
    print(out[0].outputs[0].text)

LLM is the offline front end: it hands every prompt to an LLMEngine
(llm_engine.py) and steps it until all are done. The engine does the loop the
course is about: prefill the prompts, then decode steps that each add one
token per sequence, until every sequence meets a stopping rule, with requests
joining and leaving the batch at every step (continuous batching).
"""
from __future__ import annotations

from collections.abc import Iterator

from tqdm.auto import tqdm

from .llm_engine import LLMEngine
from .outputs import RequestOutput
from .sampling import SamplingParams
from .tokenizer import Tokenizer


class LLM:
    """Takes the same keyword arguments as LLMEngine: the fields of EngineConfig
    (max_num_seqs, max_num_batched_tokens, block_size, kv_cache_memory_bytes,
    enable_prefix_caching, scheduling, quantization, enforce_eager, ...)."""

    def __init__(self, model: str | None = None, **engine_args):
        self.llm_engine = LLMEngine(model, **engine_args)

    # The engine's parts, under the names the labs and chapters use.
    tokenizer = property(lambda self: self.llm_engine.tokenizer)
    model_config = property(lambda self: self.llm_engine.model_config)
    model_runner = property(lambda self: self.llm_engine.model_runner)
    runner = model_runner  # the name the labs use
    model = property(lambda self: self.llm_engine.model)
    device = property(lambda self: self.llm_engine.device)
    dtype = property(lambda self: self.llm_engine.dtype)
    max_model_len = property(lambda self: self.llm_engine.max_model_len)
    eos_token_ids = property(lambda self: self.llm_engine.eos_token_ids)
    model_name = property(lambda self: self.llm_engine.model_name)

    def get_tokenizer(self) -> Tokenizer:
        return self.tokenizer

    def reset_prefix_cache(self) -> int:
        """Forget the prompt prefixes kept in free KV blocks (vLLM's LLM.reset_prefix_cache)."""
        return self.llm_engine.reset_prefix_cache()

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Complete one prompt or a batch. A prompt is a string or
        {"prompt_token_ids": [...]}; results come back in the same order."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if not prompts:
            raise ValueError("prompts: expected at least one prompt, got an empty list")
        params = sampling_params if sampling_params is not None else SamplingParams()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"sampling_params: got {len(params)} for {len(prompts)} prompts")
        engine = self.llm_engine
        # Build and check every request before queueing any, so a bad one changes nothing.
        requests = [engine.make_request(p, sp, prompt_index=i) for i, (p, sp) in enumerate(zip(prompts, params))]
        ids = [engine.queue_request(r) for r in requests]
        results: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="generate", disable=not use_tqdm)
        try:
            while len(results) < len(ids):
                for out in engine.step():
                    if out.finished:
                        results[out.request_id] = out
                        bar.update(1)
        finally:  # an exception (or Ctrl-C) must not leave requests in the engine
            engine.abort_request([i for i in ids if i not in results])
            bar.close()
        return [results[i] for i in ids]

    def chat(self, messages, sampling_params: SamplingParams | None = None,
             add_generation_prompt: bool = True) -> list[RequestOutput]:
        """Reply to one conversation (a list of {"role", "content"} dicts) or to a
        list of conversations, using the model's own chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        if not conversations:
            raise ValueError("messages: expected a non-empty conversation")
        prompts = [{"prompt_token_ids": self.tokenizer.apply_chat_template(c, add_generation_prompt)}
                   for c in conversations]
        return self.generate(prompts, sampling_params)

    def stream(self, prompt, sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the reply's text as it is produced, one increment per step.
        Increments never split a UTF-8 character or reveal part of a stop string."""
        engine = self.llm_engine
        rid = engine.add_request(prompt, sampling_params)
        sent = ""
        try:
            while True:
                for out in engine.step():
                    if out.request_id != rid:
                        continue
                    text = out.outputs[0].text
                    if len(text) > len(sent):
                        yield text[len(sent):]
                        sent = text
                    if out.finished:
                        return
        finally:  # the reader stopped early: free the request's blocks
            engine.abort_request(rid)
