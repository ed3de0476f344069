"""What every test folder shares (tests/engine, tests/course, tests/book): the
environment, the default model and a tiny one. Nothing here touches the network:
the default model comes from the pip-fetched package (see tinyinfer.weights),
tiny models are built in-process. The notebooks' and the book's orchestration is
tests/book/conftest.py's."""
import os
import sys

import pytest

from inductor_cache import inductor_cache_dir  # tests/ is on sys.path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a failed Hub lookup would cost ~50 s
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# torch.compile's C++ builds in this process, not in a pool of worker processes:
# the run gives each of its parts one thread, and on two shared cores the pool's
# start-up (each worker imports torch) cost more than it saved (cold compile of
# the tiny model: 45 s with the pool, 38 s without, one thread, quiet machine).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# The labs keep each passing exercise in the learner's engine folder
# (tinyinfer_course.labcheck.my_engine), ~/tinyinfer-my-engine by default. Notebooks run
# by the tests (in subprocesses, which inherit this) write to a folder of their own.
if "TINYINFER_MY_ENGINE" not in os.environ:
    import tempfile

    os.environ["TINYINFER_MY_ENGINE"] = tempfile.mkdtemp(prefix="tinyinfer-my-engine-")

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
def one_layer_dir(tmp_path_factory, default_model_dir):
    """tiny_dir's model with one layer: for the tests that compile or record the
    decode step, whose cost grows with the layers."""
    from tiny_model import save_tiny_llama  # tests/ is on sys.path

    return save_tiny_llama(tmp_path_factory.mktemp("one-layer"), default_model_dir, num_hidden_layers=1)


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


def pytest_runtest_setup(item):
    """While the notebooks' streams and the book's build run beside the tests
    (tests/book/conftest.py starts them), every test runs on one thread. Once
    they have finished, the tests still to run have the machine to themselves:
    give them its threads back, so the run does not end on one busy core beside
    an idle one. (Here, not in tests/book/conftest.py: this hook runs for the
    tests of every folder.)"""
    notebooks, book = sys.modules.get("test_notebooks"), sys.modules.get("test_book")
    restore = getattr(notebooks, "RESTORE_THREADS", None)
    if not restore or not notebooks.streams_finished() or (book is not None and not book.build_finished()):
        return
    import torch

    env, threads = restore.pop()
    if env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = env
    torch.set_num_threads(threads)
