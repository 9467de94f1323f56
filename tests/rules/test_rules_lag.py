"""The rule engine's own consumer lag (``health`` records, rule ``obshub_consumer_lag``): read from the
watermarks the consumer's fetches carry (``rules.service_common.consumer_lag``), never by a broker query
that would hold up the evaluation loop. A real broker: the lag follows what is produced and consumed."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from obshub.rules.service_common import consumer_lag

pytestmark = pytest.mark.kafka


def _wait_lag(cons: Consumer, topic: str, want: int, timeout_s: float = 30.0) -> dict[str, int]:
    """Poll ``consumer_lag`` (without consuming) until the topic's lag is ``want``; returns the last value."""
    deadline = time.monotonic() + timeout_s
    lag: dict[str, int] = {}
    while time.monotonic() < deadline:
        lag = consumer_lag(cons)
        if lag.get(topic, 0) == want:
            return lag
        time.sleep(0.2)
    return lag


def test_lag_is_what_was_produced_and_not_yet_consumed(kafka, unique):
    topic = f"lag-{unique}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    for fut in admin.create_topics([NewTopic(topic, 2, 1)]).values():
        fut.result(30)
    prod = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(12):
        prod.produce(topic, value=b"x", partition=i % 2)
    assert prod.flush(10) == 0
    cons = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": f"lag-{unique}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        cons.subscribe([topic])
        got, deadline = 0, time.monotonic() + 30
        while got < 12 and time.monotonic() < deadline:
            got += sum(1 for m in cons.consume(12 - got, 0.5) if not m.error())
        assert got == 12
        assert _wait_lag(cons, topic, 0) == {topic: 0}
        for i in range(7):  # produced, fetched in the background, not consumed: the lag is 7
            prod.produce(topic, value=b"y", partition=i % 2)
        assert prod.flush(10) == 0
        assert _wait_lag(cons, topic, 7) == {topic: 7}
        got, deadline = 0, time.monotonic() + 30
        while got < 7 and time.monotonic() < deadline:
            got += sum(1 for m in cons.consume(7 - got, 0.5) if not m.error())
        assert got == 7
        assert _wait_lag(cons, topic, 0) == {topic: 0}
    finally:
        cons.close()
