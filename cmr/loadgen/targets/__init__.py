"""The stores a load task drives, behind one small async protocol.

A target reads and writes integer values under string keys. ``get`` returns the value it saw
(None: nothing there yet) and ``put`` stores one; both report how many SDK retries the call
took. Every failure leaves a target as :class:`OpFailed` carrying one of the jam report's
error classes (listed in :mod:`cmr.loadgen.targets.base`), translated at this edge so the
driver never sees botocore's types.

Targets (``make_target``):

- ``dynamodb``: GetItem with or without ConsistentRead; PutItem with or without a condition.
- ``s3``: GetObject / PutObject. S3 has been strongly consistent for every read since 2020,
  so "consistent" reads and "conditional" writes both map to the plain calls (mode "plain").
- ``sqs``: put = SendMessage, get = ReceiveMessage then DeleteMessage of what it got; keys are
  ignored (one queue) and every operation is "plain".
- ``simpledb``: GetAttributes with ConsistentRead; PutAttributes with Expected. moto's server,
  the only local SimpleDB, accepts ConsistentRead and Expected but ignores both.
- ``azure-table``: Azure Table storage, Query Entity / Insert Or Replace Entity; its reads
  are always strong ("plain"); conditional writes If-Match an ETag (``azure_table``).
- ``azure-blob``: Azure Blob storage, Get Blob / Put Blob; reads always strong ("plain");
  conditional writes If-Match / If-None-Match (``azure_blob``).
- ``sim``: :class:`cmr.loadgen.sim.SimStore` in this process (one store per task).

Conditional writes come in two styles (``condition=``), both from seed 000:

- ``"absent"`` (the default): the condition is ``attribute_not_exists`` of a fictitious
  attribute that is never written, so it always holds. It measures what a conditional write
  costs without making concurrent writers fail each other, which is what seed 000 did for its
  multi-threaded runs ("checking a fictitious attribute to be non-existent").
- ``"version"``: the condition is that the item's version attribute still holds the version
  this target last read or wrote (absent if it has seen none), as in seed 000's single-thread
  run. Concurrent writers make most of these fail; a failure refreshes the remembered version.
  The simulated store only has version conditions, so ``sim`` always uses this style.

Endpoints, credentials and SDK retries: see :mod:`cmr.loadgen.targets.aws`, and for the
Azure targets (``AZURE_STORAGE_CONNECTION_STRING`` alone) :mod:`cmr.loadgen.targets.azure`.
Azure's conditions are ETags, not attributes: each Azure module says what the two styles
become there.

Modules: ``base`` (the protocol, replies, error classes), ``aws`` (the AWS targets' client,
endpoints and SDK retries), ``dynamodb``, ``s3``, ``sqs``, ``simpledb``, ``sim``, ``azure``
(the Azure targets' client; ``azure_table`` and ``azure_blob``, imported only when used:
the Azure SDKs are the ``azure`` extra), ``azure_resources``,
``resources`` (``find``/``prepare``/``cleanup``: a run deletes only what it created),
``endpoints`` (where calls go, and whether that is local) and ``aim`` (the target as stated
before a load test starts); ``make_target`` is here.
"""

from __future__ import annotations

from typing import Any

from cmr.errors import UsageError
from cmr.loadgen.sim import SimConfig
from cmr.loadgen.spec import TARGETS, LoadTask
from cmr.loadgen.targets.aws import retry_config
from cmr.loadgen.targets.azure import SDKS, need_sdk
from cmr.loadgen.targets.base import (
    ERROR_CLASSES,
    Condition,
    ErrorClass,
    OpFailed,
    Reply,
    Target,
    classify,
)
from cmr.loadgen.targets.dynamodb import DynamoDBTarget
from cmr.loadgen.targets.resources import MARKER, RESOURCE, Prepared, cleanup, find, prepare
from cmr.loadgen.targets.s3 import S3Target
from cmr.loadgen.targets.sim import SimTarget
from cmr.loadgen.targets.simpledb import SimpleDBTarget
from cmr.loadgen.targets.sqs import SQSTarget

__all__ = [
    "ERROR_CLASSES",
    "MARKER",
    "RESOURCE",
    "DynamoDBTarget",
    "ErrorClass",
    "OpFailed",
    "Prepared",
    "Reply",
    "S3Target",
    "SQSTarget",
    "SimTarget",
    "SimpleDBTarget",
    "Target",
    "classify",
    "cleanup",
    "find",
    "make_target",
    "prepare",
    "retry_config",
]


def make_target(
    task: LoadTask,
    *,
    condition: Condition = "absent",
    connect_timeout: float = 5.0,
    read_timeout: float = 30.0,
) -> Target:
    """The target a task names, configured from it (not yet set up)."""
    if task.target == "sim":
        try:
            config = SimConfig(**{"seed": task.seed, **task.sim})
        except TypeError as exc:
            raise UsageError(f"bad simulated store config {task.sim!r}: {exc}") from None
        return SimTarget(config)
    options: dict[str, Any] = {
        "retries": task.retries,
        "connections": task.readers + task.writers,
        "connect_timeout": connect_timeout,
        "read_timeout": read_timeout,
    }
    if task.target == "dynamodb":
        return DynamoDBTarget(task.resources, condition=condition, **options)
    if task.target == "simpledb":
        return SimpleDBTarget(task.resources, condition=condition, **options)
    if task.target == "s3":
        return S3Target(task.resources, **options)
    if task.target == "sqs":
        return SQSTarget(task.resources, **options)
    if task.target in SDKS:
        return _azure_target(task, condition, options)
    raise UsageError(f"unknown target {task.target!r}: use one of {', '.join(TARGETS)}")


def _azure_target(task: LoadTask, condition: Condition, options: dict[str, Any]) -> Target:
    # imported here: the Azure SDKs come with the azure extra, never with cmr alone
    need_sdk(task.target)
    if task.target == "azure-table":
        from cmr.loadgen.targets.azure_table import AzureTableTarget

        return AzureTableTarget(task.resources, condition=condition, **options)
    from cmr.loadgen.targets.azure_blob import AzureBlobTarget

    return AzureBlobTarget(task.resources, condition=condition, **options)
