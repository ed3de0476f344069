"""SpeculativeDecoder: draft k tokens cheaply, verify them with one target pass.

Decoding one token at a time reads every weight once per token, and at batch 1
that memory traffic, not arithmetic, sets the speed. A pass over k+1 tokens
reads the same weights once, so it costs little more than a pass over one.
Speculative decoding exploits that: a cheap draft guesses k tokens, the target
scores all of them in one pass, and the rejection rule in verify.py keeps a
prefix of the guesses plus one token of its own. Every step yields at least one
token (no worse than plain decoding, apart from the draft's cost) and up to k+1.

This decoder works on one sequence with the contiguous KVCache, next to the
engine rather than inside its scheduler, so the whole algorithm fits on a screen.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch

from tinyinfer.checks import check_choice, check_context_window, check_prompt_ids, is_int, require
from tinyinfer.forward import forward_tokens, new_cache
from tinyinfer.kv_cache import KVCache
from tinyinfer.request import Request
from tinyinfer.sampler import Sampler
from tinyinfer.sampling import SamplingParams, processed_probs
from tinyinfer.sequence import Sequence
from tinyinfer.tokenizer import Tokenizer
from .drafts import LayerDraft, NgramDraft
from .verify import accept_draft_tokens

DRAFTS = ("ngram", "layers", "none")  # "none": plain decoding through the same loop, the baseline
MAX_SPECULATIVE_TOKENS = 64


@dataclass
class SpecDecodeStats:
    num_proposed: int = 0  # draft tokens offered for verification
    num_accepted: int = 0  # of those, kept by the rejection rule
    num_generated: int = 0  # tokens returned
    num_target_forward_passes: int = 0  # the prefill included
    num_draft_forward_passes: int = 0
    wall_time_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_proposed if self.num_proposed else 0.0

    @property
    def tokens_per_target_pass(self) -> float:
        """Plain decoding makes one pass per token, so this is the best-case speed-up."""
        return self.num_generated / self.num_target_forward_passes if self.num_target_forward_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.num_generated / self.wall_time_s if self.wall_time_s else 0.0


class SpeculativeDecoder:
    """Greedy or sampled decoding of one prompt with a draft:

        spec = SpeculativeDecoder(llm, draft="ngram", num_speculative_tokens=4)
        token_ids, stats = spec.generate(prompt_ids, SamplingParams(max_tokens=64, temperature=0))

    draft="ngram": prompt lookup (prompt_lookup_max..prompt_lookup_min tokens);
    draft="layers": the target's first draft_layers layers (default: three quarters
    of them; a model not trained to exit early rarely agrees with itself much
    sooner); draft="none": no draft, one token per pass (plain decoding, for
    comparison).
    `llm_or_model` is an LLM or a LlamaForCausalLM."""

    def __init__(self, llm_or_model, draft: str = "ngram", num_speculative_tokens: int = 4,
                 draft_layers: int | None = None, prompt_lookup_max: int = 3, prompt_lookup_min: int = 1):
        self.model, self.tokenizer, self.eos_token_ids, self.max_model_len = _unwrap(llm_or_model)
        num_layers = self.model.config.num_hidden_layers
        check_choice("draft", draft, DRAFTS)
        require(is_int(num_speculative_tokens) and 1 <= num_speculative_tokens <= MAX_SPECULATIVE_TOKENS,
                "num_speculative_tokens", num_speculative_tokens, f"an integer in [1, {MAX_SPECULATIVE_TOKENS}]")
        if draft == "layers":
            draft_layers = num_layers - num_layers // 4 if draft_layers is None else draft_layers
            require(is_int(draft_layers) and 1 <= draft_layers <= num_layers, "draft_layers", draft_layers,
                    f"an integer in [1, {num_layers}] (the target has {num_layers} layers)")
        if draft == "ngram":
            require(is_int(prompt_lookup_min) and prompt_lookup_min >= 1, "prompt_lookup_min",
                    prompt_lookup_min, "an integer >= 1")
            require(is_int(prompt_lookup_max) and prompt_lookup_max >= prompt_lookup_min, "prompt_lookup_max",
                    prompt_lookup_max, f"an integer >= prompt_lookup_min ({prompt_lookup_min})")
        self.draft_name = draft
        self.num_speculative_tokens = num_speculative_tokens
        self.draft_layers = draft_layers if draft == "layers" else None
        self.draft = {"ngram": lambda: NgramDraft(prompt_lookup_max, prompt_lookup_min),
                      "layers": lambda: LayerDraft(self.model, draft_layers),
                      "none": lambda: None}[draft]()
        self._ids = itertools.count()
        self.sampler = Sampler()

    def generate(self, prompt_token_ids: list[int], sampling_params: SamplingParams | None = None):
        """Returns (output token ids, SpecDecodeStats)."""
        params = sampling_params if sampling_params is not None else SamplingParams()
        prompt = self._validate(prompt_token_ids, params)
        device = self.model.lm_head.weight.device
        request = Request(str(next(self._ids)), None, prompt, params, self.eos_token_ids,
                          self.tokenizer.decode if self.tokenizer is not None else None)
        return self._generate(request.samples[0], device)  # the sequence, and its sampler state, end here

    def _generate(self, seq: Sequence, device):
        params, prompt = seq.params, seq.prompt_token_ids
        stats = SpecDecodeStats()
        start = time.perf_counter()
        # Drafts are capped so nothing is written past the last position a reply can reach.
        capacity = len(prompt) + params.max_tokens
        cache = new_cache(self.model, capacity)
        if self.draft is not None:
            self.draft.start(capacity)
        # Prefill: the first token is sampled from the target as usual.
        logits = forward_tokens(self.model, prompt, 0, cache)[-1]
        stats.num_target_forward_passes += 1
        self._append(seq, self.sampler(logits[None], [seq]).token_ids)  # the engine's sampler
        while not seq.finished:
            self._step(seq, cache, stats)
        if device.type == "cuda":
            torch.cuda.synchronize()
        stats.wall_time_s = time.perf_counter() - start
        stats.num_generated = seq.num_output_tokens
        if self.draft is not None:
            stats.num_draft_forward_passes = self.draft.num_forward_passes
        return seq.output_token_ids, stats

    def _step(self, seq: Sequence, cache: KVCache, stats: SpecDecodeStats) -> None:
        """Draft, verify in one target pass, accept a prefix, append."""
        params, context = seq.params, seq.token_ids
        generator = self.sampler.state(seq, self.model.lm_head.weight.device).generator  # seeded: its own stream
        # A step yields up to k+1 tokens; never draft beyond what max_tokens allows.
        k = min(self.num_speculative_tokens, params.max_tokens - seq.num_output_tokens - 1)
        drafts, draft_probs = [], None
        if self.draft is not None and k > 0:
            drafts, draft_probs = self.draft.propose(context, k, params, generator)
        # The cache holds positions 0..n-2; the last token (position n-1) has not
        # been through the target yet. Feeding it plus the drafts at positions
        # n-1..n-1+k gives the target's distribution for every drafted position
        # and one more, all in ONE pass.
        logits = forward_tokens(self.model, [context[-1]] + drafts, len(context) - 1, cache)
        stats.num_target_forward_passes += 1
        target_probs = draft_target_probs(logits, seq, drafts)
        tokens, num_accepted = accept_draft_tokens(target_probs, draft_probs, drafts, generator)
        stats.num_proposed += len(drafts)
        stats.num_accepted += num_accepted
        # Rejected drafts leave keys in cache columns past the accepted ones. They
        # need no cleanup: the next pass starts at the first of those columns and
        # overwrites them, and the causal mask never lets a query see beyond itself.
        self._append(seq, tokens)

    def _append(self, seq: Sequence, tokens: list[int]) -> None:
        """Add tokens one by one, so EOS, stop ids, stop strings and max_tokens
        cut the reply exactly where plain decoding would."""
        for token in tokens:
            seq.append_token(token)
            if seq.finished:
                return

    def _validate(self, prompt_token_ids, params: SamplingParams) -> list[int]:
        """Check everything before touching any state, so a bad call changes nothing."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params: expected a SamplingParams, got {type(params).__name__}")
        params.validate()
        if params.stop and self.tokenizer is None:
            raise ValueError("SamplingParams.stop: stop strings need a tokenizer; pass an LLM, or use stop_token_ids")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(params, name) is not None:
                raise ValueError(f"SamplingParams.{name}={getattr(params, name)!r} is not supported by "
                                 "SpeculativeDecoder: must be None")
        if isinstance(prompt_token_ids, (str, bytes)) or not hasattr(prompt_token_ids, "__iter__"):
            raise ValueError(f"prompt_token_ids: expected a list of token ids, got {type(prompt_token_ids).__name__}")
        ids = list(prompt_token_ids)
        check_prompt_ids(ids, self.model.config.vocab_size, "prompt_token_ids")  # the engine's checks
        check_context_window(len(ids), params.max_tokens, self.max_model_len, "prompt_token_ids")
        return ids


def draft_target_probs(logits: torch.Tensor, seq: Sequence, drafts: list[int]) -> torch.Tensor:
    """logits[j] is the target's output after seq's tokens and drafts[:j].
    Returns the probabilities the sampler would draw from at each row, with the
    repetition penalty counting the drafts before that row as seen."""
    params, seen = seq.params, None
    if params.repetition_penalty != 1.0:
        seen = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        seen[torch.tensor(seq.token_ids, device=logits.device)] = True
    rows = []
    for j in range(logits.shape[0]):
        if seen is not None and j:
            seen = seen.clone()
            seen[drafts[j - 1]] = True
        rows.append(processed_probs(logits[j], params, seen))
    return torch.stack(rows)


def _unwrap(obj):
    """(model, tokenizer or None, eos ids, max_model_len) from an LLM or a bare model."""
    if hasattr(obj, "lm_head") and hasattr(obj, "config"):  # a LlamaForCausalLM
        config = obj.config
        return obj, None, list(config.eos_token_ids), config.max_position_embeddings
    model = getattr(obj, "model", None)  # LLM and LLMEngine both expose .model
    if model is None or not hasattr(model, "lm_head"):
        raise ValueError(f"llm_or_model: expected an LLM or a LlamaForCausalLM, got {type(obj).__name__}")
    tokenizer = getattr(obj, "tokenizer", None)
    eos = set(tokenizer.eos_token_ids(model.config) if isinstance(tokenizer, Tokenizer) else model.config.eos_token_ids)
    eos |= set(getattr(obj, "eos_token_ids", None) or [])  # an LLM's own list, if it has one
    max_len = getattr(obj, "max_model_len", None) or model.config.max_position_embeddings
    return model, tokenizer, sorted(eos), max_len
