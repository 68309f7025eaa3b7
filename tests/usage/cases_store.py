"""The store is down: nothing listens at the endpoints, or their host does not resolve. Said
at once from a socket, naming the endpoint and what to do, before botocore loads (a slow
store, which is waited for, is tests/backends/test_aws_reachability.py's)."""

from __future__ import annotations

from tests.usage.cases import RUN, Case, words

# The local stack's settings, with nothing listening where they point.
STOPPED = {
    "AWS_ENDPOINT_URL": "{closed}",
    "AWS_ENDPOINT_URL_DYNAMODB": "{closed}",
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
}

CASES: list[Case] = [
    Case(
        "aws-stack-stopped",
        "--store aws while the local stack is stopped",
        (*RUN, "--store", "aws"),
        names=("{closed}", "nothing is listening", "scripts/stack.sh start"),
        setup=words,
        env=STOPPED,
        seconds=8.0,
    ),
    Case(
        "aws-status-stack-stopped",
        "`cmr status` while the local stack is stopped",
        ("status", "--store", "aws"),
        names=("{closed}", "nothing is listening", "scripts/stack.sh start"),
        env=STOPPED,
        seconds=8.0,
    ),
    Case(
        "aws-endpoint-unresolved",
        "AWS_ENDPOINT_URL names a host that does not resolve",
        (*RUN, "--store", "aws"),
        names=("cmr-no-such-host.invalid", "does not resolve", "AWS_ENDPOINT_URL"),
        setup=words,
        env={
            **{k: v for k, v in STOPPED.items() if not k.startswith("AWS_ENDPOINT_URL")},
            "AWS_ENDPOINT_URL": "http://cmr-no-such-host.invalid:4566",
        },
        seconds=10.0,
    ),
]
