"""A demo run removes from the broker what it created there (its rule engine's consumer groups and state
topic), and only that: the real broker of the test session, no demo cluster (no root, no torch)."""

from __future__ import annotations

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


def _groups(admin: AdminClient) -> set[str]:
    return {g.group_id for g in admin.list_consumer_groups(request_timeout=10).result().valid}


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
