#!/usr/bin/env bash
# Create .venv (Python 3.11+) and install cmr with its pinned, hashed dev requirements.
#   scripts/setup.sh        then: .venv/bin/cmr --help
#   scripts/setup.sh lock   re-resolve requirements-dev.txt (same pins, fresh hashes); pass
#                           --upgrade-package NAME (or --upgrade) to move a pin on purpose
#
# Every distribution installed is checked against a sha256 in requirements-dev.txt
# (--require-hashes), the build backend of cmr's own editable install (hatchling) included:
# a file that changed on the index, or on the way, is refused instead of run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export UV_PYTHON_DOWNLOADS=never
step() { printf '\n==> %s\n' "$*"; }

uv_cmd() {
    if command -v uv >/dev/null 2>&1; then
        uv "$@"
    else
        if ! python3 -m uv --version >/dev/null 2>&1; then
            python3 -m pip install -q uv
        fi
        python3 -m uv "$@"
    fi
}

lock() {
    # pyproject's dev extra plus the build backend its [build-system] names, resolved for
    # CI's interpreter and machine (Python 3.11, x86_64 Linux); hashes of every file of each
    # pinned version. The current file is the constraint, so pins move only when asked.
    local build
    build="$(mktemp --suffix=.in)"
    trap 'rm -f "$build"' RETURN
    # pyproject.toml's [build-system], and what hatchling asks for to build an editable wheel
    printf '%s\n' hatchling editables >"$build"
    uv_cmd pip compile pyproject.toml "$build" --extra dev --generate-hashes \
        --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
        --constraint requirements-dev.txt --custom-compile-command "scripts/setup.sh lock" \
        --output-file requirements-dev.txt "$@"
    sed -i "s|$build|pyproject.toml [build-system]|" requirements-dev.txt
}

if [[ "${1:-}" == lock ]]; then
    shift
    lock "$@"
    exit 0
fi

step "Python environment (.venv)"
if [[ ! -x .venv/bin/python ]]; then
    uv_cmd venv --python python3.11 .venv
else
    echo ".venv exists ($(.venv/bin/python --version))"
fi

step "Install the pinned requirements (every file checked against its sha256)"
uv_cmd pip install --python .venv/bin/python --require-hashes -r requirements-dev.txt

step "Install cmr itself (editable: no hash to check; built by the hatchling just installed)"
uv_cmd pip install --python .venv/bin/python --no-deps --no-build-isolation -e .
