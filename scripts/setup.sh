#!/usr/bin/env bash
# Creates .venv and installs atroposlib into it (editable, with the extras named in $EXTRAS).
# Safe to run again: an existing .venv is reused, and left as it is while its inputs hold.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv_stamp.sh
source scripts/uv.sh
extras="${EXTRAS:-dev}"
# reused as it is while pyproject.toml, this script and the torch version are unchanged and it
# has the extras asked for (a .venv scripts/test.sh built has the quickstart's among its own)
inputs="$(inputs_hash pyproject.toml scripts/setup.sh)"

# tcmalloc makes CPU training steps ~1.4x faster (atroposlib/local/allocator.py): installed where root can
if ! python3 -c "import ctypes.util, sys; sys.exit(not ctypes.util.find_library('tcmalloc_minimal'))"; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 "$@" >/dev/null; }
        apt_get install -y --no-install-recommends libtcmalloc-minimal4 \
            || { apt_get update && apt_get install -y --no-install-recommends libtcmalloc-minimal4; } \
            || echo "note: libtcmalloc-minimal4 did not install: training uses the system allocator"
    else
        echo "note: libtcmalloc-minimal4 (apt) or gperftools (conda) makes CPU training steps ~1.4x faster"
    fi
fi
if extras_covered .venv "$inputs" "$extras"; then
    echo "atroposlib already installed in $(pwd)/.venv (extras: ${extras}; its inputs are unchanged)"
    exit 0
fi
ensure_uv
[ "${ATROPOS_UV:-pip}" != pip ] || .venv/bin/python -m pip install -q --upgrade pip
case ",${extras}," in
    # A bare torch requirement resolves to a multi-GB CUDA build: take the CPU build first.
    *,rewardfns,*|*,example_trainer,*|*,example-trainer,*|*,examples,*|*,all,*) install_into .venv "torch==${TORCH_VERSION:-2.13.0}" ;;
esac
install_into .venv -e ".[${extras}]"
write_stamp .venv "${inputs}-${extras}"
echo "atroposlib installed in $(pwd)/.venv (extras: ${extras})"
