"""A small random Llama (2 layers unless asked) with the default model's
tokenizer, saved as a model folder the engine loads: the engine's code paths at
a fraction of the real model's cost. One builder for the tests' tiny models
(conftest's tiny_dir, the server tests' variants with longer positions or a chat
template, and the compiled-decode test's single layer)."""
from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def save_tiny_llama(folder: Path, default_model_dir: Path, max_position_embeddings: int = 1024,
                    files: tuple[str, ...] = TOKENIZER_FILES, num_hidden_layers: int = 2) -> str:
    """Write the tiny model (seeded: the same weights every time) and the
    default model's `files` that exist into folder; return it as a str."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=num_hidden_layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    for name in files:
        if (Path(default_model_dir) / name).exists():
            shutil.copy(Path(default_model_dir) / name, Path(folder) / name)
    return str(folder)
