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


# Licences of what the Azure part of the stack installs (issue 29): Azurite and every npm
# package of its lock, and the Azure SDKs with what they brought into the development lock.
# OSI-approved licences (SPDX identifiers, as the packages declare them):
OSI_APPROVED = {"MIT", "ISC", "Apache-2.0", "BSD-2-Clause", "BSD-3-Clause", "0BSD"}
# Open licences that are not on OSI's list (as far as the SPDX data seen here said), each
# package named with why it is accepted: the day another package brings one in, this fails.
NOT_OSI_LISTED = {
    # Permissive, copyright and patent grant; reviewed on OSI's license-review list (December
    # 2023) as conforming to the Open Source Definition. graceful-fs (under fs-extra) and sax
    # (under xml2js) moved to it from ISC.
    ("graceful-fs", "BlueOak-1.0.0"): "Blue Oak Model License 1.0.0: permissive",
    ("sax", "BlueOak-1.0.0"): "Blue Oak Model License 1.0.0: permissive",
    # Azurite's own dependency: its package.json names tv4's licence page as its licence and its
    # README says "released as public-domain ... Anybody can modify or re-license it for any
    # purpose, without restriction": a public-domain dedication, not a licence OSI lists.
    ("uri-templates", "http://geraintluff.github.io/tv4/LICENSE.txt"): "public domain",
}
AZURE_PYPI = {  # what `cmr[azure]` adds to the development lock, and each one's licence
    "azure-core": "MIT",
    "azure-storage-blob": "MIT",
    "azure-storage-queue": "MIT",
    "azure-data-tables": "MIT",
    "isodate": "BSD",  # BSD-3-Clause (its classifier says "BSD License")
}


def test_the_azurite_lock_is_azurite_3_35_0_hashed_with_open_licences_only() -> None:
    import json

    lock = json.loads((REPO / "scripts" / "azurite" / "package-lock.json").read_text())
    packages = {path: meta for path, meta in lock["packages"].items() if path}
    assert packages["node_modules/azurite"]["version"] == "3.35.0"
    assert packages["node_modules/azurite"]["license"] == "MIT"
    refused = []
    for path, meta in packages.items():
        name = path.rsplit("node_modules/", 1)[1]
        # npm ci checks each tarball against its sha512; no package runs an install script
        # (the stack installs with --ignore-scripts); no registry host is named in the lock.
        assert meta["integrity"].startswith("sha512-"), path
        assert not meta.get("hasInstallScript"), path
        assert "resolved" not in meta, path
        licence = meta.get("license")
        if licence not in OSI_APPROVED and (name, licence) not in NOT_OSI_LISTED:
            refused.append(f"{name}@{meta['version']}: {licence}")
    assert refused == []
    assert len(packages) > 300  # the whole tree was read


def test_the_azure_sdks_and_what_they_brought_are_open_source() -> None:
    from importlib.metadata import metadata

    lock = (REPO / "requirements-dev.txt").read_text()
    for name, licence in AZURE_PYPI.items():
        meta = metadata(name)
        assert re.search(rf"^{name}=={re.escape(meta['Version'])} \\$", lock, re.MULTILINE), name
        declared = " ".join(
            [
                *(meta.get_all("License-Expression") or []),
                *(text[:100] for text in meta.get_all("License") or []),
                *(c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")),
            ]
        )
        assert licence in declared, (name, declared)
