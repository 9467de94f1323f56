"""One definition of a valid event: the reference decoder (``schema.validate_event``), the stream
worker's msgspec fast path (``streams.wire``) and the rule engine's (``rules.intake``) all take their
ranges from ``schema.EVENT_INT_RANGES``; at every field's bounds the three agree on accept and refuse."""

from __future__ import annotations

import msgpack
import msgspec
import pytest

from obshub.core import schema, wiretypes
from obshub.rules import intake
from obshub.streams import wire

KIND = int(schema.Kind.STEP_BEGIN)


def _batch(event: list) -> bytes:
    return msgpack.packb(
        {
            "v": 1,
            "job": "j",
            "host": "h",
            "host_id": 1,
            "agent_id": "a",
            "seq": 0,
            "sent_ns": 1,
            "clock": {"offset_ns": 0, "uncertainty_ns": 0},
            "events": [event],
        }
    )


def _event(**over) -> list:
    ev = dict(zip(schema.EVENT_FIELDS, schema.Event(KIND, 1)))
    ev.update(over)
    return [ev[f] for f in schema.EVENT_FIELDS]


def test_the_fast_decoders_are_built_from_the_schema():
    assert wire.WireEvent._fields == schema.EVENT_FIELDS
    assert [n for n, _ in wiretypes.event_fields(10)] == list(schema.EVENT_FIELDS)
    assert [f[0] for f in intake._EVENT_FIELDS][:-1] == list(schema.EVENT_FIELDS[1:])


@pytest.mark.parametrize("name", [n for n in schema.EVENT_INT_RANGES if n != "kind"])
def test_every_decoder_agrees_at_each_fields_bounds(name):
    lo, hi = schema.EVENT_INT_RANGES[name]
    fast = msgspec.msgpack.Decoder(wire.WireBatch)
    for value, ok in ((lo, True), (hi, True), (lo - 1, False), (hi + 1, False)):
        if not -(2**63) <= value <= 2**64 - 1:
            continue  # msgpack cannot carry it
        data = _batch(_event(**{name: value}))
        try:
            schema.decode_batch(data)
            ref = True
        except schema.SchemaError as exc:
            ref = False
            assert exc.field == f"events[0].{name}", exc
        try:
            fast.decode(data)
            got = True
        except (msgspec.DecodeError, msgspec.ValidationError):
            got = False
        assert ref is ok and got is ok, (name, value)
        rules_ok = True
        try:
            intake.decode_event_batch(data, frozenset({KIND}))
        except schema.SchemaError:
            rules_ok = False
        assert rules_ok is ok, (name, value)
