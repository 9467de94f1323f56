"""Faust (aiokafka) against the broker the project installs (Kafka 4.1.1 by default; OBSHUB_KAFKA_VERSION
selects another): Faust creates its own changelog topic, joins a consumer group, commits offsets, and a
restarted worker recovers its table from the changelog."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support import testkit
from tests.support.stopping import stop_group

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]


def _run(kafka, app_id, topic, out: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.compat",
            "--bootstrap",
            kafka.bootstrap_servers,
            "--app-id",
            app_id,
            "--topic",
            topic,
            "--out",
            str(out),
            "--state-dir",
            str(out.parent / "state"),
        ],
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        cwd=REPO,
        start_new_session=True,
    )


def _wait_count(out: Path, n: int, proc: subprocess.Popen, log: Path, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if out.exists() and out.read_text().strip() == str(n):
            return
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"count {out.read_text().strip() if out.exists() else None} != {n}\n{log.read_text()[-3000:]}")


def test_faust_creates_topics_joins_group_and_recovers_changelog(kafka, tmp_path, unique):
    app_id, topic = f"compat-{unique}", f"compat-{unique}-in"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
    out, log = tmp_path / "count", tmp_path / "faust.log"
    testkit.publish(kafka, topic, [(b"k", b"x")] * 5)
    proc = _run(kafka, app_id, topic, out, log)
    try:
        _wait_count(out, 5, proc, log)
        time.sleep(1.5)  # let a commit happen
    finally:
        stop_group(proc)
    md = admin.list_topics(timeout=10)
    assert f"{app_id}-counts-changelog" in md.topics, "Faust created its changelog topic"
    groups = {g.group_id for g in admin.list_consumer_groups().result().valid}
    assert app_id in groups, "Faust's consumer group is known to the broker"
    out.unlink()
    mark = len(log.read_text())
    proc = _run(kafka, app_id, topic, out, log)
    try:
        # publish once the restarted worker has recovered and is ready (docs/STREAMS.md: Faust can
        # mishandle input that arrives while a worker is still recovering)
        deadline = time.monotonic() + 90
        while "Worker ready" not in log.read_text()[mark:] and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        testkit.publish(kafka, topic, [(b"k", b"y")] * 3)
        _wait_count(out, 8, proc, log)  # 5 recovered from the changelog + 3 new, none re-read
    finally:
        stop_group(proc)
    assert "Recovery complete" in log.read_text() or "Restore complete" in log.read_text()
