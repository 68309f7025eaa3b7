"""What every service's client shares: counting the requests it sends (botocore's
before-send event, so retries count too) and charging each, in billing units, to the job
it serves (cmr.usage), and running calls side by side."""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

from cmr import billing, usage
from cmr.aio import run_all


def _counting(calls: Counter[str]) -> Any:
    """An event handler counting every HTTP request a client sends, retries included."""

    def count(event_name: str, **_kwargs: Any) -> None:
        _, service, op = event_name.split(".", 2)
        calls[f"{service}.{op}"] += 1

    return count


def counting(client: Any, service: str, calls: Counter[str]) -> None:
    """Count the client's requests into ``calls`` and charge each to its job: the units a
    request's parameters decide are worked out once per call (before-parameter-build), the
    ones its answer decides per answer; every HTTP attempt is charged (response-received is
    emitted once per attempt, as before-send is)."""
    events = client.meta.events
    events.register(f"before-send.{service}", _counting(calls))
    events.register(f"before-parameter-build.{service}", _units_of_params)
    events.register(f"response-received.{service}", _charge)


_KEY = "cmr_billing"  # where a call's request-side units wait in botocore's request context


def _units_of_params(event_name: str, params: Any, context: Any, **_kwargs: Any) -> None:
    op = event_name.split(".", 2)[2]
    service = event_name.split(".", 2)[1]
    try:
        context[_KEY] = _request_units(service, op, params)
    except Exception:  # never fail a request for its billing: charge it one unit
        context[_KEY] = (1.0, True)


def _request_units(service: str, op: str, params: dict[str, Any]) -> tuple[float, bool]:
    """(units, consistent): units known from the request (writes, sends), or the
    consistency a read's answer is billed at."""
    if service == "sqs":
        if op == "SendMessageBatch":
            return float(billing.sqs_units(sum(_sqs_size(e) for e in params["Entries"]))), True
        if op == "SendMessage":
            return float(billing.sqs_units(_sqs_size(params))), True
        return 1.0, True
    if service != "dynamodb":
        return 1.0, True
    item_size = billing.item_size
    if op == "PutItem":
        return float(billing.write_units(item_size(params["Item"]))), True
    if op == "UpdateItem":
        values = params.get("ExpressionAttributeValues") or {}
        return float(billing.write_units(item_size({**params["Key"], **values}))), True
    if op == "DeleteItem":
        return float(billing.write_units(item_size(params["Key"]))), True
    if op == "TransactWriteItems":
        total = 0
        for entry in params["TransactItems"]:
            ((kind, body),) = entry.items()
            if kind == "Put":
                size = item_size(body["Item"])
            else:
                size = item_size({**body["Key"], **(body.get("ExpressionAttributeValues") or {})})
            total += billing.write_units(size, transactional=True)
        return float(total), True
    return 0.0, bool(params.get("ConsistentRead", False))


def _sqs_size(entry: dict[str, Any]) -> int:
    """An SQS message's billed payload: its body and its attributes' names, types and values."""
    size = len(str(entry.get("MessageBody", "")).encode("utf-8"))
    for name, attr in (entry.get("MessageAttributes") or {}).items():
        size += len(name.encode("utf-8")) + len(str(attr.get("DataType", "")))
        value = attr.get("StringValue", attr.get("BinaryValue", b""))
        size += len(value) if isinstance(value, bytes) else len(str(value).encode("utf-8"))
    return size


def _as_sent(m: dict[str, Any]) -> dict[str, Any]:
    return {"MessageBody": m.get("Body", ""), "MessageAttributes": m.get("MessageAttributes")}


def _charge(event_name: str, context: Any, parsed_response: Any, **_kwargs: Any) -> None:
    _, service, op = event_name.split(".", 2)
    units, consistent = context.get(_KEY, (1.0, True))
    with contextlib.suppress(Exception):  # an answer we cannot read: the request's units
        units = _answer_units(service, op, parsed_response, units, consistent)
    usage.charge(f"{service}.{op}", 1, units)


def _answer_units(service: str, op: str, parsed: Any, units: float, consistent: bool) -> float:
    if not isinstance(parsed, dict):
        return units
    if service == "sqs" and op == "ReceiveMessage":
        got = parsed.get("Messages") or ()
        return float(billing.sqs_units(sum(_sqs_size(_as_sent(m)) for m in got)))
    if service != "dynamodb":
        return units
    if op == "GetItem":
        item = parsed.get("Item")
        return billing.read_units(billing.item_size(item) if item else 0, consistent=consistent)
    if op == "Query":
        size = sum(billing.item_size(i) for i in parsed.get("Items") or ())
        return billing.read_units(size, consistent=consistent)
    if op == "UpdateItem" and parsed.get("Attributes"):
        # Billed on the larger of the item before and after: after is what ALL_NEW returns.
        return max(units, float(billing.write_units(billing.item_size(parsed["Attributes"]))))
    return units


# Every aws protocol runs its calls side by side as the other backends do (cmr.aio).
_all = run_all
