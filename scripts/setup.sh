#!/usr/bin/env bash
# Creates .venv and installs atroposlib into it (editable, with the extras named in $EXTRAS).
# Safe to run again: an existing .venv is reused, and left as it is while its inputs hold.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv_stamp.sh
extras="${EXTRAS:-dev}"
# reused as it is while pyproject.toml, this script, the extras and the torch version are unchanged
key="$(inputs_hash pyproject.toml scripts/setup.sh)-${extras}"
if stamp_holds .venv "$key"; then
    echo "atroposlib already installed in $(pwd)/.venv (extras: ${extras}; its inputs are unchanged)"
    exit 0
fi
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
case ",${extras}," in
    # A bare torch requirement resolves to a multi-GB CUDA build: take the CPU build first.
    *,rewardfns,*|*,example_trainer,*|*,example-trainer,*|*,examples,*|*,all,*) .venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}" ;;
esac
.venv/bin/python -m pip install -q -e ".[${extras}]"
write_stamp .venv "$key"
echo "atroposlib installed in $(pwd)/.venv (extras: ${extras})"
