#!/usr/bin/env bash
# uv for the other scripts, found or installed without touching the system Python.
#   source scripts/uv.sh; uv_cmd pip install ...     (scripts/setup.sh, scripts/stack.sh)
#   scripts/uv.sh [uv args]                          runs uv itself (bootstrapping it if needed)
#   scripts/uv.sh lock                               re-resolve scripts/uv-requirements.txt
#
# Order: uv on PATH; python3 -m uv; the project's own copy in .tools/uv (made once: a venv of
# python3 with uv installed from scripts/uv-requirements.txt, every file checked against its
# sha256). A stock Debian or Ubuntu python3 is "externally managed": pip refuses to install
# into it, so uv goes into a venv of its own, never into the system. Where the venv module
# is missing (Debian's python3-venv), it is installed with apt-get when running as root.

_UV_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_UV_HOME="${CMR_TOOLS_DIR:-$_UV_ROOT/.tools}/uv"

_uv_log() { printf '[uv] %s\n' "$*" >&2; }

_uv_bootstrap() {
    local py
    py="$(command -v python3 || true)"
    if [[ -z "$py" ]]; then
        _uv_log "ERROR: no python3 on PATH to install uv with; install Python 3.11 or newer"
        return 1
    fi
    if ! "$py" -c 'import ensurepip, venv' >/dev/null 2>&1; then
        if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
            _uv_log "installing python3-venv with apt-get (python3 has no venv module)"
            apt-get update -qq >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2
        else
            _uv_log "ERROR: $py has no venv module: install python3-venv (or uv: pipx install uv)"
            return 1
        fi
    fi
    _uv_log "installing uv into ${_UV_HOME#"$_UV_ROOT"/} (scripts/uv-requirements.txt, hashes checked)"
    rm -rf "$_UV_HOME"
    "$py" -m venv "$_UV_HOME" >&2 || return 1
    "$_UV_HOME/bin/python" -m pip install --quiet --disable-pip-version-check \
        --require-hashes --no-deps -r "$_UV_ROOT/scripts/uv-requirements.txt" >&2 || return 1
    # uv alone, for PATH (cmr fleet builds and locks with it): not the venv's python or pip.
    mkdir -p "$_UV_HOME/../bin"
    ln -sf ../uv/bin/uv "$_UV_HOME/../bin/uv"
}

uv_cmd() {
    if command -v uv >/dev/null 2>&1; then
        uv "$@"
    elif python3 -m uv --version >/dev/null 2>&1; then
        python3 -m uv "$@"
    else
        [[ -x "$_UV_HOME/bin/uv" ]] || _uv_bootstrap || return 1
        "$_UV_HOME/bin/uv" "$@"
    fi
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    set -euo pipefail
    if [[ "${1:-}" == lock ]]; then
        in="$(mktemp --suffix=.in)"
        trap 'rm -f "$in"' EXIT
        grep -o '^uv==[^ ]*' "$_UV_ROOT/scripts/uv-requirements.txt" >"$in"
        uv_cmd pip compile --quiet --universal --python-version 3.11 --generate-hashes \
            --custom-compile-command "scripts/uv.sh lock" \
            --output-file "$_UV_ROOT/scripts/uv-requirements.txt" "$in" "${@:2}"
        sed -i "s|-r $in|scripts/uv-requirements.txt's own pin|" "$_UV_ROOT/scripts/uv-requirements.txt"
    else
        uv_cmd "$@"
    fi
fi
