#!/usr/bin/env bash
# Sets up the project and runs the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=dev bash scripts/setup.sh
# The reference atroposlib 0.4.0, in its own venv, lets tests/api/test_reference_suite.py run
# the reference's own API tests against this server; without it that test is skipped.
reference="${ATROPOS_REFERENCE_PYTHON:-$(pwd)/.cache/refvenv/bin/python}"
if [ ! -x "$reference" ]; then
    bash bench/setup_reference.sh "$(dirname "$(dirname "$reference")")" >/dev/null 2>&1 \
        || echo "note: reference atroposlib not installed; its conformance test will be skipped"
fi
export ATROPOS_REFERENCE_PYTHON="$reference"
export WANDB_MODE=disabled
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
