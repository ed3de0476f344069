"""Shared fixtures. Nothing here touches the network: the default model comes
from the pip-fetched package (see tinyinfer.weights), tiny models are built in-process."""
import os
import sys
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a failed Hub lookup would cost ~50 s
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# torch.compile's C++ builds in this process, not in a pool of worker processes:
# the run gives each of its parts one thread, and on two shared cores the pool's
# start-up (each worker imports torch) cost more than it saved (cold compile of
# the tiny model: 45 s with the pool, 38 s without, one thread, quiet machine).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# The labs keep each passing exercise in the learner's engine folder
# (tinyinfer.labcheck.my_engine), ~/tinyinfer-my-engine by default. Notebooks run
# by the tests (in subprocesses, which inherit this) write to a folder of their own.
if "TINYINFER_MY_ENGINE" not in os.environ:
    import tempfile

    os.environ["TINYINFER_MY_ENGINE"] = tempfile.mkdtemp(prefix="tinyinfer-my-engine-")


def inductor_cache_dir(environ) -> str | None:
    """The folder torch.compile's caches should use under `environ`, or None for
    torch's default. Inductor generates C++ for the vector ISA ATEN_CPU_CAPABILITY
    names, but its on-disk cache (torch 2.13) does not key on it: a graph compiled
    under ATEN_CPU_CAPABILITY=avx2 and then loaded with native kernels aborts, and
    the other way round it wrote [314, 0, 0, ...] for [314, 314, ...]. So each
    emulated CPU (make test-portable) keeps a cache of its own."""
    capability = environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if "TORCHINDUCTOR_CACHE_DIR" in environ or not capability:
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # torch's own name for the folder

    return f"{default_cache_dir()}_{capability}"


if (_cache := inductor_cache_dir(os.environ)) is not None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _cache  # notebooks' kernels inherit it


@pytest.fixture(scope="session")
def default_model_dir():
    from tinyinfer.weights import ensure_packaged_model

    return ensure_packaged_model()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, default_model_dir):
    """A 2-layer random Llama with the default model's tokenizer: the engine's
    code paths at a fraction of the cost (and torch.compile's)."""
    from tiny_model import save_tiny_llama  # tests/ is on sys.path

    return save_tiny_llama(tmp_path_factory.mktemp("tiny"), default_model_dir)


@pytest.fixture(scope="session")
def llm():
    """One fp32 engine on the default model, shared by the tests that only read it."""
    from tinyinfer import LLM

    return LLM("smollm2-135m-instruct", dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def hf_model(default_model_dir):
    """transformers' own implementation on the very same weights: the reference."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()


def pytest_collection_finish(session):
    """Start the notebooks' streams (and the book's build) as soon as the run
    knows what it selected, so they run beside the engine tests instead of after
    them: on a two-core machine the engine tests alone leave much of the second
    core idle (Python, small tensors, waits on servers). This process, and every
    process a test starts, then use one thread, as each stream does: OpenMP
    threads that spin waiting for a thread the OS has parked on a busy core
    made one benchmark test 14 times slower than alone."""
    from test_notebooks import _builds_book, _selected, start_streams  # tests/ is on sys.path

    selected = _selected(session)
    if selected:
        import torch

        _ALONE.append((os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()))
        os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the subprocesses tests start (servers, benchmarks)
        torch.set_num_threads(1)
        start_streams(selected, with_book=_builds_book(session))


_ALONE: list[tuple[str | None, int]] = []  # the thread settings to restore once the streams are done


def pytest_runtest_setup(item):
    """Once the streams and the book's build have finished, the tests still to run
    have the machine to themselves: give them its threads back, so the run does not
    end on one busy core beside an idle one."""
    if not _ALONE:
        return
    from test_book import build_finished
    from test_notebooks import streams_finished

    if streams_finished() and build_finished():
        import torch

        env, threads = _ALONE.pop()
        if env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env
        torch.set_num_threads(threads)


_STARTED = time.monotonic()  # when pytest read this file: the clock of the summary below


def pytest_terminal_summary(terminalreporter):
    """When each of the run's parallel parts finished, from the start of the run:
    the part that ends last, alone on its core, is where a faster run starts."""
    # Read from the modules only if this run imported them: test_book imports
    # nbformat, which a machine that runs only the engine's tests (the GPU
    # machine's image) may lack, and a summary hook that raises turns any run red.
    build = getattr(sys.modules.get("test_book"), "_BUILD", {})
    finished = getattr(sys.modules.get("test_notebooks"), "FINISHED", {})
    ends = dict(finished, **({"book build": build["finished"]} if "finished" in build else {}))
    if ends:
        ends["this process's tests"] = time.monotonic()
        parts = ", ".join(f"{name} {end - _STARTED:.0f} s" for name, end in sorted(ends.items(), key=lambda e: e[1]))
        terminalreporter.write_line(f"finished after: {parts}")


def pytest_collection_modifyitems(items):
    """Run the slowest things last: engine tests, then notebooks, then the book build
    (the notebooks and the build themselves start at once: pytest_collection_finish)."""
    def rank(item):
        return 2 if item.get_closest_marker("book") else 1 if item.get_closest_marker("notebooks") else 0

    items.sort(key=rank)  # stable sort keeps pytest's order within each group
