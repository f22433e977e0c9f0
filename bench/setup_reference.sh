#!/usr/bin/env bash
# Installs the reference atroposlib 0.4.0 in its own virtual environment for the benchmarks.
set -euo pipefail
target="${1:-/opt/refvenv}"
source "$(dirname "$0")/../scripts/uv.sh"  # with uv when the caller made it available (ensure_uv)
python3 -m venv "$target"
install_into "$target" 'atroposlib==0.4.0' 'transformers<5' 'datasets<5'
echo "reference interpreter: $target/bin/python"
