"""`cmr fleet up --inputs-under` (issue 26, item 1): the fleet's workers get the prefixes a
job's inputs must lie under, shaped and checked as --outputs-under is."""

from __future__ import annotations

import re

import pytest

from cmr.admission import Admission
from cmr.errors import FleetError
from cmr.fleet.params import Found, UpOptions, resolve
from tests.deploy.test_fleet_params import BUCKET, LOCK, NEW, PREVIOUS, WHEEL


def test_inputs_under_defaults_to_the_whole_bucket() -> None:
    params = resolve(UpOptions(), NEW)
    assert params["InputsUnder"] == ""  # no --inputs-under reaches the workers
    admission = Admission.of(["cmr.loadgen.job"], [], f"s3://{BUCKET}/cmr")
    # The scratch is not listed: a job reads only its own (and its step before's outputs).
    assert admission.inputs == (f"s3://{BUCKET}/",)


def test_inputs_under_becomes_a_space_separated_list_kept_on_update() -> None:
    opts = UpOptions(inputs_under=(f"s3://{BUCKET}/datasets/", f"s3://{BUCKET}/team-a"))
    params = resolve(opts, NEW)
    assert params["InputsUnder"] == f"s3://{BUCKET}/datasets/ s3://{BUCKET}/team-a"
    previous = {**PREVIOUS, "InputsUnder": "s3://my-bucket/in/"}
    found = Found(region="eu-west-1", wheel_key=WHEEL, lock_key=LOCK, previous=previous)
    assert resolve(UpOptions(processes=4), found)["InputsUnder"] == "s3://my-bucket/in/"
    assert resolve(UpOptions(inputs_under=("",)), found)["InputsUnder"] == ""
    # A stack from before this parameter gets the default.
    old = Found(region="eu-west-1", wheel_key=WHEEL, lock_key=LOCK, previous=PREVIOUS)
    assert resolve(UpOptions(), old)["InputsUnder"] == ""


@pytest.mark.parametrize(
    "entry", ["file:///etc/", f"s3://{BUCKET}/x'y", f"s3://{BUCKET}/*", f"s3://{BUCKET}/$(id)"]
)
def test_inputs_under_entries_that_are_not_s3_prefixes_are_refused(entry: str) -> None:
    with pytest.raises(FleetError, match=f"^--inputs-under {re.escape(repr(entry))} is not"):
        resolve(UpOptions(inputs_under=(entry,)), NEW)


def test_inputs_outside_the_fleets_bucket_are_refused() -> None:
    """The workers' role may read the fleet's bucket only."""
    with pytest.raises(FleetError, match=r"^--inputs-under 's3://other/in/' is outside"):
        resolve(UpOptions(inputs_under=("s3://other/in/",)), NEW)
    with pytest.raises(FleetError, match="role may read s3://"):
        resolve(UpOptions(inputs_under=(f"s3://{BUCKET}x/",)), NEW)
