"""LLM: the user-facing API, shaped like vLLM's.

    llm = LLM("smollm2-135m-instruct")
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8, temperature=0))
    print(out[0].outputs[0].text)

Generation is the loop the course is about: one prefill pass over the prompts,
then decode steps that each add one token per sequence, until every sequence
meets a stopping rule.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import torch
from tqdm.auto import tqdm

from .model_runner import ModelRunner
from .outputs import Logprob, RequestOutput
from .sampling import SamplingParams, make_generator, sample
from .sequence import Sequence
from .tokenizer import Tokenizer
from .weights import DEFAULT_MODEL, read_config, resolve_model, load_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"device={device!r} is invalid: must be 'auto', 'cpu' or 'cuda[:N]'")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for, but torch sees no CUDA device; use 'cpu' or 'auto'")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":  # fp32 on CPU (exact, widely fast), bf16 on GPU
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is invalid: must be one of 'auto', {', '.join(map(repr, DTYPES))}")
    return DTYPES[dtype]


class LLM:
    def __init__(self, model: str = DEFAULT_MODEL, dtype: str = "auto", device: str = "auto",
                 max_model_len: int | None = None, max_num_seqs: int = 16, seed: int | None = None,
                 quantization: str | None = None, group_size: int = 128):
        # Check the cheap arguments before loading anything.
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        if quantization is not None or group_size != 128:
            from .quant import check_method  # names the field and its allowed values

            check_method(quantization or "int4", group_size)
        if not (isinstance(max_num_seqs, int) and max_num_seqs >= 1):
            raise ValueError(f"max_num_seqs={max_num_seqs!r} is invalid: must be an integer >= 1")
        folder = resolve_model(model)
        self.model_name = model
        self.model_config = read_config(folder)
        window = self.model_config.max_position_embeddings
        if max_model_len is not None and not (isinstance(max_model_len, int) and 1 <= max_model_len <= window):
            raise ValueError(f"max_model_len={max_model_len!r} is invalid: must be in [1, {window}]")
        self.max_model_len = max_model_len or window
        self.max_num_seqs = max_num_seqs
        if seed is not None:
            torch.manual_seed(seed)
        self.tokenizer = Tokenizer(folder)
        eos = set(self.model_config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = sorted(eos)
        model_ = load_model(folder, self.dtype, self.device)
        if quantization is not None:  # weight-only: swap each decoder Linear for its quantized twin
            from .quant import quantize_model

            quantize_model(model_, quantization, group_size)
        self.runner = ModelRunner(model_, self.device, self.dtype, pad_token_id=self.eos_token_ids[0] if eos else 0)
        self._ids = itertools.count()

    @property
    def model(self):
        return self.runner.model

    def get_tokenizer(self) -> Tokenizer:
        return self.tokenizer

    # --- public API -----------------------------------------------------------

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Complete one prompt or a batch. A prompt is a string or
        {"prompt_token_ids": [...]}; results come back in the same order."""
        seqs = self._make_sequences(prompts, sampling_params)
        bar = tqdm(total=len(seqs), desc="generate", disable=not use_tqdm)
        for batch in _chunks(seqs, self.max_num_seqs):
            for _ in self._run(batch):
                pass
            bar.update(len(batch))
        bar.close()
        return [s.to_output() for s in seqs]

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
        (seq,) = self._make_sequences([prompt], sampling_params)
        sent = ""
        for _ in self._run([seq]):
            text = seq.stable_text()
            if len(text) > len(sent):
                yield text[len(sent):]
                sent = text

    # --- internals --------------------------------------------------------------

    def _make_sequences(self, prompts, sampling_params) -> list[Sequence]:
        """Validate everything first, so a bad request changes no state."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if not prompts:
            raise ValueError("prompts: expected at least one prompt, got an empty list")
        params = sampling_params if sampling_params is not None else SamplingParams()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"sampling_params: got {len(params)} for {len(prompts)} prompts")
        seqs = []
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            p.validate()  # fields may have been changed after construction
            text, ids = self._tokenize(prompt, i)
            over = len(ids) + p.max_tokens - self.max_model_len
            if over > 0:
                raise ValueError(
                    f"prompts[{i}]: {len(ids)} prompt tokens + max_tokens {p.max_tokens} exceeds the "
                    f"context window of {self.max_model_len} tokens by {over} tokens"
                )
            seqs.append(Sequence(
                request_id=str(next(self._ids)), prompt=text, prompt_token_ids=ids, params=p,
                eos_token_ids=self.eos_token_ids, generator=make_generator(p.seed, self.device),
                logprobs=[] if p.logprobs is not None else None, arrival_time=time.perf_counter(),
            ))
        return seqs

    def _tokenize(self, prompt, i: int) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            text, ids = prompt, self.tokenizer.encode(prompt)
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, ids = prompt.get("prompt"), list(prompt["prompt_token_ids"])
            vocab = self.model_config.vocab_size
            if any(not (0 <= t < vocab) for t in ids):
                raise ValueError(f"prompts[{i}].prompt_token_ids: every id must be in [0, {vocab - 1}]")
        else:
            raise ValueError(f"prompts[{i}]: expected a string or {{'prompt_token_ids': [...]}}, got {type(prompt).__name__}")
        if not ids:
            raise ValueError(f"prompts[{i}]: the prompt is empty (0 tokens); give at least one token")
        return text, ids

    def _run(self, seqs: list[Sequence]) -> Iterator[None]:
        """Prefill, then decode until every sequence has finished; yield after each step."""
        want_prompt_lp = any(s.params.prompt_logprobs is not None for s in seqs)
        logits, hidden = self.runner.prefill(seqs, all_positions=want_prompt_lp)
        if want_prompt_lp:
            self._prompt_logprobs(seqs, hidden)
        try:
            while True:
                self._sample_and_append(seqs, logits)
                yield
                if all(s.finished for s in seqs):
                    return
                logits = self.runner.decode(seqs)
        finally:
            self.runner.release()

    def _sample_and_append(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        now = time.perf_counter()
        for s, row in zip(seqs, logits):
            if s.finished:
                continue
            seen = None
            if s.params.repetition_penalty != 1.0:
                seen = torch.tensor(sorted(set(s.token_ids)), device=row.device)
            token = sample(row, s.params, s.generator, seen)
            if s.logprobs is not None:
                lp = torch.log_softmax(row.float(), -1)
                s.logprobs.append(self._top_logprobs(lp, token, s.params.logprobs))
                s.cumulative_logprob += float(lp[token])
            s.append_token(token, self.tokenizer.decode)
            s.token_times.append(now)

    def _prompt_logprobs(self, seqs: list[Sequence], hidden: torch.Tensor) -> None:
        """Logprob of each prompt token given the ones before it (None for the first)."""
        for b, s in enumerate(seqs):
            n = s.params.prompt_logprobs
            if n is None:
                continue
            ids = s.prompt_token_ids
            lp = torch.log_softmax(self.runner.logits_for(hidden[b, : len(ids) - 1]), -1)
            s.prompt_logprobs = [None] + [self._top_logprobs(lp[t - 1], ids[t], n) for t in range(1, len(ids))]

    def _top_logprobs(self, lp: torch.Tensor, token: int, n: int) -> dict[int, Logprob]:
        """The chosen token plus the n most likely ones, each with its rank."""
        out = {}
        if n:
            values, ids = torch.topk(lp, n)
            for rank, (v, t) in enumerate(zip(values.tolist(), ids.tolist()), start=1):
                out[t] = Logprob(v, rank, self.tokenizer.decode([t]))
        if token not in out:
            rank = int((lp > lp[token]).sum()) + 1
            out[token] = Logprob(float(lp[token]), rank, self.tokenizer.decode([token]))
        return out


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]
