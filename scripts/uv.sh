# Sourced by scripts/setup.sh, scripts/test.sh, bench/setup_reference.sh and bench/setup_trl.sh:
# what builds the venvs.
#
# `ensure_uv` makes the project's .venv (when missing) and puts uv in it, then exports
# ATROPOS_UV so that every venv built after it (the vLLM runtime's too) is installed by uv,
# about ten times faster than pip on a 2-core CPU; where uv cannot be had, pip does it all.
# `install_into VENV ARGS...` installs ARGS (what `pip install` would take) into VENV, with
# pip's own configuration carried over to uv (atroposlib/local/installer.py).
atropos_checkout="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ensure_uv() {
    [ -x "$atropos_checkout/.venv/bin/python" ] || python3 -m venv "$atropos_checkout/.venv" || return 1
    if [ -n "${ATROPOS_UV:-}" ]; then return 0; fi  # chosen by the caller (a path, or `pip`)
    local uv="$atropos_checkout/.venv/bin/uv" said
    if [ -x "$uv" ] || said="$("$atropos_checkout/.venv/bin/python" -m pip install -q --disable-pip-version-check uv 2>&1)"; then
        export ATROPOS_UV="$uv"
    else
        echo "note: uv did not install ($(printf '%s' "$said" | tail -n 1)): pip builds the venvs (several times slower)" >&2
    fi
}
install_into() {
    local venv="$1"
    shift
    python3 "$atropos_checkout/atroposlib/local/installer.py" --python "$venv/bin/python" -- "$@"
}
