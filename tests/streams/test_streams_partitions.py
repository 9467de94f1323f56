"""Partition counts are settings: ``obshub up`` sizes the events and step topics from the settings, a new
stream app takes ``OBSHUB_STREAMS_PARTITIONS``, an existing app keeps the count it was created with, and
asking an existing app for another count is a clear error (real broker, real worker processes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from confluent_kafka.admin import AdminClient

from obshub.core import schema
from obshub.core.settings import load_settings
from obshub.core.topics import TOPICS, topic_specs
from tests.support import testkit


def test_topic_specs_follow_the_settings(monkeypatch):
    monkeypatch.setenv("OBSHUB_EVENTS_PARTITIONS", "64")
    monkeypatch.setenv("OBSHUB_STEPS_PARTITIONS", "6")
    specs = {t.name: t for t in topic_specs(load_settings())}
    assert specs[schema.TOPIC_EVENTS].partitions == 64 and specs[schema.TOPIC_STEPS].partitions == 6
    assert {n: t.partitions for n, t in specs.items() if n not in (schema.TOPIC_EVENTS, schema.TOPIC_STEPS)} == {
        t.name: t.partitions for t in TOPICS if t.name not in (schema.TOPIC_EVENTS, schema.TOPIC_STEPS)
    }
    monkeypatch.setenv("OBSHUB_STREAMS_PARTITIONS", "0")
    from obshub.core.errors import ConfigError

    with pytest.raises(ConfigError, match="streams_partitions: Input should be greater than or equal to 1"):
        load_settings()


def _own_partitions(kafka, app: str) -> int:
    md = AdminClient({"bootstrap.servers": kafka.bootstrap_servers}).list_topics(timeout=10)
    return len(md.topics[f"{app}-steps"].partitions)


@pytest.mark.kafka
def test_new_app_takes_the_setting_existing_app_keeps_its_count(kafka, tmp_path, unique):
    topics = testkit.make_topics(kafka, f"parts-{unique}", partitions=2)
    app = f"parts-{unique}-app"
    base = [
        sys.executable,
        "-m",
        "obshub.cli",
        "streams",
        "worker",
        "--app-id",
        app,
        "--input-topic",
        topics.events,
        "--output-topic",
        topics.steps,
        "--dlq-topic",
        topics.dlq,
        "--log-level",
        "info",
    ]

    def start(extra: list[str], env: dict, log: str) -> subprocess.Popen:
        return subprocess.Popen(
            base + extra,
            stdout=open(tmp_path / log, "wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            cwd=testkit.REPO,
            start_new_session=True,
        )

    def wait_ready(proc, log: str) -> None:
        import time

        deadline = time.monotonic() + 120
        while "Worker ready" not in (tmp_path / log).read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / log).read_text()[-2000:]
            time.sleep(0.3)

    def stop(proc) -> None:
        import signal

        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)

    w = start([], {"OBSHUB_STREAMS_PARTITIONS": "3"}, "a.log")
    try:
        wait_ready(w, "a.log")
    finally:
        stop(w)
    assert _own_partitions(kafka, app) == 3
    w = start([], {"OBSHUB_STREAMS_PARTITIONS": "5"}, "b.log")  # the app exists: its count wins
    try:
        wait_ready(w, "b.log")
    finally:
        stop(w)
    assert _own_partitions(kafka, app) == 3
    bad = subprocess.run(base + ["--partitions", "4"], capture_output=True, text=True, timeout=120, cwd=testkit.REPO)
    assert bad.returncode != 0
    assert f"topic {app}-steps has 3 partitions, this worker needs 4" in bad.stderr + bad.stdout
