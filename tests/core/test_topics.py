"""``obshub topics create|check`` against the real broker of the test session: the one table
(``obshub.core.topics.layout``) covers the stream worker's own topics, ``create`` is idempotent, ``check``
names each difference (topic, setting, want, have) and exits 1, and a replication factor larger than the
cluster is a clear error before anything is created."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient, NewTopic

from obshub.core.topics import layout, min_insync_replicas, topic_config
from obshub.streams.topics import TABLES
from obshub.topics_cli import _wait_listed, topics_group, wanted


def test_the_table_covers_every_topic_of_the_worker_and_engine(monkeypatch):
    from obshub.core.settings import load_settings

    monkeypatch.setenv("OBSHUB_KAFKA_REPLICATION_FACTOR", "3")
    monkeypatch.setenv("OBSHUB_KAFKA_PARTITIONS", "obshub.events.v1=64")
    rows = {r.name: r for r in wanted(load_settings(), "app", 16, "prod")}
    assert rows["obshub.events.v1"].partitions == 64 and rows["obshub.events.v1"].retention_ms == 24 * 3600 * 1000
    for table, like in TABLES.items():
        r = rows[f"app-{table}-changelog"]
        assert r.cleanup_policy == "compact" and r.retention_ms is None and "retention.ms" not in r.config()
        assert r.partitions == (64 if like == "input" else 16)
    assert rows["app-steps"].cleanup_policy == "delete" and rows["app-steps"].partitions == 16
    assert rows["app-__assignor-__leader"].partitions == 1
    assert (
        rows["prod-state"].cleanup_policy == "compact"
        and rows["prod-state"].partitions == rows["obshub.steps.v1"].partitions
    )
    assert {(r.replication_factor, r.min_insync_replicas) for r in rows.values()} == {(3, 2)}
    assert [min_insync_replicas(n) for n in (1, 2, 3, 5)] == [1, 1, 2, 2]
    assert layout(load_settings()) and topic_config("x-folded-changelog", 1) == {
        "min.insync.replicas": "1",
        "cleanup.policy": "compact",
        "max.message.bytes": str(16 * 1024 * 1024),  # what the worker's producer may send
    }


def _invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(topics_group, list(args), env=env, catch_exceptions=False)


@pytest.mark.kafka
def test_create_is_idempotent_and_check_names_each_difference(kafka, unique):
    app = f"topics-{unique}"
    r = _invoke("create", "--app-id", app, "--streams-partitions", "3")
    assert r.exit_code == 0, r.output
    assert f"{app}-steps" in r.output and f"{app}-folded-changelog" in r.output
    assert "obshub.events.v1," not in r.output  # made by `obshub up` already
    again = _invoke("create", "--app-id", app, "--streams-partitions", "3")
    assert again.exit_code == 0 and "created 0 topic(s)" in again.output
    assert _invoke("check", "--app-id", app, "--streams-partitions", "3").exit_code == 0

    # a topic made by hand with other settings, and one missing
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    other = f"topics2-{unique}"
    fut = admin.create_topics([NewTopic(f"{other}-steps", 2, 1, config={"retention.ms": "60000"})])
    fut[f"{other}-steps"].result(30)
    _wait_listed(admin, [f"{other}-steps"], kafka.bootstrap_servers)
    r = _invoke("check", "--app-id", other, "--streams-partitions", "3", "--json")
    assert r.exit_code == 1
    diffs = [json.loads(line) for line in r.output.splitlines() if line.startswith("{")]
    by = {(d["topic"], d["setting"]): (d["want"], d["have"]) for d in diffs}
    assert by[(f"{other}-steps", "partitions")] == ("3", "2")
    assert by[(f"{other}-steps", "retention.ms")] == (str(24 * 3600 * 1000), "60000")
    assert by[(f"{other}-folded-changelog", "exists")] == ("yes", "no")
    assert (f"{other}-steps", "cleanup.policy") not in by  # the same as wanted: not reported
    assert not any(t == "obshub.events.v1" for t, _s in by)
    pending = {d["topic"] for d in diffs if d["pending"]}
    assert f"{other}-folded-changelog" in pending and f"{other}-steps" not in pending

    # right after `obshub up`: the worker's and engine's own topics are not there yet, which is no failure
    fresh = f"fresh-{unique}"
    r = _invoke("check", "--app-id", fresh, "--rules-group-prefix", f"{fresh}-rules")
    assert r.exit_code == 0, r.output
    assert f"{fresh}-steps" in r.output and f"{fresh}-rules-state" in r.output and "not created yet" in r.output
    assert "0 difference(s)" in r.output and "the rule engine at its first start" in r.output


@pytest.mark.kafka
def test_a_replication_factor_above_the_broker_count_is_a_clear_error(kafka, unique):
    env = {**os.environ, "OBSHUB_KAFKA_REPLICATION_FACTOR": "3"}
    app = f"toobig-{unique}"
    r = subprocess.run(
        [sys.executable, "-m", "obshub.cli", "topics", "create", "--app-id", app],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 1
    assert "replication factor 3 is larger than the 1 broker(s)" in r.stderr and "Traceback" not in r.stderr
    assert "OBSHUB_KAFKA_REPLICATION_FACTOR" in r.stderr
    md = AdminClient({"bootstrap.servers": kafka.bootstrap_servers}).list_topics(timeout=10)
    assert not any(t.startswith(app) for t in md.topics)  # nothing was created


def test_the_deployment_checked_is_the_running_worker_and_engine_else_the_default(tmp_path):
    """`obshub topics check` on a running demo stack checked the default app id's topics
    (obshub-streams-*), not the demo worker's (obshub-demo-streams-*): the running worker's and engine's
    component records (`obshub status`) now say which, and the first line of the output says it."""
    from obshub.core import registry
    from obshub.core.settings import load_settings
    from obshub.topics_cli import deployment

    s = load_settings(home=tmp_path)
    d = deployment(s, None, None, None)
    assert (d.app_id, d.partitions, d.rules_prefix) == ("obshub-streams", None, "obshub-rules")
    assert "(the default: no stream worker runs from" in d.said
    # records as the worker and the engine write them (this process stands for both: it is running)
    registry.register_component(s, "streams-1", os.getpid(), app_id="obshub-demo-streams", partitions=8)
    registry.register_component(s, "rules", os.getpid(), group_prefix="obshub-rules-demo-r1")
    registry.register_component(s, "streams-9", 2**22 + 7, app_id="gone-app")  # not running: not counted
    d = deployment(s, None, None, None)
    assert (d.app_id, d.partitions, d.rules_prefix) == ("obshub-demo-streams", 8, "obshub-rules-demo-r1")
    assert "--app-id obshub-demo-streams (the running stream worker streams-1's)" in d.said and "gone" not in d.said
    # an option given wins; a second worker of another app is named as also running
    registry.register_component(s, "streams-2", os.getpid(), app_id="other-app", partitions=2)
    d = deployment(s, "mine", 3, None)
    assert (d.app_id, d.partitions) == ("mine", 3) and "also running here: --app-id" not in d.said
    d = deployment(s, None, None, "p")
    assert d.app_id == "obshub-demo-streams" and "also running here: --app-id other-app" in d.said


@pytest.mark.kafka
def test_check_without_app_id_covers_the_running_worker(kafka, unique, tmp_path):
    """A real stream worker running from the session's OBSHUB_HOME: `topics check` with no --app-id checks
    its topics (at its --partitions) and says so."""
    from tests.support import testkit

    tag = f"tc-{unique}"
    topics = testkit.make_topics(kafka, tag, partitions=kafka.events_partitions)  # as obshub.events.v1
    w = testkit.Worker(topics, f"{tag}-app", 161, tmp_path / "w.log", partitions=3)
    try:
        w.wait_ready(120)
        r = _invoke("check", "--json")
        assert f"checking the topics of --app-id {tag}-app (the running stream worker streams-161's)" in r.output
        got = [json.loads(line) for line in r.output.splitlines() if line.startswith("{")]
        assert not any(d["topic"].startswith("obshub-streams-") for d in got), got
        assert r.exit_code == 0, r.output  # the worker made its own topics, at its own partitions
    finally:
        w.stop()
