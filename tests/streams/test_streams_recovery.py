"""A damaged table changelog cannot wedge a stream worker: records whose key or value does not decode
(keys: JSON text; values: msgpack after a mark byte, or JSON as older workers wrote them) in the changelogs of an app are logged, counted and skipped when a worker
(re)starts and recovers its tables; it becomes ready and summarises new input."""

from __future__ import annotations

import re
import socket
import uuid

import httpx
import pytest
from confluent_kafka import Producer

from obshub.streams import synthetic
from obshub.streams.topics import ensure_internal_topics
from tests.support import testkit

pytestmark = pytest.mark.kafka


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _summaries(kafka, topic: str, job: str, n: int) -> list[dict]:
    def enough(msgs):
        return sum(1 for m in msgs if m.key() == job.encode()) >= n

    return [s for s in testkit.summaries(testkit.collect(kafka, topic, until=enough, timeout_s=90)) if s["job"] == job]


def test_undecodable_changelog_records_are_skipped_and_the_worker_becomes_ready(kafka, tmp_path):
    """The app's changelogs (as a stopped worker leaves them) hold damaged records; a worker starting on
    them recovers its tables from the changelogs, skips those records and becomes ready."""
    tag = f"rc-{uuid.uuid4().hex[:8]}"
    topics = testkit.make_topics(kafka, tag, partitions=2)
    app = f"{tag}-app"
    ensure_internal_topics(kafka.bootstrap_servers, app, 2, 2)
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    bad = [
        (f"{app}-parts-changelog", b"\xff\xfenot utf-8", b'{"a": 1}'),
        (f"{app}-steps-changelog", b'"job|1"', b"not json at all"),
        (f"{app}-agents-changelog", b"\x80\x81", b"\xc1"),
        (f"{app}-closed-changelog", b'"job|2"', b"\xc1\x93\x01"),  # the msgpack mark, then a cut array
    ]
    for topic, key, value in bad:
        for part in range(2):
            p.produce(topic, key=key, value=value, partition=part)
        p.produce(topic, key=b'"valid"', value=b'{"ok": 1}', partition=0)  # undamaged records recover,
        p.produce(topic, key=b'"valid2"', value=b"\xc1\x81\xa2ok\x01", partition=0)  # in either format
    assert p.flush(10) == 0
    port = _free_port()
    w = testkit.Worker(topics, app, 302, tmp_path / "w.log", window_s=30.0, partitions=2, metrics_port=port)
    try:
        w.wait_ready(90)
        scn = synthetic.Scenario(job=f"{tag}-b", hosts=2, steps=2)
        testkit.publish(kafka, topics.events, synthetic.generate(scn))
        got = _summaries(kafka, topics.steps, scn.job, 2)
        assert sorted(s["step"] for s in got) == [0, 1], "the recovered worker processes new input"
        text = (tmp_path / "w.log").read_text(errors="replace")
        assert text.count("skipped a changelog record") == 2 * len(bad), text[-3000:]
        assert "key (not UTF-8: byte 0xff" in text and "value (not JSON" in text and "value (not msgpack" in text
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        skipped = sum(
            float(v) for v in re.findall(r"^obshub_streams_changelog_skipped_total\{[^}]*\} (\S+)$", metrics, re.M)
        )
        assert skipped == 2 * len(bad)
    finally:
        w.stop()
