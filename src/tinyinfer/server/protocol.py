"""The OpenAI wire format: request models (validated by pydantic) and the
JSON shapes of responses and streamed chunks.

Field names follow OpenAI's API; top_k, min_p, repetition_penalty, ignore_eos,
stop_token_ids and structured_outputs are vLLM's extensions to it. A response is built from the
engine core's RequestDeltas (messages.py), so this file is where "what the
engine produced" turns into "what the client reads".
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

from ..outputs import PositionLogprobs
from ..sampling import SamplingParams
from ..structured_output import StructuredOutputsParams
from .messages import ChatPrompt, RequestDelta, Usage


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingFields(BaseModel):
    """Fields that both endpoints share. Unknown fields are ignored, as OpenAI-style servers do."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int = 1
    ignore_eos: bool = False
    repetition_penalty: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stream: bool = False
    stream_options: StreamOptions | None = None
    structured_outputs: dict | None = None  # vLLM's: {"json": schema} | {"regex": ...} | {"choice": [...]} | ...
    response_format: dict | None = None  # OpenAI's: {"type": "text" | "json_object" | "json_schema", ...}

    def unsupported(self) -> tuple[str, str] | None:
        """(field, message) for a valid-looking request this engine cannot honour."""
        penalties = {"presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty}
        for name, value in penalties.items():
            if value:
                return name, f"{name} is not supported (use repetition_penalty); it must be 0"
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed when stream is true"
        return None

    def sampling_params(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        """Map to SamplingParams; absent fields take OpenAI's defaults (temperature 1).
        SamplingParams raises ValueError naming any field out of range."""
        return SamplingParams(
            n=self.n,  # parallel samples: one choice each
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k is None else self.top_k,
            min_p=0.0 if self.min_p is None else self.min_p,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            seed=self.seed,
            logprobs=logprobs,
            ignore_eos=self.ignore_eos,
            structured_outputs=self.structured(),
        )

    def structured(self) -> StructuredOutputsParams | None:
        """The grammar asked for, by vLLM's field or by OpenAI's response_format
        (one or the other). Raises ValueError naming the field."""
        if self.structured_outputs is not None and self.response_format is not None:
            raise ValueError("response_format: give structured_outputs or response_format, not both")
        if self.structured_outputs is not None:
            return StructuredOutputsParams.from_dict(self.structured_outputs)
        if self.response_format is None:
            return None
        kind = self.response_format.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return StructuredOutputsParams(json_object=True)
        if kind == "json_schema":
            schema = (self.response_format.get("json_schema") or {}).get("schema")
            if not isinstance(schema, dict):
                raise ValueError("response_format.json_schema.schema: expected a JSON schema object")
            return StructuredOutputsParams(json=schema)
        raise ValueError(f"response_format.type={kind!r} is invalid: must be one of text, json_object, json_schema")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default for /v1/completions
    logprobs: int | None = None  # top-N alternatives per token
    echo: bool = False

    def engine_prompt(self):
        """The one prompt, in the engine's form: a string or {"prompt_token_ids": [...]}."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise ValueError(f"prompt: got a list of {len(p)} prompts; this server takes one prompt per request")
            p = p[0]
        return p if isinstance(p, str) else {"prompt_token_ids": list(p)}


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


# The roles a chat template knows how to render. OpenAI's "tool" and "function"
# need tool calls, which this server does not support.
CHAT_ROLES = ("system", "developer", "user", "assistant")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[ContentPart] | None = None

    @field_validator("role")
    @classmethod
    def _known_role(cls, role: str) -> str:
        if role not in CHAT_ROLES:
            raise ValueError(f"role {role!r} is not supported: must be one of {', '.join(CHAT_ROLES)}")
        return role

    def as_dict(self) -> dict:
        content = self.content
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...] -> one string
            content = "".join(part.text for part in content)
        # "developer" is OpenAI's newer name for "system"; chat templates know only the older one.
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content or ""}


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage]
    max_tokens: int | None = None  # the older name
    max_completion_tokens: int | None = None  # the newer name; wins when both are set
    logprobs: bool = False
    top_logprobs: int | None = None

    def engine_prompt(self) -> ChatPrompt:
        if not self.messages:
            raise ValueError("messages: expected at least one message")
        return ChatPrompt([m.as_dict() for m in self.messages])

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def top_n(self) -> int | None:
        """Alternatives per token, or None when no logprobs are asked for."""
        return (self.top_logprobs or 0) if self.logprobs else None


# --- responses ------------------------------------------------------------------


@dataclass
class Choice:
    """One sample's whole answer, gathered from its deltas: a response that is
    not streamed is sent once the request has finished."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    finish_reason: str | None = None

    def add(self, delta: RequestDelta) -> None:
        self.text += delta.text_delta
        self.token_ids += delta.new_token_ids
        self.logprobs += delta.new_logprobs or []
        self.finish_reason = delta.finish_reason or self.finish_reason


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(u: Usage) -> dict:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def completion_logprobs(positions, token_ids, top_n: int, offset: int = 0) -> dict:
    """The legacy completions shape: parallel lists, one entry per token."""
    tokens, lps, tops, offsets = [], [], [], []
    for pos, token in zip(positions, token_ids):
        chosen = pos[token]
        tokens.append(chosen.decoded_token or "")
        lps.append(chosen.logprob)
        tops.append({lp.decoded_token or "": lp.logprob for lp in _top(pos, top_n)})
        offsets.append(offset)
        offset += len(chosen.decoded_token or "")
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(positions, token_ids, top_n: int) -> dict:
    """The chat shape: one object per token, with its top alternatives."""
    return {"content": [{**_token_entry(pos[token]), "top_logprobs": [_token_entry(lp) for lp in _top(pos, top_n)]}
                        for pos, token in zip(positions, token_ids)]}


def _top(pos, n: int) -> list:
    """The engine stores the top n plus the chosen token (when it ranks lower)."""
    return sorted(pos.values(), key=lambda lp: lp.rank)[:n]


def _token_entry(lp) -> dict:
    text = lp.decoded_token or ""
    return {"token": text, "logprob": lp.logprob, "bytes": list(text.encode())}


def completion_response(rid: str, model: str, created: int, choices: list[Choice], u: Usage,
                        top_n: int | None) -> dict:
    return {
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": c.index, "text": c.text, "finish_reason": c.finish_reason,
                     "logprobs": None if top_n is None else completion_logprobs(c.logprobs, c.token_ids, top_n)}
                    for c in choices],
        "usage": usage(u),
    }


def chat_response(rid: str, model: str, created: int, choices: list[Choice], u: Usage, top_n: int | None) -> dict:
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                     "finish_reason": c.finish_reason,
                     "logprobs": None if top_n is None else chat_logprobs(c.logprobs, c.token_ids, top_n)}
                    for c in choices],
        "usage": usage(u),
    }


def completion_chunk_choice(d: RequestDelta, top_n: int | None) -> dict:
    lps = None if top_n is None else completion_logprobs(d.new_logprobs, d.new_token_ids, top_n, d.text_offset)
    return {"index": d.index, "text": d.text_delta, "logprobs": lps, "finish_reason": d.finish_reason}


def chat_chunk_choice(d: RequestDelta, top_n: int | None) -> dict:
    lps = None if top_n is None else chat_logprobs(d.new_logprobs, d.new_token_ids, top_n)
    return {"index": d.index, "delta": {"content": d.text_delta} if d.text_delta else {}, "logprobs": lps,
            "finish_reason": d.finish_reason}


def role_chunk_choice(index: int) -> dict:
    """OpenAI's first chat chunk of each choice announces the role."""
    return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}


def error_body(message: str, type_: str, param: str | None = None, code: str | int | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def now() -> int:
    return int(time.time())
