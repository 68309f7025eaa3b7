#!/usr/bin/env bash
# Local AWS stack for cmr, without Docker:
#   * LocalStack (S3, SQS, CloudFormation, CloudWatch, EC2, IAM, SSM, STS) on 127.0.0.1:4566
#   * Amazon DynamoDB Local on 127.0.0.1:8000
#
# Usage: scripts/stack.sh {install|start|stop|restart|status|env|logs|lock}
#   install  install both into .stack/ (idempotent; skips what is present)
#   start    install if needed, start both in the background, wait until healthy
#            (a no-op when both already answer)
#   stop     stop the processes this checkout started (from .stack/run/*.pid)
#   restart  stop, then start
#   status   show pids and health; exit 0 only when both are healthy
#   env      print export lines:  eval "$(scripts/stack.sh env)"
#   logs     print the tail of both logs
#   lock     re-resolve scripts/localstack-requirements.txt (pinned by LS_EXCLUDE_NEWER)
#
# Everything lives in .stack/ (gitignored): venv, jars, logs, pid files.
# Downloads come from the package registries only, each file checked against a pinned sha256:
# PyPI (uv, hashes in scripts/localstack-requirements.txt), Maven Central (curl, hashes below).
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
LS_SERVICES=s3,sqs,cloudformation,cloudwatch,ec2,iam,ssm,sts   # no dynamodb: DynamoDB Local serves that
LS_VENV="$STACK_DIR/localstack-venv"
LS_LOCK="$ROOT/scripts/localstack-requirements.txt"
LS_LAUNCHER="$STACK_DIR/localstack-launch.py"
LS_PYTHON="${CMR_LOCALSTACK_PYTHON:-python3.11}"

# --- DynamoDB Local ---------------------------------------------------------------
DDB_VERSION=2.6.1
DDB_PORT=8000
DDB_DIR="$STACK_DIR/dynamodb-local"
MAVEN_CENTRAL="${CMR_MAVEN_CENTRAL:-https://repo1.maven.org/maven2}"
MAVEN_CACHE="${CMR_MAVEN_CACHE:-$HOME/.m2/repository}"   # read only; a file used if it matches

# Every file DynamoDB Local runs with: its runtime dependencies as Maven resolves them
# (`mvn dependency:copy-dependencies -DincludeScope=runtime` on com.amazonaws:DynamoDBLocal)
# and sqlite4java's Linux x86_64 library, by path on Maven Central, with their sha256. Files
# are fetched directly (no Maven, whose plugins would run before any check) and a file that
# does not match is refused. A new DDB_VERSION needs a new list: resolve it with Maven once,
# then `sha256sum` the copied files.
ddb_artifacts() {
    cat <<'EOF'
a28d8b4919999b7dee6ffa9fd4e9a08744460657a9bd3e3499e3aad00e1f2cc4  com/amazonaws/DynamoDBLocal/2.6.1/DynamoDBLocal-2.6.1.jar
ad00792d761b2be965daa4775b3ba7efd2487bcbc0d1de10dd167969fc650ae9  software/amazon/awssdk/annotations/2.25.50/annotations-2.25.50.jar
da66be0c98acfb29bc708300d05f1a3269c40f9984a4cb9251cf2ba1898d1334  org/antlr/antlr4-runtime/4.10.1/antlr4-runtime-4.10.1.jar
a03510f154fadca3d33b5520d5f30ac8d8e328d9d6564ccbef1d16b95f59f331  software/amazon/awssdk/apache-client/2.25.50/apache-client-2.25.50.jar
98e8736668936a4dfca1263969aaef641037ed40a43bb33544c8571042d8d892  software/amazon/awssdk/auth/2.25.50/auth-2.25.50.jar
6258fe8ca8f75ffb498500c57020496d75861e31b80b5b61bc5809d76236e803  software/amazon/awssdk/aws-core/2.25.50/aws-core-2.25.50.jar
6ce2a5f90534dae97bc6a2638cf418deb665274b3b813eca0123616f5b735830  com/amazonaws/aws-java-sdk-core/1.12.721/aws-java-sdk-core-1.12.721.jar
2795a203ac9a11da08bc7c25588904c913b62348f8826880b5b80d3e075f7ecf  com/amazonaws/aws-java-sdk-dynamodb/1.12.721/aws-java-sdk-dynamodb-1.12.721.jar
9ad71375d2dcbf77dfef8de137c6c8746a5d3f88117488be4a2faf246a2cd8d4  com/amazonaws/aws-java-sdk-kms/1.12.721/aws-java-sdk-kms-1.12.721.jar
cd41afa71038ad007bb36cc5c21fc10ec79e62e821eeb7021332aab11d31b888  com/amazonaws/aws-java-sdk-s3/1.12.721/aws-java-sdk-s3-1.12.721.jar
1f301237d43dc2f39b9a174682c7ad05d22a9f07cfa736871869a3d62ed242aa  software/amazon/awssdk/aws-json-protocol/2.25.50/aws-json-protocol-2.25.50.jar
3fbc2e98f05854c3df16df9abaa955b91b15b3ecac33623208ed6424640ef0f6  org/checkerframework/checker-qual/3.43.0/checker-qual-3.43.0.jar
c4ba8f3d77d1d1db7b700b5f7b068ba5c503adf582afd739984144e1d63d76f3  software/amazon/awssdk/checksums/2.25.50/checksums-2.25.50.jar
3f18cb08301ba93e2ec1524e53c022b0614216ef44efa59c3133a8011ea641ff  software/amazon/awssdk/checksums-spi/2.25.50/checksums-spi-2.25.50.jar
63b0159abcd2d5d4d22840f926f2963c9e9e3104f095bacc06b00b7ddefa23b6  software/amazon/awssdk/cognitoidentity/2.25.50/cognitoidentity-2.25.50.jar
f16d6379f9a00718a637e85857e680297f9f225a4975c25893337ebe92264386  software/amazon/awssdk/cognitoidentityprovider/2.25.50/cognitoidentityprovider-2.25.50.jar
69e1237059acd56f0f8654dcde09d8a1412eee82918bef5564d51f8fb275711b  commons-cli/commons-cli/1.6.0/commons-cli-1.6.0.jar
b3e9f6d63a790109bf0d056611fbed1cf69055826defeb9894a71369d246ed63  commons-codec/commons-codec/1.15/commons-codec-1.15.jar
6ee731df5c8e5a2976a1ca023b6bb320ea8d3539fbe64c8a1d5cb765127c33b4  org/apache/commons/commons-lang3/3.17.0/commons-lang3-3.17.0.jar
70903f6fc82e9908c8da9f20443f61d90f0870a312642991fe8462a0b9391784  commons-logging/commons-logging/1.1.3/commons-logging-1.1.3.jar
5350e8a132d99ac45724fb5f1056dcaa3234d984601c62da43cd94e5ece13ae6  software/amazon/awssdk/dynamodb/2.25.50/dynamodb-2.25.50.jar
7f722bf952b3cce019a3667780fc55ee3e9593a7adf729fe7c801c74934fd47f  software/amazon/awssdk/dynamodb-enhanced/2.25.50/dynamodb-enhanced-2.25.50.jar
d1ec4b4c6c3b77d837c3903791bc991416ddf28977e08e7f086aa4005bd9b92e  software/amazon/awssdk/endpoints-spi/2.25.50/endpoints-spi-2.25.50.jar
77440e270b0bc9a249903c5a076c36a722c4886ca4f42675f2903a1c53ed61a5  com/google/errorprone/error_prone_annotations/2.36.0/error_prone_annotations-2.36.0.jar
0c37d8e696117f02c302191b8110b0d0eb20fa412fce34c3a269ec73c16ce822  software/amazon/eventstream/eventstream/1.0.1/eventstream-1.0.1.jar
8a8f81cf9b359e3f6dfa691a1e776985c061ef2f223c9b2c80753e1b458e8064  com/google/guava/failureaccess/1.0.2/failureaccess-1.0.2.jar
b918c98a7e44dbe94ebd9fe3e40cddaadb5a93e6a78eb6008b42df237241e538  com/google/guava/guava/33.4.0-jre/guava-33.4.0-jre.jar
0361d1493ff0d94f861359efea91200720635072134792efb7217f6e09d5cffb  org/hamcrest/hamcrest-core/1.1/hamcrest-core-1.1.jar
84eb1fa01119c6ca7b49187b31f278ab1d65b9a82b4e102f9b55e3a3001f30d0  software/amazon/awssdk/http-auth/2.25.50/http-auth-2.25.50.jar
8a972935b58a498702eb5dafce5082ca390278273ff86a81c3ee2b96d90a0cfa  software/amazon/awssdk/http-auth-aws/2.25.50/http-auth-aws-2.25.50.jar
f8e1876fe705c9b0ae4e547835fbf9d368a38b6209e758c1ba507d1d660f2f92  software/amazon/awssdk/http-auth-spi/2.25.50/http-auth-spi-2.25.50.jar
3f6cedacf6a10d3113fa685868d5f1e9661f7e625fb9a4febad53a78e1227f1d  software/amazon/awssdk/http-client-spi/2.25.50/http-client-spi-2.25.50.jar
6fe9026a566c6a5001608cf3fc32196641f6c1e5e1986d1037ccdbd5f31ef743  org/apache/httpcomponents/httpclient/4.5.13/httpclient-4.5.13.jar
e06e89d40943245fcfa39ec537cdbfce3762aecde8f9c597780d2b00c2b43424  org/apache/httpcomponents/httpcore/4.4.13/httpcore-4.4.13.jar
4708e42d7498ca0d343d0f755c6856f920b2478f296fbec0950170a2e3ac8071  software/amazon/awssdk/identity-spi/2.25.50/identity-spi-2.25.50.jar
88241573467ddca44ffd4d74aa04c2bbfd11bf7c17e0c342c94c9de7a70a7c64  com/google/j2objc/j2objc-annotations/3.0.0/j2objc-annotations-3.0.0.jar
3cacef714a89f3d68b69fa11263afa55a6aa2fdef1fff93ded22caa16b54687c  com/fasterxml/jackson/core/jackson-annotations/2.12.7/jackson-annotations-2.12.7.jar
3987a6a335046e226e56b81d69668fb5a91b155ea7fd96b0851adbb7d4ac1ca6  com/fasterxml/jackson/core/jackson-core/2.12.7/jackson-core-2.12.7.jar
4ed50208a764347fb86e79305d3b91c68a5232b22b763214683db07d88b6c687  com/fasterxml/jackson/core/jackson-databind/2.12.7/jackson-databind-2.12.7.jar
cfa008d15f052e69221e8c3193056ff95c3c594271321ccac8d72dc1a770619c  com/fasterxml/jackson/dataformat/jackson-dataformat-cbor/2.12.6/jackson-dataformat-cbor-2.12.6.jar
a8ccf675c7083c052a17f31bfeead65bd9103a6af219f02dfa0e836fa0dfb33d  com/fasterxml/jackson/datatype/jackson-datatype-jsr310/2.12.7/jackson-datatype-jsr310-2.12.7.jar
50c0a7c760c13ae6c042acf182b28f0047413db95b4636fb8879bcffab5ba875  jakarta/transaction/jakarta.transaction-api/2.0.1/jakarta.transaction-api-2.0.1.jar
1008ae638d03de848f4cae7d4b7f9828f1858eb51b6dfe730a1a2b0f7a02e0db  org/eclipse/jetty/jetty-alpn-client/12.0.14/jetty-alpn-client-12.0.14.jar
305681fe7469500be5ab6cc0e3377eee5b24ba4299a7bdf38d6b283423edc1d5  org/eclipse/jetty/jetty-client/12.0.14/jetty-client-12.0.14.jar
c0135a68214b74c45de118c52a8b354a02f138622a123ae78f4b4ee631acc625  org/eclipse/jetty/jetty-http/12.0.14/jetty-http-12.0.14.jar
7e4331e06f6f03a370ad3351f61d5390653423b587e40911d9669f8dcff17509  org/eclipse/jetty/jetty-io/12.0.14/jetty-io-12.0.14.jar
92d5062919fe4a56242a1c95fe0b533ad4ccab122f8cc1632d6567120e16445f  org/eclipse/jetty/jetty-server/12.0.14/jetty-server-12.0.14.jar
ab9d69ccf51ee84a39cd9d79ceaf0cd97d7071005c384246e577e573a829f622  org/eclipse/jetty/jetty-util/12.0.14/jetty-util-12.0.14.jar
5853363acf6f389ef7f5087274fd5ef367c4aa9592487b5827d2b3dd44e65044  com/amazonaws/jmespath-java/1.12.721/jmespath-java-1.12.721.jar
385282b005818cfaccdbe8bd2429811e7e641782f2b88932a6b8ff51d668f616  joda-time/joda-time/2.12.7/joda-time-2.12.7.jar
66fbe81ec3287ad28e8441946b548f39135b564cb7d6873cc6a18b313282212d  software/amazon/awssdk/json-utils/2.25.50/json-utils-2.25.50.jar
766ad2a0783f2687962c8ad74ceecc38a28b9f72a2d085ee438b7813e928d0c7  com/google/code/findbugs/jsr305/3.0.2/jsr305-3.0.2.jar
da3d7d21eef476baf644026e449b392dbd738bf9246fca48ce072987264c3aca  com/almworks/sqlite4java/libsqlite4java-linux-amd64/1.0.392/libsqlite4java-linux-amd64-1.0.392.so
b372a037d4230aa57fbeffdef30fd6123f9c0c2db85d0aced00c91b974f33f99  com/google/guava/listenablefuture/9999.0-empty-to-avoid-conflict-with-guava/listenablefuture-9999.0-empty-to-avoid-conflict-with-guava.jar
b0d8a4c8ab4fb8b1888d0095822703b0e6d4793c419550203da9e69196161de4  org/apache/logging/log4j/log4j-api/2.17.1/log4j-api-2.17.1.jar
c967f223487980b9364e94a7c7f9a8a01fd3ee7c19bdbf0b0f9f8cb8511f3d41  org/apache/logging/log4j/log4j-core/2.17.1/log4j-core-2.17.1.jar
b0a5e52ffda7fa7c622eaa9bfb98c0e77883957853692cc4e9e97cac8dc1b6d0  software/amazon/awssdk/metrics-spi/2.25.50/metrics-spi-2.25.50.jar
d5831ee4f71055800821a34a3051cf1ed5b3702f295ffebd50f65fb5d81a71b8  org/mockito/mockito-core/1.10.19/mockito-core-1.10.19.jar
348e3ff64c7129ca661bc09d4bdda09c824474cfd1f5918368bdc56f5ee17f79  io/netty/netty-buffer/4.1.108.Final/netty-buffer-4.1.108.Final.jar
32c220dea93756fba28f9302481bc657738cc40d07440daa985a2ba21df226f1  io/netty/netty-codec/4.1.108.Final/netty-codec-4.1.108.Final.jar
2bdb276d40c2293014638a7e065bea977b574fb6a978e1197f514f2e13b695a6  io/netty/netty-codec-http/4.1.108.Final/netty-codec-http-4.1.108.Final.jar
a813e1810f7c1959b90fc7f221e03ce15e66005ee56e29cd0d68312b9679c772  io/netty/netty-codec-http2/4.1.108.Final/netty-codec-http2-4.1.108.Final.jar
8e3649fc6bab84a88ad47af82e38f9c36ab3725de478632c8a59e4bd74d16e08  io/netty/netty-common/4.1.108.Final/netty-common-4.1.108.Final.jar
55b2458011527d94abc868086afd039cd00cc3a547e7322569e0fb4f906d9d80  io/netty/netty-handler/4.1.108.Final/netty-handler-4.1.108.Final.jar
ee99a6e3713352f28596c6a7211a45d0fb8272e6bb81626dd628231ffadfddf3  software/amazon/awssdk/netty-nio-client/2.25.50/netty-nio-client-2.25.50.jar
55279fdcf6c0e1819b6561cc70b0eb2de1b1cf1ef5635fc46334d7e06faa9dd9  io/netty/netty-resolver/4.1.108.Final/netty-resolver-4.1.108.Final.jar
fef2ec66fe01aa89734db40f292676719da3985786512fc31a9efe1ca4d2e0ff  io/netty/netty-transport/4.1.108.Final/netty-transport-4.1.108.Final.jar
5959715036c1dfc1b5a41a6b8518762f43b99c9f6f45e5c80543550cb4773c88  io/netty/netty-transport-classes-epoll/4.1.108.Final/netty-transport-classes-epoll-4.1.108.Final.jar
c3f324a6f526313e432235bf1a3a12e3db283e3b8669e02f26f569c421036bcb  io/netty/netty-transport-native-unix-common/4.1.108.Final/netty-transport-native-unix-common-4.1.108.Final.jar
c74330cc6b806c804fd37e74487b4fe5d7c2750c5e15fbc6efa13bdee1bdef80  org/objenesis/objenesis/2.1/objenesis-2.1.jar
77e7be8cf51c83d77b9ffd8a0c2fb60e7909e8dbcc783a0c880d88e1baf5484b  software/amazon/awssdk/pinpoint/2.25.50/pinpoint-2.25.50.jar
28b9725c300f74379db40b188d4dcd250f78dca539d5c5793f63f974b4f2ee8a  software/amazon/awssdk/profiles/2.25.50/profiles-2.25.50.jar
3e46864cf1ce53c4f97eab3e4f5d3ff35b7918c48d5c7966735c7bf4580e6fa3  software/amazon/awssdk/protocol-core/2.25.50/protocol-core-2.25.50.jar
f75ca597789b3dac58f61857b9ac2e1034a68fa672db35055a8fb4509e325f28  org/reactivestreams/reactive-streams/1.0.4/reactive-streams-1.0.4.jar
1dff144701f0bdc0907753e45aa30724188ac11f7d4d028dee739bdd2836b12c  software/amazon/awssdk/regions/2.25.50/regions-2.25.50.jar
1a757bd736da4e996c5131f3e1911b3069c4257a70a3c5a20d5783338a0ec366  software/amazon/awssdk/sdk-core/2.25.50/sdk-core-2.25.50.jar
cdba07964d1bb40a0761485c6b1e8c2f8fd9eb1d19c53928ac0d7f9510105c57  org/slf4j/slf4j-api/1.7.30/slf4j-api-1.7.30.jar
243a64470fda0e86a6fddeb0af4c7aa9426ce84e68cbfe18d75ee5da4b7e0b92  com/almworks/sqlite4java/sqlite4java/1.0.392/sqlite4java-1.0.392.jar
8cb0f1a6973a40e6942f856f15bd38ce91d33a2de17b9044edb943b54bc12e74  software/amazon/awssdk/third-party-jackson-core/2.25.50/third-party-jackson-core-2.25.50.jar
05a5a1601e387da92428ca7b12a8f8fb5f83883641bc124e23687a1d4da14560  software/amazon/awssdk/url-connection-client/2.25.50/url-connection-client-2.25.50.jar
cded735cdabbf7b75727a33ef4a6eee26121182a15b732c07bd241bb8c02e3d1  software/amazon/awssdk/utils/2.25.50/utils-2.25.50.jar
EOF
}

export UV_PYTHON_DOWNLOADS=never             # use the local interpreter; never fetch one

log() { printf '[stack] %s\n' "$*" >&2; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }

# ===================================================================== helpers ====

uv_cmd() {
    if command -v uv >/dev/null 2>&1; then
        uv "$@"
    elif python3 -m uv --version >/dev/null 2>&1; then
        python3 -m uv "$@"
    else
        log "uv not found; installing it with pip"
        python3 -m pip install -q uv >&2
        python3 -m uv "$@"
    fi
}

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

# ======================================================== install: DynamoDB Local ====

ensure_java() {
    if command -v java >/dev/null 2>&1 && command -v javac >/dev/null 2>&1; then
        return
    fi
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        log "installing Java 17 with apt-get"
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless >&2
    else
        die "DynamoDB Local needs java (>= 17) and javac on PATH"
    fi
}

fetch_ddb_artifacts() {
    # fetch_ddb_artifacts DIR: every pinned file into DIR (flat), each checked; dies otherwise
    local dir=$1 sum path config="$1/.curl-config"
    : >"$config"
    while read -r sum path; do
        if [[ -f "$MAVEN_CACHE/$path" ]] && [[ "$(sha256_of "$MAVEN_CACHE/$path")" == "$sum" ]]; then
            cp "$MAVEN_CACHE/$path" "$dir/"
        else
            printf 'url = "%s/%s"\noutput = "%s/%s"\n' "$MAVEN_CENTRAL" "$path" "$dir" "${path##*/}" >>"$config"
        fi
    done < <(ddb_artifacts)
    if [[ -s "$config" ]]; then
        log "downloading $(grep -c '^url' "$config") files from $MAVEN_CENTRAL"
        curl --fail --silent --show-error --no-progress-meter --location --retry 3 \
            --proto '=https' --tlsv1.2 --parallel --parallel-max 8 --config "$config" >&2 \
            || die "downloading DynamoDB Local's files from $MAVEN_CENTRAL failed"
    fi
    rm -f "$config"
    # The check that matters: whatever the source (cache, mirror, network), every byte that
    # will run is the byte pinned above.
    if ! (cd "$dir" && ddb_artifacts | sed 's|  .*/|  |' | sha256sum --check --strict --quiet >&2); then
        die "DynamoDB Local's files do not match the sha256 pinned in scripts/stack.sh: refused"
    fi
}

write_ddb_launcher_source() {
    # DynamoDB Local's ServerRunner has no bind-address option (Jetty listens on all
    # interfaces). This launcher builds the server exactly as ServerRunner does, sets the
    # Jetty connector host, then starts it. Telemetry is never configured (and
    # -disableTelemetry is passed as well).
    mkdir -p "$DDB_DIR/launcher-src"
    cat >"$DDB_DIR/launcher-src/LoopbackDynamoDBLocal.java" <<'JAVA'
// Generated by scripts/stack.sh -- runs DynamoDB Local bound to one address.
import java.lang.reflect.Field;
import org.eclipse.jetty.server.Connector;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import com.amazonaws.services.dynamodbv2.local.main.ServerRunner;
import com.amazonaws.services.dynamodbv2.local.server.DynamoDBProxyServer;

public final class LoopbackDynamoDBLocal {
    public static void main(String[] args) throws Exception {
        String host = System.getProperty("dynamodb.local.host", "127.0.0.1");
        DynamoDBProxyServer proxy = ServerRunner.createServerFromCommandLineArgs(args);
        Field field = DynamoDBProxyServer.class.getDeclaredField("server");
        field.setAccessible(true);
        Server jetty = (Server) field.get(proxy);
        for (Connector c : jetty.getConnectors()) {
            if (c instanceof ServerConnector) {
                ((ServerConnector) c).setHost(host);
            }
        }
        proxy.start();
        System.out.println("DynamoDB Local listening on " + host);
        proxy.join();
    }
}
JAVA
}

ddb_stamp_value() { echo "ddb=$DDB_VERSION files=$(ddb_artifacts | sha256_of)"; }

ddb_installed() {
    [[ -f "$DDB_DIR/.cmr-installed" && "$(cat "$DDB_DIR/.cmr-installed")" == "$(ddb_stamp_value)" ]] \
        && [[ -f "$DDB_DIR/lib/DynamoDBLocal-$DDB_VERSION.jar" ]] \
        && [[ -f "$DDB_DIR/native/libsqlite4java-linux-amd64.so" ]] \
        && [[ -f "$DDB_DIR/launcher/LoopbackDynamoDBLocal.class" ]]
}

install_ddb() {
    if ddb_installed; then
        log "DynamoDB Local $DDB_VERSION: already installed in ${DDB_DIR#"$ROOT"/}"
        return
    fi
    ensure_java
    log "fetching DynamoDB Local $DDB_VERSION and its dependencies (sha256 pinned) from Maven Central"
    rm -rf "$DDB_DIR"
    mkdir -p "$DDB_DIR/lib" "$DDB_DIR/native" "$DDB_DIR/launcher"
    fetch_ddb_artifacts "$DDB_DIR/lib"
    # sqlite4java's native library is a Maven artifact of type 'so' with the version in its
    # name; sqlite4java looks for libsqlite4java-linux-amd64.so on java.library.path.
    local so="" f
    for f in "$DDB_DIR"/lib/libsqlite4java-linux-amd64-*.so; do
        [[ -f "$f" ]] && { so="$f"; break; }
    done
    [[ -n "$so" ]] || die "libsqlite4java-linux-amd64 .so not among the copied dependencies"
    cp "$so" "$DDB_DIR/native/libsqlite4java-linux-amd64.so"
    write_ddb_launcher_source
    javac -nowarn -cp "$DDB_DIR/lib/*" -d "$DDB_DIR/launcher" \
        "$DDB_DIR/launcher-src/LoopbackDynamoDBLocal.java" >&2
    ddb_stamp_value >"$DDB_DIR/.cmr-installed"
}

do_install() {
    mkdir -p "$STACK_DIR"
    install_localstack
    install_ddb
}

# ================================================================ health probes ====

probe_py() {
    # A tiny HTTP probe without a curl dependency; prefers the LocalStack venv's Python.
    local py=python3
    [[ -x "$LS_VENV/bin/python" ]] && py="$LS_VENV/bin/python"
    "$py" - "$@" <<'PY'
import json, sys, urllib.request
kind, url = sys.argv[1], sys.argv[2]
try:
    if kind == "localstack":
        with urllib.request.urlopen(url, timeout=3) as r:
            services = json.load(r).get("services", {})
        ok = all(services.get(s) in ("available", "running") for s in ("s3", "sqs"))
        sys.exit(0 if ok else 1)
    else:  # dynamodb: ListTables (DynamoDB Local does not check the signature)
        req = urllib.request.Request(url, data=b"{}", method="POST", headers={
            "Content-Type": "application/x-amz-json-1.0",
            "X-Amz-Target": "DynamoDB_20120810.ListTables",
            "Authorization": "AWS4-HMAC-SHA256 Credential=test/20200101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0",
        })
        with urllib.request.urlopen(req, timeout=3) as r:
            sys.exit(0 if "TableNames" in json.load(r) else 1)
except Exception:
    sys.exit(1)
PY
}

ls_healthy()  { probe_py localstack "http://$BIND_HOST:$LS_PORT/_localstack/health"; }
ddb_healthy() { probe_py dynamodb "http://$BIND_HOST:$DDB_PORT/"; }

port_in_use() {
    # true if something accepts TCP connections on 127.0.0.1:$1
    (exec 3<>"/dev/tcp/$BIND_HOST/$1") 2>/dev/null
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
ddb_pid() { our_pid dynamodb LoopbackDynamoDBLocal; }

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
        PERSISTENCE=0 \
        "$LS_VENV/bin/python" "$LS_LAUNCHER"
}

start_ddb() {
    if ddb_healthy; then
        local pid
        if pid="$(ddb_pid)"; then
            log "DynamoDB Local already running (pid $pid) and healthy"
        else
            log "DynamoDB Local already answering on $BIND_HOST:$DDB_PORT (not started by this checkout); reusing it"
        fi
        return
    fi
    if ddb_pid >/dev/null; then
        log "DynamoDB Local process $(ddb_pid) exists but is not healthy yet; waiting for it"
        return
    fi
    port_in_use "$DDB_PORT" && die "port $DDB_PORT is in use by another process that is not DynamoDB Local"
    log "starting DynamoDB Local $DDB_VERSION on $BIND_HOST:$DDB_PORT (in memory, shared db)"
    spawn dynamodb "$LOG_DIR/dynamodb.log" \
        java -Xms64m -Xmx1g \
        -Djava.library.path="$DDB_DIR/native" \
        -Ddynamodb.local.host="$BIND_HOST" \
        -cp "$DDB_DIR/launcher:$DDB_DIR/lib/*" \
        LoopbackDynamoDBLocal -inMemory -sharedDb -port "$DDB_PORT" -disableTelemetry
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
    local deadline=$((SECONDS + START_TIMEOUT)) ls_ok=0 ddb_ok=0
    while :; do
        ((ls_ok)) || { ls_healthy && ls_ok=1 && log "LocalStack healthy (s3, sqs) after ${SECONDS}s"; } || true
        ((ddb_ok)) || { ddb_healthy && ddb_ok=1 && log "DynamoDB Local answers ListTables after ${SECONDS}s"; } || true
        ((ls_ok && ddb_ok)) && return 0
        # fail fast if a server we started has died
        if ((!ls_ok)) && ! ls_pid >/dev/null && ! ls_healthy; then
            fail_with_log "LocalStack exited during startup" "$LOG_DIR/localstack.log"
        fi
        if ((!ddb_ok)) && ! ddb_pid >/dev/null && ! ddb_healthy; then
            fail_with_log "DynamoDB Local exited during startup" "$LOG_DIR/dynamodb.log"
        fi
        if ((SECONDS >= deadline)); then
            ((ls_ok)) || fail_with_log "LocalStack not healthy after ${START_TIMEOUT}s ($BIND_HOST:$LS_PORT/_localstack/health)" "$LOG_DIR/localstack.log"
            fail_with_log "DynamoDB Local not answering after ${START_TIMEOUT}s ($BIND_HOST:$DDB_PORT)" "$LOG_DIR/dynamodb.log"
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
    if ls_healthy && ddb_healthy; then
        log "stack already running and healthy"
        return
    fi
    # refuse before starting anything if a port is taken by something else
    if ! ls_healthy && ! ls_pid >/dev/null && port_in_use "$LS_PORT"; then
        die "port $LS_PORT is in use by another process that is not a healthy LocalStack"
    fi
    if ! ddb_healthy && ! ddb_pid >/dev/null && port_in_use "$DDB_PORT"; then
        die "port $DDB_PORT is in use by another process that is not DynamoDB Local"
    fi
    do_install
    SECONDS=0
    start_localstack
    start_ddb
    wait_healthy
    log "stack ready: LocalStack http://$BIND_HOST:$LS_PORT  DynamoDB http://$BIND_HOST:$DDB_PORT"
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
    ((any)) || log "nothing to stop (no live processes from ${RUN_DIR#"$ROOT"/})"
    return 0
}

status_line() {
    # status_line NAME URL PID_FUNC HEALTH_FUNC LOG
    local name=$1 url=$2 pid who
    if pid="$($3)"; then who="pid $pid, log ${5#"$ROOT"/}"; else who="no process from this checkout"; fi
    if $4; then
        printf '%-11s %-23s healthy  (%s)\n' "$name" "$url" "$who"
    else
        printf '%-11s %-23s DOWN     (%s)\n' "$name" "$url" "$who"
        return 3
    fi
}

do_status() {
    local rc=0
    status_line localstack "http://$BIND_HOST:$LS_PORT" ls_pid ls_healthy "$LOG_DIR/localstack.log" || rc=3
    status_line dynamodb "http://$BIND_HOST:$DDB_PORT" ddb_pid ddb_healthy "$LOG_DIR/dynamodb.log" || rc=3
    return $rc
}

do_env() {
    cat <<EOF
export AWS_ENDPOINT_URL=http://$BIND_HOST:$LS_PORT
export AWS_ENDPOINT_URL_DYNAMODB=http://$BIND_HOST:$DDB_PORT
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
export AWS_DEFAULT_REGION=us-east-1
EOF
}

do_logs() {
    local f
    for f in "$LOG_DIR/localstack.log" "$LOG_DIR/dynamodb.log"; do
        echo "==> $f <=="
        tail -n "${1:-30}" "$f" 2>/dev/null || echo "(none)"
    done
}

usage() { sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

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
    lock)    with_lock; lock_localstack ;;
    -h|--help|help) usage ;;
    *) usage >&2; exit 2 ;;
esac
