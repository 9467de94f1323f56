"""A tombstone on obshub.events.v1 is dead-lettered with the same reason by every consumer (newuser23): on
f174a23 the stream worker's DLQ record said ``message: expected bytes, got NoneType`` for it (and ``empty
message`` for b""), the rule engine's ``empty message (a tombstone or a message without a value)``."""

from __future__ import annotations

import pytest

from obshub.core import schema
from obshub.rules import intake


@pytest.mark.parametrize("value", [None, b"", bytearray()])
def test_no_value_is_named_a_tombstone_by_the_worker_and_the_engine_alike(value):
    with pytest.raises(schema.SchemaError) as worker:
        schema.decode_batch(value)
    with pytest.raises(schema.SchemaError) as engine:
        intake.decode(schema.TOPIC_EVENTS, value)
    assert str(worker.value) == str(engine.value)
    assert worker.value.field == "message" and "tombstone" in str(worker.value)


def test_other_types_still_name_their_type():
    with pytest.raises(schema.SchemaError, match="expected bytes, got str"):
        schema.decode_batch("x")  # type: ignore[arg-type]
