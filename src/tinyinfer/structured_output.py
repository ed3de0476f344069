"""Structured output: a mask over the logits that only lets through tokens
which keep the reply inside a grammar (a JSON schema, a regular expression, a
list of choices, or a Lark grammar), so that every reply parses by construction.

How it works. The grammar is an automaton over characters. Before each step,
the sampler asks the automaton which of the 49,152 tokens can come next: a
token is allowed when the text so far plus the token's text is still the start
of something the grammar accepts. Every other token's score becomes -inf, so
greedy, top-k, top-p and seeded draws all choose among the allowed ones only.
After the draw, the chosen token moves the automaton on. The end-of-sequence
token is allowed only where the grammar may end.

Why a library. Testing each of 49,152 tokens in Python at every step took
34-85 ms per row for a list of three tool names (2-core Intel Xeon, shared,
2026-12-05; the slow version is in tests/engine/test_structured_output.py), about as
long as a whole decode step of the 135M model. Precomputing, for a hand-made
automaton of the tool-call schema, the allowed tokens of each state would be
fast, but it covers one schema, and a JSON value nests, which a finite
automaton cannot follow. So the engine uses llguidance (Microsoft's
Low-level Guidance, on PyPI), which vLLM also offers as a backend: it walks a
prefix tree of the vocabulary against an Earley parser, in Rust, and computes
a mask in well under a millisecond for the grammars here. It reads the same
tokenizer.json as the engine, so the mask is over the course's own vocabulary.
Lab 10 has you build a prefix tree of the vocabulary in plain Python for a
list of choices, count its work against the scan's, and compare its rows
with this mask's.

The names follow vLLM: SamplingParams(structured_outputs=StructuredOutputsParams(
json=..., regex=..., choice=..., grammar=..., json_object=...)), and on the
server the `structured_outputs` field of the request body or OpenAI's
`response_format`. StructuredOutputManager (vLLM's name) checks a request's
grammar when it arrives and gives each sequence its own matcher.
"""
from __future__ import annotations

import json as json_module
import re
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

# vLLM's StructuredOutputsParams fields that this engine implements, in the order it checks them.
KINDS = ("json", "regex", "choice", "grammar", "json_object")
# JSON as json.dumps writes it (", " and ": " between items, no line breaks): a small model left
# free to add whitespace can fill its whole token budget with it.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass
class StructuredOutputsParams:
    """Which grammar a reply must follow; set exactly one field (vLLM's rule).
      json         a JSON schema (dict or its JSON text): the reply is one JSON value that satisfies it
      regex        a regular expression the whole reply matches
      choice       a list of strings: the reply is exactly one of them
      grammar      a Lark grammar, in llguidance's dialect (it may embed %json {schema})
      json_object  True: any JSON object"""

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """The checks that need no tokenizer; StructuredOutputManager.check does the grammar itself."""
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs: set exactly one of {', '.join(KINDS)}; got "
                             f"{', '.join(given) if given else 'none'}")
        kind = given[0]
        value = getattr(self, kind)
        if kind == "json" and isinstance(value, str):
            try:
                value = json_module.loads(value)
            except json_module.JSONDecodeError as e:
                raise ValueError(f"structured_outputs.json: not valid JSON text ({e})") from None
        ok = {"json": isinstance(value, dict), "regex": isinstance(value, str) and value != "",
              "choice": isinstance(value, list) and value and all(isinstance(c, str) and c for c in value),
              "grammar": isinstance(value, str) and value.strip() != "", "json_object": value is True}[kind]
        allowed = {"json": "a JSON schema: an object (dict) or its JSON text", "regex": "a non-empty string",
                   "choice": "a non-empty list of non-empty strings", "grammar": "a non-empty Lark grammar",
                   "json_object": "True"}[kind]
        if not ok:
            raise ValueError(f"structured_outputs.{kind}={value!r} is invalid: must be {allowed}")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @classmethod
    def from_dict(cls, d: dict) -> StructuredOutputsParams:
        """From a request body's `structured_outputs` object; unknown keys are an error."""
        if not isinstance(d, dict):
            raise ValueError(f"structured_outputs: expected an object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"structured_outputs: unknown field(s) {', '.join(unknown)}; "
                             f"this server supports {', '.join(KINDS)}")
        return cls(**d)

    def llguidance_grammar(self) -> str:
        """The grammar in llguidance's form (does not check it)."""
        from llguidance import LLMatcher, regex_to_lark

        kind = self.kind
        if kind == "json":
            return LLMatcher.grammar_from_json_schema(self.json, overrides=_JSON_OPTIONS)
        if kind == "json_object":
            return LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=_JSON_OPTIONS)
        if kind == "regex":  # \d, \w and \s as ASCII, as most readers expect (Unicode \d takes '٣' too)
            return LLMatcher.grammar_from_lark(f"start: /{regex_to_lark(self.regex, 'dws')}/")
        if kind == "choice":  # each choice as literal text, joined by |
            return LLMatcher.grammar_from_regex("|".join(f"({re.escape(c)})" for c in self.choice))
        return LLMatcher.grammar_from_lark(self.grammar)


class StructuredOutputManager:
    """Checks grammars and makes one matcher (the grammar's automaton, at its
    start) per sequence. The vocabulary is read from tokenizer.json the first
    time a request asks for structured output (about 0.3 s), never before."""

    def __init__(self, tokenizer_json: str | Path, eos_token_ids: list[int], vocab_size: int):
        self.tokenizer_json = Path(tokenizer_json)
        self.eos_token_ids = list(eos_token_ids)
        self.vocab_size = vocab_size  # the width of the model's logits
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from llguidance import LLTokenizer

            self._tokenizer = LLTokenizer(self.tokenizer_json.read_text(), n_vocab=self.vocab_size,
                                          eos_token=self.eos_token_ids)
        return self._tokenizer

    def check(self, params: StructuredOutputsParams) -> None:
        """Raise ValueError naming the field when the grammar cannot be built
        (a schema llguidance does not accept, a regex that does not parse)."""
        from llguidance import LLMatcher

        params.validate()
        try:
            grammar = params.llguidance_grammar()
        except (ValueError, TypeError) as e:
            raise ValueError(f"structured_outputs.{params.kind}: {e}") from None
        error = LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error:
            raise ValueError(f"structured_outputs.{params.kind}: {error.strip().splitlines()[0]}")

    def matcher(self, params: StructuredOutputsParams):
        from llguidance import LLMatcher

        m = LLMatcher(self.tokenizer, params.llguidance_grammar(), log_level=0)
        if m.is_error():  # check() ran when the request arrived, so this is the course's bug
            raise RuntimeError(f"structured_outputs.{params.kind}: {m.get_error()}")
        return m

    def allowed(self, matchers: list) -> torch.Tensor:
        """[len(matchers), vocab_size] bool: the tokens each matcher allows next.
        llguidance writes one bit per token, token t at bit t % 32 of int32 word
        t // 32. Read as bytes (little-endian, as on x86 and ARM), that is bit
        t % 8 of byte t // 8, which numpy's unpackbits turns into one entry per
        token, with no Python loop over the vocabulary (about 5x faster than
        shifting the words in torch, 2-core Intel Xeon, 2026-12-05)."""
        import llguidance.torch as llg_torch

        words = (self.vocab_size + 31) // 32
        bits = torch.zeros(len(matchers), words, dtype=torch.int32)
        for i, m in enumerate(matchers):
            llg_torch.fill_next_token_bitmask(m, bits, i)
        unpacked = np.unpackbits(bits.numpy().view(np.uint8), axis=-1, bitorder="little")
        mask = torch.from_numpy(unpacked[:, : self.vocab_size]).bool()
        empty = ~mask.any(-1)
        if empty.any():  # a matcher that allows nothing (it failed): let the sequence end
            mask[empty, self.eos_token_ids[0]] = True
        return mask


def allowed_token_ids(manager: StructuredOutputManager, params: StructuredOutputsParams,
                      prefix_ids: list[int]) -> list[int]:
    """The tokens the mask allows after the tokens prefix_ids (a chapter's and a test's view of one row)."""
    m = manager.matcher(params)
    if prefix_ids and not m.consume_tokens(list(prefix_ids)):
        raise ValueError(f"prefix_ids: the grammar does not accept them ({m.get_error()})")
    return manager.allowed([m])[0].nonzero().flatten().tolist()


def tool_call_grammar(tools: list[str] | dict[str, dict], open_tag: str = "<tool_call>",
                      close_tag: str = "</tool_call>") -> str:
    """A Lark grammar for chapter 10's tool call: the opening tag, a JSON object
    {"name": ..., "arguments": {...}}, the closing tag. tools: the tool names,
    each taking flat arguments (strings, numbers, booleans), or {name: the JSON
    schema of its arguments}, as OpenAI's `tools` give each function's parameters."""
    if isinstance(tools, dict):
        schema = {"anyOf": [_call_schema({"const": name}, arguments) for name, arguments in tools.items()]}
    else:
        # Flat arguments: a small model left free to nest objects can nest them until
        # max_tokens cuts the call short, and then it does not parse.
        flat = {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}}
        schema = _call_schema({"enum": list(tools)}, flat)
    schema["x-guidance"] = _JSON_OPTIONS  # %json reads its options from the schema
    return (f"start: {json_module.dumps(open_tag)} call {json_module.dumps(close_tag)}\n"
            f"call: %json {json_module.dumps(schema)}\n")


def _call_schema(name: dict, arguments: dict) -> dict:
    return {"type": "object", "properties": {"name": name, "arguments": arguments},
            "required": ["name", "arguments"], "additionalProperties": False}
