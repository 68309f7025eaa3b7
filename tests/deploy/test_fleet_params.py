"""`cmr fleet up`'s parameter resolution, without any server: the command line wins, then the
existing stack's values, then the defaults."""

from __future__ import annotations

import re
import secrets

import pytest

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
