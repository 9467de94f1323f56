"""Two `obshub rules serve --scale-out` in one consumer group against the real broker: they split four jobs
(one per steps partition) between them; one engine is SIGKILLed after it evaluated and committed two of
the three steps its rule needs; the survivor takes its jobs over with their window state. Every job's
alert fires once: one firing change per job on obshub.alerts.v1 (read_committed) and one delivery per
job to the webhook."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from obshub.core import schema
from obshub.rules.service_engine import murmur2, partition_for
from tests.conftest import consume_all
from tests.rules.test_rules_sinks import HttpRecorder
from tests.support.stopping import stop_group

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.kafka


def test_murmur2_is_kafkas_default_partitioner():
    # reference values of the Java client's Utils.murmur2 (its own unit test)
    cases = {
        "21": -973932308,
        "foobar": -790332482,
        "a-little-bit-long-string": -985981536,
        "a-little-bit-longer-string": -1486304829,
        "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        "abc": 479470107,
    }
    for key, want in cases.items():
        assert murmur2(key.encode()) == want & 0xFFFFFFFF, key
    assert partition_for("foobar", 4) == (-790332482 & 0x7FFFFFFF) % 4


def _start(kafka, tmp_path: Path, name: str, rules: Path, cfg: Path, prefix: str, url: str) -> subprocess.Popen:
    home = tmp_path / name
    env = {
        **os.environ,
        "OBSHUB_HOME": str(home),
        "OBSHUB_KAFKA_PORT": str(kafka.kafka_port),
        "TEST_RULES_WEBHOOK": url,
    }
    log = open(tmp_path / f"{name}.log", "ab")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "obshub.cli",
            "rules",
            "serve",
            "-r",
            str(rules),
            "-c",
            str(cfg),
            "--group-prefix",
            prefix,
            "--scale-out",
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait(cond, timeout: float, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.3)
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in logs if p.exists())
    raise AssertionError(f"timed out waiting for {what}\n{tails}")


def _owned(log: Path) -> set[int]:
    """Steps partitions an engine holds now, from its log (took over / revoked)."""
    text = log.read_text() if log.exists() else ""
    owned: set[int] = set()
    for m in re.finditer(r"engine: (took over|gave up) partition (\d+)", text):
        (owned.add if m.group(1) == "took over" else owned.discard)(int(m.group(2)))
    return owned


def _committed(kafka, group: str, parts: list[int]) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group, "enable.auto.commit": False})
    try:
        return {
            tp.partition: tp.offset
            for tp in c.committed([TopicPartition(schema.TOPIC_STEPS, p) for p in parts], timeout=10)
        }
    finally:
        c.close()


def _ends(kafka, parts: list[int]) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "ends"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(schema.TOPIC_STEPS, p), timeout=10)[1] for p in parts}
    finally:
        c.close()


def test_two_engines_split_jobs_and_survive_a_kill(kafka, unique, tmp_path):
    md = AdminClient({"bootstrap.servers": kafka.bootstrap_servers}).list_topics(timeout=10)
    n = len(md.topics[schema.TOPIC_STEPS].partitions)
    assert n >= 2, "the steps topic needs partitions to split jobs over"
    jobs: dict[int, str] = {}
    i = 0
    while len(jobs) < min(4, n):
        name = f"so-{unique}-{i}"
        jobs.setdefault(partition_for(name, n), name)
        i += 1
    prefix = f"so-{unique}"
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"""\
version: 1
rules:
  - id: lost_three_times
    description: batches lost in 3 steps of a job (test rule)
    severity: error
    signal: steps
    condition: job.startsWith('so-{unique}-') && quality.lost_batches > 0
    group_by: {{job: job}}
    window: 10m
    threshold: {{aggregate: count, at_least: 3}}
    annotations: {{summary: "lost batches in 3 steps, last {{{{ step }}}}"}}
  - id: slow_sync_twice
    description: two slow CUDA synchronize calls of a job (test rule on the events topic)
    severity: warning
    signal: events
    kinds: [CUDA_SYNC]
    condition: job.startsWith('so-{unique}-') && duration_ns > 1000
    group_by: {{job: job}}
    window: 10m
    threshold: {{aggregate: count, at_least: 2}}
""")
    cfg = tmp_path / "alerting.yaml"
    cfg.write_text("""\
version: 1
route: {group_by: [alertname, job], group_wait: 0s, group_interval: 1s, repeat_interval: 1h}
delivery: {max_attempts: 100, max_elapsed: 2m, timeout: 2s, backoff_initial: 100ms, backoff_max: 300ms}
sinks:
  - {name: hook, type: webhook, url_env: TEST_RULES_WEBHOOK}
""")
    hook = HttpRecorder()
    url = hook.url + "/hook"
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = {"a": _start(kafka, tmp_path, "a", rules, cfg, prefix, url)}
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "partitioner": "murmur2_random"})

    def send_event(seq: int) -> None:
        for job in jobs.values():
            ev = schema.Event(int(schema.Kind.CUDA_SYNC), time.time_ns(), 5000)
            batch = schema.Batch(job=job, host=f"{job}-h", host_id=1, agent_id=f"{job}-agent", seq=seq, events=[ev])
            producer.produce(schema.TOPIC_EVENTS, key=batch.host, value=schema.encode_batch(batch))
        assert producer.flush(30) == 0

    def send(step: int) -> None:
        for job in jobs.values():
            summary = {
                "v": 1,
                "job": job,
                "step": step,
                "closed_by": "complete",
                "closed_at_ns": time.time_ns(),
                "hosts": ["h"],
                "expected_hosts": ["h"],
                "missing_hosts": [],
                "quality": {"lost_batches": 1},
            }
            producer.produce(schema.TOPIC_STEPS, key=job, value=json.dumps(summary).encode())
        assert producer.flush(30) == 0

    try:
        _wait(lambda: len(_owned(logs[0])) == n, 90, "engine a to own every steps partition", logs)
        procs["b"] = _start(kafka, tmp_path, "b", rules, cfg, prefix, url)
        _wait(
            lambda: (
                _owned(logs[1])
                and len(_owned(logs[0])) + len(_owned(logs[1])) == n
                and not _owned(logs[0]) & _owned(logs[1])
            ),
            90,
            "the two engines to split the partitions",
            logs,
        )
        a_jobs = [j for p, j in jobs.items() if p in _owned(logs[0])]
        b_jobs = [j for p, j in jobs.items() if p in _owned(logs[1])]
        assert a_jobs and b_jobs, (a_jobs, b_jobs)
        send_event(0)
        send(1)
        send(2)
        parts = sorted(jobs)
        _wait(
            lambda: all(_committed(kafka, f"{prefix}-engine", parts)[p] >= _ends(kafka, parts)[p] for p in parts),
            60,
            "both engines to commit steps 1 and 2",
            logs,
        )
        time.sleep(2.5)  # > the 1 s checkpoint: the first event's window hit is committed too
        os.killpg(procs["a"].pid, signal.SIGKILL)  # engine a dies holding the window state of its jobs
        procs["a"].wait(30)
        send(3)
        send_event(1)

        want = {(rule, job): 1 for rule in ("lost_three_times", "slow_sync_twice") for job in jobs.values()}

        def fired() -> dict[tuple[str, str], int]:
            out: dict[tuple[str, str], int] = {}
            for r in list(hook.requests):
                body = r["json"]
                if body.get("status") == "firing":
                    key = (body["commonLabels"].get("alertname", ""), body["commonLabels"].get("job", ""))
                    out[key] = out.get(key, 0) + len(body.get("alerts", []))
            return out

        _wait(lambda: set(want) <= set(fired()), 120, "every job's alerts to be delivered", logs)
        time.sleep(4)  # room for a (wrong) second firing or delivery
        assert {k: c for k, c in fired().items() if k in want} == want
        # every change was delivered, so it is in the topic; the 4 s above were the room for a wrong repeat
        changes = [json.loads(m.value()) for m in consume_all(kafka, schema.TOPIC_ALERTS, timeout_s=8, to_end=True)]
        mine = [c for c in changes if c["labels"].get("job") in jobs.values()]
        assert sorted((c["rule"], c["labels"]["job"], c["status"]) for c in mine) == sorted(
            (rule, job, "firing") for rule, job in want
        )
        assert all(
            c["annotations"]["summary"] == "lost batches in 3 steps, last 3"
            for c in mine
            if c["rule"] == "lost_three_times"
        )
        assert set(_owned(logs[1])) == set(range(n)), "the survivor owns every partition"
    finally:
        for proc in procs.values():
            stop_group(proc)
        hook.close()
