"""The launch template's user data is a real script: render it as CloudFormation would, run
it here in a scratch root (systemctl and pip replaced through its CMR_* variables)
against LocalStack and DynamoDB Local, and check that the worker it starts serves a job."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3

from cmr.api import run_async
from cmr.fleet import build_wheel, wheel_key
from cmr.settings import AwsSettings
from tests.deploy.conftest import ROOT, load_template, render_user_data
from tests.engine.reference import counts_from_parts, word_count
from tests.stack import remove_test_resources

# Stands in for systemd: `enable --now` runs the unit's ExecStart detached like a service and
# records its exit status where systemd would keep it.
FAKE_SYSTEMCTL = r"""#!/bin/bash
set -e
[ "$1" = enable ] || exit 0
unit="$CMR_ROOT/etc/systemd/system/$3"
start=$(sed -n 's/^ExecStart=//p' "$unit")
setsid bash -c '"$1"; echo $? >"$2"' _ "$start" "$CMR_ROOT/worker.exit" \
  >"$CMR_ROOT/worker.log" 2>&1 </dev/null &
echo $! >"$CMR_ROOT/worker.pid"
"""

IDLE_EXIT_S = 8
TEXT = [
    "the quick brown fox jumps over the lazy dog\n" * 40,
    "ünï κόσμε the dog\n\n  spaces   and\ttabs the\n" * 25,
    "a b c d e f g a b c a\n" * 60,
]


def stop_worker(root: Path) -> None:
    pidfile = root / "worker.pid"
    if pidfile.exists():
        pid = int(pidfile.read_text())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)  # the session fake systemctl started


def test_user_data_installs_wheel_and_worker_serves_a_job(
    aws_stack: dict[str, str], tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    bucket, table, prefix = f"cmr-boot-{tag}", f"cmr-boot-{tag}", f"cmrboot{tag}-"
    root = tmp_path / "instance"
    root.mkdir()
    s3, db = boto3.client("s3"), boto3.client("dynamodb")
    # What the stack provides before any instance boots: bucket, table, wheel.
    s3.create_bucket(Bucket=bucket)
    db.create_table(
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
    wheel = build_wheel(ROOT, tmp_path / "dist")
    key = wheel_key(wheel)
    s3.upload_file(str(wheel), bucket, key)

    script = render_user_data(
        load_template(),
        {
            "BucketName": bucket,
            "WheelKey": key,
            "TableName": table,
            "QueuePrefix": prefix,
            "Processes": "1",
            "IdleExitSeconds": str(IDLE_EXIT_S),
            "AWS::Region": "us-east-1",
            "AWS::StackName": f"boot-{tag}",
        },
    )
    (root / "user-data.sh").write_text(script)
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(FAKE_SYSTEMCTL)
    systemctl.chmod(0o755)
    venv = root / "opt" / "cmr" / "venv"
    env = {
        **os.environ,
        "CMR_ROOT": str(root),
        "CMR_PYTHON": sys.executable,
        "CMR_VENV_OPTS": "--without-pip",
        # The uv cache stands in for PyPI: same packages, no network.
        "CMR_PIP": f"uv pip install --offline --quiet --python {venv}/bin/python",
        "CMR_SYSTEMCTL": str(systemctl),
        "CMR_BOOT_LOG": str(root / "bootstrap.log"),
    }
    try:
        started = time.monotonic()
        boot = subprocess.run(
            ["bash", str(root / "user-data.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert boot.returncode == 0, boot.stdout + boot.stderr
        boot_s = time.monotonic() - started
        # The wheel came from the bucket and is what the venv's cmr runs.
        assert (root / "opt" / "cmr" / wheel.name).read_bytes() == wheel.read_bytes()
        assert (venv / "bin" / "cmr").exists()
        unit = (root / "etc" / "systemd" / "system" / "cmr-worker.service").read_text()
        assert "StandardOutput=journal+console" in unit and "Restart=on-failure" in unit
        run = (root / "opt" / "cmr" / "run-worker.sh").read_text()
        assert f'--bucket "{bucket}"' in run and f'--idle-exit "{IDLE_EXIT_S}"' in run
        assert "AWS_ENDPOINT_URL_DYNAMODB=" in (root / "etc" / "cmr" / "worker.env").read_text()

        data = tmp_path / "input"
        data.mkdir()
        for i, text in enumerate(TEXT):
            (data / f"f{i}.txt").write_text(text)
        out = tmp_path / "out"
        result = asyncio.run(
            asyncio.wait_for(
                run_async(
                    "examples/wordcount.py",
                    str(data),
                    str(out),
                    backend="aws",
                    workers=0,
                    aws=AwsSettings(bucket=bucket, table=table, queue_prefix=prefix),
                ),
                timeout=180,
            )
        )
        assert counts_from_parts(out, 4) == word_count(data)
        assert result.record["state"] == "succeeded"

        # Idle, the worker exits cleanly (status 0: systemd's Restart=on-failure leaves it
        # down, the instance goes quiet and the fleet's idle alarm scales the group in).
        exit_file = root / "worker.exit"
        deadline = time.monotonic() + IDLE_EXIT_S + 60
        while not exit_file.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        log = (root / "worker.log").read_text()
        assert exit_file.exists(), log[-3000:]
        assert exit_file.read_text().strip() == "0", log[-3000:]
        print(f"bootstrap {boot_s:.1f}s, job {result.seconds:.1f}s")
    finally:
        stop_worker(root)
        remove_test_resources(bucket, table, prefix)
