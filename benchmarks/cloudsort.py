"""A CloudSort-style sort (TeraGen records, S3 to S3) at 100 TB: its bill, modelled from
what a smaller one does on the wire here.

    scripts/stack.sh start
    .venv/bin/python benchmarks/cloudsort.py measure [--size-mb 1000] [--split-mb 256]
        [--reducers 8] [--memory-mb 64] [--workers 2] [--json F]
    .venv/bin/python benchmarks/cloudsort.py model --measured F [--tb 100]
        [--instance i4i.8xlarge] [--instances 40] [--split-gb 32] [--reducers 1280]
        [--json F] [--markdown F]

``measure`` sorts a TeraGen input already in the bucket (S3 to S3: nothing staged, nothing
fetched back while counting) with ``cmr run examples/terasort.py --shuffle blob`` on the
local stack, every HTTP request through the counting proxies of benchmarks/shuffle_wire.py,
each S3 request labelled by what it touched (input, shuffle objects, output, the rest of
the job's scratch). It records the CPU seconds of cmr's processes (the client, its
workers and their pools; not LocalStack's nor moto's, which are the cloud's), the wall time,
the shuffle's bytes, and checks the output with Hadoop's TeraValidate and the input's
checksum. The shape is the one the model scales: map tasks larger than memory (streamed,
cmr.rangefile), reducers whose partitions exceed their memory (spilled, merged).

``model`` derives the requests of a sort of ``--tb`` TB from the protocol's structure (the
constants are cmr's own, imported), checks that structure against the measured run (the
predicted and measured counts of every term that scales, side by side), and prices it:
instance-seconds from the CPU seconds per GB measured here, requests, and the shuffle's
storage, at the list prices in benchmarks/aws_prices.json and benchmarks/ec2_prices.json.
It prints three rows: the blob shuffle as built; the batch path (queues) beside it, from
the billed SQS requests per GB measured by benchmarks/shuffle_wire.py; and the design the
model points to (see RESULTS.md), marked as not built.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import boto3

if __package__:  # imported as benchmarks.cloudsort
    from benchmarks import hadoop, shuffle_wire
else:  # run as a script: benchmarks/ is on sys.path
    import hadoop  # type: ignore[no-redef]
    import shuffle_wire  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from cmr import bulk, rangefile  # noqa: E402
from cmr.backends import parts  # noqa: E402
from cmr.backends.aws import s3  # noqa: E402
from cmr.cpu.runs import MERGE_FANIN  # noqa: E402
from cmr.records import PAGE_PARTITIONS, PART_DIGEST, MapCommit, MapPage, page_sk, pages_for  # noqa: E402

GB = 1_000_000_000
BUCKET, TABLE, PREFIX = "cmr-cloudsort", "cmr-cloudsort", "cmrcs-"
LOCALSTACK, DYNAMODB = "http://127.0.0.1:4566", "http://127.0.0.1:8000"  # scripts/stack.sh's
IN_KEY, OUT_KEY = "cloudsort-in/", "cloudsort-out/"


def kind(path: str) -> str:
    """What an S3 request of the run touched (path style: /bucket/key)."""
    key = path.strip("/").partition("/")[2]
    if key.startswith(IN_KEY):
        return "input"
    if key.startswith(OUT_KEY):
        return "output"
    if "/shuffle/" in key:
        return "shuffle"
    if "/out/" in key:
        return "scratch-output"
    return "scratch" if key else "bucket"


def _s3() -> Any:
    return boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL", LOCALSTACK))


def dynamodb_url() -> str:
    """Read when called: the stack's environment may be set after this module loads."""
    return os.environ.get("AWS_ENDPOINT_URL_DYNAMODB", DYNAMODB)


def stage_input(data: Path, size_mb: int) -> str:
    """The TeraGen files in the bucket (before counting: CloudSort's input is in S3)."""
    client = _s3()
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)
    prefix = f"{IN_KEY}{size_mb}mb/"
    have = {
        o["Key"]: o["Size"]
        for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    }
    for f in sorted(data.glob("part-*")):
        if have.get(prefix + f.name) != f.stat().st_size:
            client.upload_file(str(f), BUCKET, prefix + f.name)
    return f"s3://{BUCKET}/{prefix}"


def fetch_output(out_prefix: str, local: Path) -> None:
    client = _s3()
    local.mkdir(parents=True, exist_ok=True)
    keys = [
        o["Key"]
        for o in client.list_objects_v2(Bucket=BUCKET, Prefix=out_prefix).get("Contents", [])
    ]
    for k in keys:
        client.download_file(BUCKET, k, str(local / k.rsplit("/", 1)[1]))
        client.delete_object(Bucket=BUCKET, Key=k)


class TreeCpu:
    """CPU seconds of a process and all its descendants, sampled from /proc every
    ``every`` s while it runs (a descendant's last moments before it exits, at most one
    interval, are missed: an undercount of a few tenths of a second per process). The
    rusage of reaped children misses processes nobody waits for (a worker's pool)."""

    def __init__(self, root: int, every: float = 0.1) -> None:
        self.root, self.every = root, every
        self.seen: dict[int, float] = {}
        self.roles: dict[int, str] = {}  # pid: what the process is (see ``role``)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")

    def _stats(self) -> dict[int, tuple[int, float]]:
        out: dict[int, tuple[int, float]] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                raw = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            fields = raw[raw.rindex(")") + 2 :].split()
            out[int(d)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / self._tick)
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            stats = self._stats()
            tree = {self.root}
            grew = True
            while grew:
                grew = False
                for pid, (ppid, _) in stats.items():
                    if ppid in tree and pid not in tree:
                        tree.add(pid)
                        grew = True
            for pid in tree:
                if pid in stats:
                    self.seen[pid] = max(self.seen.get(pid, 0.0), stats[pid][1])
                    if pid not in self.roles:
                        self.roles[pid] = role(pid, stats[pid][0])
            self._stop.wait(self.every)

    def __enter__(self) -> TreeCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def seconds(self) -> float:
        return sum(self.seen.values())

    def by_role(self) -> dict[str, float]:
        """CPU seconds by kind of process: where a run's CPU goes."""
        out: dict[str, float] = {}
        for pid, cpu in self.seen.items():
            kind = self.roles.get(pid, "other")
            out[kind] = round(out.get(kind, 0.0) + cpu, 2)
        return dict(sorted(out.items()))


def _argv(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def role(pid: int, ppid: int) -> str:
    """``client`` (``cmr run``), ``worker`` (a ``cmr worker``'s event loop), ``pool`` (its
    pool processes, under the forkserver), ``forkserver``, or ``other``."""
    text = _argv(pid)
    if "forkserver import main" in text:
        # The forkserver forks the pool's processes without exec: their argv is its own,
        # so a pool process is told by its parent's (read, not remembered: a parent and its
        # child may first be seen in the same sample, in either order).
        return "pool" if "forkserver import main" in _argv(ppid) else "forkserver"
    if " cmr worker" in text or "cmr.cli worker" in text:
        return "worker"
    if " cmr run" in text:
        return "client"
    return "other"


class MapPhase:
    """When the job's last map task committed, and the CPU its processes had used by then:
    the table is asked every quarter second (from outside the run: its requests do not go
    through the proxies) how many of the job's map tasks have a commit record."""

    def __init__(self, table: str, output: str) -> None:
        self.table, self.output = table, output
        self.cpu_s: float | None = None
        self.at_s: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, cpu: TreeCpu, started: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(cpu, started), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _job(self, ddb: Any) -> tuple[str, int] | None:
        """This run's job record, known by its output (no other job may write there while
        it runs): its key and how many map tasks it has."""
        pages = ddb.get_paginator("scan").paginate(
            TableName=self.table,
            FilterExpression="sk = :job AND #out = :out",
            ExpressionAttributeNames={"#out": "output"},
            ExpressionAttributeValues={":job": {"S": "job"}, ":out": {"S": self.output}},
        )
        for page in pages:
            for item in page["Items"]:
                return str(item["pk"]["S"]), int(item["maps"]["N"])
        return None

    def _run(self, cpu: TreeCpu, started: float) -> None:
        ddb = boto3.client("dynamodb", endpoint_url=dynamodb_url())
        found: tuple[str, int] | None = None
        while not self._stop.wait(0.25):
            with contextlib.suppress(Exception):  # the table or the job may not exist yet
                found = found or self._job(ddb)
                if found is None:
                    continue
                job, maps = found
                done = sum(
                    page["Count"]
                    for page in ddb.get_paginator("query").paginate(
                        TableName=self.table,
                        KeyConditionExpression="pk = :pk AND begins_with(sk, :map)",
                        ExpressionAttributeValues={":pk": {"S": job}, ":map": {"S": "map#"}},
                        Select="COUNT",
                    )
                )
                if maps and done >= maps:
                    self.cpu_s, self.at_s = cpu.seconds, time.monotonic() - started
                    return


def run_counted(
    argv: list[str],
    env: dict[str, str],
    phase: MapPhase | None = None,
    roles: dict[str, float] | None = None,
) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run ``argv``; its result, wall seconds and its process tree's CPU seconds (and, with
    ``phase``, when its maps ended)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    with TreeCpu(proc.pid) as cpu:
        if phase is not None:
            phase.start(cpu, started)
        try:
            out, err = proc.communicate(timeout=7200)
        finally:
            if phase is not None:
                phase.stop()
    wall = time.monotonic() - started
    if roles is not None:
        roles.update(cpu.by_role())
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), wall, cpu.seconds


def embedded_utilization(args: argparse.Namespace, data: Path) -> dict[str, float]:
    """The same sort on the embedded backend (its store is local files: it costs our
    processes little CPU, as a remote store would, and no service shares the cores): the
    share of the cores cmr keeps busy, the figure the model takes for a fleet's."""
    out = args.scratch / "embedded-out"
    shutil.rmtree(out, ignore_errors=True)
    argv = [
        sys.executable, "-m", "cmr", "run", str(REPO / "examples" / "terasort.py"),
        "--input", str(data), "--output", str(out),
        "--workers", str(args.workers), "--reducers", str(args.reducers),
        "--split-mb", str(args.split_mb), "--memory-mb", str(args.memory_mb),
        "--shuffle", "blob", "--no-progress",
    ]  # fmt: skip
    done, wall, cpu = run_counted(argv, dict(os.environ))
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"cmr run (embedded) failed:\n{done.stderr[-3000:]}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "utilization": round(cpu / (wall * (os.cpu_count() or 1)), 3),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    data = shuffle_wire.teragen_input(args.size_mb, args.data)
    source = stage_input(data, args.size_mb)
    input_bytes = sum(f.stat().st_size for f in data.glob("part-*"))
    tag = time.strftime("%H%M%S")
    out_prefix = f"{OUT_KEY}{tag}/"
    env = dict(os.environ)
    scheme = "https" if args.https else "http"
    with contextlib.ExitStack() as stack:
        tls = None
        if args.https:  # as a fleet speaks to AWS: TLS, and no payload signing
            tls, env["AWS_CA_BUNDLE"] = stack.enter_context(shuffle_wire.self_signed())
        aws, ddb, aws_port, ddb_port = stack.enter_context(
            shuffle_wire.proxies(
                env.get("AWS_ENDPOINT_URL", LOCALSTACK),
                env.get("AWS_ENDPOINT_URL_DYNAMODB", DYNAMODB),
                kind,
                tls,
            )
        )
        env["AWS_ENDPOINT_URL"] = f"{scheme}://127.0.0.1:{aws_port}"
        env["AWS_ENDPOINT_URL_DYNAMODB"] = f"{scheme}://127.0.0.1:{ddb_port}"
        argv = [
            sys.executable, "-m", "cmr", "run", str(REPO / "examples" / "terasort.py"),
            "--store", f"aws://{BUCKET}/{TABLE}?prefix={PREFIX}",
            "--input", source, "--output", f"s3://{BUCKET}/{out_prefix}",
            "--workers", str(args.workers), "--reducers", str(args.reducers),
            "--split-mb", str(args.split_mb), "--memory-mb", str(args.memory_mb),
            "--shuffle", "blob", "--no-progress",
        ]  # fmt: skip
        if args.profile:  # py-spy samples the run and its workers' processes (slows it)
            argv = [
                str(Path(sys.executable).with_name("py-spy")), "record", "--subprocesses",
                "--format", "raw", "--rate", "50", "-o", str(args.profile), "--",
                *argv,
            ]  # fmt: skip
        phase = MapPhase(TABLE, f"s3://{BUCKET}/{out_prefix}")
        roles: dict[str, float] = {}
        done, wall, cpu = run_counted(argv, env, phase, roles)
    if done.returncode != 0:
        raise SystemExit(f"cmr run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    embedded = embedded_utilization(args, data)
    local = args.scratch / f"out-{tag}"
    fetch_output(out_prefix, local)
    try:
        ok, lines = hadoop.validate_cmr_output(local, hadoop.Env(args.scratch / f".check-{tag}"))
    finally:  # the sort's output, fetched for the check: as large as its input, each run
        shutil.rmtree(local, ignore_errors=True)
        shutil.rmtree(args.scratch / f".check-{tag}", ignore_errors=True)
    got = hadoop.checksum(lines)
    want = shuffle_wire.input_checksum(data, args.scratch / f".check-in-{args.size_mb}")
    requests: Counter[str] = Counter(aws.requests) + Counter(ddb.requests)
    shuffle_up = sum(
        v
        for k, v in aws.kind_bytes.items()
        if k.endswith("@shuffle") and ("UploadPart" in k or "PutObject" in k)
    )
    return {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "size_mb": args.size_mb,
        "scheme": scheme,
        "input_bytes": input_bytes,
        "split_mb": args.split_mb,
        "reducers": args.reducers,
        "memory_mb": args.memory_mb,
        "workers": args.workers,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "cpu_s_per_gb": round(cpu / (input_bytes / GB), 2),
        "cpu_s_by_process": roles,
        # The CPU spent before the last map task committed (reducers fetch the winners'
        # parts meanwhile): what the model's --map-cpu-share stands for.
        "maps_done_s": None if phase.at_s is None else round(phase.at_s, 2),
        "map_cpu_share": None if phase.cpu_s is None else round(phase.cpu_s / cpu, 3),
        # Here, where LocalStack and moto share the two cores: not the fleet's figure.
        "utilization_on_the_stack": round(cpu / (wall * (os.cpu_count() or 1)), 3),
        "embedded": embedded,
        "utilization": embedded["utilization"],
        "shuffle_bytes": shuffle_up,
        "compression": round(input_bytes / max(1, shuffle_up), 3),
        "valid": bool(ok and got is not None and got == want),
        "check": f"TeraValidate {'ok' if ok else 'FAILED'}, checksum {got} vs input's {want}",
        "requests": dict(sorted(requests.items())),
        "s3_by_kind": dict(sorted(aws.by_kind.items())),
        "s3_bytes_by_kind": dict(sorted(aws.kind_bytes.items())),
        "sqs_billed": aws.sqs_billed,
        "dynamodb_bytes_down": ddb.bytes_down.get("dynamodb", 0),
        "dynamodb_bytes_up": ddb.bytes_up.get("dynamodb", 0),
    }


# ------------------------------------------------------------------------------ the model

MIB = 1024 * 1024
S3_COPY_PART = s3.COPY_PART_BYTES
S3_COPY_MAX = s3.COPY_MAX_BYTES
SQS_LONG_POLL_S = 20  # an idle slot's receive waits this long (cmr.settings: poll_s)


def item_bytes(item: dict[str, Any]) -> int:
    """An item's size as DynamoDB bills it: names plus values (numbers ~ their digits)."""

    def size(v: Any) -> int:
        if isinstance(v, bytes | str):
            return len(v.encode() if isinstance(v, str) else v)
        if isinstance(v, bool) or v is None:
            return 1
        if isinstance(v, int | float):
            return 1 + (len(str(abs(v))) + 1) // 2
        if isinstance(v, dict):
            return 3 + sum(len(k) + 1 + size(x) for k, x in v.items())
        if isinstance(v, list | tuple):
            return 3 + sum(1 + size(x) for x in v)
        return len(str(v))

    return sum(len(k) + size(v) for k, v in item.items())


def commit_bytes(reducers: int, part_bytes: int, records: int) -> int:
    """A map commit record of a blob-shuffle attempt with every partition non-empty."""
    parts = {p: (p * part_bytes, part_bytes, b"d" * PART_DIGEST) for p in range(reducers)}
    commit = MapCommit(
        "0123456789ab",
        {p: max(1, part_bytes // (256 * 1024)) for p in range(reducers)},
        {p: records for p in range(reducers)},
        reducers * records,
        reducers * part_bytes,
        {},
        parts,
    )
    return item_bytes(
        {"pk": "job#20260101-000000-0123456789abcdef", "sk": "map#00000000", **commit.to_item()}
    )


def page_bytes(part_bytes: int, records: int) -> int:
    """A full page of a paged blob attempt (every one of its partitions with a part)."""
    parts = {p: (p * part_bytes, part_bytes, b"d" * PART_DIGEST) for p in range(PAGE_PARTITIONS)}
    counts = {p: max(1, part_bytes // (256 * 1024)) for p in range(PAGE_PARTITIONS)}
    page = MapPage.of(0, parts, counts, {p: records for p in range(PAGE_PARTITIONS)})
    key = {"pk": "job#20260101-000000-0123456789abcdef", "sk": page_sk(0, "0" * 12, 0)}
    return item_bytes({**key, **page.to_item()})


def upload_requests(size: float) -> int:
    """PUT-class requests of cmr's upload of a file (cmr.backends.aws.s3.upload_file)."""
    if size <= parts.PART_BYTES:
        return 1
    return 2 + math.ceil(size / parts.part_bytes(int(size)))


def copy_requests(size: float) -> int:
    """PUT-class requests of a server-side copy (publishing a part to the output)."""
    return 1 if size <= S3_COPY_MAX else 2 + math.ceil(size / S3_COPY_PART)


def shape(
    d_bytes: float, split: float, reducers: int, memory_mb: int, ratio: float
) -> dict[str, float]:
    """The blob shuffle's request terms that grow with the data, by the protocol's
    structure (cmr's own constants): per job."""
    maps = math.ceil(d_bytes / split)
    per_map = d_bytes / maps
    obj = per_map / ratio
    part = obj / reducers
    piece = max(bulk.PIECE_MIN, min(bulk.PIECE_BYTES, memory_mb * MIB // 16))
    out = d_bytes / reducers
    return {
        "maps": maps,
        "input_get": maps
        * (math.ceil(per_map / rangefile.PIECE_BYTES) if rangefile.streams(int(per_map)) else 1),
        "shuffle_put": maps * upload_requests(obj),
        "shuffle_get": maps * reducers * math.ceil(part / piece),
        "output_put": reducers * upload_requests(out),
        "publish_copy": reducers * copy_requests(out),
    }


def predicted_vs_measured(m: dict[str, Any]) -> list[dict[str, Any]]:
    """Each scaling term as the model has it for the measured run, and as counted."""
    k = Counter(m["s3_by_kind"])
    put = (
        "s3.PutObject",
        "s3.UploadPart",
        "s3.CreateMultipartUpload",
        "s3.CompleteMultipartUpload",
    )
    measured = {
        "input_get": k["s3.GetObject@input"],
        "shuffle_put": sum(k[f"{op}@shuffle"] for op in put),
        "shuffle_get": k["s3.GetObject@shuffle"],
        "output_put": sum(k[f"{op}@scratch-output"] for op in put),
        "publish_copy": k["s3.CopyObject@output"]
        + k["s3.UploadPart@output"]
        + k["s3.CreateMultipartUpload@output"]
        + k["s3.CompleteMultipartUpload@output"],
    }
    modelled = shape(
        m["input_bytes"], m["split_mb"] * 1e6, m["reducers"], m["memory_mb"], m["compression"]
    )
    return [{"term": t, "modelled": modelled[t], "measured": measured[t]} for t in measured]


NETWORK_EFFICIENCY = 0.8  # of an instance's sustained bandwidth, as S3 transfers get it


def _price(prices: dict[str, Any], name: str) -> float:
    p = prices["prices"][name]
    return float(p["usd"]) / float(p["per"])


# What each pass of a sort moves through a worker's local disk, (written, read) bytes, for
# the code as built ("built") and as it was at e0f2188 (2026-11-28 14:20). Rows' msgpack
# framing (8 bytes a 100-byte record) is left out.
DISK_CODES = ("built", "e0f2188")


def disk_traffic(
    d: float, maps: int, reducers: int, ratio: float, memory_mb: int, code: str = "built"
) -> dict[str, tuple[float, float]]:
    if code not in DISK_CODES:
        raise ValueError(f"no disk passes known for code {code!r}: one of {DISK_CODES}")
    split = d / maps
    part = d / reducers
    built = code == "built"
    passes: dict[str, tuple[float, float]] = {}
    if rangefile.streams(int(split)) and not built:  # now streamed into the pool (FIFOs)
        passes["map: the split copied to local files"] = (d, d)
    # The spool: read once to index it, once to make the object (at e0f2188, its file,
    # then read to upload it; now streamed to the store as it is made).
    passes["map: the spool (compressed)"] = (d / ratio, 2 * d / ratio)
    if not built:
        passes["map: the object's file, read to upload it"] = (d / ratio, d / ratio)
    passes["reduce: the fetched parts, decompressed"] = (d, d)
    # Past the reducer's memory, sorted runs of its rows (each record held at ~3.3 times
    # its size, cmr.cpu.fixedsort.Layout.held), merged at most MERGE_FANIN at a time.
    held = 3.3 * part
    budget = memory_mb * MIB
    if held > budget:
        runs = math.ceil(held / budget)
        merges = max(1, math.ceil(math.log(runs, MERGE_FANIN)))
        passes["reduce: sorted runs"] = (d * merges, d * merges)
    if not built:  # now streamed to the store as the pool writes it (cmr.poolpipe)
        passes["reduce: the output file, read to upload it"] = (d, d)
    return passes


def bill(
    m: dict[str, Any],
    wire: dict[str, Any] | None,
    *,
    tb: float,
    instance: str,
    instances: int,
    split_gb: float,
    reducers: int,
    memory_mb: int,
    design: str,
    map_cpu_share: float = 0.5,
    nvme_read_mb_s: float = 0.0,
    nvme_write_mb_s: float = 0.0,
    code: str = "built",
) -> dict[str, Any]:
    """One row: the sort's dollars by what they pay for, its requests, and its time.

    ``design``: "blob" (the blob shuffle as built: reducers learn the winners from their
    commit records, polling the table from the lowest task whose winner they do not know,
    less often the more partitions, and read their page of each winner's parts);
    "blob-unpaged" (as it was built first, until 2026-11-28: each commit record named every
    partition's part, and reducers polled every 0.25 to 1 s); "queue" (the batch path: map
    output as batches in SQS messages)."""
    req_prices = json.loads((HERE / "aws_prices.json").read_text())
    ec2 = json.loads((HERE / "cloudsort_prices.json").read_text())
    kind_of = ec2["instances"][instance]
    d = tb * 1e12
    d_gb = d / GB
    ratio = float(m["compression"])
    vcpus = int(kind_of["vcpus"])
    slots = instances * vcpus  # `cmr worker --processes VCPUS`: a map and a reduce slot each
    util = float(m["utilization"])
    cpu_s = d_gb * float(m["cpu_s_per_gb"])
    t_cpu = cpu_s / (slots * util)
    # EC2's bandwidth is each way at once ("up to 10 Gbps for inbound traffic and,
    # simultaneously, up to 10 Gbps for outbound", the EC2 user guide's "Amazon EC2 instance
    # network bandwidth"), and S3 in the region may use all of it. But a sort's two big
    # transfers cannot overlap: no reducer writes output before every map task has read
    # its input. While maps run: in, the input; out, the shuffle. Then: in, the shuffle
    # (taken as read after the maps, the slower case); out, the output. Each phase is
    # bound by its busier direction. (Until 2026-11-28 this added all four: d(2 + 2/r);
    # then, for a few hours, took the busier direction of the whole: d(1 + 1/r), which a
    # review showed no sort can reach.)
    per_instance_bps = float(kind_of["network_gbps"]) * 1e9 / 8 * NETWORK_EFFICIENCY
    net_mapping = max(d, d / ratio) / instances / per_instance_bps
    net_reducing = max(d / ratio, d) / instances / per_instance_bps
    t_net = net_mapping + net_reducing
    sh = shape(d, split_gb * GB, reducers, memory_mb, ratio)
    maps = int(sh["maps"])
    tasks = maps + reducers
    # The local disk: what each pass of the code writes and reads (disk_traffic), over
    # the instance store's write and read rates (sharing its drives), or an EBS volume's.
    traffic = disk_traffic(d, maps, reducers, ratio, memory_mb, code)
    written = sum(w for w, _ in traffic.values())
    read = sum(r for _, r in traffic.values())
    split = d / maps
    part = d / reducers
    footprint_gb = vcpus * max(split * (1 + 2 / ratio), part * (1 / ratio + 2)) / GB
    nvme = "nvme_gb" in kind_of
    if nvme:
        write_mb_s = nvme_write_mb_s or float(kind_of["nvme_write_mb_s"])
        read_mb_s = nvme_read_mb_s or float(kind_of["nvme_read_mb_s"])
    else:
        write_mb_s = read_mb_s = float(ec2["ebs_gp3_max_mb_s"])
    t_disk = (written / write_mb_s + read / read_mb_s) / 1e6 / instances
    # Each phase takes its CPU or its network time, whichever is longer: ``map_cpu_share``
    # of the CPU falls while maps run (0.5 unless asked). Never shorter than all the CPU
    # or all the network time; longer when a phase's CPU and the other's network dominate.
    t_phases = max(map_cpu_share * t_cpu, net_mapping) + max(
        (1 - map_cpu_share) * t_cpu, net_reducing
    )
    t = max(t_disk, t_phases)
    if t_disk >= t_phases:
        bound_by = "disk"
    elif math.isclose(t_phases, max(t_cpu, t_net), rel_tol=1e-9):
        bound_by = "cpu" if t_cpu >= t_net else "network"
    else:
        bound_by = "cpu and network by phase"

    # What the measured run did beyond the scaling terms (sampling at submit, the plan,
    # manifests, small records), counted per task: an overstatement, as part is per job.
    measured_maps = shape(
        m["input_bytes"], m["split_mb"] * 1e6, m["reducers"], m["memory_mb"], ratio
    )["maps"]
    measured_tasks = measured_maps + m["reducers"]
    req = Counter(m["requests"])
    put_ops = set(req_prices["s3_operations"]["put_copy_post_list"])
    get_ops = set(req_prices["s3_operations"]["get_and_other"])
    scaling = {r["term"]: r["measured"] for r in predicted_vs_measured(m)}
    s3_put_rest = sum(n for op, n in req.items() if op.removeprefix("s3.") in put_ops) - (
        scaling["shuffle_put"] + scaling["output_put"] + scaling["publish_copy"]
    )
    s3_get_rest = sum(n for op, n in req.items() if op.removeprefix("s3.") in get_ops) - (
        scaling["input_get"] + scaling["shuffle_get"]
    )
    s3_put = (
        sh["shuffle_put"]
        + sh["output_put"]
        + sh["publish_copy"]
        + s3_put_rest / measured_tasks * tasks
    )
    s3_get = sh["input_get"] + s3_get_rest / measured_tasks * tasks
    if design != "queue":
        s3_get += sh["shuffle_get"]
    else:
        s3_put -= sh["shuffle_put"]

    # DynamoDB. Writes: the measured run's write requests per task beyond the scaling
    # terms, each of one unit, twice for a transaction (DynamoDB's rule); then each map's
    # commit record and its pages. Reads: each reducer reads its page of each winner, and
    # the reducers running at once poll the table while map commits arrive: every
    # ``fast`` s while a poll finds a new one, backing off to ``most`` s; each poll reads
    # the commits from the lowest unknown task on, about half the map tasks in flight.
    writes = sum(
        req[op] for op in ("dynamodb.PutItem", "dynamodb.UpdateItem", "dynamodb.DeleteItem")
    )
    transacts = req["dynamodb.TransactWriteItems"] - measured_maps  # pages: one per map
    gets = req["dynamodb.GetItem"] - measured_maps * m["reducers"]  # pages read
    per_task = ((writes + 2 * transacts) / measured_tasks, gets / measured_tasks)
    part_bytes = int(d / maps / ratio / reducers)
    pages = pages_for(reducers)
    if design == "blob":  # as built: paged
        commit = commit_bytes(1, part_bytes, 1000)
        page = page_bytes(part_bytes, 1000)
        wru = maps * 2 * (math.ceil(commit / 1024) + pages * math.ceil(page / 1024))
        page_reads = maps * reducers * math.ceil(page / 4096)
        fast, most = bulk.poll_intervals(reducers)
    else:  # before paging (2026-11-28 morning), and the queue path: every part in the record
        commit = commit_bytes(reducers, part_bytes, 1000)
        wru = maps * 2 * math.ceil(commit / 1024)
        page_reads = 0
        fast, most = bulk.poll_intervals(1)  # as a small job's reducers still poll
    wru += per_task[0] * tasks
    running = min(reducers, slots)
    rate = maps / t
    interval = min(most, max(fast, 1 / rate))
    polls = running * t / interval
    window = min(maps, slots) / 2
    # A strongly consistent read costs a unit per 4 KB, an eventual one half that. The code
    # as built polls and reads pages eventually (a commit and its pages are written once);
    # at e0f2188, and before paging, both were strong.
    per_4kb = 0.5 if design == "blob" and code == "built" else 1.0
    per_poll_rru = per_4kb * max(1, math.ceil(window * commit / 4096))
    rru = polls * per_poll_rru + per_4kb * page_reads + per_task[1] * tasks
    if design == "queue":
        polls = per_poll_rru = 0
        rru = (gets + req["dynamodb.Query"]) / measured_tasks * tasks

    # SQS: task messages (sent ten at a time, received and deleted), lease renewals every
    # third of a 60 s visibility while a task runs, idle long polls of every slot.
    map_s = split_gb * float(m["cpu_s_per_gb"]) / util
    sqs = tasks / 10 + 2 * tasks + maps * map_s / 20 + 2 * slots * t / SQS_LONG_POLL_S
    if design == "queue" and wire is not None:
        per_gb = [r for r in wire["runs"] if r["shuffle"] == "queue"]
        biggest = max(per_gb, key=lambda r: r["size_mb"])
        sqs += biggest["sqs_billed"] / (biggest["size_mb"] * 1e6 / GB) * d_gb

    hours = t / 3600
    dollars = {
        "instances": instances * hours * float(kind_of["usd_hour"]),
        "ebs": 0.0
        if nvme
        else instances
        * footprint_gb
        * float(ec2["ebs_gp3_gb_month"])
        * hours
        / ec2["hours_per_month"],
        "s3_storage": (0 if design == "queue" else d_gb / ratio)
        * float(ec2["s3_standard_gb_month"])
        * hours
        / ec2["hours_per_month"],
        "s3_put": s3_put * _price(req_prices, "s3_standard_put_copy_post_list"),
        "s3_get": s3_get * _price(req_prices, "s3_standard_get_and_other"),
        "dynamodb": wru * _price(req_prices, "dynamodb_on_demand_write_request_unit")
        + rru * _price(req_prices, "dynamodb_on_demand_read_request_unit"),
        "sqs": sqs * _price(req_prices, "sqs_standard_request"),
    }
    total = sum(dollars.values())
    requests_usd = dollars["s3_put"] + dollars["s3_get"] + dollars["dynamodb"] + dollars["sqs"]
    return {
        "design": design,
        "tb": tb,
        "fleet": f"{instances} x {instance} ({slots} vCPUs, `cmr worker --processes {vcpus}`)",
        "maps": maps,
        "reducers": reducers,
        "hours": round(hours, 2),
        "bound_by": bound_by,
        "seconds_if_bound_by": {
            "cpu": round(t_cpu),
            "network": round(t_net),
            "disk": round(t_disk),
            "phases": round(t_phases),
        },
        "disk_gb_per_instance": round(footprint_gb),
        # Bytes each pass moves through the local disk per input byte: (written, read).
        "disk_passes": {k: (round(w / d, 2), round(r / d, 2)) for k, (w, r) in traffic.items()},
        "disk_bytes_per_input_byte": (round(written / d, 2), round(read / d, 2)),
        "disk_mb_s_per_instance": round((written + read) / instances / t / 1e6),
        "disk_fits": (not nvme) or footprint_gb <= float(kind_of["nvme_gb"]),
        "usd": {k: round(v, 2) for k, v in dollars.items()},
        "usd_total": round(total, 2),
        "usd_per_tb": round(total / tb, 3),
        "requests_share": round(requests_usd / total, 3),
        "requests_per_gb": {
            "s3": round((s3_put + s3_get) / d_gb, 1),
            "dynamodb_units": round((wru + rru) / d_gb, 1),
            "sqs_billed": round(sqs / d_gb, 2),
        },
        "commit_record_bytes": commit,
        # All on the job's one partition key: DynamoDB serves one partition at most 3,000
        # read and 1,000 write units a second, unless it splits it by sort key for heat.
        "table_read_units_per_s": round(rru / t),
        "table_write_units_per_s": round(wru / t),
        "reducer_polls": round(polls),
        "units_per_poll": per_poll_rru,
    }


def markdown(rows: list[dict[str, Any]], checks: list[dict[str, Any]], m: dict[str, Any]) -> str:
    out = [
        f"Measured here ({m['when']}, {m['machine']}): TeraSort of {m['size_mb']} MB S3 to S3 on "
        f"the local stack, {m['workers']} workers, {m['reducers']} reducers, splits of "
        f"{m['split_mb']} MB, --memory-mb {m['memory_mb']}: {m['wall_s']} s, "
        f"{m['cpu_s_per_gb']} CPU s per GB, utilization {m['utilization']}, the shuffle "
        f"compressed {m['compression']}x; {m['check']}; over {m.get('scheme', 'http')}."
        + (
            f" CPU seconds of each run: {m['cpu_runs']} (whole runs: "
            f"{m['cpu_s_per_gb_whole_run']} s per GB)."
            if "cpu_runs" in m
            else ""
        ),
        "",
        "| term (measured run) | modelled | measured |",
        "|---|---:|---:|",
        *(f"| {c['term']} | {c['modelled']:,} | {c['measured']:,} |" for c in checks),
        "",
        "| design | fleet | hours | instances $ | S3 PUT $ | S3 GET $ | S3 storage $ "
        "| EBS $ | DynamoDB $ | SQS $ | $/TB | requests share | bound by | CPU s/GB for $0.97/TB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        u = r["usd"]
        out.append(
            f"| {r['design']} | {r['fleet']} | {r['hours']} | {u['instances']:,.2f} | "
            f"{u['s3_put']:,.2f} | {u['s3_get']:,.2f} | {u['s3_storage']:,.2f} | "
            f"{u['ebs']:,.2f} | {u['dynamodb']:,.2f} | {u['sqs']:,.2f} | "
            f"**{r['usd_per_tb']:,.3f}** | {r['requests_share']:.1%} | {r['bound_by']} | "
            f"{r.get('cpu_s_per_gb_for_record') or 'none'} |"
        )
    return "\n".join(out) + "\n"


def break_even(m: dict[str, Any], wire: Any, design: str, options: dict[str, Any]) -> float | None:
    """The CPU seconds per GB at which this design's sort would cost the record's $/TB
    (None: not even at none, or already under it at 1,000)."""
    record = json.loads((HERE / "cloudsort_prices.json").read_text())["cloudsort_record"]
    target = float(record["usd_per_tb"])

    def cost(rate: float) -> float:
        return float(
            bill({**m, "cpu_s_per_gb": rate}, wire, design=design, **options)["usd_per_tb"]
        )

    lo, hi = 0.01, 1000.0
    if cost(lo) > target or cost(hi) <= target:
        return None
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cost(mid) <= target else (lo, mid)
    return round(lo, 1)


def cpu_slope(small: list[dict[str, Any]], large: list[dict[str, Any]]) -> dict[str, Any]:
    """CPU seconds per extra GB between runs of two sizes (the median run of each): what a
    GB more costs, without what every run pays once whatever its size (each process's
    start, the job's submission and sampling, its last reducer's tail), which a 100 TB sort
    pays once per worker, not per GB."""

    def median(runs: list[dict[str, Any]]) -> tuple[float, float]:
        cpu = statistics.median(float(r["cpu_s"]) for r in runs)
        return cpu, float(runs[0]["input_bytes"])

    (c1, b1), (c2, b2) = median(small), median(large)
    sizes = [{int(r["input_bytes"]) for r in runs} for runs in (small, large)]
    if sizes != [{int(b1)}, {int(b2)}] or b2 <= b1:
        raise SystemExit("--measured and --larger: runs of one size each, --larger's larger")
    return {
        "cpu_s_per_gb": round((c2 - c1) / ((b2 - b1) / GB), 2),
        "runs": {
            f"{b1 / 1e6:.0f} MB": sorted(float(r["cpu_s"]) for r in small),
            f"{b2 / 1e6:.0f} MB": sorted(float(r["cpu_s"]) for r in large),
        },
    }


def model_main(args: argparse.Namespace) -> int:
    runs = [json.loads(p.read_text()) for p in args.measured]
    m = runs[0]
    if len(runs) > 1:  # this machine's speed moves from one minute to the next
        m = {
            **m,
            "cpu_s_per_gb": statistics.median(float(r["cpu_s_per_gb"]) for r in runs),
            "utilization": statistics.median(float(r["utilization"]) for r in runs),
        }
    if args.larger:
        larger = [json.loads(p.read_text()) for p in args.larger]
        slope = cpu_slope(runs, larger)
        m = {
            **m,
            "utilization": statistics.median(float(r["utilization"]) for r in runs + larger),
            "cpu_s_per_gb_whole_run": m["cpu_s_per_gb"],
            "cpu_s_per_gb": slope["cpu_s_per_gb"],
            "cpu_runs": slope["runs"],
            "when": m["when"] + " (CPU per GB: the slope between two sizes)",
        }
    if args.cpu_s_per_gb is not None:
        m = {
            **m,
            "cpu_s_per_gb": args.cpu_s_per_gb,
            "when": m["when"] + " (CPU per GB set by hand)",
        }
    wire = json.loads(args.wire.read_text()) if args.wire.exists() else None
    options = dict(
        tb=args.tb, instance=args.instance, instances=args.instances, split_gb=args.split_gb,
        reducers=args.reducers, memory_mb=args.memory_mb, map_cpu_share=args.map_cpu_share,
        nvme_read_mb_s=args.nvme_read_mb_s, nvme_write_mb_s=args.nvme_write_mb_s,
        code=args.code,
    )  # fmt: skip
    designs = ("blob", "blob-unpaged", "queue")
    rows = [bill(m, wire, design=d, **options) for d in designs]  # type: ignore[arg-type]
    for row in rows:
        row["cpu_s_per_gb_for_record"] = break_even(m, wire, row["design"], options)
    checks = predicted_vs_measured(m)
    text = markdown(rows, checks, m)
    print(text)
    if args.json:
        args.json.write_text(
            json.dumps({"measured": m, "checks": checks, "rows": rows}, indent=2) + "\n"
        )
    if args.markdown:
        args.markdown.write_text(text)
    return 0


def share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a share between 0 and 1")
    return value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    me = sub.add_parser("measure", help="a sort on the local stack, every request counted")
    me.add_argument("--size-mb", type=int, default=1000)
    me.add_argument("--split-mb", type=float, default=256)
    me.add_argument("--reducers", type=int, default=8)
    me.add_argument("--memory-mb", type=int, default=64)
    me.add_argument("--workers", type=int, default=2)
    me.add_argument("--data", type=Path, default=HERE / "data")
    me.add_argument("--scratch", type=Path, default=HERE / "out" / "cloudsort")
    me.add_argument("--json", type=Path)
    me.add_argument(
        "--https",
        action="store_true",
        help="speak https to the counting proxies, as a fleet does to AWS (botocore signs "
        "no payload over TLS; over http it hashes every one)",
    )
    me.add_argument(
        "--profile",
        type=Path,
        help="record the run with py-spy (collapsed stacks, every process) into this file; "
        "its CPU figures then include the sampler's",
    )
    mo = sub.add_parser("model", help="the bill of a large sort, from a measured run")
    mo.add_argument(
        "--measured",
        type=Path,
        nargs="+",
        required=True,
        help="measure's output; several runs of one size: the first's requests, and with "
        "--larger the median CPU and utilization",
    )
    mo.add_argument(
        "--larger",
        type=Path,
        nargs="*",
        help="measure's runs of a larger size: the CPU per GB is then the slope between "
        "the two sizes' median runs, without what each run pays once",
    )
    mo.add_argument("--wire", type=Path, default=HERE / "results-shuffle-wire.json")
    mo.add_argument("--tb", type=float, default=100)
    mo.add_argument("--instance", default="i4i.8xlarge")
    mo.add_argument("--instances", type=int, default=40)
    mo.add_argument("--split-gb", type=float, default=32)
    mo.add_argument("--reducers", type=int, default=1280)
    mo.add_argument("--memory-mb", type=int, default=4096)
    mo.add_argument(
        "--nvme-read-mb-s",
        type=float,
        default=0.0,
        help="what an instance's NVMe store reads, MB/s (default: the price table's, "
        "ScyllaDB's iotune figures)",
    )
    mo.add_argument(
        "--nvme-write-mb-s",
        type=float,
        default=0.0,
        help="what an instance's NVMe store writes, MB/s (default: the price table's)",
    )
    mo.add_argument(
        "--code",
        choices=DISK_CODES,
        default="built",
        help="whose local disk passes: the code as built, or as it was at e0f2188",
    )
    mo.add_argument(
        "--map-cpu-share",
        type=share,
        default=0.5,
        help="the share of the CPU spent while map tasks run (not measured; the phases' "
        "network times do not overlap, so an uneven split lengthens the sort)",
    )
    mo.add_argument(
        "--cpu-s-per-gb",
        type=float,
        help="instead of the measured figure: what if cmr's CPU per GB were this",
    )
    mo.add_argument("--json", type=Path)
    mo.add_argument("--markdown", type=Path)
    args = ap.parse_args()
    if args.command == "measure":
        result = measure(args)
        text = json.dumps(result, indent=2)
        print(text)
        print(json.dumps(predicted_vs_measured(result), indent=2))
        if args.json:
            args.json.write_text(text + "\n")
        return 0 if result["valid"] else 1
    return model_main(args)


if __name__ == "__main__":
    sys.exit(main())
