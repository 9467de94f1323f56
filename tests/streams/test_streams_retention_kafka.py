"""Retention through a real broker and a real ``obshub streams worker`` (docs/STREAMS.md "Retention"): a
job that stopped sending is dropped --job-retention-s after its last data (every one of its records in
the changelogs ends in a tombstone) while a job that keeps sending keeps its state; a worker restarted
after the expiry recovers only the live job, whose steps go on closing complete with every host."""

from __future__ import annotations

import re
import socket
import time
import uuid

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from obshub.streams import synthetic
from tests.support import testkit

pytestmark = pytest.mark.kafka

RETENTION_S = 5.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _compacted(kafka, topic: str) -> dict[bytes, bytes | None]:
    """What compaction keeps of ``topic`` (every partition): key -> its last value (None: a tombstone)."""
    c = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": f"kit-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out: dict[bytes, bytes | None] = {}
        eof: set[int] = set()
        deadline = time.monotonic() + 30
        while len(eof) < len(parts) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                eof.add(m.partition())
                continue
            out[m.key()] = m.value()
        return out
    finally:
        c.close()


def _gauge(port: int, name: str, label: str | None = None) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    pat = rf"^{name}\{{table=\"{label}\"\}} (\S+)$" if label else rf"^{name} (\S+)$"
    m = re.search(pat, text, re.M)
    return float(m.group(1)) if m else float("nan")


def _gauge_within(port: int, table: str, want: float, timeout_s: float = 4.0) -> float:
    """``obshub_streams_table_keys{table}`` once it equals ``want``, or its value after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = _gauge(port, "obshub_streams_table_keys", table)
        if got == want or time.monotonic() >= deadline:
            return got
        time.sleep(0.25)


class _Live:
    """A job that keeps sending: one step (a batch per host) per ``publish_step`` call."""

    def __init__(self, kafka, topic: str, job: str, hosts: int = 2, steps: int = 200):
        self.kafka, self.topic, self.hosts = kafka, topic, hosts
        self.items = synthetic.generate(synthetic.Scenario(job=job, hosts=hosts, steps=steps))
        testkit.publish(kafka, topic, self.items[:hosts])  # registrations
        self.next = hosts
        self.job = job

    def publish_step(self) -> None:
        testkit.publish(self.kafka, self.topic, self.items[self.next : self.next + self.hosts])
        self.next += self.hosts


def _wait_log(w: testkit.Worker, needle: str, count: int, timeout_s: float, live: _Live) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if w.log_path.read_text(errors="replace").count(needle) >= count:
            return
        live.publish_step()
        time.sleep(0.5)
    raise AssertionError(f"no {count} x {needle!r} in {timeout_s} s:\n{w.log_path.read_text(errors='replace')[-3000:]}")


def test_an_ended_job_is_dropped_a_live_one_kept_and_a_restart_recovers_only_the_live_job(kafka, tmp_path):
    tag = f"rt-{uuid.uuid4().hex[:8]}"
    topics = testkit.make_topics(kafka, tag, partitions=2)
    app = f"{tag}-app"
    args = ["--job-retention-s", str(RETENTION_S)]
    port = _free_port()
    w = testkit.Worker(topics, app, 331, tmp_path / "w1.log", window_s=2.0, partitions=2, metrics_port=port, args=args)
    old_job = f"{tag}-old"
    try:
        w.wait_ready(90)
        testkit.publish(kafka, topics.events, synthetic.generate(synthetic.Scenario(job=old_job, hosts=2, steps=3)))
        live = _Live(kafka, topics.events, f"{tag}-live")
        for _ in range(3):
            live.publish_step()
        got = testkit.summaries(
            testkit.collect(
                kafka, topics.steps, until=lambda ms: sum(m.key() == old_job.encode() for m in ms) >= 3, timeout_s=90
            )
        )
        assert sorted(s["step"] for s in got if s["job"] == old_job) == [0, 1, 2]
        # the old job is silent from now on; the live one sends a step every 0.5 s
        _wait_log(w, f"dropped the state of job {old_job} in partition", 2, 60, live)
        for _ in range(4):
            live.publish_step()
            time.sleep(0.5)
        assert "dropped the state of job " + live.job not in w.log_path.read_text(errors="replace")
        # the live job's, one per partition (the gauges are set every timer tick, 0.5 s)
        assert _gauge_within(port, "jobs", 2) == 2
    finally:
        w.stop()

    # every record of the old job ends in a tombstone; the live job's records are there
    for table in ("jobs", "members", "closed", "agents"):
        view = _compacted(kafka, f"{app}-{table}-changelog")
        old = {k: v for k, v in view.items() if old_job.encode() in k}
        assert old and all(v is None for v in old.values()), (table, old)
        assert any(live.job.encode() in k and v is not None for k, v in view.items()), table

    # a restart (well within the live job's retention) recovers the live job only, and it goes on
    port2 = _free_port()
    w2 = testkit.Worker(
        topics, app, 332, tmp_path / "w2.log", window_s=2.0, partitions=2, metrics_port=port2, args=args
    )
    try:
        w2.wait_ready(90)
        first = live.next // live.hosts - 1  # the step number of the next batch
        for _ in range(4):
            live.publish_step()
            time.sleep(0.3)
        got = testkit.summaries(
            testkit.collect(
                kafka,
                topics.steps,
                until=lambda ms: any(
                    m.key() == live.job.encode() and b'"step":%d,' % (first + 2) in m.value() for m in ms
                ),
                timeout_s=90,
            )
        )
        after = [s for s in got if s["job"] == live.job and s["step"] >= first]
        assert after and all(s["missing_hosts"] == [] and len(s["expected_hosts"]) == 2 for s in after)
        assert _gauge_within(port2, "jobs", 2) == 2
        # per partition: the live job's 2 host buckets and 2 rank buckets (the old job's would double it)
        assert _gauge(port2, "obshub_streams_table_keys", "members") == 2 * (2 + 2)
    finally:
        w2.stop()
