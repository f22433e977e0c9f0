# Sourced by scripts/setup.sh and scripts/test.sh: a venv remembers what it was built from.
#
# `inputs_hash FILE...` hashes the files a venv is built from (and $TORCH_VERSION; a caller adds
# anything else that varies, such as the extras, to its key);
# `write_stamp VENV KEY` records KEY in the venv once it is built; `stamp_holds VENV KEY`
# says whether VENV has a python and was built from KEY, so that it can be reused as it is;
# `extras_covered VENV HASH EXTRAS` whether it was built from HASH with every extra of the comma
# list EXTRAS, perhaps among others (keys HASH-EXTRAS, as scripts/setup.sh writes them).
inputs_hash() { { cat "$@"; echo "${TORCH_VERSION:-}"; } | sha256sum | cut -c1-16; }
stamp_file() { echo "$1/.atropos-built-from"; }
write_stamp() { echo "$2" >> "$(stamp_file "$1")"; }
stamp_holds() { [ -x "$1/bin/python" ] && grep -qxF "$2" "$(stamp_file "$1")" 2>/dev/null; }
extras_covered() {
    local stamp line wanted
    stamp="$(stamp_file "$1")"
    [ -x "$1/bin/python" ] && [ -f "$stamp" ] || return 1
    while IFS= read -r line; do
        [ "${line%%-*}" = "$2" ] || continue
        for wanted in ${3//,/ }; do
            [[ ",${line#*-}," == *",${wanted},"* ]] || continue 2
        done
        return 0
    done < "$stamp"
    return 1
}
