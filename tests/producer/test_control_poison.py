"""Poison on the control topic (newuser23): any message value, a tombstone included, is refused naming
what is wrong, and the agent's listener lives on to serve the next valid request. On f174a23 a deeply
nested JSON message (RecursionError), a tombstone (TypeError) or a ts_ns beyond a float (OverflowError)
escaped the listener's handler and ended its thread: the agent never served a deep dive again."""

from __future__ import annotations

import json
import logging
import uuid

import pytest

from obshub.producer.control import ControlListener, parse_request
from tests.support.transport_helpers import wait_for


def _req(**over) -> bytes:
    d = {"action": "deep_dive", "host": "h", "steps": 2, "max_s": 30, "ts_ns": 1, **over}
    return json.dumps(d).encode()


POISON = [
    (None, "tombstone"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
    (b'{"action": ' * 50_000 + b"1" + b"}" * 50_000, "nested too deep"),
    (_req(ts_ns=10**400), "ts_ns 1000"),
    (_req(ts_ns=2**63), "ts_ns"),
    (_req(steps=10**30), "steps"),
    (_req(host="x" * 100_000), None),  # a valid, if silly, host: parsed (not the listener's)
    (json.dumps({"action": "y" * 100_000}).encode(), "is not 'deep_dive'"),
]


@pytest.mark.parametrize(("raw", "why"), POISON, ids=[f"poison{i}" for i in range(len(POISON))])
def test_parse_request_refuses_anything_with_a_value_error_naming_it(raw, why):
    if why is None:
        assert parse_request(raw).host == "x" * 100_000
        return
    with pytest.raises(ValueError) as exc:
        parse_request(raw)
    assert why in str(exc.value) and len(str(exc.value)) < 300  # a log line, not the message itself


@pytest.mark.kafka
def test_the_listener_survives_poison_and_serves_the_next_request(kafka, caplog):
    """The real listener on the session's broker: every poison message above is produced to the control
    topic, then a valid request for the listener's host; the request is served and each poison message
    left one warning."""
    from confluent_kafka import Producer

    from obshub.core.control import CONTROL_TOPIC, ensure_control_topic
    from obshub.core.kafka import KafkaConnection
    from obshub.producer.control import request_deep_dive

    conn = KafkaConnection(bootstrap=kafka.bootstrap_servers)
    ensure_control_topic(conn)
    host = f"poison-{uuid.uuid4().hex[:8]}"
    got = []
    caplog.set_level(logging.WARNING, logger="producer.control")
    listener = ControlListener(conn, host, got.append, poll_s=0.05)
    try:
        wait_for(listener.ready.is_set, 30, "the listener")
        p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "message.max.bytes": 2_000_000})
        for raw, _ in POISON:
            p.produce(CONTROL_TOPIC, key=host.encode(), value=raw)
        assert p.flush(30) == 0
        request_deep_dive(conn, host, steps=3, max_s=30)
        wait_for(lambda: got, 30, "the valid request after the poison (the listener thread died?)")
        assert [(r.host, r.steps) for r in got] == [(host, 3)]
        assert listener._thread.is_alive()
        skipped = [r for r in caplog.records if "skipping a message" in r.getMessage()]
        assert len(skipped) >= len([w for _, w in POISON if w])  # older tests' messages may add theirs
    finally:
        listener.close()
