#!/usr/bin/env bash
# Local cloud stack for cmr, without Docker, from open-source parts only:
#   * LocalStack (S3, SQS, CloudFormation, CloudWatch, EC2, IAM, SSM, STS) on 127.0.0.1:4566
#   * moto's DynamoDB and SimpleDB (scripts/dynamodb_server.py) on 127.0.0.1:8000
#   * Azurite (Azure Blob, Queue and Table storage) on 127.0.0.1:10000, 10001 and 10002
#
# Usage: scripts/stack.sh {install|start|stop|restart|status|env|logs|lock}
#   install  install all three into .stack/ (idempotent; skips what is present)
#   start    install if needed, start all three in the background, wait until healthy and
#            LocalStack has loaded s3 and sqs (a no-op when all three already answer)
#   stop     stop the processes this checkout started (from .stack/run/*.pid)
#   restart  stop, then start
#   status   show pids and health; exit 0 only when all three are healthy
#   env      print export lines:  eval "$(scripts/stack.sh env)"
#   logs     print the tail of the three logs
#   lock     re-resolve scripts/localstack-requirements.txt, scripts/moto-requirements.txt
#            and scripts/azurite/package-lock.json
#
# Everything lives in .stack/ (gitignored): venvs, node_modules, logs, pid files. Downloads
# come from PyPI and npm only, each file checked against a pinned hash: LocalStack's against
# scripts/localstack-requirements.txt and moto's against scripts/moto-requirements.txt
# (sha256, uv --require-hashes), Azurite's against scripts/azurite/package-lock.json (the
# lock's sha512 integrity fields, npm ci). Azurite needs node 20 or newer and npm on PATH.
# With Docker, docker-compose.yml at the repo root runs the same versions instead.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK_DIR="${CMR_STACK_DIR:-$ROOT/.stack}"
RUN_DIR="$STACK_DIR/run"
LOG_DIR="$STACK_DIR/logs"

BIND_HOST=127.0.0.1
START_TIMEOUT="${CMR_STACK_TIMEOUT:-120}"   # seconds to wait for health on start

# --- LocalStack -------------------------------------------------------------------
LS_VERSION=4.9.2
LS_EXCLUDE_NEWER=2025-10-15                 # resolution date pin (newer releases need Python >= 3.12)
LS_PORT=4566
LS_SERVICES=s3,sqs,cloudformation,cloudwatch,ec2,iam,ssm,sts   # no dynamodb: moto serves that (below)
LS_VENV="$STACK_DIR/localstack-venv"
LS_LOCK="$ROOT/scripts/localstack-requirements.txt"
LS_LAUNCHER="$STACK_DIR/localstack-launch.py"
LS_PYTHON="${CMR_LOCALSTACK_PYTHON:-python3.11}"

# --- DynamoDB and SimpleDB: moto's server ----------------------------------------------
# moto (Apache-2.0) rather than Amazon's DynamoDB Local, whose licence is the vendor's own (and
# LocalStack's community DynamoDB runs that same jar). Its gaps against DynamoDB are named in
# scripts/README-stack.md, and in the tests by the emulator_gap marker (tests/conftest.py).
MOTO_VERSION=5.2.5
DDB_PORT=8000
MOTO_VENV="$STACK_DIR/moto-venv"
MOTO_LOCK="$ROOT/scripts/moto-requirements.txt"
MOTO_SERVER="$ROOT/scripts/dynamodb_server.py"

# --- Azure Blob, Queue and Table storage: Azurite ----------------------------------------
# Azurite (MIT), Microsoft's emulator, from npm. 3.35.0: 3.36 and later need node 22, and
# this project's machines have node 20. Installed by `npm ci` from the committed lock,
# scripts/azurite/package-lock.json, whose integrity fields (sha512) npm checks every
# tarball against. --ignore-scripts: no package in the lock has an install script (none is
# marked hasInstallScript), and Azurite runs from its published dist/ without a build.
AZURITE_VERSION=3.35.0
AZURITE_NODE_MAJOR=20                        # the oldest node the lock's packages accept
AZURITE_PKG="$ROOT/scripts/azurite"          # package.json + package-lock.json
AZURITE_DIR="$STACK_DIR/azurite"             # npm ci runs here: $AZURITE_DIR/node_modules
AZURITE_MAIN="$AZURITE_DIR/node_modules/azurite/dist/src/azurite.js"
AZ_BLOB_PORT=10000
AZ_QUEUE_PORT=10001
AZ_TABLE_PORT=10002
# Azurite's development account: public, the same in every Azurite (Azure's documentation
# of the emulator gives both); it opens nothing but a local emulator.
AZ_ACCOUNT=devstoreaccount1
AZ_KEY='Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=='

export UV_PYTHON_DOWNLOADS=never             # use the local interpreter; never fetch one
# npm: no update check, no audit or funding calls: nothing is asked of the registry but packages
export NPM_CONFIG_UPDATE_NOTIFIER=false NPM_CONFIG_AUDIT=false NPM_CONFIG_FUND=false

log() { printf '[stack] %s\n' "$*" >&2; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }

# ===================================================================== helpers ====

# uv_cmd: uv on PATH, python3 -m uv, or a hash-checked copy in .tools/uv (scripts/uv.sh)
source "$ROOT/scripts/uv.sh"

sha256_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

pick_python() {
    if command -v "$LS_PYTHON" >/dev/null 2>&1; then
        command -v "$LS_PYTHON"
    elif command -v python3 >/dev/null 2>&1; then
        log "WARNING: $LS_PYTHON not found, using $(command -v python3) (LocalStack $LS_VERSION supports 3.9-3.13)"
        command -v python3
    else
        die "no Python 3 interpreter found (want $LS_PYTHON)"
    fi
}

# ============================================================ install: LocalStack ====

write_localstack_launcher() {
    # LocalStack's default (twisted) gateway ignores the host part of GATEWAY_LISTEN for IPv4
    # and binds 0.0.0.0. This wrapper makes every IPv4 twisted listener without an explicit
    # interface bind to CMR_STACK_BIND_HOST, then runs the normal entry point.
    cat >"$LS_LAUNCHER.tmp" <<'PY'
# Generated by scripts/stack.sh -- runs LocalStack bound to a loopback address.
import os
import runpy

from twisted.internet import endpoints

_HOST = os.environ.get("CMR_STACK_BIND_HOST", "127.0.0.1")
_orig_init = endpoints.TCP4ServerEndpoint.__init__


def _init(self, reactor, port, backlog=50, interface=""):
    _orig_init(self, reactor, port, backlog, interface or _HOST)


endpoints.TCP4ServerEndpoint.__init__ = _init
runpy.run_module("localstack.runtime.main", run_name="__main__", alter_sys=True)
PY
    mv "$LS_LAUNCHER.tmp" "$LS_LAUNCHER"
}

localstack_stamp_value() { echo "ls=$LS_VERSION lock=$(sha256_of "$LS_LOCK")"; }

localstack_installed() {
    [[ -x "$LS_VENV/bin/python" && -f "$LS_VENV/.cmr-installed" && -f "$LS_LAUNCHER" && -f "$LS_LOCK" ]] \
        && [[ "$(cat "$LS_VENV/.cmr-installed")" == "$(localstack_stamp_value)" ]]
}

lock_localstack() {
    mkdir -p "$STACK_DIR"
    local in="$STACK_DIR/localstack-requirements.in"
    echo "localstack-core[runtime]==$LS_VERSION" >"$in"
    log "resolving localstack-core[runtime]==$LS_VERSION as of $LS_EXCLUDE_NEWER -> ${LS_LOCK#"$ROOT"/}"
    uv_cmd pip compile --quiet --universal --python-version 3.11 --generate-hashes \
        --exclude-newer "$LS_EXCLUDE_NEWER" \
        --custom-compile-command "scripts/stack.sh lock" \
        --output-file "$LS_LOCK" "$in"
    { echo "# localstack-core[runtime]==$LS_VERSION resolved with uv --exclude-newer $LS_EXCLUDE_NEWER (Python 3.11)."
      grep -v '^# localstack-core\[runtime\]==' "$LS_LOCK"; } >"$LS_LOCK.tmp"
    mv "$LS_LOCK.tmp" "$LS_LOCK"
}

install_localstack() {
    if localstack_installed; then
        log "LocalStack $LS_VERSION: already installed in ${LS_VENV#"$ROOT"/}"
        return
    fi
    [[ -f "$LS_LOCK" ]] || lock_localstack
    local py
    py="$(pick_python)"
    if [[ ! -x "$LS_VENV/bin/python" ]]; then
        log "creating venv ${LS_VENV#"$ROOT"/} with $py"
        uv_cmd venv --quiet --python "$py" "$LS_VENV"
    fi
    log "installing LocalStack $LS_VERSION from ${LS_LOCK#"$ROOT"/} (exclude-newer $LS_EXCLUDE_NEWER, hashes checked)"
    # Every file checked against the lock's sha256: a changed file is refused, not run.
    uv_cmd pip sync --quiet --python "$LS_VENV/bin/python" --require-hashes \
        --exclude-newer "$LS_EXCLUDE_NEWER" "$LS_LOCK"
    write_localstack_launcher
    localstack_stamp_value >"$LS_VENV/.cmr-installed"
}

# =================================================== install: DynamoDB (moto) ====

lock_moto() {
    # The pins of the development lock (requirements-dev.txt holds moto[server] for the
    # tests), so the stack's server and the tests' in-process moto are the same code.
    local in="$STACK_DIR/moto-requirements.in"
    mkdir -p "$STACK_DIR"
    printf '%s\n' "moto[dynamodb]==$MOTO_VERSION" flask flask-cors >"$in"
    log "resolving moto[dynamodb]==$MOTO_VERSION with the pins of requirements-dev.txt -> ${MOTO_LOCK#"$ROOT"/}"
    uv_cmd pip compile --quiet --universal --python-version 3.11 --generate-hashes \
        --constraint "$ROOT/requirements-dev.txt" \
        --custom-compile-command "scripts/stack.sh lock" \
        --output-file "$MOTO_LOCK" "$in"
    sed -i "s|$in|moto[dynamodb]==$MOTO_VERSION, flask, flask-cors|; s|-c $ROOT/|-c |" "$MOTO_LOCK"
}

moto_stamp_value() { echo "moto=$MOTO_VERSION lock=$(sha256_of "$MOTO_LOCK")"; }

moto_installed() {
    [[ -x "$MOTO_VENV/bin/python" && -f "$MOTO_VENV/.cmr-installed" ]] \
        && [[ "$(cat "$MOTO_VENV/.cmr-installed")" == "$(moto_stamp_value)" ]]
}

install_moto() {
    if moto_installed; then
        log "moto $MOTO_VERSION (DynamoDB, SimpleDB): already installed in ${MOTO_VENV#"$ROOT"/}"
        return
    fi
    local py
    py="$(pick_python)"
    if [[ ! -x "$MOTO_VENV/bin/python" ]]; then
        log "creating venv ${MOTO_VENV#"$ROOT"/} with $py"
        uv_cmd venv --quiet --python "$py" "$MOTO_VENV"
    fi
    log "installing moto $MOTO_VERSION from ${MOTO_LOCK#"$ROOT"/} (hashes checked)"
    uv_cmd pip sync --quiet --python "$MOTO_VENV/bin/python" --require-hashes "$MOTO_LOCK"
    moto_stamp_value >"$MOTO_VENV/.cmr-installed"
}

# ================================================================ install: Azurite ====

require_node() {
    local major
    command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 \
        || die "Azurite needs node (>= $AZURITE_NODE_MAJOR) and npm on PATH (e.g. apt-get install nodejs npm)"
    major="$(node -p 'process.versions.node.split(".")[0]')"
    ((major >= AZURITE_NODE_MAJOR)) \
        || die "Azurite $AZURITE_VERSION's packages need node >= $AZURITE_NODE_MAJOR; this is node $(node --version)"
}

lock_azurite() {
    # Bring the lock in line with scripts/azurite/package.json (azurite pinned exactly there):
    # what it already pins stays pinned, as `scripts/setup.sh lock` keeps its pins; delete
    # it first to resolve the whole tree anew. No "resolved" URLs in it: npm takes each
    # package from the registry it is configured with, and checks it against the lock's
    # integrity hash wherever it came from.
    require_node
    log "resolving azurite@$AZURITE_VERSION -> ${AZURITE_PKG#"$ROOT"/}/package-lock.json"
    (cd "$AZURITE_PKG" && npm install --package-lock-only --ignore-scripts \
        --omit-lockfile-registry-resolved --no-audit --no-fund >&2)
}

azurite_stamp_value() {
    echo "azurite=$AZURITE_VERSION lock=$(sha256_of "$AZURITE_PKG/package.json" "$AZURITE_PKG/package-lock.json") node=$(node --version)"
}

azurite_installed() {
    [[ -f "$AZURITE_MAIN" && -f "$AZURITE_DIR/.cmr-installed" ]] \
        && [[ "$(cat "$AZURITE_DIR/.cmr-installed")" == "$(azurite_stamp_value)" ]]
}

install_azurite() {
    require_node
    if azurite_installed; then
        log "Azurite $AZURITE_VERSION: already installed in ${AZURITE_DIR#"$ROOT"/}"
        return
    fi
    log "installing Azurite $AZURITE_VERSION from ${AZURITE_PKG#"$ROOT"/}/package-lock.json (npm ci, integrity checked)"
    rm -f "$AZURITE_DIR/.cmr-installed"
    mkdir -p "$AZURITE_DIR"
    cp "$AZURITE_PKG/package.json" "$AZURITE_PKG/package-lock.json" "$AZURITE_DIR/"
    # npm ci installs exactly the lock (it refuses one that disagrees with package.json) and
    # checks every tarball against the lock's sha512; --engine-strict refuses a package whose
    # declared node versions exclude this node.
    (cd "$AZURITE_DIR" && npm ci --ignore-scripts --no-audit --no-fund --engine-strict \
        --loglevel=warn >&2) || die "npm ci of Azurite $AZURITE_VERSION failed (above)"
    [[ -f "$AZURITE_MAIN" ]] || die "npm ci finished but ${AZURITE_MAIN#"$ROOT"/} is missing"
    azurite_stamp_value >"$AZURITE_DIR/.cmr-installed"
}

do_install() {
    mkdir -p "$STACK_DIR"
    install_localstack
    install_moto
    install_azurite
}

# ================================================================ health probes ====

probe_py() {
    # A tiny HTTP probe without a curl dependency; prefers the LocalStack venv's Python.
    local py=python3
    [[ -x "$LS_VENV/bin/python" ]] && py="$LS_VENV/bin/python"
    "$py" - "$@" <<'PY'
import json, sys, urllib.error, urllib.request
kind, url = sys.argv[1], sys.argv[2]
# Neither server checks the signature; LocalStack routes by the credential's service.
auth = "AWS4-HMAC-SHA256 Credential=test/20200101/us-east-1/{}/aws4_request, SignedHeaders=host, Signature=0"
try:
    if kind == "localstack":
        with urllib.request.urlopen(url, timeout=3) as r:
            services = json.load(r).get("services", {})
        ok = all(services.get(s) in ("available", "running") for s in ("s3", "sqs"))
        sys.exit(0 if ok else 1)
    elif kind == "warm":
        # LocalStack loads a service at its first request (~1 s of CPU each, more on a
        # slower machine): done here, so that no test's or user's first call pays for it
        # inside a timeout. One read-only call per service.
        for req in (
            urllib.request.Request(url, data=b"{}", method="POST", headers={
                "Content-Type": "application/x-amz-json-1.0",
                "X-Amz-Target": "AmazonSQS.ListQueues", "Authorization": auth.format("sqs")}),
            urllib.request.Request(url, method="GET", headers={"Authorization": auth.format("s3")}),
        ):
            with urllib.request.urlopen(req, timeout=60) as r:
                r.read()
    elif kind == "azurite":
        # Each of the three services answers an unsigned request (403 or 400) with its
        # Server header; a port held by anything else is not Azurite.
        for port, service in zip(sys.argv[3:], ("Blob", "Queue", "Table")):
            try:
                with urllib.request.urlopen(f"{url}:{port}/devstoreaccount1?comp=list", timeout=3) as r:
                    server = r.headers.get("Server", "")
            except urllib.error.HTTPError as e:
                server = e.headers.get("Server", "")
            if not server.startswith(f"Azurite-{service}/"):
                sys.exit(1)
    else:  # dynamodb: ListTables
        req = urllib.request.Request(url, data=b"{}", method="POST", headers={
            "Content-Type": "application/x-amz-json-1.0",
            "X-Amz-Target": "DynamoDB_20120810.ListTables",
            "Authorization": auth.format("dynamodb"),
        })
        with urllib.request.urlopen(req, timeout=3) as r:
            # moto's server (Werkzeug) only: an older checkout's DynamoDB Local answers too
            ours = "Werkzeug" in r.headers.get("Server", "")
            sys.exit(0 if ours and "TableNames" in json.load(r) else 1)
except Exception:
    sys.exit(1)
PY
}

ls_healthy()  { probe_py localstack "http://$BIND_HOST:$LS_PORT/_localstack/health"; }
ddb_healthy() { probe_py dynamodb "http://$BIND_HOST:$DDB_PORT/"; }
ls_warm()     { probe_py warm "http://$BIND_HOST:$LS_PORT/"; }
az_healthy()  { probe_py azurite "http://$BIND_HOST" "$AZ_BLOB_PORT" "$AZ_QUEUE_PORT" "$AZ_TABLE_PORT"; }

port_in_use() {
    # true if something accepts TCP connections on 127.0.0.1:$1
    (exec 3<>"/dev/tcp/$BIND_HOST/$1") 2>/dev/null
}

az_ports_in_use() {
    # true if something accepts connections on any of Azurite's three ports
    port_in_use "$AZ_BLOB_PORT" || port_in_use "$AZ_QUEUE_PORT" || port_in_use "$AZ_TABLE_PORT"
}

# ============================================================ process handling ====

# pid of a process we started, if its pid file exists and the process is still ours
our_pid() {
    local name=$1 marker=$2 pidfile="$RUN_DIR/$1.pid" pid
    [[ -f "$pidfile" ]] || return 1
    pid="$(cat "$pidfile")"
    if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
            && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$marker"; then
        echo "$pid"
        return 0
    fi
    rm -f "$pidfile"     # stale
    return 1
}

ls_pid()  { our_pid localstack localstack-launch.py; }
ddb_pid() { our_pid dynamodb dynamodb_server.py; }
az_pid()  { our_pid azurite node_modules/azurite/dist/src/azurite.js; }

rotate_log() { [[ -f "$1" ]] && mv -f "$1" "$1.prev"; return 0; }

spawn() {
    # spawn NAME LOGFILE CMD... : detached (own session, survives this script), pid file written
    local name=$1 logfile=$2
    shift 2
    rotate_log "$logfile"
    # No job control in a script, so the child is not a group leader and setsid
    # execs in place: $! is the server's own pid. fd 9 (the lock) is not passed on.
    setsid nohup "$@" >"$logfile" 2>&1 </dev/null 9>&- &
    echo $! >"$RUN_DIR/$name.pid"
}

start_localstack() {
    if ls_healthy; then
        local pid
        if pid="$(ls_pid)"; then
            log "LocalStack already running (pid $pid) and healthy"
        else
            log "LocalStack already answering on $BIND_HOST:$LS_PORT (not started by this checkout); reusing it"
        fi
        return
    fi
    if ls_pid >/dev/null; then
        log "LocalStack process $(ls_pid) exists but is not healthy yet; waiting for it"
        return
    fi
    port_in_use "$LS_PORT" && die "port $LS_PORT is in use by another process that is not a healthy LocalStack"
    log "starting LocalStack $LS_VERSION on $BIND_HOST:$LS_PORT (services: $LS_SERVICES)"
    mkdir -p "$STACK_DIR/localstack-fs"
    # SQS_DISABLE_CLOUDWATCH_METRICS: with CloudWatch among the services, LocalStack's SQS
    # publishes a metric through a client call of its own for every SQS call: ~18 ms of its
    # CPU per SendMessage instead of ~2.4 (measured here): ~100 CPU-s of a full test run.
    spawn localstack "$LOG_DIR/localstack.log" env \
        ACTIVATE_PRO=0 \
        SERVICES="$LS_SERVICES" \
        GATEWAY_LISTEN="$BIND_HOST:$LS_PORT" \
        CMR_STACK_BIND_HOST="$BIND_HOST" \
        LOCALSTACK_HOST="$BIND_HOST:$LS_PORT" \
        SQS_ENDPOINT_STRATEGY=path \
        OVERRIDE_IN_DOCKER=0 \
        FILESYSTEM_ROOT="$STACK_DIR/localstack-fs" \
        DNS_ADDRESS=0 \
        SKIP_SSL_CERT_DOWNLOAD=1 \
        DISABLE_EVENTS=1 \
        SQS_DISABLE_CLOUDWATCH_METRICS=1 \
        PERSISTENCE=0 \
        "$LS_VENV/bin/python" "$LS_LAUNCHER"
}

start_ddb() {
    if ddb_healthy; then
        local pid
        if pid="$(ddb_pid)"; then
            log "DynamoDB (moto) already running (pid $pid) and healthy"
        else
            log "DynamoDB already answering on $BIND_HOST:$DDB_PORT (not started by this checkout); reusing it"
        fi
        return
    fi
    if ddb_pid >/dev/null; then
        log "DynamoDB (moto) process $(ddb_pid) exists but is not healthy yet; waiting for it"
        return
    fi
    port_in_use "$DDB_PORT" && die "port $DDB_PORT is in use by another process that is not moto's DynamoDB server (an older checkout's DynamoDB Local? stop that process first)"
    log "starting DynamoDB and SimpleDB (moto $MOTO_VERSION) on $BIND_HOST:$DDB_PORT (in memory)"
    spawn dynamodb "$LOG_DIR/dynamodb.log" \
        "$MOTO_VENV/bin/python" "$MOTO_SERVER" --host "$BIND_HOST" --port "$DDB_PORT"
}

start_azurite() {
    if az_healthy; then
        local pid
        if pid="$(az_pid)"; then
            log "Azurite already running (pid $pid) and healthy"
        else
            log "Azurite already answering on $BIND_HOST:$AZ_BLOB_PORT-$AZ_TABLE_PORT (not started by this checkout); reusing it"
        fi
        return
    fi
    if az_pid >/dev/null; then
        log "Azurite process $(az_pid) exists but is not healthy yet; waiting for it"
        return
    fi
    az_ports_in_use && die "one of ports $AZ_BLOB_PORT-$AZ_TABLE_PORT is in use by another process that is not a healthy Azurite"
    log "starting Azurite $AZURITE_VERSION on $BIND_HOST:$AZ_BLOB_PORT (blob), $AZ_QUEUE_PORT (queue), $AZ_TABLE_PORT (table) (in memory)"
    # --inMemoryPersistence: nothing on disk (no --location then: Azurite refuses both); the
    #   data is gone after stop, as moto's is.
    # --disableTelemetry: else Azurite reports its use to Microsoft (Application Insights).
    # --silent: no access-log line per request; its start-up lines and errors still reach
    #   .stack/logs/azurite.log.
    # --skipApiVersionCheck: a gap, named here rather than hidden. Azurite 3.35.0 implements
    #   the storage REST API up to version 2025-11-05 and refuses a newer x-ms-version; the
    #   pinned azure-storage-blob 12.31.1 and azure-storage-queue 12.18.1 send 2026-10-06
    #   (azure-data-tables 12.7.0 sends 2019-02-02). With the check skipped Azurite answers
    #   them as 2025-11-05 would: what the newer versions added is not emulated.
    spawn azurite "$LOG_DIR/azurite.log" \
        node "$AZURITE_MAIN" \
        --blobHost "$BIND_HOST" --blobPort "$AZ_BLOB_PORT" \
        --queueHost "$BIND_HOST" --queuePort "$AZ_QUEUE_PORT" \
        --tableHost "$BIND_HOST" --tablePort "$AZ_TABLE_PORT" \
        --inMemoryPersistence --disableTelemetry --silent --skipApiVersionCheck
}

fail_with_log() {
    local what=$1 logfile=$2
    printf '[stack] ERROR: %s\n' "$what" >&2
    if [[ -f "$logfile" ]]; then
        printf '[stack] ---- last 40 lines of %s ----\n' "$logfile" >&2
        tail -n 40 "$logfile" >&2
        printf '[stack] ----\n' >&2
    fi
    printf '[stack] whatever did start is left running: scripts/stack.sh status | stop\n' >&2
    exit 1
}

wait_healthy() {
    local deadline=$((SECONDS + START_TIMEOUT)) ls_ok=0 ddb_ok=0 az_ok=0
    while :; do
        ((ls_ok)) || { ls_healthy && ls_ok=1 && log "LocalStack healthy (s3, sqs) after ${SECONDS}s"; } || true
        ((ddb_ok)) || { ddb_healthy && ddb_ok=1 && log "DynamoDB (moto) answers ListTables after ${SECONDS}s"; } || true
        ((az_ok)) || { az_healthy && az_ok=1 && log "Azurite answers on blob, queue and table after ${SECONDS}s"; } || true
        if ((ls_ok && ddb_ok && az_ok)); then
            ls_warm || fail_with_log "LocalStack is healthy but did not answer its first SQS and S3 calls" "$LOG_DIR/localstack.log"
            log "LocalStack's s3 and sqs loaded after ${SECONDS}s"
            return 0
        fi
        # fail fast if a server we started has died
        if ((!ls_ok)) && ! ls_pid >/dev/null && ! ls_healthy; then
            fail_with_log "LocalStack exited during startup" "$LOG_DIR/localstack.log"
        fi
        if ((!ddb_ok)) && ! ddb_pid >/dev/null && ! ddb_healthy; then
            fail_with_log "DynamoDB (moto) exited during startup" "$LOG_DIR/dynamodb.log"
        fi
        if ((!az_ok)) && ! az_pid >/dev/null && ! az_healthy; then
            fail_with_log "Azurite exited during startup" "$LOG_DIR/azurite.log"
        fi
        if ((SECONDS >= deadline)); then
            ((ls_ok)) || fail_with_log "LocalStack not healthy after ${START_TIMEOUT}s ($BIND_HOST:$LS_PORT/_localstack/health)" "$LOG_DIR/localstack.log"
            ((ddb_ok)) || fail_with_log "DynamoDB (moto) not answering after ${START_TIMEOUT}s ($BIND_HOST:$DDB_PORT)" "$LOG_DIR/dynamodb.log"
            fail_with_log "Azurite not answering after ${START_TIMEOUT}s ($BIND_HOST:$AZ_BLOB_PORT-$AZ_TABLE_PORT)" "$LOG_DIR/azurite.log"
        fi
        sleep 0.5
    done
}

with_lock() {
    # serialize install/start/stop between concurrent invocations
    mkdir -p "$STACK_DIR" "$RUN_DIR" "$LOG_DIR"
    exec 9>"$STACK_DIR/.lock"
    flock -w 600 9 || die "could not lock $STACK_DIR/.lock"
}

do_start() {
    if ls_healthy && ddb_healthy && az_healthy; then
        ls_warm || true   # one started by hand may not have loaded them yet
        log "stack already running and healthy"
        return
    fi
    # refuse before starting anything if a port is taken by something else
    if ! ls_healthy && ! ls_pid >/dev/null && port_in_use "$LS_PORT"; then
        die "port $LS_PORT is in use by another process that is not a healthy LocalStack"
    fi
    if ! ddb_healthy && ! ddb_pid >/dev/null && port_in_use "$DDB_PORT"; then
        die "port $DDB_PORT is in use by another process that is not a DynamoDB server"
    fi
    if ! az_healthy && ! az_pid >/dev/null && az_ports_in_use; then
        die "one of ports $AZ_BLOB_PORT-$AZ_TABLE_PORT is in use by another process that is not a healthy Azurite"
    fi
    do_install
    SECONDS=0
    start_localstack
    start_ddb
    start_azurite
    wait_healthy
    log "stack ready: LocalStack http://$BIND_HOST:$LS_PORT  DynamoDB http://$BIND_HOST:$DDB_PORT  Azurite http://$BIND_HOST:$AZ_BLOB_PORT-$AZ_TABLE_PORT"
    log "use it with:  eval \"\$(scripts/stack.sh env)\""
}

stop_one() {
    local name=$1 pid=$2 i
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$name did not exit after 10s; killing its process group"
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$RUN_DIR/$name.pid"
}

do_stop() {
    local pid any=0
    if pid="$(ls_pid)"; then stop_one localstack "$pid"; any=1; fi
    if pid="$(ddb_pid)"; then stop_one dynamodb "$pid"; any=1; fi
    if pid="$(az_pid)"; then stop_one azurite "$pid"; any=1; fi
    ((any)) || log "nothing to stop (no live processes from ${RUN_DIR#"$ROOT"/})"
    return 0
}

status_line() {
    # status_line NAME URL PID_FUNC HEALTH_FUNC LOG
    local name=$1 url=$2 pid who
    if pid="$($3)"; then who="pid $pid, log ${5#"$ROOT"/}"; else who="no process from this checkout"; fi
    if $4; then
        printf '%-11s %-28s healthy  (%s)\n' "$name" "$url" "$who"
    else
        printf '%-11s %-28s DOWN     (%s)\n' "$name" "$url" "$who"
        return 3
    fi
}

do_status() {
    local rc=0
    status_line localstack "http://$BIND_HOST:$LS_PORT" ls_pid ls_healthy "$LOG_DIR/localstack.log" || rc=3
    status_line dynamodb "http://$BIND_HOST:$DDB_PORT" ddb_pid ddb_healthy "$LOG_DIR/dynamodb.log" || rc=3
    status_line azurite "http://$BIND_HOST:$AZ_BLOB_PORT-$AZ_TABLE_PORT" az_pid az_healthy "$LOG_DIR/azurite.log" || rc=3
    return $rc
}

do_env() {
    cat <<EOF
export AWS_ENDPOINT_URL=http://$BIND_HOST:$LS_PORT
export AWS_ENDPOINT_URL_DYNAMODB=http://$BIND_HOST:$DDB_PORT
export AWS_ENDPOINT_URL_SIMPLEDB=http://$BIND_HOST:$DDB_PORT
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
export AWS_DEFAULT_REGION=us-east-1
export AZURE_STORAGE_CONNECTION_STRING='DefaultEndpointsProtocol=http;AccountName=$AZ_ACCOUNT;AccountKey=$AZ_KEY;BlobEndpoint=http://$BIND_HOST:$AZ_BLOB_PORT/$AZ_ACCOUNT;QueueEndpoint=http://$BIND_HOST:$AZ_QUEUE_PORT/$AZ_ACCOUNT;TableEndpoint=http://$BIND_HOST:$AZ_TABLE_PORT/$AZ_ACCOUNT'
EOF
}

do_logs() {
    local f
    for f in "$LOG_DIR/localstack.log" "$LOG_DIR/dynamodb.log" "$LOG_DIR/azurite.log"; do
        echo "==> $f <=="
        tail -n "${1:-30}" "$f" 2>/dev/null || echo "(none)"
    done
}

usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "${BASH_SOURCE[0]}"; }

cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
    install) with_lock; do_install ;;
    start)   with_lock; do_start ;;
    stop)    with_lock; do_stop ;;
    restart) with_lock; do_stop; do_start ;;
    status)  do_status ;;
    env)     do_env ;;
    logs)    do_logs "$@" ;;
    lock)    with_lock; lock_localstack; lock_moto; lock_azurite ;;
    -h|--help|help) usage ;;
    *) usage >&2; exit 2 ;;
esac
