#!/usr/bin/env bash
# Create .venv (Python 3.11+) and install cmr with its pinned dev requirements into it.
#   scripts/setup.sh        then: .venv/bin/cmr --help
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

step "Python environment (.venv)"
if [[ ! -x .venv/bin/python ]]; then
    uv_cmd venv --python python3.11 .venv
else
    echo ".venv exists ($(.venv/bin/python --version))"
fi

step "Install cmr and its pinned requirements"
uv_cmd pip install --python .venv/bin/python -r requirements-dev.txt -e .
