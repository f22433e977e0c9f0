#!/usr/bin/env bash
# Installs TRL (GRPOTrainer) in its own virtual environment for bench/trl_compare.py: the CPU
# build of torch first (a bare torch requirement pulls a multi-GB CUDA build), then TRL.
set -euo pipefail
target="${1:-.cache/trlvenv}"
source "$(dirname "$0")/../scripts/uv.sh"  # with uv when the caller made it available (ensure_uv)
python3 -m venv "$target"
install_into "$target" "torch==${TORCH_VERSION:-2.13.0}"
install_into "$target" "trl==${TRL_VERSION:-1.16.0}"
echo "TRL interpreter: $target/bin/python"
