#!/usr/bin/env bash
# Set up, then lint, type-check and run every test against the embedded backend and the
# local AWS stack (LocalStack + DynamoDB Local, installed and started on first use).
#   scripts/test.sh [pytest args...]
# The stack is left running: scripts/stack.sh stop ends it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
step() { printf '\n==> %s\n' "$*"; }

bash scripts/setup.sh dev  # the runtime lock, then the development tools (requirements-dev.txt)

step "Local AWS stack (scripts/stack.sh start)"
bash scripts/stack.sh start
eval "$(bash scripts/stack.sh env)"
bash scripts/stack.sh env

step "ruff and mypy"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy cmr
.venv/bin/mypy --explicit-package-bases tests

step "pytest $*"
.venv/bin/python -m pytest -q "$@"
