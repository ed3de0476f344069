"""The forbidden-call watch: does the learner's code call the course's answer?

A check passes only if the learner wrote the exercise, so it refuses code that
calls the course's own answer to it: labcheck's reference, the engine's
function for the same job, PyTorch's fused kernel. `Watch(forbidden)` is a
context manager that runs the block under a profiler (sys.setprofile) and
notes the first call to any of `forbidden`:

- a Python function, matched by its code object, so an alias, a
  `from ... import`, a wrapper or a decorator (functools.wraps) cannot hide it;
- a class: every method the course wrote (its own and its course-written
  bases'; nn.Module's are not forbidden, every model call goes through them);
  to forbid only some methods, list those (`LlamaForCausalLM.forward`), and the
  class's harmless helpers (`compute_logits`) stay allowed;
- a C builtin (torch's fused attention), matched by identity.

The harness's own code runs inside the same block: the runner around the
learner's function, and code the check hands the learner (lab 7's model step,
lab 5's attention). That code may use the answers; `paused()` and `pausing(fn)`
switch the watch off around it, so labcheck never needs a copy of an answer to
hide it from its own watch.

`answers_allowed()` switches the refusal off for a block: the course's tests use
it to prove that the references the labs fall back to pass their checks.

What the watch cannot do (it is a deterrent, not a guarantee):
- it sees only calls made in this thread, and only while it is the thread's
  profiler: code that sets its own (cProfile, torch.profiler with stacks)
  displaces it for the rest of the block, and code that calls sys.setprofile(None),
  or this module's paused(), hides what it calls;
- a builtin is matched by identity, so another entry point to the same kernel
  (torch.ops.aten.scaled_dot_product_attention) goes unseen, and a bound tensor
  method (`x.softmax`) cannot be forbidden at all;
- code reached from a paused block is not watched, so given code must not call
  back into the learner's.
"""
from __future__ import annotations

import contextvars
import functools
import inspect
import sys
from contextlib import contextmanager
from typing import Callable

# True inside answers_allowed(): a context variable, so it is scoped to the
# block (and to one thread or task), not a switch left on for everyone.
_ANSWERS_ALLOWED = contextvars.ContextVar("labcheck_answers_allowed", default=False)


class Watch:
    """Notes, in `called`, the label of the first forbidden call in the block."""

    def __init__(self, forbidden: tuple):
        self.codes, self.builtins = {}, {}
        if not _ANSWERS_ALLOWED.get():
            for obj in forbidden:
                for label, f in functions_of(obj):
                    if hasattr(f, "__code__"):
                        self.codes[f.__code__] = label
                    else:
                        self.builtins[id(f)] = label
        self.called = None

    def _profile(self, frame, event, arg):
        if event == "call" and frame.f_code in self.codes:
            self.called = self.called or self.codes[frame.f_code]
        elif event == "c_call" and id(arg) in self.builtins:
            self.called = self.called or self.builtins[id(arg)]

    def __enter__(self):
        self._previous = sys.getprofile()
        if self.codes or self.builtins:
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._previous)
        return False


@contextmanager
def paused():
    """Inside this block the running Watch (if any) sees nothing: for the
    harness's own code and the code a check hands the learner."""
    profile = sys.getprofile()
    watching = isinstance(getattr(profile, "__self__", None), Watch)
    if watching:
        sys.setprofile(None)
    try:
        yield
    finally:
        if watching:
            sys.setprofile(profile)


def pausing(fn: Callable) -> Callable:
    """fn, run with the watch paused: what a check hands the learner's code."""
    @functools.wraps(fn)
    def unwatched(*args, **kwargs):
        with paused():
            return fn(*args, **kwargs)
    return unwatched


@contextmanager
def answers_allowed():
    """Checks in this block refuse nothing (for the course's own tests)."""
    token = _ANSWERS_ALLOWED.set(True)
    try:
        yield
    finally:
        _ANSWERS_ALLOWED.reset(token)


def functions_of(obj) -> list[tuple[str, Callable]]:
    """(label, function) for a function or builtin, or for each method of a class."""
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", obj))
    label = f"{getattr(obj, '__module__', None) or 'torch'}.{name}"
    if label.startswith("tinyinfer_course.labcheck."):  # labcheck.reference_rope, whichever module defines it
        label = "labcheck." + label.split(".", 3)[-1]
    label = label.replace("torch._C._nn.", "torch.nn.functional.")
    if isinstance(obj, type):
        found = []
        for klass in obj.__mro__:  # its own and its course-written bases' methods, not nn.Module's
            if not klass.__module__.startswith("tinyinfer"):
                continue
            for attr, value in vars(klass).items():
                value = inspect.unwrap(getattr(value, "__func__", value))  # staticmethod/classmethod
                if hasattr(value, "__code__"):
                    found.append((f"{label}.{attr}", value))
        return found
    # inspect.unwrap: a function behind a decorator (functools.wraps) is watched
    # by its own code, not by the decorator's wrapper, which many functions share.
    return [(label, inspect.unwrap(getattr(obj, "__func__", obj)))]
