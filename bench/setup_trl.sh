#!/usr/bin/env bash
# Installs TRL (GRPOTrainer) in its own virtual environment for bench/trl_compare.py: the CPU
# build of torch first (a bare torch requirement pulls a multi-GB CUDA build), then TRL.
set -euo pipefail
target="${1:-.cache/trlvenv}"
python3 -m venv "$target"
"$target/bin/pip" install -q --upgrade pip
"$target/bin/pip" install -q "torch==${TORCH_VERSION:-2.13.0}"
"$target/bin/pip" install -q "trl==${TRL_VERSION:-1.16.0}"
echo "TRL interpreter: $target/bin/python"
