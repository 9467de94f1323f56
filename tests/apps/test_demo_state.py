"""A demo run removes from the broker what it created there (its rule engine's consumer groups and state
topic), and only that: the real broker of the test session, no demo cluster (no root, no torch)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from obshub.core import schema
from obshub.demo import parts

pytestmark = pytest.mark.kafka


def _commit(bootstrap: str, group: str) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(schema.TOPIC_STEPS, 0, 0)], asynchronous=False)
    finally:
        c.close()


def _committed(admin: AdminClient, group: str) -> bool:
    from confluent_kafka import ConsumerGroupTopicPartitions

    res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)], request_timeout=10)
    return any(tp.offset >= 0 for tp in res[group].result().topic_partitions or [])


def _groups(admin: AdminClient) -> set[str]:
    return {g.group_id for g in admin.list_consumer_groups(request_timeout=10).result().valid}


# The drain wait in a fresh process that holds no other librdkafka client: prints the seconds it waited,
# the clients (``rdk:main`` threads) that came and went during it, and those still alive after it.
_DRAIN_CHILD = """
import os, sys, threading, time
from obshub.core.settings import load_settings
from obshub.demo.runner import _wait_drained

def clients():
    out = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == "rdk:main":
                    out.add(int(tid))
        except OSError:
            continue
    return out

before, seen, stop = clients(), set(), threading.Event()
def sample():
    while not stop.is_set():
        seen.update(clients() - before)
        time.sleep(0.005)
t = threading.Thread(target=sample, daemon=True)
t.start()
t0 = time.monotonic()
try:
    _wait_drained(load_settings(), sys.argv[1], 2.0)
finally:
    stop.set()
    t.join(5)
print(time.monotonic() - t0, len(seen), len(seen & clients()))
"""


def test_a_demo_run_removes_its_groups_and_state_topic_and_nothing_else(kafka, unique):
    run_id, job = f"t-{unique}", f"demo-t-{unique}"
    groups, topics = parts.run_state(run_id, job)
    prefix = parts.rules_group_prefix(run_id)
    assert groups[:2] == [f"{prefix}-engine", f"{prefix}-notify"] and topics == [f"{prefix}-state"]
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_topics([NewTopic(topics[0], 1, 1)])[topics[0]].result(30)
    other = f"obshub-rules-demo-other-{unique}-engine"  # another run's group stays
    for g in (*groups[:2], other):
        _commit(kafka.bootstrap_servers, g)
    assert set(groups[:2]) | {other} <= _groups(admin)

    said: list[str] = []
    removed = parts.remove_run_state(kafka, run_id, job, said.append)
    assert sorted(removed) == sorted([*groups[:2], *topics]), said  # demo-<job> was never made: skipped
    left = _groups(admin)
    assert not set(groups) & left and other in left
    deadline = time.monotonic() + 15  # a deleted topic leaves the metadata a moment after the call returns
    while topics[0] in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.1)
    assert topics[0] not in admin.list_topics(timeout=10).topics
    assert parts.remove_run_state(kafka, run_id, job, said.append) == [] and said == []  # twice: nothing left


def test_group_lag_counts_what_a_group_has_not_committed(kafka, unique):
    """The demo stops its stream worker once the worker's group committed its input (``group_lag`` 0): a
    worker stopped before it read the agents' exit reports left them to the next run's worker, which
    paged ``rank_hang`` for the ended job."""
    from confluent_kafka import Producer

    topic, group = f"lag-{unique}", f"obshub-lag-{unique}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(5):  # 3 in partition 0, 2 in partition 1
        p.produce(topic, b"x", partition=i % 2)
    assert p.flush(10) == 0
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 1), TopicPartition(topic, 1, 0)], asynchronous=False)
        assert parts.group_lag(kafka, group) == 2 + 2
        c.commit(offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 2)], asynchronous=False)
        assert parts.group_lag(kafka, group) == 0
    finally:
        c.close()


def test_the_demos_drain_wait_builds_its_clients_once_and_closes_them(kafka, unique):
    """The demo's stop waits for the stream worker's group to commit its input (``_wait_drained``): it
    read the lag every 0.25 s with an AdminClient and a Consumer built for each read (two librdkafka
    clients, their threads and broker connections, eight times a second). Now one pair serves the whole
    wait and is gone when it returns. Seen from outside: the librdkafka clients (their ``rdk:main``
    threads) that came and went during a 2 s wait on a group that never drains."""

    from confluent_kafka import Producer

    topic, group = f"drain-{unique}", f"obshub-drain-{unique}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for _ in range(3):
        p.produce(topic, b"x", partition=0)
    assert p.flush(10) == 0
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)  # 2 never committed
    finally:
        c.close()
    assert parts.group_lag(kafka, group) == 2
    # In a process of its own: this one holds the suite's other clients (a fixture's, a test's daemon
    # thread's), whose coming and going must not count (a shared process once saw 3).
    out = subprocess.run(
        [sys.executable, "-c", _DRAIN_CHILD, group],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OBSHUB_BOOTSTRAP": kafka.bootstrap_servers},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    waited, built, alive = (float(x) for x in out.stdout.split())
    assert waited >= 2.0  # it waited: the lag stayed 2
    assert built == 2, f"{built:.0f} librdkafka clients built during the wait"  # one admin, one consumer
    assert alive == 0  # both gone once it returned


def test_the_drain_wait_ends_when_a_group_that_writes_to_its_own_topic_committed_what_was_there(kafka, unique):
    """The demo's stream worker writes to a topic it reads itself (its ``progress`` timer broadcasts a
    ``read`` record to every partition of ``<app id>-steps`` twice a second): the lag against the moving
    high watermarks was rarely 0 when read, and a clean demo waited out the whole 15 s drain wait (speed19:
    14.86 s). The wait counts up to the offsets there were when it began (and once more after), so a group
    that keeps committing what it reads is drained though its topic still grows. Here a producer writes a
    record every 0.05 s while a consumer of the group reads and commits (real broker, no worker)."""
    import threading

    from confluent_kafka import Producer

    from obshub.demo.runner import _wait_drained

    topic, group = f"drain-{unique}", f"obshub-drain-{unique}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    stop = threading.Event()

    def produce() -> None:
        p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 0})
        i = 0
        while not stop.is_set():
            p.produce(topic, b"read", partition=i % 2)
            p.flush(5)
            i += 1
            time.sleep(0.05)

    def consume() -> None:
        c = Consumer(
            {
                "bootstrap.servers": kafka.bootstrap_servers,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        c.subscribe([topic])
        try:
            last = time.monotonic()
            while not stop.is_set():
                c.poll(0.05)
                if time.monotonic() - last >= 0.3:  # a commit interval, as the worker's
                    try:
                        c.commit(asynchronous=False)
                    except Exception:  # noqa: BLE001 - nothing read since the last commit
                        pass
                    last = time.monotonic()
        finally:
            c.close()

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 30  # the consumer joined and committed once
        while not _committed(admin, group) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _committed(admin, group), "the consumer never committed"
        assert _wait_drained(kafka, group, 10.0) is True
    finally:
        stop.set()
        for t in threads:
            t.join(10)
