"""Where the rule engine's consumers start on a partition their group never committed: fixed when the
partition is assigned, so a record produced while the engine is still starting is read, not skipped."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from obshub.rules.service_common import pin_start

pytestmark = pytest.mark.kafka


def _topic(kafka, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    for fut in admin.create_topics([NewTopic(name, 1, 1)]).values():
        fut.result(30)


def _read(kafka, topic: str, group: str, want: int, pin: bool = True, earliest: bool = False) -> list[bytes]:
    """Subscribe a new group to ``topic``; inside the assignment callback (before any fetch) produce
    one record ``b"during"``; return what the consumer reads within 8 s (and 1 s after ``want``
    records arrived, to see any extra one)."""
    prod = Producer({"bootstrap.servers": kafka.bootstrap_servers})

    def on_assign(cons, parts):
        if pin:
            pin_start(cons, parts, kafka, earliest)
        prod.produce(topic, value=b"during")
        assert prod.flush(10) == 0

    cons = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": group,
            "auto.offset.reset": "earliest" if earliest else "latest",
            "enable.auto.commit": False,
        }
    )
    got: list[bytes] = []
    try:
        cons.subscribe([topic], on_assign=on_assign)
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            m = cons.poll(0.2)
            if m is not None and not m.error():
                got.append(m.value())
                if len(got) == want:
                    deadline = min(deadline, time.monotonic() + 1.0)
    finally:
        cons.close()
    return got


def test_a_record_produced_during_assignment_is_read(kafka, unique):
    topic = f"pin-{unique}"
    _topic(kafka, topic)
    prod = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    prod.produce(topic, value=b"before")
    assert prod.flush(10) == 0
    # pinned: starts at the end as it was at assignment, so "during" is read and "before" is not
    assert _read(kafka, topic, f"g1-{unique}", 1) == [b"during"]


def test_from_the_beginning_reads_everything_once(kafka, unique):
    topic = f"pin-{unique}"
    _topic(kafka, topic)
    prod = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    prod.produce(topic, value=b"before")
    assert prod.flush(10) == 0
    assert _read(kafka, topic, f"g2-{unique}", 2, earliest=True) == [b"before", b"during"]


def test_a_committed_offset_wins(kafka, unique):
    from confluent_kafka import TopicPartition

    topic = f"pin-{unique}"
    _topic(kafka, topic)
    prod = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for v in (b"a", b"b", b"c"):
        prod.produce(topic, value=v)
    assert prod.flush(10) == 0
    group = f"g3-{unique}"
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group})
    c.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
    c.close()
    assert _read(kafka, topic, group, 3) == [b"b", b"c", b"during"]
