"""Operators' commands against the session's broker: `obshub alerts` (latest change per alert, filters,
time range), reading topics by time (offsets-for-times: `snapshot`, `trace export --since`, the events of
exported steps bounded by their summaries' times), and `obshub doctor`'s exit status."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from confluent_kafka import Producer

from obshub.core import schema
from obshub.export.source import parse_when, read_job, snapshot
from obshub.streams import synthetic
from tests.conftest import REPO
from tests.support import testkit

pytestmark = pytest.mark.kafka
OBSHUB = [sys.executable, "-m", "obshub.cli"]
H = 3_600_000_000_000  # one hour, ns


def _change(job: str, host: str, rule: str, status: str, t_ns: int) -> dict:
    """An alert change as a rule engine writes it, of an engine no test runs (``engine``): every notify loop
    on the session's broker skips it as another engine's. Without it, a rule engine started later in the
    session (a new notify group reads the topic from its beginning) took the recent ones for its own and
    delivered them first; with its webhook down, its sink's queue retried them and never reached its own
    alert (test_rules_service's at-least-once test, when no test truncated the topic in between)."""
    fp = f"{job}-{host}-{rule}"[-16:]
    return {
        "v": 1,
        "engine": "ops-commands-test",
        "fingerprint": fp,
        "rule": rule,
        "status": status,
        "severity": "warning",
        "labels": {"alertname": rule, "job": job, "host": host, "layer": "network", "severity": "warning"},
        "annotations": {"summary": f"{rule} on {host}"},
        "starts_at_ns": t_ns,
        "ends_at_ns": 0,
        "updated_at_ns": t_ns,
        "value": 1.0,
    }


def _produce(bootstrap: str, topic: str, items: list[tuple[int, bytes]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for t_ns, value in items:
        p.produce(topic, value=value, timestamp=t_ns // 1_000_000)
    assert p.flush(30) == 0


def test_alerts_lists_the_latest_change_per_alert_within_the_time_range(kafka, unique):
    job, now = f"ops-{unique}", time.time_ns()
    recs = [
        _change(job, "n1", "old_rule", "firing", now - 48 * H),  # outside the default 24 h
        _change(job, "n2", "tcp_rule", "firing", now - 2 * H),
        {**_change(job, "n2", "tcp_rule", "resolved", now - H), "ends_at_ns": now - H},
        _change(job, "n3", "mem_rule", "firing", now - H // 6),
        _change(f"other-{unique}", "n9", "mem_rule", "firing", now - H // 6),
    ]
    _produce(kafka.bootstrap_servers, schema.TOPIC_ALERTS, [(r["updated_at_ns"], json.dumps(r).encode()) for r in recs])

    def run(*args):
        r = subprocess.run(
            OBSHUB + ["alerts", "--job", job, *args], capture_output=True, text=True, cwd=REPO, timeout=120
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    got = json.loads(run("--json"))
    assert [(r["labels"]["host"], r["status"]) for r in got] == [("n3", "firing"), ("n2", "resolved")]
    assert [r["labels"]["host"] for r in json.loads(run("--json", "--firing"))] == ["n3"]
    assert {r["labels"]["host"] for r in json.loads(run("--json", "--since", "3d"))} == {"n1", "n2", "n3"}
    assert [r["labels"]["host"] for r in json.loads(run("--json", "--since", "3d", "--rule", "old_rule"))] == ["n1"]
    table = run("--host", "n3")
    assert "mem_rule" in table and "firing" in table and "tcp_rule" not in table
    r = subprocess.run(
        OBSHUB + ["alerts", "--since", "yesterday"], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert r.returncode == 2 and "'yesterday' is neither a duration" in r.stderr


def test_alerts_refuses_a_range_that_ends_before_it_starts():
    """`--since 2h --until 5h` reads from two hours ago to five hours ago: empty, and refused before any
    broker is asked (exit 2, naming --until)."""
    r = subprocess.run(
        OBSHUB + ["alerts", "--since", "2h", "--until", "5h", "--bootstrap", "127.0.0.1:1", "--timeout-s", "1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert "--until" in r.stderr and "5h is before --since 2h" in r.stderr


def test_snapshot_reads_only_the_time_range(kafka, unique):
    topics = testkit.make_topics(kafka, f"seek-{unique}", partitions=3)
    now = time.time_ns()
    old = [(now - 5 * H + i * 1_000_000_000, f"old{i}".encode()) for i in range(20)]
    new = [(now - H // 60 + i * 1_000_000, f"new{i}".encode()) for i in range(7)]
    _produce(kafka.bootstrap_servers, topics.events, old + new)

    def values(**kw):
        return sorted(m.value() for m in snapshot(kafka.bootstrap_servers, topics.events, 30, **kw))

    assert values(since_ns=now - H) == sorted(v for _t, v in new)
    assert values(until_ns=now - 4 * H) == sorted(v for _t, v in old)
    assert list(snapshot(kafka.bootstrap_servers, topics.events, 30, since_ns=now + H)) == []
    assert len(list(snapshot(kafka.bootstrap_servers, topics.events, 30))) == 27
    assert abs(parse_when("2h", now) - (now - 2 * H)) == 0
    assert parse_when("2026-12-01T02:00:00Z") == parse_when("2026-12-01T02:00:00+00:00")


def test_export_reads_events_near_the_summaries_of_its_steps(kafka, unique, tmp_path):
    topics = testkit.make_topics(kafka, f"exs-{unique}", partitions=2)
    job, now = f"exs-{unique}", time.time_ns()
    scn = synthetic.Scenario(job=job, hosts=2, steps=6, straggler=1, guilty_steps=(3,))
    batches = synthetic.generate(scn)
    # the same job's batches two days ago (an earlier run under the same name) and now
    _produce(
        kafka.bootstrap_servers,
        topics.events,
        [(now - 48 * H, schema.encode_batch(b)) for _k, b in batches]
        + [(now, schema.encode_batch(b)) for _k, b in batches],
    )
    summaries = [
        {"v": 1, "job": job, "step": s, "closed_at_ns": now, "straggler": None, "blame": []} for s in range(2, 5)
    ]
    _produce(kafka.bootstrap_servers, topics.steps, [(now, json.dumps(s).encode()) for s in summaries])
    data = read_job(
        kafka.bootstrap_servers, job, (2, 4), timeout_s=30, events_topic=topics.events, steps_topic=topics.steps
    )
    assert data.batches == len(batches)  # only the recent copy was read
    assert sorted(data.summaries) == [2, 3, 4] and [h.host for h in data.hosts] == ["node0", "node1"]
    out = tmp_path / "t.json"
    r = subprocess.run(
        OBSHUB
        + [
            "trace",
            "export",
            "--job",
            job,
            "--steps",
            "0-5",
            "--since",
            "1h",
            "-o",
            str(out),
            "--events-topic",
            topics.events,
            "--steps-topic",
            topics.steps,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        OBSHUB
        + [
            "trace",
            "export",
            "--job",
            job,
            "--steps",
            "0-5",
            "--until",
            "1d",
            "--since",
            "3d",
            "-o",
            str(out),
            "--events-topic",
            topics.events,
            "--steps-topic",
            topics.steps,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 0 and "2 hosts" in r.stderr, r.stderr


def test_doctor_exit_status_follows_the_checks_a_role_needs(kafka, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "OBSHUB_HOME": str(tmp_path / "h"), "HOME": str(tmp_path)}
    ok = subprocess.run(
        OBSHUB + ["doctor", "--no-bpf", "--json", "--role", "kafka"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**env, "OBSHUB_BOOTSTRAP": kafka.bootstrap_servers},
    )
    assert ok.returncode == 0, ok.stderr
    checks = {c["name"]: c for c in json.loads(ok.stdout)}
    assert checks["kafka broker"]["ok"] is True and checks["kafka broker"]["needed_by"] == "kafka"
    bad = subprocess.run(
        OBSHUB + ["doctor", "--no-bpf", "--role", "kafka"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**env, "OBSHUB_BOOTSTRAP": "127.0.0.1:9"},
    )
    assert bad.returncode == 1
    assert "doctor: 1 check that the kafka role needs failed: kafka broker" in bad.stderr
