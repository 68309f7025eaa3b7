#!/usr/bin/env bash
# Create .venv (Python 3.11 or newer) and install cmr with what running a job needs, pinned
# and hashed (requirements.txt).
#   scripts/setup.sh        then: .venv/bin/cmr --help
#   scripts/setup.sh dev    also the development tools (requirements-dev.txt: pytest, mypy,
#                           ruff, moto ...) and the load generator's, as scripts/test.sh does
#   scripts/setup.sh mrjob  also mrjob 0.7.4, to run mrjob jobs (requirements-mrjob.txt;
#                           the checkout's `pip install 'cmr[mrjob]'`)
#   scripts/setup.sh loadgen  also what `cmr loadgen` needs: hdrhistogram, matplotlib
#                           (requirements-loadgen.txt; the checkout's `pip install 'cmr[loadgen]'`)
#   scripts/setup.sh azure  also the Azure Storage SDKs, to run on Azure or Azurite
#                           (requirements-azure.txt; the checkout's `pip install 'cmr[azure]'`)
#   scripts/setup.sh lock   re-resolve every lock (same pins, fresh hashes); pass
#                           --upgrade-package NAME (or --upgrade) to move a pin on purpose
#   PYTHON=python3.12 scripts/setup.sh    use that interpreter for a new .venv (default:
#                           python3.11 if found, else the newest 3.11+ on PATH)
#
# Every distribution installed is checked against a sha256 in the lock (--require-hashes),
# the build backend of cmr's own editable install (hatchling) included: a file that changed
# on the index, or on the way, is refused instead of run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export UV_PYTHON_DOWNLOADS=never
step() { printf '\n==> %s\n' "$*"; }

# uv_cmd: uv on PATH, python3 -m uv, or a hash-checked copy in .tools/uv (scripts/uv.sh)
source scripts/uv.sh

lock() {
    # Resolved once for every Python from 3.11 on and every platform (--universal: a pin
    # that only some interpreters need carries its marker), hashes of every file of each
    # pinned version. requirements-dev.txt (pyproject's dev extra, the runtime and the build
    # backend) is resolved first; the runtime lock takes its pins from it, so both agree.
    # The current files are the constraints, so pins move only when asked.
    local build
    build="$(mktemp --suffix=.in)"
    trap 'rm -f "$build"' RETURN
    # pyproject.toml's [build-system], and what hatchling asks for to build an editable wheel
    printf '%s\n' hatchling editables >"$build"
    local common=(--generate-hashes --universal --python-version 3.11
                  --custom-compile-command "scripts/setup.sh lock")
    uv_cmd pip compile pyproject.toml "$build" --extra dev "${common[@]}" \
        --constraint requirements-dev.txt --output-file requirements-dev.txt "$@"
    uv_cmd pip compile pyproject.toml "$build" "${common[@]}" \
        --constraint requirements-dev.txt --output-file requirements.txt
    uv_cmd pip compile pyproject.toml "$build" --extra mrjob "${common[@]}" \
        --constraint requirements-dev.txt --output-file requirements-mrjob.txt
    uv_cmd pip compile pyproject.toml "$build" --extra loadgen "${common[@]}" \
        --constraint requirements-dev.txt --output-file requirements-loadgen.txt
    uv_cmd pip compile pyproject.toml "$build" --extra azure "${common[@]}" \
        --constraint requirements-dev.txt --output-file requirements-azure.txt
    sed -i "s|$build|pyproject.toml [build-system]|" requirements-dev.txt requirements.txt \
        requirements-mrjob.txt requirements-loadgen.txt requirements-azure.txt
}

# The interpreter for a new .venv: $PYTHON, else python3.11, else the newest 3.11+ found.
pick_python() {
    local version
    if [[ -n "${PYTHON:-}" ]]; then
        if ! version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>&1)"
        then
            echo "error: PYTHON=$PYTHON does not run ($(head -n1 <<<"$version"))" >&2
            return 1
        fi
        if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
            echo "error: PYTHON=$PYTHON is Python $version; cmr needs 3.11 or newer" >&2
            return 1
        fi
        echo "$PYTHON"
        return
    fi
    local found=() best="" best_minor=0 candidate minor candidates
    candidates=(python3.11 python3.12 python3.13 python3.14 python3.15 python3 python)
    # pyenv's versions, which its shims run only when selected (pyenv global/local)
    if command -v pyenv >/dev/null 2>&1; then
        candidates+=("$(pyenv root)"/versions/3.*/bin/python3)
    fi
    for candidate in "${candidates[@]}"; do
        command -v "$candidate" >/dev/null 2>&1 || continue
        # A pyenv shim exists for versions that are not selected: it must run to count.
        version="$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' \
            2>/dev/null)" || continue
        found+=("$version")
        [[ "$version" == 3.* ]] || continue
        minor="${version#3.}"
        if ((minor == 11)); then
            echo "$candidate"
            return
        fi
        if ((minor > 11 && minor > best_minor)); then
            best="$candidate" best_minor="$minor"
        fi
    done
    if [[ -z "$best" ]]; then
        found=("$(printf '%s\n' "${found[@]}" | sort -uV | paste -sd, -)")
        echo "error: cmr needs Python 3.11 or newer; found ${found[*]:-no Python on PATH}" \
            "(install one, or name it: PYTHON=/path/to/python3.12 scripts/setup.sh)" >&2
        return 1
    fi
    echo "$best"
}

case "${1:-}" in
    lock)
        shift
        lock "$@"
        exit 0
        ;;
    dev) locks=(requirements.txt requirements-dev.txt) ;;
    mrjob) locks=(requirements-mrjob.txt) ;;
    loadgen) locks=(requirements-loadgen.txt) ;;
    azure) locks=(requirements-azure.txt) ;;
    "") locks=(requirements.txt) ;;
    *)
        echo "error: unknown argument '$1': use scripts/setup.sh [dev|mrjob|loadgen|azure|lock]" >&2
        exit 2
        ;;
esac

step "Python environment (.venv)"
if [[ ! -x .venv/bin/python ]]; then
    python="$(pick_python)"
    uv_cmd venv --python "$python" .venv
else
    echo ".venv exists ($(.venv/bin/python --version)); remove it to use another Python"
fi
if ! .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "error: .venv has $(.venv/bin/python --version); cmr needs 3.11 or newer:" \
        "rm -rf .venv and run scripts/setup.sh again" >&2
    exit 1
fi

# What cmr runs is compiled at install (pip does it by default, uv does not): else the first
# import of each module compiles it, in every process where PYTHONDONTWRITEBYTECODE is set
# (containers often set it, and so does this project's CI machine) - measured: `cmr status`
# on the local stack 3.7-4.0 CPU-s with the packages uncompiled, 1.6-2.0 compiled. What
# only the development lock brings is not (the tools, and with them mrjob and the load
# generator's libraries): uv compiles all of site-packages, and with them that took ~35
# CPU-s (2 s without); scripts/test.sh lets the suite's processes write their bytecode.
for file in "${locks[@]}"; do
    step "Install $file (every file checked against its sha256)"
    compile=(--compile-bytecode)
    [[ "$file" == requirements-dev.txt ]] && compile=()
    # ${a[@]+...}: an empty array under set -u, on bash before 4.4 too
    uv_cmd pip install --python .venv/bin/python --require-hashes \
        ${compile[@]+"${compile[@]}"} -r "$file"
done

step "Install cmr itself (editable: no hash to check; built by the hatchling just installed)"
uv_cmd pip install --python .venv/bin/python --no-deps --no-build-isolation -e .
.venv/bin/python -m compileall -q -j 0 cmr >/dev/null
