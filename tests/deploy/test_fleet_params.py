"""`cmr fleet up`'s parameter resolution, without any server: the command line wins, then the
existing stack's values, then the defaults."""

from __future__ import annotations

import re
import secrets
import zipfile
from pathlib import Path

import pytest

from cmr.admission import Admission
from cmr.errors import FleetError
from cmr.fleet.params import (
    DEFAULTS,
    Found,
    UpOptions,
    bucket_name,
    idle_periods,
    needs_account,
    needs_network,
    resolve,
)
from cmr.fleet.wheel import not_in_wheel, wheel_modules
from cmr.job import JobRef
from cmr.loadgen.job import JOB as LOADGEN_JOB
from tests.deploy.conftest import ROOT

WHEEL = f"fleet/wheels/{'a' * 64}/cmr-0.1.0-py3-none-any.whl"
WHEEL2 = f"fleet/wheels/{'c' * 64}/cmr-0.1.0-py3-none-any.whl"
LOCK = f"fleet/locks/{'b' * 64}/requirements.txt"
NEW = Found(
    region="eu-west-1",
    wheel_key=WHEEL,
    lock_key=LOCK,
    account="123456789012",
    suffix="0badc0de",
    network=("vpc-1", ["subnet-a", "subnet-b"]),
)
PREVIOUS = {
    **DEFAULTS,
    "TableName": "jobs",
    "InstanceType": "m7i.large",
    "BucketName": "my-bucket",
    "CreateBucket": "true",
    "CreateTable": "false",
    "DesiredCount": "3",
    "MaxCount": "5",
    "VpcId": "vpc-9",
    "SubnetIds": "['subnet-x', 'subnet-y']",  # as moto reports a list parameter
    "ImageId": "/aws/service/ami-amazon-linux-latest/al2023",
}


def test_a_new_stack_gets_the_defaults() -> None:
    params = resolve(UpOptions(), NEW)
    assert params == {
        **DEFAULTS,
        "BucketName": "cmr-123456789012-eu-west-1-0badc0de",
        "CreateBucket": "true",
        "CreateTable": "true",
        "WheelKey": WHEEL,
        "LockKey": LOCK,
        "DesiredCount": "1",
        "VpcId": "vpc-1",
        "SubnetIds": "subnet-a,subnet-b",
        "IdlePeriods": "1",
    }


def test_existing_bucket_and_table_are_not_made_by_a_new_stack() -> None:
    found = Found(**{**NEW.__dict__, "bucket_exists": True, "table_exists": True})
    params = resolve(UpOptions(), found)
    assert (params["CreateBucket"], params["CreateTable"]) == ("false", "false")
    forced = resolve(UpOptions(create_table=True), found)
    assert forced["CreateTable"] == "true"


def test_options_are_written_as_cloudformation_strings() -> None:
    opts = UpOptions(
        count=4, spot=True, on_demand_base=1, max_count=2, processes=8, idle_exit=301, image="ami"
    )
    params = resolve(opts, NEW)
    assert params["Spot"] == "true"
    assert params["OnDemandBase"] == "1"
    assert params["Processes"] == "8"
    assert params["DesiredCount"] == "4"
    assert params["MaxCount"] == "4"  # raised to the count asked for
    assert params["IdlePeriods"] == "2"  # 301 s is more than one 5-minute period
    assert params["ImageId"] == "ami"


def test_an_update_keeps_what_is_not_restated() -> None:
    found = Found(
        region="eu-west-1", wheel_key=WHEEL2, lock_key=LOCK, previous=PREVIOUS, group_desired=2
    )
    assert not needs_account(UpOptions(), PREVIOUS)
    assert not needs_network(UpOptions(), PREVIOUS)
    params = resolve(UpOptions(processes=4), found)
    assert params["TableName"] == "jobs"
    assert params["InstanceType"] == "m7i.large"
    assert params["Processes"] == "4"
    assert params["BucketName"] == "my-bucket"
    assert (params["CreateBucket"], params["CreateTable"]) == ("true", "false")
    assert params["DesiredCount"] == "2"  # the group's current capacity, not the stack's 3
    assert params["MaxCount"] == "5"
    assert (params["VpcId"], params["SubnetIds"]) == ("vpc-9", "subnet-x,subnet-y")
    assert params["ImageId"] == "/aws/service/ami-amazon-linux-latest/al2023"
    assert params["WheelKey"] == WHEEL2


def test_an_update_without_a_group_keeps_the_stack_count() -> None:
    found = Found(region="eu-west-1", wheel_key=WHEEL, lock_key=LOCK, previous=PREVIOUS)
    assert resolve(UpOptions(), found)["DesiredCount"] == "3"


def test_a_resolved_ami_id_is_not_passed_back() -> None:
    previous = {**PREVIOUS, "ImageId": "ami-0123456789"}
    found = Found(region="eu-west-1", wheel_key=WHEEL, lock_key=LOCK, previous=previous)
    assert "ImageId" not in resolve(UpOptions(), found)


def test_new_network_options_need_a_lookup() -> None:
    opts = UpOptions(subnets=("subnet-z",))
    assert needs_network(opts, PREVIOUS)
    found = Found(
        region="r",
        wheel_key=WHEEL,
        lock_key=LOCK,
        previous=PREVIOUS,
        network=("vpc-2", ["subnet-z"]),
    )
    params = resolve(opts, found)
    assert (params["VpcId"], params["SubnetIds"]) == ("vpc-2", "subnet-z")
    with pytest.raises(FleetError, match="not looked up"):
        resolve(opts, Found(region="r", wheel_key=WHEEL, lock_key=LOCK, previous=PREVIOUS))


def test_bucket_names() -> None:
    assert needs_account(UpOptions(), {})
    assert bucket_name(UpOptions(bucket="b"), PREVIOUS, "", "r", "") == "b"
    assert bucket_name(UpOptions(), PREVIOUS, "", "r", "") == "my-bucket"
    assert (
        bucket_name(UpOptions(), {}, "42", "us-east-1", "0123abcd") == "cmr-42-us-east-1-0123abcd"
    )
    with pytest.raises(FleetError, match="--bucket"):
        bucket_name(UpOptions(), {}, "", "r", "0123abcd")
    with pytest.raises(FleetError, match="random suffix"):
        bucket_name(UpOptions(), {}, "42", "r", "")


def test_a_new_default_bucket_name_cannot_be_guessed() -> None:
    """Bucket names are global: the old default, cmr-<account>-<region>, could be created by
    anyone who knew the account id before the fleet's first `up`."""
    names = {
        resolve(UpOptions(), Found(**{**NEW.__dict__, "suffix": secrets.token_hex(4)}))[
            "BucketName"
        ]
        for _ in range(20)
    }
    assert len(names) == 20
    assert all(re.fullmatch(r"cmr-123456789012-eu-west-1-[0-9a-f]{8}", n) for n in names)
    assert all(len(n) <= 63 for n in names)


@pytest.mark.parametrize(
    ("opts", "flag"),
    [
        (UpOptions(bucket="b'; touch /tmp/x; '"), "--bucket"),
        (UpOptions(table="t$(id)"), "--table"),
        (UpOptions(queue_prefix="p`id`"), "--queue-prefix"),
        (UpOptions(instance_type="c7i.large; reboot"), "--instance-type"),
        (UpOptions(processes=0), "--processes"),
        (UpOptions(idle_exit=-5), "--idle-exit"),
    ],
)
def test_values_that_could_reach_a_shell_are_refused(opts: UpOptions, flag: str) -> None:
    with pytest.raises(FleetError, match=f"^{flag} .* is not allowed: the fleet's") as err:
        resolve(opts, NEW)
    assert "\n" not in str(err.value)


def test_keys_of_another_form_are_refused() -> None:
    for found in (
        Found(**{**NEW.__dict__, "wheel_key": "fleet/wheels/abc/cmr.whl"}),  # a short digest
        Found(**{**NEW.__dict__, "lock_key": "other/requirements.txt"}),
    ):
        with pytest.raises(FleetError, match="key"):
            resolve(UpOptions(), found)


def test_a_stack_value_of_another_form_is_refused() -> None:
    """An update re-checks what the stack holds too: a value no `up` wrote is not passed on."""
    previous = {**PREVIOUS, "QueuePrefix": "a'b"}
    with pytest.raises(FleetError, match="--queue-prefix"):
        resolve(UpOptions(), Found(region="r", wheel_key=WHEEL, lock_key=LOCK, previous=previous))


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(FleetError, match="--count -1"):
        resolve(UpOptions(count=-1), NEW)


def test_idle_periods_round_up_to_whole_alarm_periods() -> None:
    assert [idle_periods(s) for s in (0, 1, 300, 301, 900)] == [1, 1, 1, 2, 3]


BUCKET = "cmr-123456789012-eu-west-1-0badc0de"  # NEW's bucket


def test_a_new_fleet_serves_the_wheels_load_generator_job_only() -> None:
    """The default the instances get: the one job module the wheel ships, which is what
    `cmr loadgen` submits; a job file given by path (relative to the client's directory, so
    nowhere on an instance) is refused, as is any module outside the list."""
    params = resolve(UpOptions(), NEW)
    assert (params["JobsFrom"], params["OutputsUnder"]) == ("cmr.loadgen.job", "")
    assert LOADGEN_JOB.startswith(params["JobsFrom"] + ":")
    admission = Admission.of(params["JobsFrom"].split(), [], f"s3://{BUCKET}/cmr")
    assert admission.code_refusal(JobRef.parse(LOADGEN_JOB)) is None
    assert admission.outputs == (f"s3://{BUCKET}/",)  # no --outputs-under: the whole bucket
    wordcount = JobRef.parse(str(ROOT / "examples" / "wordcount.py"))
    assert "see --jobs-from" in (admission.code_refusal(wordcount) or "")
    assert "see --jobs-from" in (admission.code_refusal(JobRef.parse("cmr.fleet.params")) or "")


def test_jobs_from_and_outputs_under_become_space_separated_lists() -> None:
    opts = UpOptions(
        jobs_from=("myjobs.wordcount", "cmr.loadgen.job"),
        outputs_under=(f"s3://{BUCKET}/results/", f"s3://{BUCKET}/team-a"),
    )
    params = resolve(opts, NEW)
    assert params["JobsFrom"] == "myjobs.wordcount cmr.loadgen.job"
    assert params["OutputsUnder"] == f"s3://{BUCKET}/results/ s3://{BUCKET}/team-a"


def test_an_update_keeps_the_lists_unless_restated() -> None:
    previous = {**PREVIOUS, "JobsFrom": "myjobs", "OutputsUnder": "s3://my-bucket/out/"}
    found = Found(region="eu-west-1", wheel_key=WHEEL, lock_key=LOCK, previous=previous)
    kept = resolve(UpOptions(processes=4), found)
    assert (kept["JobsFrom"], kept["OutputsUnder"]) == ("myjobs", "s3://my-bucket/out/")
    changed = resolve(UpOptions(jobs_from=("other.jobs",)), found)
    assert (changed["JobsFrom"], changed["OutputsUnder"]) == ("other.jobs", "s3://my-bucket/out/")
    # '' restores the default: the load generator's job; outputs anywhere in the bucket.
    reset = resolve(UpOptions(jobs_from=("",), outputs_under=("",)), found)
    assert (reset["JobsFrom"], reset["OutputsUnder"]) == ("cmr.loadgen.job", "")
    # A stack from before these parameters gets the defaults.
    old = Found(region="eu-west-1", wheel_key=WHEEL, lock_key=LOCK, previous=PREVIOUS)
    assert (resolve(UpOptions(), old)["JobsFrom"], resolve(UpOptions(), old)["OutputsUnder"]) == (
        "cmr.loadgen.job",
        "",
    )


@pytest.mark.parametrize(
    ("opts", "entry"),
    [
        (UpOptions(jobs_from=("examples/wordcount.py",)), "examples/wordcount.py"),
        (UpOptions(jobs_from=("/var/lib/cmr",)), "/var/lib/cmr"),
        (UpOptions(jobs_from=("myjobs", "a;reboot")), "a;reboot"),
        (UpOptions(jobs_from=("$(id)",)), "$(id)"),
        (UpOptions(jobs_from=("cmr.*",)), "cmr.*"),
        (UpOptions(jobs_from=("a..b",)), "a..b"),
        (UpOptions(outputs_under=("file:///etc/",)), "file:///etc/"),
        (UpOptions(outputs_under=(f"s3://{BUCKET}/x'y",)), f"s3://{BUCKET}/x'y"),
        (UpOptions(outputs_under=(f"s3://{BUCKET}/*",)), f"s3://{BUCKET}/*"),
    ],
)
def test_list_entries_that_are_not_module_names_or_s3_prefixes_are_refused(
    opts: UpOptions, entry: str
) -> None:
    flag = "--jobs-from" if opts.jobs_from else "--outputs-under"
    with pytest.raises(FleetError, match=f"^{flag} {re.escape(repr(entry))} is not allowed"):
        resolve(opts, NEW)


def test_outputs_outside_the_fleets_bucket_are_refused() -> None:
    """The workers' role may write the fleet's bucket only: an output elsewhere could never
    be written, so `up` says so instead of starting workers that would fail every such job."""
    with pytest.raises(FleetError, match=r"^--outputs-under 's3://other-bucket/out/' is outside"):
        resolve(UpOptions(outputs_under=("s3://other-bucket/out/",)), NEW)
    # A bucket whose name merely starts with the fleet's is another bucket.
    with pytest.raises(FleetError, match="is outside the fleet's bucket"):
        resolve(UpOptions(outputs_under=(f"s3://{BUCKET}x/",)), NEW)


def test_a_stack_list_of_another_form_is_refused() -> None:
    previous = {**PREVIOUS, "JobsFrom": "myjobs /tmp"}
    with pytest.raises(FleetError, match=r"^--jobs-from '/tmp' is not allowed"):
        resolve(UpOptions(), Found(region="r", wheel_key=WHEEL, lock_key=LOCK, previous=previous))


def test_modules_the_wheel_installs(tmp_path: Path) -> None:
    wheel = tmp_path / "cmr-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name in ("cmr/__init__.py", "cmr/loadgen/__init__.py", "cmr/loadgen/job.py",
                     "nsjobs/count.py", "cmr/data.json", "cmr-0.1.0.dist-info/RECORD",
                     "cmr-0.1.0.data/scripts/x.py"):  # fmt: skip
            zf.writestr(name, "")
    assert wheel_modules(wheel) == {"cmr", "cmr.loadgen", "cmr.loadgen.job", "nsjobs",
                                    "nsjobs.count"}  # fmt: skip
    assert not_in_wheel(wheel, ["cmr.loadgen.job", "nsjobs", "myjobs", "cmr.job"]) == [
        "myjobs",
        "cmr.job",
    ]


def test_the_root_volume_is_sized_by_volume_gib_and_kept_on_an_update() -> None:
    """A large sort spools terabytes per instance (docs/fleet.md, "A sort of 100 TB"):
    --volume-gib sets the template's VolumeGiB, an update without it keeps the stack's, and
    a size no gp3 root volume can have is refused before anything is made."""
    assert resolve(UpOptions(volume_gib=6000), NEW)["VolumeGiB"] == "6000"
    assert (
        resolve(
            UpOptions(), Found(**{**NEW.__dict__, "previous": {**PREVIOUS, "VolumeGiB": "6000"}})
        )["VolumeGiB"]
        == "6000"
    )
    for wrong in (4, 20_000):
        with pytest.raises(FleetError, match=f"--volume-gib {wrong}"):
            resolve(UpOptions(volume_gib=wrong), NEW)


def test_memory_mb_is_auto_unless_given_and_kept_on_an_update() -> None:
    """--memory-mb sets each worker's reducer budget (the template's MemoryMb): auto, sized on
    each instance from its memory, unless given; an update without it keeps the stack's."""
    assert resolve(UpOptions(), NEW)["MemoryMb"] == "auto"
    assert resolve(UpOptions(memory_mb=4096), NEW)["MemoryMb"] == "4096"
    assert resolve(UpOptions(memory_mb="1024"), NEW)["MemoryMb"] == "1024"
    assert resolve(UpOptions(memory_mb="64"), NEW)["MemoryMb"] == "64"
    assert resolve(UpOptions(memory_mb="1048576"), NEW)["MemoryMb"] == "1048576"
    previous = {**PREVIOUS, "MemoryMb": "4096"}
    found = Found(region="eu-west-1", wheel_key=WHEEL, lock_key=LOCK, previous=previous)
    assert resolve(UpOptions(processes=16), found)["MemoryMb"] == "4096"
    assert resolve(UpOptions(memory_mb=2048), found)["MemoryMb"] == "2048"
    # auto, restated, goes back to sizing on the instance.
    assert resolve(UpOptions(memory_mb="auto"), found)["MemoryMb"] == "auto"
    assert resolve(UpOptions(memory_mb="AUTO"), found)["MemoryMb"] == "auto"
    # A stack from before this parameter gets the default.
    old = Found(region="eu-west-1", wheel_key=WHEEL, lock_key=LOCK, previous=PREVIOUS)
    assert "MemoryMb" in DEFAULTS and resolve(UpOptions(), old)["MemoryMb"] == "auto"


@pytest.mark.parametrize(
    "wrong", [0, 63, -5, 1048577, "lots", "1e3", "4096; reboot", "$(id)", "", " 64 64"]
)
def test_a_memory_mb_out_of_range_or_not_a_number_is_refused(wrong: int | str) -> None:
    with pytest.raises(FleetError, match=r"^--memory-mb .*: give each reducer's memory in MB, "
                       r"64 to 1,048,576 .* or auto") as err:  # fmt: skip
        resolve(UpOptions(memory_mb=wrong), NEW)
    assert "\n" not in str(err.value)


def test_a_stack_memory_mb_of_another_form_is_refused() -> None:
    previous = {**PREVIOUS, "MemoryMb": "4096'; reboot; '"}
    with pytest.raises(FleetError, match=r"^--memory-mb .* is not allowed: the fleet's MemoryMb"):
        resolve(UpOptions(), Found(region="r", wheel_key=WHEEL, lock_key=LOCK, previous=previous))
