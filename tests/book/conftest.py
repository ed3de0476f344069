"""The notebooks' streams and the book's build, run beside the other tests.

The notebooks (tests/book/test_notebooks.py) and the book's build
(tests/book/test_book.py) take most of a run's time and one core each; the
engine's and the course's tests leave much of the second core idle (Python,
small tensors, waits on servers). So both start as soon as the run knows what
it selected, and the tests wait for their results at the end."""
import os
import time

_STARTED = time.monotonic()  # when pytest read this file: the clock of the summary below


def pytest_collection_finish(session):
    """Start the notebooks' streams (and the book's build) once collection ends.
    This process, and every process a test starts, then use one thread, as each
    stream does: OpenMP threads that spin waiting for a thread the OS has parked
    on a busy core made one benchmark test 14 times slower than alone.
    tests/conftest.py gives the threads back when the streams are done."""
    import test_notebooks  # tests/book/ is on sys.path
    from test_notebooks import _builds_book, _selected, start_streams

    selected = _selected(session)
    if selected:
        import torch

        test_notebooks.RESTORE_THREADS.append((os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()))
        os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the subprocesses tests start (servers, benchmarks)
        torch.set_num_threads(1)
        start_streams(selected, with_book=_builds_book(session))


def pytest_collection_modifyitems(items):
    """Run the slowest things last: the other tests, then notebooks, then the book
    build (the notebooks and the build themselves start at once: pytest_collection_finish)."""
    def rank(item):
        return 2 if item.get_closest_marker("book") else 1 if item.get_closest_marker("notebooks") else 0

    items.sort(key=rank)  # stable sort keeps pytest's order within each group


def pytest_terminal_summary(terminalreporter):
    """When each of the run's parallel parts finished, from the start of the run:
    the part that ends last, alone on its core, is where a faster run starts."""
    from test_book import _BUILD
    from test_notebooks import FINISHED

    ends = dict(FINISHED, **({"book build": _BUILD["finished"]} if "finished" in _BUILD else {}))
    if ends:
        ends["this process's tests"] = time.monotonic()
        parts = ", ".join(f"{name} {end - _STARTED:.0f} s" for name, end in sorted(ends.items(), key=lambda e: e[1]))
        terminalreporter.write_line(f"finished after: {parts}")
