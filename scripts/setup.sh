#!/usr/bin/env bash
# Creates .venv and installs atroposlib into it (editable, with the extras named in $EXTRAS).
# Safe to run again: an existing .venv is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${EXTRAS:-dev}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
case ",${extras}," in
    # A bare torch requirement resolves to a multi-GB CUDA build: take the CPU build first.
    *,rewardfns,*|*,example_trainer,*|*,example-trainer,*|*,examples,*|*,all,*) .venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}" ;;
esac
.venv/bin/python -m pip install -q -e ".[${extras}]"
echo "atroposlib installed in $(pwd)/.venv (extras: ${extras})"
