"""The local stack's DynamoDB (scripts/dynamodb_server.py) writes items itself instead of
through moto's generic serializer (over half of its CPU): every response must be byte for
byte what the generic walk writes, for every attribute type, nested and empty values, and
the kinds it hands back to the generic walk (binary sets)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# In a process of its own: importing the server patches moto's JSON serializer.
PROBE = r"""
import importlib.util, json, sys
from werkzeug.test import Client
spec = importlib.util.spec_from_file_location("dynamodb_server", sys.argv[1])
server = importlib.util.module_from_spec(spec)
spec.loader.exec_module(server)
from moto.core.serialize import JSONSerializer

ITEMS = [
    {"pk": {"S": "a"}, "sk": {"S": "1"}, "n": {"N": "12.5"}, "b": {"B": "AAEC/w=="},
     "t": {"BOOL": True}, "f": {"BOOL": False}, "z": {"NULL": True}, "e": {"S": ""},
     "ss": {"SS": ["x", "y"]}, "ns": {"NS": ["1", "2"]}, "u": {"S": "é\u202e\x00"}},
    {"pk": {"S": "a"}, "sk": {"S": "2"},
     "m": {"M": {"in": {"L": [{"S": "v"}, {"N": "3"}, {"M": {}}, {"L": []}, {"B": "/w=="}]},
                 "deep": {"M": {"x": {"M": {"y": {"BOOL": False}}}}}}},
     "empty": {"M": {}}, "list": {"L": []}},
    {"pk": {"S": "a"}, "sk": {"S": "3"}, "bs": {"BS": ["AAE=", "Ag=="]}, "s": {"S": "k"}},
]
def requests(t):
    made = [("Query", {"TableName": t, "KeyConditionExpression": "pk = :p",
                       "ExpressionAttributeValues": {":p": {"S": "a"}}})]
    for item in ITEMS:
        key = {"pk": item["pk"], "sk": item["sk"]}
        made.append(("GetItem", {"TableName": t, "Key": key, "ConsistentRead": True}))
        made.append(("UpdateItem", {"TableName": t, "Key": key, "ReturnValues": "ALL_NEW",
                                    "UpdateExpression": "SET w = :w",
                                    "ExpressionAttributeValues": {":w": {"N": "1"}}}))
    made.append(("BatchGetItem", {"RequestItems": {t: {"Keys": [
        {"pk": i["pk"], "sk": i["sk"]} for i in ITEMS]}}}))
    made.append(("PutItem", {"TableName": t, "Item": ITEMS[0],
                             "ConditionExpression": "attribute_not_exists(pk)",
                             "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}))
    return made


def call(client, action, body):
    r = client.post("/", data=json.dumps(body), headers={
        "X-Amz-Target": "DynamoDB_20120810." + action,
        "Content-Type": "application/x-amz-json-1.0",
        "Authorization": "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/"
                         "aws4_request, SignedHeaders=host, Signature=x"})
    return r.status_code, r.get_data(as_text=True)


def run(t):
    client = Client(server.OneAtATime())
    call(client, "CreateTable", {"TableName": t, "BillingMode": "PAY_PER_REQUEST",
             "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"},
                           {"AttributeName": "sk", "KeyType": "RANGE"}],
             "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"},
                                      {"AttributeName": "sk", "AttributeType": "S"}]})
    for item in ITEMS:
        assert call(client, "PutItem", {"TableName": t, "Item": item})[0] == 200
    # A table of its own each time; its name (in BatchGetItem's answer) made the same.
    return [(code, text.replace(f'"{t}"', '"T"'))
            for code, text in (call(client, a, body) for a, body in requests(t))]


fast = run("t1")
fast_writes = server.fast_writes[0]
JSONSerializer._serialize_type_map = server._generic_map
generic = run("t2")
print(json.dumps({"fast": fast, "generic": generic, "fast_writes": fast_writes}))
"""


def test_items_are_written_as_the_generic_serializer_writes_them() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(REPO / "scripts" / "dynamodb_server.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    # The items went the fast way (the query's three at least; an error answer, as the
    # conditional failure's, is written by moto before any serializer).
    assert got["fast_writes"] >= 3, got["fast_writes"]
    assert [code for code, _ in got["fast"]] == [200] * (len(got["fast"]) - 1) + [400]
    assert got["fast"] == got["generic"]
    # What was compared holds every kind of value, so the check is not vacuous.
    query = json.loads(got["fast"][0][1])
    assert query["Count"] == 3
    written = json.dumps(query["Items"])
    for kind in ("S", "N", "B", "BOOL", "NULL", "SS", "NS", "BS", "M", "L"):
        assert f'"{kind}":' in written, kind
    assert '"B": "AAEC/w=="' in written and '"BS": ["AAE=", "Ag=="]' in written
    failed = json.loads(got["fast"][-1][1])  # an error answer: the same either way
    assert failed["Item"]["n"] == {"N": "12.5"}  # the old item, as the condition saw it
