"""Billing units against the worked examples of the services' own pages."""

from __future__ import annotations

import pytest

from cmr import billing


def test_sqs_is_billed_per_64_kib_chunk() -> None:
    # "a 256 KB message is billed as four 64 KB requests" (SQS pricing; 200 KB: 4 too)
    assert billing.sqs_units(200 * 1000) == 4
    assert billing.sqs_units(256 * 1024) == 4
    assert billing.sqs_units(64 * 1024) == 1
    assert billing.sqs_units(64 * 1024 + 1) == 2
    assert billing.sqs_units(0) == 1  # an empty receive is still a request


def test_a_send_is_billed_as_the_aws_backend_batches_it() -> None:
    # Ten 190 KB bodies (near the largest cmr sends): base64 makes each 253,336 bytes, so
    # one to a batch (256 KiB at most), ten SendMessageBatch of 4 chunks of 64 KiB each.
    assert billing.sqs_send_units([190_000] * 10) == 10 * 4
    # Small bodies: ten to a batch, one chunk each batch.
    assert billing.sqs_send_units([100] * 25) == 3
    assert billing.sqs_send_units([]) == 0


def test_dynamodb_write_units_round_up_to_1_kb() -> None:
    # "a 3.5 KB item ... 4 write request units"; transactional writes cost twice
    assert billing.write_units(3500) == 4
    assert billing.write_units(3500, transactional=True) == 8
    assert billing.write_units(1024) == 1
    assert billing.write_units(1025) == 2
    assert billing.write_units(10) == 1


def test_dynamodb_read_units_round_up_to_4_kb() -> None:
    # "a 3.5 KB item rounds to 4 KB; a 10 KB item to 12 KB" (GetItem); an 8 KB item: 2
    # strongly consistent, 1 eventually consistent, 4 transactional
    assert billing.read_units(3500) == 1
    assert billing.read_units(10 * 1024) == 3
    assert billing.read_units(8 * 1024) == 2
    assert billing.read_units(8 * 1024, consistent=False) == 1
    assert billing.read_units(8 * 1024, transactional=True) == 4
    assert billing.read_units(0) == 1  # a read of a missing item costs the minimum


def test_item_size_follows_dynamodb_rules() -> None:
    # Names and strings in UTF-8, binary as is, 1 byte for bool and null, numbers by digits.
    assert billing.item_size({"pk": "ab", "sk": "c"}) == 2 + 2 + 2 + 1
    assert billing.item_size({"b": b"\x00" * 3500}) == 3501
    assert billing.item_size({"t": True, "n": None}) == 4
    assert billing.dynamo_size(12345) == 4  # 5 digits: 3 bytes, plus 1
    assert billing.dynamo_size("δ") == 2
    # The wire's typed form measures the same as the plain value.
    assert billing.item_size({"pk": {"S": "ab"}, "v": {"B": b"xyz"}, "n": {"N": "12345"}}) == (
        billing.item_size({"pk": "ab", "v": b"xyz", "n": 12345})
    )
    assert billing.dynamo_size({"L": [{"S": "a"}, {"N": "1"}]}) == billing.dynamo_size(["a", 1])


@pytest.mark.parametrize(
    ("op", "key"),
    [
        ("sqs.ReceiveMessage", "sqs.requests"),
        ("s3.PutObject", "s3.class_a"),
        ("s3.UploadPart", "s3.class_a"),
        ("s3.CompleteMultipartUpload", "s3.class_a"),
        ("s3.ListObjectsV2", "s3.class_a"),
        ("s3.GetObject", "s3.class_b"),
        ("s3.HeadObject", "s3.class_b"),
        ("s3.DeleteObjects", None),
        ("dynamodb.Query", "dynamodb.read_units"),
        ("dynamodb.TransactWriteItems", "dynamodb.write_units"),
        ("dynamodb.DescribeTable", None),
        ("blob.PutBlock", "azure.blob.write"),
        ("blob.GetBlob", "azure.blob.read"),
        ("blob.ListBlobs", "azure.blob.list"),
        ("blob.DeleteBlob", None),
        ("queue.PutMessage", "azure.queue.class1"),
        ("queue.GetMessages", "azure.queue.class2"),
        ("table.EntityGroupTransaction", "azure.table.transactions"),
    ],
)
def test_each_operation_has_its_class(op: str, key: str | None) -> None:
    assert billing.price_key(op) == key
