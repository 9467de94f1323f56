"""Shared fixtures. The test session starts its own real Apache Kafka broker (the one `obshub up` installs)
on free ports in a temporary $OBSHUB_HOME, so several test sessions can run side by side, and stops it at
the end."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from obshub import stack
from obshub.core.settings import Settings, load_settings

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


free_port_pair = stack.free_port_pair  # re-exported for the tests that start brokers of their own


@pytest.fixture(scope="session")
def kafka(tmp_path_factory) -> Settings:
    """A running broker for the whole session: yields Settings whose ``bootstrap_servers`` reach it.
    Also exports OBSHUB_HOME / OBSHUB_KAFKA_PORT so `obshub` subprocesses use the same broker."""
    from obshub.core.errors import StackError

    home = tmp_path_factory.mktemp("obshub-home")
    for attempt in range(3):  # another test session may grab the free port between choice and bind
        port = free_port_pair()
        settings = load_settings(home=home, kafka_port=port)
        try:
            stack.up(settings, timeout_s=180)
            break
        except StackError:
            stack.down(settings)
            if attempt == 2:
                raise
    os.environ["OBSHUB_HOME"] = str(home)
    os.environ["OBSHUB_KAFKA_PORT"] = str(port)
    yield settings
    stack.down(settings)


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topic, group and job names."""
    return uuid.uuid4().hex[:10]


def consume_all(
    settings: Settings,
    topic: str,
    *,
    expect: int | None = None,
    timeout_s: float = 30.0,
    group: str | None = None,
    to_end: bool = False,
) -> list:
    """Read ``topic`` from the beginning until ``expect`` messages arrived (or, when ``expect`` is None, it
    is quiet for 3 s, or with ``to_end`` every partition was read to its end: everything written before the
    call, for topics whose writers are done or flushed), or ``timeout_s`` passed. Returns confluent_kafka
    Message objects."""
    import time

    from confluent_kafka import Consumer, KafkaError

    c = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": group or f"t-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": to_end,
        }
    )
    parts = set(c.list_topics(topic, timeout=10).topics[topic].partitions) if to_end else set()
    c.subscribe([topic])
    out, deadline, quiet_since = [], time.monotonic() + timeout_s, time.monotonic()
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                if expect is None and not to_end and out and time.monotonic() - quiet_since > 3:
                    break
                continue
            if m.error():
                if to_end and m.error().code() == KafkaError._PARTITION_EOF:
                    parts.discard(m.partition())
                    if not parts:
                        break
                continue
            out.append(m)
            quiet_since = time.monotonic()
            if expect is not None and len(out) >= expect:
                break
    finally:
        c.close()
    return out
