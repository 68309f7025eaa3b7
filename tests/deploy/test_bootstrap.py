"""The launch template's user data is a real script: render it as CloudFormation would, run
it here in a scratch root (systemctl, the AWS CLI, pip and the disk tools replaced through its
CMR_* variables) against the local stack (LocalStack, moto), and check that the worker it starts
serves a job; that a wheel or a lock that is not the one its key names is never installed; and
that the spool goes on the instance store when there is one, or nothing starts; and that each
reducer's memory is sized from the instance's own (a stand-in /proc/meminfo, CMR_MEMINFO)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from cmr.api import run_async
from cmr.fleet import build_wheel, wheel_key
from cmr.fleet.lock import compile_lock, lock_key
from cmr.settings import AwsSettings
from tests.deploy.conftest import ROOT, load_template, render_user_data
from tests.deploy.owner_front import LOCAL_ACCOUNT, owner_front
from tests.engine.reference import counts_from_parts, word_count
from tests.stack import LOCALSTACK_URL, remove_test_resources

# Stands in for systemd: `enable --now` runs the unit's ExecStart detached like a service and
# records its exit status where systemd would keep it. (It runs it as the test's user: the
# unit's User= and sandbox are checked as text here, and by systemd-analyze in
# test_template.py.)
FAKE_SYSTEMCTL = r"""#!/bin/bash
set -e
echo "$@" >>"$CMR_ROOT/systemctl.calls"
[ "$1" = enable ] || exit 0
unit="$CMR_ROOT/etc/systemd/system/$3"
start=$(sed -n 's/^ExecStart=//p' "$unit")
setsid bash -c '"$1"; echo $? >"$2"' _ "$start" "$CMR_ROOT/worker.exit" \
  >"$CMR_ROOT/worker.log" 2>&1 </dev/null &
echo $! >"$CMR_ROOT/worker.pid"
"""

# Stands in for Amazon Linux 2023's AWS CLI, the one command the user data runs with it.
FAKE_AWS = """#!{python}
import argparse, sys
import boto3
from botocore.config import Config

p = argparse.ArgumentParser()
p.add_argument("service", choices=["s3api"])
p.add_argument("op", choices=["get-object"])
p.add_argument("--bucket", required=True)
p.add_argument("--key", required=True)
p.add_argument("--expected-bucket-owner", required=True)
p.add_argument("outfile")
a = p.parse_args()
s3 = boto3.client("s3", config=Config(s3={{"addressing_style": "path"}}))
try:
    got = s3.get_object(Bucket=a.bucket, Key=a.key, ExpectedBucketOwner=a.expected_bucket_owner)
except Exception as exc:
    sys.exit(f"aws: {{exc}}")
with open(a.outfile, "wb") as f:
    f.write(got["Body"].read())
"""

# lsblk's answer to the user data's `lsblk -d -n -b -P -o NAME,TYPE,SIZE,MODEL`, as AL2023's
# util-linux prints it: key="value" pairs, NVMe models padded with spaces. The root EBS volume
# and an EBS data volume, which the spool must never take, and instance-store disks.
LSBLK_ARGS = "-d -n -b -P -o NAME,TYPE,SIZE,MODEL"
EBS_MODEL = "Amazon Elastic Block Store              "
STORE_MODEL = "Amazon EC2 NVMe Instance Storage        "


def disk(name: str, size: int, model: str) -> str:
    return f'NAME="{name}" TYPE="disk" SIZE="{size}" MODEL="{model}"'


EBS_ROOT = disk("nvme0n1", 20 * 2**30, EBS_MODEL)
EBS_DATA = disk("nvme3n1", 100 * 2**30, EBS_MODEL)


def fake_lsblk(*disks: str) -> str:
    """Stands in for lsblk: records its arguments and lists these disks."""
    listing = "\n".join(disks)
    return f"""#!/bin/bash
echo "lsblk $*" >>"$CMR_ROOT/boot.calls"
cat <<'EOF'
{listing}
EOF
"""


# Stands in for mdadm, mkfs.xfs and any other command the test only needs to see called: it
# records its name and arguments, in order, in one file the other fakes write too. The real
# disk tools never run here.
RECORD = """#!/bin/bash
echo "$(basename "$0") $*" >>"$CMR_ROOT/boot.calls"
"""
# Stands in for mount: checks the mount point is a directory as mount does, then shows what a
# mounted filesystem would (the new XFS's root, mode 0755, not the directory under it).
FAKE_MOUNT = (
    RECORD
    + """for target; do :; done
[ -d "$target" ] || { echo "mount: $target: mount point does not exist." >&2; exit 32; }
chmod 0755 "$target"
"""
)
# A mount that fails as a bad filesystem would.
FAILING_MOUNT = (
    RECORD
    + """echo "mount: $4: wrong fs type, bad option, bad superblock on $3." >&2
exit 32
"""
)

IDLE_EXIT_S = 8
TEXT = [
    "the quick brown fox jumps over the lazy dog\n" * 40,
    "ünï κόσμε the dog\n\n  spaces   and\ttabs the\n" * 25,
    "a b c d e f g a b c a\n" * 60,
]
WORKER_USER = pwd.getpwuid(os.getuid()).pw_name  # the unit's User=, here: no useradd
PACKAGE = "fleetjobs"  # the job package the instance may run from (JobsFrom)
# One worker runs them all when the suite runs in parallel (--dist loadgroup): the wheel and
# its lock (`built`) are made once, not once per worker. Those that boot against the local
# stack are the full suite's (slow); the disk tests, a second each without it, everyday's.
pytestmark = pytest.mark.xdist_group("bootstrap")


@dataclass(frozen=True)
class Built:
    wheel: Path
    lock: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    """The project's wheel and its lock, as `cmr fleet up` makes them (from uv's cache)."""
    out = tmp_path_factory.mktemp("dist")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("UV_OFFLINE", "1")
        wheel = build_wheel(ROOT, out)
        yield Built(wheel, compile_lock(wheel, out))


def stop_worker(root: Path) -> None:
    pidfile = root / "worker.pid"
    if pidfile.exists():
        pid = int(pidfile.read_text())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)  # the session fake systemctl started


def make_table(table: str) -> None:
    boto3.client("dynamodb").create_table(
        TableName=table,
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )


# The user data's CMR_* variable for each command a test replaces.
STAND_INS = {
    "systemctl": "CMR_SYSTEMCTL",
    "aws": "CMR_AWS",
    "lsblk": "CMR_LSBLK",
    "mdadm": "CMR_MDADM",
    "mkfs.xfs": "CMR_MKFS",
    "mount": "CMR_MOUNT",
}


def boot(
    tmp_path: Path,
    bucket: str,
    table: str,
    prefix: str,
    wheel: str,
    lock: str,
    jobs_from: str = "cmr.loadgen.job",
    env: dict[str, str] | None = None,
    fakes: dict[str, str] | None = None,
    processes: str = "1",
    memory_mb: str = "auto",
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the user data, rendered for these names and keys, in a fresh scratch root, with
    these stand-ins (by default: the local stack's S3, a fake systemd, and an instance with no
    instance store, whose disk tools must never be called)."""
    root = tmp_path / "instance"
    root.mkdir()
    script = render_user_data(
        load_template(),
        {
            "BucketName": bucket,
            "WheelKey": wheel,
            "LockKey": lock,
            "TableName": table,
            "QueuePrefix": prefix,
            "Processes": processes,
            "MemoryMb": memory_mb,
            "IdleExitSeconds": str(IDLE_EXIT_S),
            "JobsFrom": jobs_from,
            "OutputsUnder": f"s3://{bucket}/out/",
            "InputsUnder": "",  # the default: inputs anywhere in the bucket
            "AWS::AccountId": LOCAL_ACCOUNT,
            "AWS::Region": "us-east-1",
            "AWS::StackName": f"boot-{bucket}",
        },
    )
    (root / "user-data.sh").write_text(script)
    stand_ins = {
        "systemctl": FAKE_SYSTEMCTL,
        "aws": FAKE_AWS.format(python=sys.executable),
        "lsblk": fake_lsblk(EBS_ROOT),
        "mdadm": RECORD,
        "mkfs.xfs": RECORD,
        "mount": RECORD,
        **(fakes or {}),
    }
    for name, text in stand_ins.items():
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    venv = root / "opt" / "cmr" / "venv"
    env = {
        **os.environ,
        "CMR_ROOT": str(root),
        "CMR_PYTHON": sys.executable,
        "CMR_VENV_OPTS": "--without-pip",
        # The uv cache stands in for PyPI: same packages, no network.
        "CMR_PIP": f"uv pip install --offline --quiet --python {venv}/bin/python",
        **{variable: str(tmp_path / name) for name, variable in STAND_INS.items()},
        "CMR_WORKER_USER": WORKER_USER,
        "CMR_BOOT_LOG": str(root / "bootstrap.log"),
        **(env or {}),
    }
    done = subprocess.run(
        ["bash", str(root / "user-data.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return done, root


def job_package(tmp_path: Path) -> Path:
    """A job package as the instance would have it from the wheel (here: on PYTHONPATH)."""
    jobs = tmp_path / "jobs"
    (jobs / PACKAGE).mkdir(parents=True)
    (jobs / PACKAGE / "__init__.py").write_text("")
    shutil.copyfile(ROOT / "examples" / "wordcount.py", jobs / PACKAGE / "wordcount.py")
    return jobs


def names() -> tuple[str, str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"cmr-boot-{tag}", f"cmr-boot-{tag}", f"cmrboot{tag}-"


@pytest.mark.slow
def test_user_data_installs_wheel_and_worker_serves_a_job(
    aws_stack: dict[str, str],
    built: Built,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bucket, table, prefix = names()
    s3 = boto3.client("s3")
    # What the stack provides before any instance boots: bucket, table, lock and wheel.
    s3.create_bucket(Bucket=bucket)
    make_table(table)
    key, locked = wheel_key(built.wheel), lock_key(built.lock)
    s3.upload_file(str(built.lock), bucket, locked)
    s3.upload_file(str(built.wheel), bucket, key)
    root = tmp_path / "instance"
    # Job code on an instance is a module the wheel installed; here a package on the
    # PYTHONPATH of the worker (and of this test, which submits it by module name).
    jobs = job_package(tmp_path)
    monkeypatch.syspath_prepend(str(jobs))
    try:
        # Every S3 request from here on (bootstrap, worker, and this test's client) passes an
        # S3 front that, like S3, refuses any ExpectedBucketOwner but the bucket's owner.
        with owner_front(LOCALSTACK_URL) as front:
            monkeypatch.setenv("AWS_ENDPOINT_URL_S3", front.url)
            started = time.monotonic()
            done, root = boot(tmp_path, bucket, table, prefix, key, locked,
                              jobs_from=PACKAGE, env={"PYTHONPATH": str(jobs)})  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
            boot_s = time.monotonic() - started
            log = (root / "bootstrap.log").read_text()
            assert f"{locked} verified" in log and f"{key} verified" in log
            # No instance store: the spool stays on the root volume, no disk touched.
            assert "cmr bootstrap: spool on the root volume (no instance store)" in log
            assert (root / "boot.calls").read_text() == f"lsblk {LSBLK_ARGS}\n"
            # The wheel came from the bucket and is what the venv's cmr runs.
            assert (root / "opt" / "cmr" / built.wheel.name).read_bytes() == (
                built.wheel.read_bytes()
            )
            assert (root / "opt" / "cmr" / "venv" / "bin" / "cmr").exists()
            # The lock carries the loadgen extra: the default JobsFrom, the load generator's
            # job, imports on the instance (its histograms are not in a plain install).
            imported = subprocess.run(
                [root / "opt" / "cmr" / "venv" / "bin" / "python", "-c", "import cmr.loadgen.job"],
                cwd=tmp_path,
                env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                capture_output=True,
                text=True,
                check=False,
            )
            assert imported.returncode == 0, imported.stderr
            unit = (root / "etc" / "systemd" / "system" / "cmr-worker.service").read_text()
            assert "StandardOutput=journal+console" in unit and "Restart=on-failure" in unit
            assert f"User={WORKER_USER}\n" in unit and "NoNewPrivileges=yes" in unit
            assert f"ReadWritePaths={root}/var/lib/cmr\n" in unit
            run = (root / "opt" / "cmr" / "run-worker.sh").read_text()
            store = f"aws://{bucket}/{table}?prefix={prefix}&owner={LOCAL_ACCOUNT}"
            assert f'--store "{store}"' in run and f'--idle-exit "{IDLE_EXIT_S}"' in run
            assert f"--jobs-from '{PACKAGE}' --outputs-under 's3://{bucket}/out/'" in run
            env_file = root / "etc" / "cmr" / "worker.env"
            assert "AWS_ENDPOINT_URL_DYNAMODB=" in env_file.read_text()
            st = env_file.stat()
            assert stat.S_IMODE(st.st_mode) == 0o600
            assert st.st_uid == pwd.getpwnam(WORKER_USER).pw_uid
            spool = (root / "var" / "lib" / "cmr").stat()
            assert stat.S_IMODE(spool.st_mode) == 0o700

            data = tmp_path / "input"
            data.mkdir()
            for i, text in enumerate(TEXT):
                (data / f"f{i}.txt").write_text(text)
            out = tmp_path / "out"
            aws = AwsSettings(bucket=bucket, table=table, queue_prefix=prefix, owner=LOCAL_ACCOUNT)
            # Two jobs the worker must not serve, submitted first: a job file by path (which
            # the worker could read: its cwd here is this checkout) and output outside
            # OutputsUnder. The worker sees them with the one it serves, and says why not.
            outside = [
                asyncio.run(
                    run_async(job, str(data), dest, backend="aws", aws=aws, workers=0, detach=True)
                ).job_id
                for job, dest in (
                    ("examples/wordcount.py", f"s3://{bucket}/out/by-path/"),
                    (f"{PACKAGE}.wordcount", f"s3://{bucket}/elsewhere/"),
                )
            ]
            result = asyncio.run(
                asyncio.wait_for(
                    run_async(
                        f"{PACKAGE}.wordcount",
                        str(data),
                        f"s3://{bucket}/out/wc/",
                        backend="aws",
                        aws=aws,
                        workers=0,
                    ),
                    timeout=180,
                )
            )
            assert result.record["state"] == "succeeded"
            parts = s3.list_objects_v2(Bucket=bucket, Prefix="out/wc/")["Contents"]
            out.mkdir()
            for part in parts:
                s3.download_file(bucket, part["Key"], str(out / part["Key"].split("/")[-1]))
            assert counts_from_parts(out, 4) == word_count(data)
            log = (root / "worker.log").read_text()
            by_path, elsewhere = (
                [line for line in log.splitlines() if job_id in line] for job_id in outside
            )
            assert any("not serving a job" in ln and "see --jobs-from" in ln for ln in by_path), log
            assert any("not serving a job" in ln and "--outputs-under" in ln for ln in elsewhere), (
                log
            )

            # Idle, the worker exits cleanly (status 0: systemd's Restart=on-failure leaves it
            # down, the instance goes quiet and the fleet's idle alarm scales the group in).
            exit_file = root / "worker.exit"
            deadline = time.monotonic() + IDLE_EXIT_S + 60
            while not exit_file.exists() and time.monotonic() < deadline:
                time.sleep(0.5)
            log = (root / "worker.log").read_text()
            assert exit_file.exists(), log[-3000:]
            assert exit_file.read_text().strip() == "0", log[-3000:]
        # The bootstrap's downloads, the worker's and the client's calls: each S3 request named
        # the bucket's owner (the front saw them on the wire; LocalStack ignores the header).
        assert len(front.seen) > 20
        assert [s for s in front.seen if s.owner != LOCAL_ACCOUNT] == []
        print(f"bootstrap {boot_s:.1f}s, job {result.seconds:.1f}s")
    finally:
        stop_worker(root)
        remove_test_resources(bucket, table, prefix)


def refused(done: subprocess.CompletedProcess[str], root: Path, why: str) -> None:
    """The bootstrap failed before it installed or started anything, and said why."""
    log = (root / "bootstrap.log").read_text()
    assert done.returncode != 0, log
    assert why in log, log
    assert not (root / "systemctl.calls").exists()
    assert not (root / "worker.pid").exists()
    assert not (root / "etc" / "systemd" / "system" / "cmr-worker.service").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("aws_stack")
def test_a_tampered_wheel_is_never_installed(built: Built, tmp_path: Path) -> None:
    """Bytes in the wheel's place that are not the wheel its key names (by sha256)."""
    bucket, table, prefix = names()
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    key, locked = wheel_key(built.wheel), lock_key(built.lock)
    tampered = tmp_path / built.wheel.name
    tampered.write_bytes(built.wheel.read_bytes() + b"\0")  # a wheel still, one byte more
    s3.upload_file(str(built.lock), bucket, locked)
    s3.upload_file(str(tampered), bucket, key)
    try:
        done, root = boot(tmp_path, bucket, table, prefix, key, locked)
        refused(done, root, f"REFUSED: s3://{bucket}/{key} has sha256")
        assert "(tampered or corrupt); the worker is not started" in done.stdout
        assert not (root / "opt" / "cmr" / "venv").exists()
    finally:
        remove_test_resources(bucket, table, prefix)


@pytest.mark.slow
@pytest.mark.usefixtures("aws_stack")
def test_a_tampered_lock_is_never_used(built: Built, tmp_path: Path) -> None:
    """A lock edited after upload (here: one package's hashes swapped for another's) no
    longer matches the sha256 its key names."""
    bucket, table, prefix = names()
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    key, locked = wheel_key(built.wheel), lock_key(built.lock)
    tampered = tmp_path / "requirements.txt"
    tampered.write_text(built.lock.read_text().replace("msgpack==", "msgpack>="))
    s3.upload_file(str(tampered), bucket, locked)
    s3.upload_file(str(built.wheel), bucket, key)
    try:
        done, root = boot(tmp_path, bucket, table, prefix, key, locked)
        refused(done, root, f"REFUSED: s3://{bucket}/{locked} has sha256")
        assert not (root / "opt" / "cmr" / "venv").exists()
    finally:
        remove_test_resources(bucket, table, prefix)


@pytest.mark.slow
@pytest.mark.usefixtures("aws_stack")
def test_a_package_that_is_not_the_locked_file_is_refused(built: Built, tmp_path: Path) -> None:
    """The lock is the one its key names, but a package file does not match its hashes
    (as if the index served other bytes): --require-hashes refuses it, nothing starts."""
    bucket, table, prefix = names()
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    lines = built.lock.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("msgpack=="))
    # Every hash of msgpack's files replaced: no file of it can match any more.
    end = next(i for i in range(at + 1, len(lines)) if not lines[i].startswith("    --hash"))
    for i in range(at + 1, end):
        lines[i] = "    --hash=sha256:" + "0" * 64 + (" \\\n" if i < end - 1 else "\n")
    wrong = tmp_path / "requirements.txt"
    wrong.write_text("".join(lines))
    key, locked = wheel_key(built.wheel), lock_key(wrong)
    s3.upload_file(str(wrong), bucket, locked)
    s3.upload_file(str(built.wheel), bucket, key)
    try:
        done, root = boot(tmp_path, bucket, table, prefix, key, locked)
        refused(done, root, f"{locked} verified")
        assert "Hash mismatch for `msgpack==" in done.stdout + done.stderr
        assert not (root / "opt" / "cmr" / "venv" / "bin" / "cmr").exists()
    finally:
        remove_test_resources(bucket, table, prefix)


# Stands in for the AWS CLI with files of a local directory, by key: the disk tests need no stack.
LOCAL_AWS = """#!/bin/bash
# s3api get-object --bucket B --key KEY --expected-bucket-owner A OUTFILE
echo "aws $*" >>"$CMR_ROOT/boot.calls"
cp "{served}/$6" "$9"
"""


def boot_without_stack(
    tmp_path: Path,
    *disks: str,
    mount: str = FAKE_MOUNT,
    env: dict[str, str] | None = None,
    processes: str = "1",
    memory_mb: str = "auto",
) -> tuple[subprocess.CompletedProcess[str], Path, list[str]]:
    """The whole user data in about a second, on an instance with these disks: a stand-in lock
    and wheel (named by their sha256, as `cmr fleet up` names them) served from a local
    directory, and pip and systemctl that only record their arguments, in the order of every
    other call. Returns the run, the scratch root and those calls."""
    served = tmp_path / "served"
    files = {"requirements.txt": b"# stand-in lock\n", "cmr-0.0.0-py3-none-any.whl": b"wheel\n"}
    keys: list[str] = []
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        key = (lock_key if name == "requirements.txt" else wheel_key)(tmp_path / name)
        (served / key).parent.mkdir(parents=True)
        (served / key).write_bytes(data)
        keys.append(key)
    (tmp_path / "pip").write_text(RECORD)
    (tmp_path / "pip").chmod(0o755)
    bucket, table, prefix = names()
    fakes = {"lsblk": fake_lsblk(*disks), "aws": LOCAL_AWS.format(served=served),
             "systemctl": RECORD, "mount": mount}  # fmt: skip
    done, root = boot(tmp_path, bucket, table, prefix, keys[1], keys[0],
                      env={"CMR_PIP": str(tmp_path / "pip"), **(env or {})}, fakes=fakes,
                      processes=processes, memory_mb=memory_mb)  # fmt: skip
    calls = root / "boot.calls"
    return done, root, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize(
    ("store", "layout"),
    [
        pytest.param([3_750_000_000_000] * 2, "RAID 0, 7.5 TB", id="two-disks"),
        pytest.param([118_000_000_000], "118 GB", id="one-disk"),
    ],
)
def test_the_spool_goes_on_the_instance_store(
    tmp_path: Path, store: list[int], layout: str
) -> None:
    """The instance-store NVMe disks, and only those (not the EBS ones), become the spool's
    filesystem: striped into a RAID 0 when there are several, XFS, mounted with noatime at the
    spool before the spool is made the worker's; then the boot goes on as on any instance."""
    devices = [f"/dev/nvme{i}n1" for i in range(1, len(store) + 1)]
    listing = [
        disk(d.removeprefix("/dev/"), size, STORE_MODEL)
        for d, size in zip(devices, store, strict=True)
    ]
    done, root, calls = boot_without_stack(tmp_path, EBS_ROOT, *listing, EBS_DATA)
    log = (root / "bootstrap.log").read_text()
    assert done.returncode == 0, log
    spool = root / "var" / "lib" / "cmr"
    raid = len(devices) > 1
    target = "/dev/md0" if raid else devices[0]
    create = f"mdadm --create /dev/md0 --level=0 --raid-devices={len(devices)} --run"
    disk_calls = [
        f"lsblk {LSBLK_ARGS}",
        *([f"{create} {' '.join(devices)}"] if raid else []),
        f"mkfs.xfs -f -K {target}",
        f"mount -o noatime {target} {spool}",
    ]
    assert calls[: len(disk_calls)] == disk_calls
    assert f"cmr bootstrap: spool on instance store {' '.join(devices)} ({layout})" in log
    # Then the downloads, the installs and the service: all after the mount.
    rest = calls[len(disk_calls) :]
    assert [c.split()[0] for c in rest] == ["aws", "aws", "pip", "pip", "systemctl", "systemctl"]
    assert rest[-1] == "systemctl enable --now cmr-worker.service"
    # The spool was made the worker's on the mounted filesystem: the mount's 0755 is gone.
    st = spool.stat()
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == pwd.getpwnam(WORKER_USER).pw_uid
    unit = (root / "etc" / "systemd" / "system" / "cmr-worker.service").read_text()
    assert f"WorkingDirectory={spool}\n" in unit and f"Environment=TMPDIR={spool}\n" in unit


def test_a_spool_that_cannot_be_mounted_starts_nothing(tmp_path: Path) -> None:
    """A worker spooling on the small root volume of an instance chosen for its NVMe would
    fail much later, disk full: the bootstrap stops, and says why, before it downloads or
    installs anything."""
    stores = [disk(f"nvme{i}n1", 3_750_000_000_000, STORE_MODEL) for i in (1, 2)]
    done, root, calls = boot_without_stack(tmp_path, EBS_ROOT, *stores, mount=FAILING_MOUNT)
    spool = root / "var" / "lib" / "cmr"
    refused(done, root, f"REFUSED: could not mount /dev/md0 at {spool}; the worker is not started")
    assert done.returncode == 1
    assert "wrong fs type" in (root / "bootstrap.log").read_text()  # mount's own word, logged
    assert [c.split()[0] for c in calls] == ["lsblk", "mdadm", "mkfs.xfs", "mount"]
    assert "spool on instance store" not in (root / "bootstrap.log").read_text()
    assert not (root / "opt" / "cmr" / "venv").exists()


def worker_flag(root: Path, flag: str) -> list[str]:
    """The values of one flag on the `cmr worker` command line run-worker.sh execs."""
    run = (root / "opt" / "cmr" / "run-worker.sh").read_text()
    (line,) = [line for line in run.splitlines() if line.startswith("exec ")]
    words = shlex.split(line)
    return [words[i + 1] for i, word in enumerate(words) if word == flag]


def meminfo(tmp_path: Path, total_kb: int) -> dict[str, str]:
    """A /proc/meminfo of an instance with this much memory, as the user data's CMR_MEMINFO."""
    path = tmp_path / "meminfo"
    path.write_text(
        f"MemTotal:       {total_kb} kB\nMemFree:        {total_kb // 2} kB\n"
        f"MemAvailable:   {total_kb - 1024} kB\nBuffers:            1024 kB\n"
    )
    return {"CMR_MEMINFO": str(path)}


@pytest.mark.parametrize(
    ("total_kb", "processes", "memory_mb"),
    [
        pytest.param(256 * 2**20, "32", 4096, id="i4i.8xlarge"),  # 256 GiB, --processes 32
        pytest.param(3_889_268, "2", 949, id="c7i.large"),  # 4 GiB less the kernel's
        pytest.param(512 * 2**10, "8", 64, id="at-least-64"),  # 32 MB each, raised to 64
    ],
)
def test_auto_memory_is_half_the_instance_over_its_processes(
    tmp_path: Path, total_kb: int, processes: str, memory_mb: int
) -> None:
    """MemoryMb auto: each reducer may hold half the instance's memory over its processes,
    worked out from /proc/meminfo at boot, logged, and passed to the worker."""
    done, root, _ = boot_without_stack(
        tmp_path, EBS_ROOT, env=meminfo(tmp_path, total_kb), processes=processes
    )
    log = (root / "bootstrap.log").read_text()
    assert done.returncode == 0, log
    machine = total_kb // 1024
    assert (
        f"cmr bootstrap: reducer memory {memory_mb} MB (auto: half of {machine} MB over "
        f"{processes} processes)\n" in log
    )
    assert worker_flag(root, "--reduce-slots") == [processes]
    assert worker_flag(root, "--memory-mb") == [str(memory_mb)]


def test_a_memory_given_passes_through_and_must_fit_the_instance(tmp_path: Path) -> None:
    """An explicit MemoryMb reaches the worker as it is; one more than the instance's memory
    (which `cmr worker` would refuse at every restart) stops the boot before any install."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    done, root, _ = boot_without_stack(
        tmp_path / "a", EBS_ROOT, env=meminfo(tmp_path, 256 * 2**20), processes="32",
        memory_mb="8000",
    )  # fmt: skip
    log = (root / "bootstrap.log").read_text()
    assert done.returncode == 0, log
    assert "cmr bootstrap: reducer memory 8000 MB (MemoryMb; the instance has 262144 MB" in log
    assert worker_flag(root, "--memory-mb") == ["8000"]

    done, root, calls = boot_without_stack(
        tmp_path / "b", EBS_ROOT, env=meminfo(tmp_path, 4 * 2**20), memory_mb="8000"
    )
    why = "REFUSED: MemoryMb (--memory-mb) 8000 is more than this instance's 4096 MB of memory"
    refused(done, root, why)
    assert calls == []  # refused before the disks, the downloads and the installs
    assert not (root / "opt" / "cmr").exists()


def test_an_unreadable_meminfo_starts_nothing(tmp_path: Path) -> None:
    done, root, calls = boot_without_stack(
        tmp_path, EBS_ROOT, env={"CMR_MEMINFO": str(tmp_path / "missing")}
    )
    refused(done, root, f"REFUSED: cannot read {tmp_path / 'missing'}")
    assert calls == []
