#!/usr/bin/env bash
# Installs the reference atroposlib 0.4.0 in its own virtual environment for the benchmarks.
set -euo pipefail
target="${1:-/opt/refvenv}"
python3 -m venv "$target"
"$target/bin/pip" install -q 'atroposlib==0.4.0' 'transformers<5' 'datasets<5'
echo "reference interpreter: $target/bin/python"
