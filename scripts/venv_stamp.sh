# Sourced by scripts/setup.sh and scripts/test.sh: a venv remembers what it was built from.
#
# `inputs_hash FILE...` hashes the files a venv is built from (and $TORCH_VERSION; a caller adds
# anything else that varies, such as the extras, to its key);
# `write_stamp VENV KEY` records KEY in the venv once it is built; `stamp_holds VENV KEY`
# says whether VENV has a python and was built from KEY, so that it can be reused as it is.
inputs_hash() { { cat "$@"; echo "${TORCH_VERSION:-}"; } | sha256sum | cut -c1-16; }
stamp_file() { echo "$1/.atropos-built-from"; }
write_stamp() { echo "$2" >> "$(stamp_file "$1")"; }
stamp_holds() { [ -x "$1/bin/python" ] && grep -qxF "$2" "$(stamp_file "$1")" 2>/dev/null; }
