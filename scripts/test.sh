#!/usr/bin/env bash
# Set up, then lint, type-check and run every test against the embedded backend and the
# local stack (LocalStack + moto's DynamoDB + Azurite, installed and started on first use).
#   scripts/test.sh [pytest args...]      e.g. -m "not slow": the everyday subset, minutes
# The stack is left running: scripts/stack.sh stop ends it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
step() { printf '\n==> %s\n' "$*"; }

bash scripts/setup.sh dev  # the runtime lock, then the development tools (requirements-dev.txt)

# The Hadoop peer's tests (tests/benchmarks/test_hadoop_peer.py) run Hadoop 3.4.2 from Maven
# Central: they need java (17) and mvn. Installed here when missing and we may (root with
# apt-get: a fresh CI machine); otherwise those tests skip, and fail under CI=true.
if ! command -v mvn >/dev/null 2>&1 || ! command -v java >/dev/null 2>&1; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        step "Java 17 and Maven (apt-get), for the Hadoop peer's tests"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            openjdk-17-jdk-headless maven \
            || echo "note: could not install Java and Maven: the Hadoop peer's tests will skip"
    else
        echo "note: java or mvn missing: the Hadoop peer's tests will skip (install Java 17 and Maven)"
    fi
fi

# The dashboard's page tests (tests/dashboard/test_page.py) drive Debian's Chromium through
# Playwright (which downloads no browser of its own). CI installs it; elsewhere those tests
# skip without it (apt-get install chromium), and fail under CI=true.
if [[ "${CI:-}" == true && ! -x /usr/bin/chromium ]]; then
    step "Chromium (apt-get), for the dashboard's page tests"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            chromium chromium-driver; }; then
        echo "error: could not install Chromium (apt-get install chromium chromium-driver):" \
            "tests/dashboard/test_page.py needs /usr/bin/chromium" >&2
        exit 1
    fi
fi

# uv bootstrapped by setup.sh (no uv on PATH): on PATH for the tests of `cmr fleet up`,
# which builds and locks the wheel with it, as a user's machine has it.
if ! command -v uv >/dev/null 2>&1 && [[ -x .tools/uv/bin/uv ]]; then
    mkdir -p .tools/bin && ln -sf ../uv/bin/uv .tools/bin/uv
    export PATH="$PWD/.tools/bin:$PATH"
fi

step "Local stack (scripts/stack.sh start): LocalStack, moto, Azurite"
bash scripts/stack.sh start
eval "$(bash scripts/stack.sh env)"
bash scripts/stack.sh env

step "ruff and mypy"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy cmr
.venv/bin/mypy --explicit-package-bases tests

# In parallel (pytest-xdist): the suite mostly waits (leases, subprocesses, the stack's
# servers), so it runs in more processes than cores. CMR_TEST_WORKERS=N sets how many, and
# `-n 0` among the arguments runs it in one. --dist loadgroup keeps each xdist_group on one
# worker (expensive shared set-up); tests marked `alone` run while no other does (tests/alone.py).
workers="${CMR_TEST_WORKERS:-4}"  # 4 on 2 cores: 878-925 s for the full suite, ~999 s at 3
# Compiled modules are kept (__pycache__, ignored by git): else each of the suite's thousands
# of Python processes (workers, pools, `cmr` commands) compiles cmr from source again, and
# each pytest worker rewrites every test module's asserts again.
unset PYTHONDONTWRITEBYTECODE
step "pytest -n $workers $*"
.venv/bin/python -m pytest -q -n "$workers" --dist loadgroup "$@"
