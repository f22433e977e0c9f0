#!/usr/bin/env bash
# The README's main job: set up, install the local vLLM runtime, prepare the bundled
# model, and run the small-sums environment in process mode through real vLLM (no GPU, no
# internet). Extra arguments go to atropos-quickstart (e.g. --groups 32, --task gsm8k).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=quickstart bash scripts/setup.sh
export ATROPOS_HOME="${ATROPOS_HOME:-$(pwd)/.cache/atropos}"
exec .venv/bin/atropos-quickstart "$@"
