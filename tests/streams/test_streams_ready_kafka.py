"""A starting stream worker says it is ready only once it reads its inputs (its tables recovered), and an
existing changelog gets the cleaner settings of the worker's job retention, through a real broker and a
real ``obshub streams worker`` (docs/STREAMS.md "Start-up and readiness", "Retention").

Why: a demo worker that had 20 earlier runs' writes to recover was Stable in its consumer group 2 s after
start and read no input for 10-27 s more; the demo took the Stable group for ready and started training,
and the job's first 10-17 s of steps were closed at once, out of step order, with empty baselines."""

from __future__ import annotations

import socket
import time
import uuid

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from obshub.core import registry
from obshub.core.topics import changelog_cleaner_config
from obshub.demo import parts
from obshub.streams.topics import ensure_internal_topics, internal_topics
from tests.support import testkit

pytestmark = pytest.mark.kafka

#: records the test's worker must read back before it reads any input: tombstones of keys no table holds
#: (cheap to apply, nothing logged), enough for seconds of recovery on any machine
RECOVERY_RECORDS = 60_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gauge(port: int, name: str) -> float:
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def _configs(kafka, topic: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    r = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return {k: e.value for k, e in admin.describe_configs([r])[r].result(timeout=20).items()}


def test_a_recovering_worker_is_not_ready_until_it_reads_its_inputs(kafka, tmp_path):
    tag = f"rd-{uuid.uuid4().hex[:8]}"
    topics = testkit.make_topics(kafka, tag, partitions=2)
    app = f"{tag}-app"
    ensure_internal_topics(kafka.bootstrap_servers, app, 2, 2)
    changelog = f"{app}-jobs-changelog"
    n_parts = internal_topics(app, 2, 2)[changelog]
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 50})
    for i in range(RECOVERY_RECORDS):
        p.produce(changelog, key=b'"junk-%d"' % i, value=None, partition=i % n_parts)
        if i % 10_000 == 0:
            p.poll(0)
    assert p.flush(60) == 0

    port = _free_port()
    index = 341
    w = testkit.Worker(topics, app, index, tmp_path / "w.log", partitions=2, metrics_port=port)
    part = parts.PipelinePart("streams", [], "streams", (app,))
    seen_recovering = 0
    try:
        deadline = time.monotonic() + 180
        rec: dict = {}
        while time.monotonic() < deadline:
            rec = next((c for c in registry.components(kafka) if c["name"] == f"streams-{index}"), {})
            if rec.get("ready") is True:
                break
            if rec.get("ready") is False:
                seen_recovering += 1
                # the demo's check: a Stable group is no longer enough while the worker recovers
                assert not parts.ready(kafka, part, w.proc.pid)
                assert "Worker ready" not in w.log_path.read_text(errors="replace")
            assert w.proc.poll() is None, w.log_path.read_text(errors="replace")[-3000:]
            time.sleep(0.05)
        assert rec.get("ready") is True, rec
        assert seen_recovering > 0  # the record said "recovering" first
        log = w.log_path.read_text(errors="replace")
        assert log.index("Worker ready") < log.index("reading inputs: tables recovered")
        assert f"streams-{index}: reading {topics.events} (tables recovered, " in log  # said at any log level
        assert rec["ready_s"] > 0 and rec["pid"] == w.proc.pid
        assert parts.ready(kafka, part, w.proc.pid)
        assert _gauge(port, "obshub_streams_ready") == 1.0
        assert _gauge(port, "obshub_streams_start_to_ready_seconds") == pytest.approx(rec["ready_s"], abs=0.01)
    finally:
        w.stop()


def test_an_existing_changelog_gets_the_cleaner_settings_of_the_retention_and_keeps_its_others(kafka):
    app = f"cl-{uuid.uuid4().hex[:8]}-app"
    ensure_internal_topics(kafka.bootstrap_servers, app, 2, 2, retention_s=3600.0)
    topic = f"{app}-jobs-changelog"
    before = _configs(kafka, topic)
    assert before["segment.ms"] == "3600000"
    ensure_internal_topics(kafka.bootstrap_servers, app, 2, 2, retention_s=120.0)
    after = _configs(kafka, topic)
    for k, v in changelog_cleaner_config(120.0).items():
        assert after[k] == v, k
    assert after["segment.ms"] == "120000"
    # settings that are not the cleaner's stay as they were (the record size limit, the policy)
    assert after["max.message.bytes"] == before["max.message.bytes"]
    assert after["cleanup.policy"] == "compact"
    # the repartition topic is no changelog: untouched
    assert "120000" not in _configs(kafka, f"{app}-steps").get("segment.ms", "")
    # a worker without a retention changes nothing
    ensure_internal_topics(kafka.bootstrap_servers, app, 2, 2)
    assert _configs(kafka, topic)["segment.ms"] == "120000"


def test_a_json_logging_worker_says_it_is_ready_in_json_only(kafka, tmp_path):
    import json

    tag = f"rj-{uuid.uuid4().hex[:8]}"
    topics = testkit.make_topics(kafka, tag, partitions=2)
    index = 342
    w = testkit.Worker(topics, f"{tag}-app", index, tmp_path / "w.log", partitions=2, args=["--log-format", "json"])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            rec = next((c for c in registry.components(kafka) if c["name"] == f"streams-{index}"), {})
            if rec.get("ready") is True:
                break
            assert w.proc.poll() is None, w.log_path.read_text(errors="replace")[-3000:]
            time.sleep(0.1)
        assert rec.get("ready") is True, rec
        time.sleep(0.5)
        lines = [ln for ln in w.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        msgs = [json.loads(ln)["message"] for ln in lines]  # every line one JSON object
        assert any(m.startswith("reading inputs: tables recovered") for m in msgs), msgs[-5:]
    finally:
        w.stop()
