"""The project installs open-source parts only: Amazon's DynamoDB Local (vendor-licensed) is
used nowhere, not in setup, the stack, the tests, the benchmarks, the README or a lock.

The grep runs over every file git tracks. DynamoDB Local's artifacts (its jar, its Maven
coordinates, its Docker image, the sqlite4java library it runs on, the launcher class the
stack once compiled) may appear nowhere; the words "DynamoDB Local" only where the project
says why it is not used or reports figures measured on it before it was replaced.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

ARTIFACTS = re.compile(
    r"DynamoDBLocal|dynamodb-local|dynamodb_local|com\.amazonaws:DynamoDB|sqlite4java",
    re.IGNORECASE,
)
# Where the name may stand in prose: the reasons it is not used, and history.
NAMED_ONLY_IN = {
    "docs/aws.md",  # why moto
    "docs/performance.md",  # figures measured on it
    "scripts/README-stack.md",  # why moto
    "scripts/stack.sh",  # why moto
    "benchmarks/RESULTS.md",  # figures measured on it, beside the emulator's today
    "benchmarks/LOADGEN.md",  # the same
    "tests/test_open_stack.py",  # this test
}


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    files = []
    for name in filter(None, listed):
        path = REPO / name.decode()
        if path.is_file() and b"\0" not in path.read_bytes()[:8192]:
            files.append(path)
    return files


def test_no_file_installs_or_runs_dynamodb_local() -> None:
    files = tracked_text_files()
    assert len(files) > 100  # the grep saw the repository, not an empty listing
    hits = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in files
        if path.name != "test_open_stack.py"
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if ARTIFACTS.search(line)
    ]
    assert hits == []


def test_dynamodb_local_is_named_only_as_history_or_the_reason_it_is_not_used() -> None:
    named = {
        str(path.relative_to(REPO))
        for path in tracked_text_files()
        if "dynamodb local" in path.read_text(errors="replace").lower()
    }
    assert named <= NAMED_ONLY_IN, sorted(named - NAMED_ONLY_IN)


def test_the_local_dynamodb_and_simpledb_are_moto(aws_stack: dict[str, str]) -> None:
    """What answers the stack's DynamoDB and SimpleDB endpoints is moto's server (Werkzeug
    under it; DynamoDB Local answered from Jetty), and it serves both."""
    import boto3

    session = boto3.Session(region_name=aws_stack["AWS_DEFAULT_REGION"])
    dynamodb = session.client("dynamodb", endpoint_url=aws_stack["AWS_ENDPOINT_URL_DYNAMODB"])
    sdb = session.client("sdb", endpoint_url=aws_stack["AWS_ENDPOINT_URL_SIMPLEDB"])
    for answer in (dynamodb.list_tables(), sdb.list_domains()):
        assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200
        assert "Werkzeug" in answer["ResponseMetadata"]["HTTPHeaders"]["server"]
    lock = (REPO / "scripts" / "moto-requirements.txt").read_text()
    assert re.search(r"^moto==5\.2\.5 \\$", lock, re.MULTILINE)
