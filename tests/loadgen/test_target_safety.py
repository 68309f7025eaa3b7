"""The load generator never surprises its target (issue 12).

It states the target before it starts; it asks (or wants ``--yes``) before loading anything
that is not a local endpoint, and with no terminal to ask on it refuses before sending a
single request; it deletes only what it created; a table, bucket or queue the user named
that existed before is used as-is and keeps its contents; cmr's own store is refused as a
target unless the user asks for it.

Against the local stack (``aws_stack``, ``azure_stack``); the refusals need no stack: a
counting HTTP(S) proxy stands in for AWS and Azure and proves no request left. The Azure
targets' endpoints are read from AZURE_STORAGE_CONNECTION_STRING, by the same rules.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from cmr.cli import app
from tests.loadgen.conftest import TEST_CREDENTIALS
from tests.stack import DYNAMODB_URL, LOCALSTACK_URL


def _name() -> str:
    return f"lgsafe-{uuid.uuid4().hex[:10]}"


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["loadgen", *args, "--no-progress"])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def _ok(*args: str) -> str:
    code, _, err = _run(*args)
    assert code == 0, err
    return err


def _client(service: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=DYNAMODB_URL if service == "dynamodb" else LOCALSTACK_URL,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


@pytest.fixture
def user_table(aws_stack: dict[str, str]) -> Iterator[str]:
    """A table the user made before the load test, keyed like the load's (k, a string),
    holding two items of theirs; one is named as the old generator named its first item."""
    ddb, name = _client("dynamodb"), _name()
    ddb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    for key in ("item-0", "users#42"):
        ddb.put_item(TableName=name, Item={"k": {"S": key}, "v": {"S": "the user's"}})
    try:
        yield name
    finally:
        with contextlib.suppress(ClientError):
            ddb.delete_table(TableName=name)


def _items(table: str) -> dict[str, Any]:
    items = _client("dynamodb").scan(TableName=table, ConsistentRead=True)["Items"]
    return {i["k"]["S"]: i for i in items}


def _tables() -> set[str]:
    return set(_client("dynamodb").list_tables()["TableNames"])


# a pre-existing target is used as-is --------------------------------------------------------


@pytest.mark.slow
def test_a_pre_existing_table_keeps_its_items_and_is_not_deleted(
    user_table: str, tmp_path: Path
) -> None:
    before = _items(user_table)
    err = _ok(
        "jam", "--target", "dynamodb", "--target-table", user_table, "--items", "5",
        "--readers", "2", "--writers", "2", "--ops", "100", "--json", str(tmp_path / "j.json"),
    )  # fmt: skip
    assert user_table in _tables()
    # the user's items untouched, and nothing of the run's left behind
    assert _items(user_table) == before
    data = json.loads((tmp_path / "j.json").read_text())
    assert sum(o["ok"] for o in data["ops"]) == 100
    # the statement, before it started
    assert "dynamodb at http://127.0.0.1:8000 (local)" in err
    assert "region us-east-1" in err
    assert f"table {user_table}: exists" in err


@pytest.mark.slow
def test_a_staleness_run_cleans_only_its_own_keys_from_a_pre_existing_table(
    user_table: str, tmp_path: Path
) -> None:
    before = _items(user_table)
    _ok(
        "cpq", "--target", "dynamodb", "--target-table", user_table, "--p", "0,1",
        "--duration", "1", "--write-interval-ms", "200", "--items", "2",
        "--json", str(tmp_path / "c.json"),
    )  # fmt: skip
    assert user_table in _tables()
    assert _items(user_table) == before


def test_a_table_of_another_shape_is_refused_before_the_load(
    aws_stack: dict[str, str], tmp_path: Path
) -> None:
    ddb, name = _client("dynamodb"), _name()
    ddb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "N"}],
        BillingMode="PAY_PER_REQUEST",
    )
    try:
        code, _, err = _run(
            "jam", "--target", "dynamodb", "--target-table", name, "--ops", "10",
            "--json", str(tmp_path / "j.json"),
        )  # fmt: skip
        assert code == 1
        assert err.startswith("error: ") and "key" in err and name in err
        assert name in _tables()
    finally:
        ddb.delete_table(TableName=name)


@pytest.mark.slow
def test_a_pre_existing_bucket_keeps_its_objects_and_is_not_deleted(
    aws_stack: dict[str, str], tmp_path: Path
) -> None:
    s3, name = _client("s3"), _name()
    s3.create_bucket(Bucket=name)
    # cmr-load/item-0 is where the old generator wrote its first item
    mine = {"cmr-load/item-0": b"the user's", "data/x.csv": b"1,2,3\n"}
    for key, body in mine.items():
        s3.put_object(Bucket=name, Key=key, Body=body)
    try:
        err = _ok(
            "jam", "--target", "s3", "--target-bucket", name, "--items", "5",
            "--readers", "2", "--writers", "2", "--ops", "100",
            "--json", str(tmp_path / "j.json"),
        )  # fmt: skip
        listed = s3.list_objects_v2(Bucket=name).get("Contents", [])
        assert {o["Key"] for o in listed} == set(mine)
        for key, body in mine.items():
            assert s3.get_object(Bucket=name, Key=key)["Body"].read() == body
        assert f"bucket {name}: exists" in err
        assert "account 000000000000" in err  # LocalStack's STS answers
    finally:
        for key in mine:
            s3.delete_object(Bucket=name, Key=key)
        for o in s3.list_objects_v2(Bucket=name).get("Contents", []):
            s3.delete_object(Bucket=name, Key=o["Key"])
        s3.delete_bucket(Bucket=name)


def _drain(sqs: Any, url: str) -> list[str]:
    bodies: list[str] = []
    empty = 0
    while empty < 2:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        messages = got.get("Messages", [])
        empty = 0 if messages else empty + 1
        for m in messages:
            bodies.append(m["Body"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    return bodies


@pytest.mark.slow
def test_a_pre_existing_queue_keeps_its_messages_and_is_not_deleted(
    aws_stack: dict[str, str], tmp_path: Path
) -> None:
    sqs, name = _client("sqs"), _name()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    # "7" reads as a value of the load's own kind: only the run's marker tells them apart
    mine = ["the user's order 1", "the user's order 2", "7"]
    for body in mine:
        sqs.send_message(QueueUrl=url, MessageBody=body)
    try:
        err = _ok(
            "jam", "--target", "sqs", "--target-queue", name, "--readers", "2",
            "--writers", "2", "--ops", "60", "--json", str(tmp_path / "j.json"),
        )  # fmt: skip
        assert f"queue {name}: exists" in err
        assert f"note: queue {name} holds about 3 messages of others" in err
        assert sorted(_drain(sqs, url)) == sorted(mine)
    finally:
        sqs.delete_queue(QueueUrl=url)


# what it creates it removes, and says so beforehand ------------------------------------------


@pytest.mark.slow
def test_a_created_table_is_stated_and_removed(aws_stack: dict[str, str], tmp_path: Path) -> None:
    name = _name()
    err = _ok(
        "jam", "--target", "dynamodb", "--target-table", name, "--ops", "20",
        "--readers", "1", "--writers", "1", "--json", str(tmp_path / "j.json"),
    )  # fmt: skip
    assert f"table {name}: will be created" in err
    assert "dynamodb at http://127.0.0.1:8000 (local)" in err
    assert name not in _tables()


def test_the_simulated_store_is_stated_as_local(tmp_path: Path) -> None:
    err = _ok("jam", "--target", "sim", "--ops", "20", "--json", str(tmp_path / "j.json"))
    assert "target: sim" in err and "(local)" in err


# cmr's own store is not a load target unless asked -------------------------------------------


def test_cmr_own_table_is_refused_as_a_target(user_table: str, tmp_path: Path) -> None:
    before = _items(user_table)
    # --table names cmr's own table (the store's; a unique one here, on the local stack)
    code, _, err = _run(
        "jam", "--target", "dynamodb", "--table", user_table, "--target-table", user_table,
        "--ops", "10", "--json", str(tmp_path / "j.json"),
    )  # fmt: skip
    assert code == 1
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "cmr's own table" in err and "--allow-cmr-store" in err
    assert _items(user_table) == before


@pytest.mark.parametrize(
    "args",
    [
        ["--target", "s3", "--bucket", "lg-own-bucket", "--target-bucket", "lg-own-bucket"],
        ["--target", "sqs", "--queue-prefix", "lgown-", "--target-queue", "lgown-x-in"],
        *(
            ["--target", target, "--store", "azure:///lg-own/lgown1", flag, name]
            for target, flag, name in [
                ("azure-table", "--target-table", "lgown1"),
                ("azure-blob", "--target-container", "lg-own"),
            ]
        ),
    ],
    ids=["bucket", "queue", "azure-table", "azure-container"],
)
def test_cmr_own_bucket_and_queues_are_refused_as_targets(
    args: list[str], test_credentials: None, tmp_path: Path
) -> None:
    code, _, err = _run("jam", *args, "--ops", "10", "--json", str(tmp_path / "j.json"))
    assert code == 1 and "cmr's own" in err and "--allow-cmr-store" in err


@pytest.mark.slow
def test_cmr_own_table_is_used_as_is_when_allowed(user_table: str, tmp_path: Path) -> None:
    before = _items(user_table)
    _ok(
        "jam", "--target", "dynamodb", "--table", user_table, "--target-table", user_table,
        "--allow-cmr-store", "--ops", "20", "--json", str(tmp_path / "j.json"),
    )  # fmt: skip
    assert _items(user_table) == before


# not local: confirmation, or --yes, before a single request ----------------------------------


class Listener:
    """A socket on ``host`` whose accepted connections go to ``handle``, in a thread, until
    ``close``."""

    def __init__(self, host: str) -> None:
        self._sock = socket.socket()
        self._sock.bind((host, 0))
        self._sock.listen()
        self.url = f"http://{host}:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.handle(conn)

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._sock.close()


class CountingProxy(Listener):
    """Accepts connections and closes them, counting: every AWS call goes through it."""

    def __init__(self) -> None:
        self.connections = 0
        super().__init__("127.0.0.1")

    def handle(self, conn: socket.socket) -> None:
        self.connections += 1
        conn.close()


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[CountingProxy]:
    """Fake credentials, no endpoint (real AWS), and every connection caught by a proxy."""
    for key, value in TEST_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    p = CountingProxy()
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(key, p.url)
    for key in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(key, raising=False)
    try:
        yield p
    finally:
        p.close()


@pytest.mark.parametrize(
    ("target", "endpoint", "stated"),
    [
        ("dynamodb", None, "dynamodb at AWS"),
        ("s3", None, "s3 at AWS"),
        ("sqs", None, "sqs at AWS"),
        ("dynamodb", "http://ddb.example.invalid:8000", "at http://ddb.example.invalid:8000"),
    ],
)
def test_a_non_local_target_without_yes_or_a_terminal_is_refused_before_any_request(
    target: str,
    endpoint: str | None,
    stated: str,
    proxy: CountingProxy,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    if endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    code, _, err = _run("jam", "--target", target, "--ops", "10", "--json", str(tmp_path / "j"))
    assert code == 1
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "--yes" in err and stated in err and "us-east-1" in err
    assert proxy.connections == 0


# a non-local endpoint that is really the local DynamoDB: --yes, and the terminal's yes or no ---


def _outward_address() -> str | None:
    """This machine's own non-loopback address, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: only picks the outgoing interface
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") else address


class Relay(Listener):
    """Forwards connections from this machine's non-loopback address to the local DynamoDB: an
    endpoint the load generator cannot take for a local one, behind which is a real store."""

    def __init__(self, host: str, to_port: int) -> None:
        self._to = to_port
        self._open: list[socket.socket] = []
        super().__init__(host)

    def handle(self, conn: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self._to))
        self._open += [conn, upstream]
        threading.Thread(target=self._relay, args=(conn, upstream), daemon=True).start()

    def _relay(self, conn: socket.socket, upstream: socket.socket) -> None:
        back = threading.Thread(target=self._pipe, args=(upstream, conn), daemon=True)
        back.start()
        self._pipe(conn, upstream)
        back.join()
        conn.close()
        upstream.close()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        super().close()
        for s in self._open:
            s.close()


@pytest.fixture
def remote_dynamodb(aws_stack: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    host = _outward_address()
    if host is None:
        pytest.skip("this machine has no non-loopback address to relay through")
    relay = Relay(host, int(DYNAMODB_URL.rsplit(":", 1)[1]))
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", relay.url)
    try:
        yield relay.url
    finally:
        relay.close()


@pytest.mark.slow
def test_yes_loads_a_non_local_target_and_states_it(remote_dynamodb: str, tmp_path: Path) -> None:
    name = _name()
    err = _ok(
        "jam", "--target", "dynamodb", "--target-table", name, "--ops", "20", "--yes",
        "--readers", "1", "--writers", "1", "--json", str(tmp_path / "j.json"),
    )  # fmt: skip
    assert f"target: dynamodb at {remote_dynamodb}, region us-east-1" in err
    assert "(local)" not in err
    assert f"table {name}: will be created" in err
    assert name not in _tables()


def _on_a_terminal(args: list[str], answer: str) -> tuple[int, str]:
    """Run ``cmr loadgen`` on a pseudo-terminal, answer its question, return (code, output)."""
    import os
    import pty
    import select
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cmr", "loadgen", *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        cwd=root,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
    )
    os.close(follower)
    seen, answered = b"", False
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            if not answered and b"Load this target?" in seen:
                os.write(leader, answer.encode() + b"\n")
                answered = True
            if proc.poll() is not None and not ready:
                break
        text = re.sub(r"\x1b\[[0-9;]*m", "", seen.decode(errors="replace"))  # rich's bold
        return proc.wait(timeout=60), text.replace("\r", "")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)


@pytest.mark.slow
def test_a_terminal_is_asked_and_no_means_nothing_is_created(
    remote_dynamodb: str, tmp_path: Path
) -> None:
    name = _name()
    args = ["jam", "--target", "dynamodb", "--target-table", name, "--ops", "20",
            "--json", str(tmp_path / "j.json"), "--no-progress"]  # fmt: skip
    code, text = _on_a_terminal(args, "n")
    assert code == 1, text
    statement = text.index(f"table {name}: will be created")
    assert statement < text.index("Load this target?") < text.index("error: not confirmed")
    assert name not in _tables()
    assert not (tmp_path / "j.json").exists()

    code, text = _on_a_terminal(args, "y")
    assert code == 0, text
    assert (tmp_path / "j.json").exists() and name not in _tables()


# the Azure targets: endpoints from the connection string, by the same rules ----------------


def _azure_connection(endpoints: str) -> str:
    from tests.stack import AZURITE_ACCOUNT, AZURITE_KEY

    return f"AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};{endpoints}"


@pytest.mark.parametrize(
    ("target", "endpoints", "stated"),
    [
        ("azure-table", "DefaultEndpointsProtocol=https;EndpointSuffix=core.windows.net",
         "azure-table at Azure (https://devstoreaccount1.table.core.windows.net)"),
        ("azure-blob", "DefaultEndpointsProtocol=https;EndpointSuffix=core.windows.net",
         "azure-blob at Azure (https://devstoreaccount1.blob.core.windows.net)"),
        ("azure-table", "TableEndpoint=http://table.example.invalid:10002/devstoreaccount1",
         "at http://table.example.invalid:10002/devstoreaccount1"),
    ],
)  # fmt: skip
def test_a_non_local_azure_target_without_yes_or_a_terminal_is_refused_before_any_request(
    target: str,
    endpoints: str,
    stated: str,
    proxy: CountingProxy,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", _azure_connection(endpoints))
    code, _, err = _run("jam", "--target", target, "--ops", "10", "--json", str(tmp_path / "j"))
    assert code == 1
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "--yes" in err and stated in err and "account devstoreaccount1" in err
    assert proxy.connections == 0


@pytest.mark.parametrize("target", ["azure-table", "azure-blob"])
def test_a_created_azure_table_or_container_is_stated_local_and_removed(
    target: str, azure_stack: str, tmp_path: Path
) -> None:
    err = _ok(
        "jam", "--target", target, "--ops", "20", "--readers", "1", "--writers", "1",
        "--json", str(tmp_path / "j.json"),
    )  # fmt: skip
    port = 10002 if target == "azure-table" else 10000
    assert f"target: {target} at http://127.0.0.1:{port}/devstoreaccount1 (local)" in err
    assert "account devstoreaccount1" in err
    kind = "table cmrload" if target == "azure-table" else "container cmr-load-"
    assert f"  {kind}" in err and "will be created" in err and "deleted afterwards" in err


def test_an_azure_table_name_azure_refuses_is_refused_before_any_request(
    proxy: CountingProxy, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    endpoints = "DefaultEndpointsProtocol=https;EndpointSuffix=core.windows.net"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", _azure_connection(endpoints))
    code, _, err = _run(
        "jam", "--target", "azure-table", "--target-table", "cmr-load-x", "--ops", "10",
        "--yes", "--json", str(tmp_path / "j"),
    )  # fmt: skip
    assert code == 1 and "table name 'cmr-load-x'" in err and "letters and digits" in err
    assert proxy.connections == 0


def test_the_container_flag_does_not_apply_to_an_aws_target(tmp_path: Path) -> None:
    code, _, err = _run(
        "jam", "--target", "s3", "--target-container", "c", "--ops", "10",
        "--json", str(tmp_path / "j"),
    )  # fmt: skip
    assert code == 1 and "--target-container does not apply to target s3" in err


@pytest.fixture
def remote_azurite(azure_stack: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Azurite's table service behind this machine's own non-loopback address."""
    host = _outward_address()
    if host is None:
        pytest.skip("this machine has no non-loopback address to relay through")
    relay = Relay(host, 10002)
    at = f"{relay.url}/devstoreaccount1"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", _azure_connection(f"TableEndpoint={at}"))
    try:
        yield at
    finally:
        relay.close()


def test_yes_loads_a_non_local_azure_target_and_states_it(
    remote_azurite: str, tmp_path: Path
) -> None:
    code, _, err = _run(
        "jam", "--target", "azure-table", "--ops", "10", "--json", str(tmp_path / "j.json"),
    )  # fmt: skip
    assert code == 1 and "is not a local endpoint" in err  # refused first, without --yes
    err = _ok(
        "jam", "--target", "azure-table", "--ops", "20", "--yes", "--readers", "1",
        "--writers", "1", "--json", str(tmp_path / "j.json"),
    )  # fmt: skip
    assert f"target: azure-table at {remote_azurite}, account devstoreaccount1" in err
    assert "(local)" not in err
    data = json.loads((tmp_path / "j.json").read_text())
    assert sum(o["ok"] for o in data["ops"]) == 20
