#!/usr/bin/env bash
# `make test`'s steps 2 and 3 (step 1, lint, is the Makefile's), so a red light says
# which part failed: 2/3 the engine's tests (tests/engine), 3/3 the course's and the book's.
#
# The notebooks (nbval, twice: strict solutions and lax labs) and the book's build
# take most of the run and mostly one core each, while the tests leave much of the
# second core idle (Python, small tensors, waits on servers). So they start in the
# background with step 2, in their own pytest run, and step 3 waits for them and
# prints their result. Run alone after step 2 they made `make test` 6 minutes longer.
#
# Called by the Makefile with PY (the venv's python) and PYTEST_ARGS.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
read -r -a ARGS <<< "${PYTEST_ARGS:-}"

log=$(mktemp -t tinyinfer-notebooks-and-book-XXXXXX.log)
echo "== the notebooks and the book's build start in the background; their results come in step 3 ($log)"
set -m  # the background run gets a process group of its own, so a failure here stops all of it
"$PY" -m pytest tests/book -m "notebooks or book" "${ARGS[@]}" >"$log" 2>&1 &
background=$!
set +m
trap 'kill -- -$background 2>/dev/null' EXIT

# The background's streams use one thread each. OpenMP threads that spin waiting for
# a thread the OS has parked on a busy core made one benchmark 14 times slower, so
# these tests use one thread too (tests/conftest.py gives none back here: no streams).
export OMP_NUM_THREADS=1

echo "== 2/3 the engine's tests"
"$PY" -m pytest tests/engine "${ARGS[@]}" || exit 1

# Step 3 in two processes, one per core, without ever running more than the
# background's streams plus one: the files that start engines, servers and
# subprocesses (about half of step 3's time) start now, beside the background if it
# is still running; the rest start when the background is done. Run on one core
# after the background, step 3 left the other idle for 5 to 6 minutes; run as two
# processes beside the background, it was slower still (5 processes on 2 cores).
FIRST=(tests/course/test_speculative.py tests/course/test_gpu_check.py tests/course/test_peers.py
       tests/course/test_assignments.py)
rest=()
for f in tests/course/test_*.py tests/book/test_*.py; do
    [[ " ${FIRST[*]} " == *" $f "* ]] || rest+=("$f")
done
first_log=$(mktemp -t tinyinfer-step3-first-XXXXXX.log)
echo "== 3/3 the course's and the book's tests: ${#FIRST[@]} files start now (log: $first_log), the other ${#rest[@]} when the background is done"
# set -m, as for the background: a job started without it begins with SIGINT ignored,
# and Python then leaves it ignored in every process it starts (a `tinyinfer fleet`
# that a test stops with a Ctrl-C never stopped; test_fleet_live now runs with the
# rest, in the foreground, and gives its child SIGINT's default itself).
set -m
"$PY" -m pytest "${FIRST[@]}" -m "not notebooks and not book" "${ARGS[@]}" >"$first_log" 2>&1 &
first=$!
set +m
trap 'kill -- -$background 2>/dev/null; kill -- -$first 2>/dev/null' EXIT

wait "$background"
notebooks=$?
"$PY" -m pytest "${rest[@]}" -m "not notebooks and not book" "${ARGS[@]}"
tests=$?
wait "$first"
first_rc=$?
trap - EXIT
echo "== 3/3 the first files of the course's tests (engines, servers, subprocesses)"
cat "$first_log"
echo "== 3/3 the notebooks and the book's build (the background run)"
cat "$log"
rm -f "$log" "$first_log"
[ "$tests" -eq 0 ] && [ "$first_rc" -eq 0 ] && [ "$notebooks" -eq 0 ]
