"""What the rule engine accepts from Kafka: every record either becomes rule input or is a dead letter.

``decode(topic, value)`` turns one message into ``[(signal, record), ...]`` (the maps of ``rules.fields``)
or raises :class:`schema.SchemaError` whose ``field`` names the offending field (``closed_at_ns``,
``layers.rank3.cuda.time_ns``, ``events[2].ts_ns``) and whose ``reason`` says what was wrong with it.
``decode_change(value)`` does the same for one alert state change read back from ``obshub.alerts.v1``.

``dead_letter`` publishes a message that failed to ``obshub.dlq.v1``, unchanged, with the reason, the
field, where it came from (topic, partition, offset) and which consumer group rejected it in the
headers of ``schema.DLQ_HEADERS``; the consumer then commits past it.

Step summaries (JSON) are checked by ``schema.decode_step_summary``, event batches (msgpack) by
``schema.decode_batch``; an event whose realtime (``ts_ns + clock.offset_ns``) leaves the signed 64-bit
range is refused here. Undocumented step-summary fields are dropped unread (``fields.step_record``).
"""

from __future__ import annotations

from typing import Any

from obshub.core import schema
from rules import fields


def decode_step(value: bytes | None) -> dict:
    """One ``obshub.steps.v1`` message -> the step record rules see. Raises SchemaError (field, reason)."""
    return fields.step_record(schema.decode_step_summary(value))


def decode_events(value: bytes | None) -> list[dict]:
    """One ``obshub.events.v1`` message -> one event record per event. Raises SchemaError."""
    if value is None:
        raise schema.SchemaError("message", "empty message (a tombstone or a message without a value)")
    batch = schema.decode_batch(value)
    out = []
    for i, ev in enumerate(batch.events):
        rt = schema.to_realtime_ns(ev.ts_ns, batch.clock)
        if not 0 <= rt <= schema.I64_MAX:
            raise schema.SchemaError(
                f"events[{i}].ts_ns", f"ts_ns + clock.offset_ns = {rt} is outside 0..{schema.I64_MAX}"
            )
        out.append(fields.event_record(batch, ev))
    return out


def decode(topic: str, value: bytes | None) -> list[tuple[str, dict]]:
    """A message of an input topic -> ``[(signal, record), ...]``; raises SchemaError when it cannot be
    used. ``topic`` is ``schema.TOPIC_STEPS`` (JSON) or any other (msgpack event batches)."""
    if topic == schema.TOPIC_STEPS:
        return [("steps", decode_step(value))]
    return [("events", rec) for rec in decode_events(value)]


_CHANGE_SHAPE: dict[str, str] = {
    "fingerprint": "str",
    "rule": "str",
    "severity": "str",
    "starts_at": "str",
    "ends_at": "str",
    "starts_at_ns": "int",
    "ends_at_ns": "int",
    "updated_at_ns": "int",
    "value": "number",
    "routes": "list[str]",
    "generator_url": "str",
    "engine": "str",
}
CHANGE_STATUSES = ("pending", "firing", "resolved", "inactive")


def decode_change(value: bytes | None) -> dict:
    """One ``obshub.alerts.v1`` message -> the change record (``lifecycle.change_record``) the notify
    loop delivers. ``fingerprint``, ``rule``, ``status`` and ``labels`` are required; every documented
    field present must have its documented type (``labels`` and ``annotations`` map strings to strings).
    Raises SchemaError (field, reason)."""
    data = schema.decode_json(value, "alert change")
    if not isinstance(data, dict):
        raise schema.SchemaError("message", f"an alert change is a JSON object, got {type(data).__name__}")
    for name in ("fingerprint", "rule", "status", "labels"):
        if name not in data:
            raise schema.SchemaError(name, "missing field")
    if data["status"] not in CHANGE_STATUSES:
        raise schema.SchemaError("status", f"{repr(data['status'])[:40]} is none of {', '.join(CHANGE_STATUSES)}")
    for name, shape in _CHANGE_SHAPE.items():
        if name in data:
            schema.check_shape(name, shape, data[name])
    if not data["fingerprint"]:
        raise schema.SchemaError("fingerprint", "must not be empty")
    for name in ("labels", "annotations"):
        m = data.get(name, {})
        if not isinstance(m, dict):
            raise schema.SchemaError(name, f"expected a map, got {type(m).__name__} ")
        for k, v in m.items():
            schema.check_json_str(f"{name} (key)", k)
            schema.check_json_str(f"{name}.{k}", v)
    return data


DLQ_MAX_BYTES = schema.DLQ_MAX_BYTES


def dead_letter(producer: Any, msg: Any, exc: BaseException, consumer: str, dlq_topic: str = schema.TOPIC_DLQ) -> str:
    """Publish ``msg`` (a confluent_kafka Message) to the DLQ with its key and value unchanged (a value
    over ``DLQ_MAX_BYTES`` is cut there and gets an ``obshub.truncated`` header with its full length), and
    the headers of ``schema.DLQ_HEADERS``: the reason (``field: problem``), the field, source topic,
    partition, offset, and ``consumer`` (the group that rejected it). Returns the reason. Does not
    flush: the caller flushes before it commits past the message."""
    reason = str(exc) or type(exc).__name__
    field = getattr(exc, "field", "") or ""
    values = (reason, field, msg.topic(), str(msg.partition()), str(msg.offset()), consumer)
    headers = [(k, v.encode("utf-8", "replace")) for k, v in zip(schema.DLQ_HEADERS, values)]
    value = msg.value()
    if value is not None and len(value) > DLQ_MAX_BYTES:
        headers.append(("obshub.truncated", str(len(value)).encode()))
        value = value[:DLQ_MAX_BYTES]
    producer.produce(dlq_topic, value=value, key=msg.key(), headers=headers)
    return reason
