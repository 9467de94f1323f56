"""`obshub rules serve` against the real broker: a step summary in, an alert change on obshub.alerts.v1
(keyed by fingerprint), delivery to a webhook that is down, a crash (SIGKILL), the webhook back, a
restart: the alert is delivered (at-least-once) and the engine does not re-fire it (state recovered)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Producer

from obshub.core import registry, schema
from obshub.core.settings import load_settings
from tests.conftest import consume_all
from tests.rules.test_rules_sinks import HttpRecorder
from tests.support.stopping import stop_group

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.kafka


def rules_file(tmp_path: Path, job: str) -> Path:
    p = tmp_path / "rules.yaml"
    p.write_text(f"""\
version: 1
rules:
  - id: test_lost_batches
    description: batches lost (test rule, only for job {job})
    severity: error
    signal: steps
    condition: job == '{job}' && quality.lost_batches > 0
    group_by: {{job: job}}
    window: 10m
    labels: {{layer: agent}}
    annotations: {{summary: "{{{{ quality.lost_batches }}}} batches lost in step {{{{ step }}}}"}}
""")
    return p


def config_file(tmp_path: Path) -> Path:
    p = tmp_path / "alerting.yaml"
    p.write_text("""\
version: 1
route: {group_by: [alertname, job], group_wait: 0s, group_interval: 1s, repeat_interval: 1h}
delivery: {max_attempts: 1000, max_elapsed: 10m, timeout: 2s, backoff_initial: 100ms, backoff_max: 300ms}
sinks:
  - {name: hook, type: webhook, url_env: TEST_RULES_WEBHOOK}
""")
    return p


def start(
    kafka,
    tmp_path: Path,
    home: Path,
    rules: Path,
    cfg: Path,
    prefix: str,
    url: str,
    *extra: str,
    from_beginning: bool = True,
) -> subprocess.Popen:
    env = {
        **os.environ,
        "OBSHUB_HOME": str(home),
        "OBSHUB_KAFKA_PORT": str(kafka.kafka_port),
        "TEST_RULES_WEBHOOK": url,
    }
    log = open(tmp_path / "serve.log", "ab")
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
            *(["--from-beginning"] if from_beginning else []),
            *extra,
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_for(cond, timeout: float, what: str, proc=None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.2)
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}\n{tail}")


def produce_step(kafka, job: str, step: int, lost: int) -> None:
    # murmur2: the partition of a job as the stream workers (the Java client's partitioner) place it
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "partitioner": "murmur2_random"})
    summary = {
        "v": 1,
        "job": job,
        "step": step,
        "closed_by": "complete",
        "closed_at_ns": time.time_ns(),
        "hosts": ["a"],
        "expected_hosts": ["a"],
        "missing_hosts": [],
        "quality": {"lost_batches": lost},
    }
    p.produce(schema.TOPIC_STEPS, key=job, value=json.dumps(summary).encode())
    assert p.flush(30) == 0


def my_changes(kafka, job: str, to_end: bool = False) -> list[dict]:
    """The alert changes of ``job``: what is in the topic now with ``to_end`` (where the change looked for was
    already seen downstream), else read until it is quiet for 3 s (room for a wrong repeat to arrive)."""
    msgs = consume_all(kafka, schema.TOPIC_ALERTS, timeout_s=8, to_end=to_end)
    out = []
    for m in msgs:
        rec = json.loads(m.value())
        if rec.get("labels", {}).get("job") == job:
            assert m.key().decode() == rec["fingerprint"]
            out.append(rec)
    return out


def lost_three_times_rules(tmp_path: Path, job: str) -> Path:
    """A rules file with one rule, ``lost_three_times``: batches lost in 3 steps of ``job`` (10 min window)."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"""\
version: 1
rules:
  - id: lost_three_times
    description: batches lost in 3 steps (test rule, only for job {job})
    severity: error
    signal: steps
    condition: job == '{job}' && quality.lost_batches > 0
    group_by: {{job: job}}
    window: 10m
    threshold: {{aggregate: count, at_least: 3}}
""")
    return rules


def test_at_least_once_across_a_crash_and_state_recovery(kafka, unique, tmp_path):
    job = f"job-{unique}"
    home = tmp_path / "home"
    rules, cfg = rules_file(tmp_path, job), config_file(tmp_path)
    hook = HttpRecorder(default=(503, {}, 0.0))
    log = tmp_path / "serve.log"
    url = hook.url + "/hook/SECRETTOKEN"
    proc = start(kafka, tmp_path, home, rules, cfg, f"t-{unique}", url)
    try:
        wait_for(lambda: (home / "run" / "rules.json").exists(), 60, "the service to register", proc, log)
        assert registry.components(load_settings(home=home))[0]["name"] == "rules"
        produce_step(kafka, job, 1, lost=3)
        bad = Producer({"bootstrap.servers": kafka.bootstrap_servers})
        bad.produce(schema.TOPIC_STEPS, key=f"bad-{unique}".encode(), value=b"{not json")
        assert bad.flush(30) == 0

        def mine():
            return [r for r in hook.requests if r["json"]["commonLabels"].get("job") == job]

        wait_for(lambda: len(mine()) >= 2, 90, "delivery attempts to the down webhook", proc, log)
        changes = my_changes(kafka, job, to_end=True)  # the notify loop read it from the topic: it is there
        assert [c["status"] for c in changes] == ["firing"], changes
        assert changes[0]["annotations"]["summary"] == "3 batches lost in step 1"
        # crash while the webhook is down: the change is not delivered, so its offset is not committed
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        n_before = len(mine())
        hook.default = (200, {}, 0.0)
        proc = start(kafka, tmp_path, home, rules, cfg, f"t-{unique}", url)
        wait_for(lambda: any(r for r in mine()[n_before:]), 90, "re-delivery after the restart", proc, log)
        delivered = mine()[-1]["json"]
        assert delivered["status"] == "firing" and delivered["alerts"][0]["labels"]["alertname"] == "test_lost_batches"
        # the engine recovered its state: the alert was not fired a second time
        time.sleep(2)
        assert [c["status"] for c in my_changes(kafka, job)] == ["firing"]
        # after a clean stop and another start, nothing is re-delivered (offsets were committed)
        time.sleep(1.5)  # > the 0.5 s commit period
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert not (home / "run" / "rules.json").exists()
        n_done = len(mine())
        proc = start(kafka, tmp_path, home, rules, cfg, f"t-{unique}", url, "--metrics-port", "0")
        n_assigned = log.read_text().count("notify: assigned")
        wait_for(lambda: log.read_text().count("notify: assigned") > n_assigned, 60, "the second restart", proc, log)
        time.sleep(3)  # time to (wrongly) re-deliver, had the offsets not been committed
        assert len(mine()) == n_done, "a delivered change was delivered again after a clean restart"
        # SIGHUP with a broken file (mtime kept, so only the signal triggers the reload): old rules stay
        good, st = rules.read_text(), rules.stat()
        rules.write_text(good.replace("quality.lost_batches > 0", "quality.lost_batches >"))
        os.utime(rules, ns=(st.st_atime_ns, st.st_mtime_ns))
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload rejected" in log.read_text(), 30, "the rejected reload", proc, log)
        assert f"{rules}:7:" in log.read_text() and "CEL syntax error" in log.read_text()
        rules.write_text(good.replace("id: test_lost_batches", "id: test_lost_batches_v2"))
        os.utime(rules, ns=(st.st_atime_ns, st.st_mtime_ns))
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "reloaded 1 rules" in log.read_text(), 30, "the accepted reload", proc, log)
        port = int(re.search(r"metrics on http://[^:/]+:(\d+)/metrics", log.read_text()).group(1))
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert 'obshub_rules_reloads_total{outcome="rejected"} 1.0' in metrics
        assert 'obshub_rules_reloads_total{outcome="ok"} 1.0' in metrics
        assert "SECRETTOKEN" not in log.read_text()
        # the undecodable step summary went to the DLQ with the reason and its origin in headers
        dlq = [
            m
            for m in consume_all(kafka, schema.TOPIC_DLQ, timeout_s=8, to_end=True)
            if m.key() == f"bad-{unique}".encode()
        ]
        assert len(dlq) >= 1 and dlq[0].value() == b"{not json"
        headers = {k: v.decode() for k, v in dlq[0].headers()}
        assert set(schema.DLQ_HEADERS) <= set(headers) and headers["obshub.source.topic"] == schema.TOPIC_STEPS
        assert "Expecting property name" in headers["obshub.reason"]
    finally:
        stop_group(proc)
        hook.close()


def test_a_producer_lost_before_the_first_commit_reevaluates_from_the_start(kafka, unique, tmp_path):
    """The transactional producer of a job's partition becomes unusable (fenced: a fatal error, as
    INVALID_TXN_STATE after a broker loss is) in the partition's first transaction, before any steps offset
    was ever committed. The engine builds a new producer and must read the partition again from where it
    started; it used to seek only to a committed offset, so the three steps read in the lost transaction
    were never evaluated again and the alert they make was lost (the broker-kill test's missing alert)."""
    from confluent_kafka import Consumer

    from obshub.rules.service_engine import partition_for

    job, prefix = f"first-{unique}", f"first-{unique}"
    home = tmp_path / "home"
    rules = lost_three_times_rules(tmp_path, job)
    hook = HttpRecorder()
    log = tmp_path / "serve.log"
    cfg = config_file(tmp_path)
    proc = start(kafka, tmp_path, home, rules, cfg, prefix, hook.url + "/hook", from_beginning=False)
    group = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"{prefix}-engine"})
    n = len(group.list_topics(schema.TOPIC_STEPS, timeout=10).topics[schema.TOPIC_STEPS].partitions)
    p = partition_for(job, n)
    try:
        wait_for(lambda: log.exists() and log.read_text().count("engine: took over") == n, 60, "the engine", proc, log)
        fencer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"{prefix}-engine-{p}"})
        fencer.init_transactions(30)  # before the engine's first transaction of p: nothing committed yet
        for step in (1, 2, 3):
            produce_step(kafka, job, step, lost=1)
        wait_for(lambda: f"transaction of partition {p} aborted" in log.read_text(), 30, "the abort", proc, log)
        wait_for(lambda: any(my_changes(kafka, job, to_end=True)), 30, "the alert change", proc, log)
        changes = my_changes(kafka, job)  # read_committed, as the notify loops read them
        assert [(c["rule"], c["status"]) for c in changes] == [("lost_three_times", "firing")], changes
        assert proc.poll() is None and "Traceback" not in log.read_text()
    finally:
        group.close()
        stop_group(proc)
        hook.close()


def test_a_fenced_transaction_is_aborted_and_its_partition_reopened(kafka, unique, tmp_path):
    """Another producer takes the transactional id of the partition a job is on (what a second engine
    does when it takes the partition over) between two steps: the engine's next transaction fails, is
    aborted, the partition is reopened from its last commit (window of two steps) and the third step
    fires the alert once, the process still up."""
    from confluent_kafka import Consumer, TopicPartition

    from obshub.rules.service_engine import partition_for

    job, prefix = f"fence-{unique}", f"fence-{unique}"
    home = tmp_path / "home"
    rules = lost_three_times_rules(tmp_path, job)
    hook = HttpRecorder()
    log = tmp_path / "serve.log"
    proc = start(kafka, tmp_path, home, rules, config_file(tmp_path), prefix, hook.url + "/hook")
    group = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"{prefix}-engine"})
    n = len(group.list_topics(schema.TOPIC_STEPS, timeout=10).topics[schema.TOPIC_STEPS].partitions)
    p = partition_for(job, n)
    try:
        wait_for(lambda: log.exists() and log.read_text().count("engine: took over") == n, 60, "the engine", proc, log)
        produce_step(kafka, job, 1, lost=1)
        produce_step(kafka, job, 2, lost=1)
        end = group.get_watermark_offsets(TopicPartition(schema.TOPIC_STEPS, p), timeout=10)[1]
        wait_for(
            lambda: group.committed([TopicPartition(schema.TOPIC_STEPS, p)], timeout=10)[0].offset >= end,
            30,
            "steps 1 and 2 committed",
            proc,
            log,
        )
        fencer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"{prefix}-engine-{p}"})
        fencer.init_transactions(30)
        produce_step(kafka, job, 3, lost=1)
        wait_for(lambda: f"transaction of partition {p} aborted" in log.read_text(), 30, "the abort", proc, log)
        wait_for(lambda: any(mine for mine in my_changes(kafka, job, to_end=True)), 30, "the alert change", proc, log)
        changes = my_changes(kafka, job)  # read_committed, as the notify loops read them
        assert [(c["rule"], c["status"]) for c in changes] == [("lost_three_times", "firing")], changes
        assert proc.poll() is None and "Traceback" not in log.read_text()
    finally:
        group.close()
        stop_group(proc)
        hook.close()


def test_a_delivery_state_that_cannot_be_written_never_stops_delivery(kafka, unique, tmp_path):
    """The notify loop writes what it delivered to $OBSHUB_HOME/state/rules after each commit. A full or
    read-only disk (here: the state's temporary file is /dev/full, so every write fails with ENOSPC)
    ended the notify thread at the first commit: the engine went on evaluating and publishing alerts, and no
    sink received one again (newuser20). Now the failure is logged once and every alert is delivered."""
    job = f"job-{unique}"
    home = tmp_path / "home"
    rules, cfg = rules_file(tmp_path, job), config_file(tmp_path)
    prefix = f"t-{unique}"
    tmp = home / "state" / "rules" / f"dispatch-{prefix}.tmp"
    tmp.parent.mkdir(parents=True)
    tmp.symlink_to("/dev/full")  # every state write fails as on a full disk: ENOSPC
    hook = HttpRecorder(default=(200, {}, 0.0))
    log = tmp_path / "serve.log"
    rules.write_text(rules.read_text().replace(f"job == '{job}'", f"job.startsWith('{job}-')"))  # one alert a job
    proc = start(kafka, tmp_path, home, rules, cfg, prefix, hook.url + "/hook")
    try:
        wait_for(lambda: (home / "run" / "rules.json").exists(), 60, "the service to register", proc, log)

        def delivered():
            return {r["json"]["commonLabels"].get("job") for r in hook.requests}

        produce_step(kafka, f"{job}-a", 1, lost=3)
        wait_for(lambda: f"{job}-a" in delivered(), 90, "the first alert's delivery", proc, log)
        time.sleep(2)  # > the 0.5 s commit period: the delivery's offset committed, its state write failed
        produce_step(kafka, f"{job}-b", 1, lost=3)
        wait_for(lambda: f"{job}-b" in delivered(), 60, "the second alert's delivery after a failed write", proc, log)
        assert proc.poll() is None
        text = log.read_text()
        assert text.count("cannot write the delivery state") == 1, text[-3000:]  # once until it works again
        assert "Traceback" not in text and "No space left on device" in text, text[-3000:]
        tmp.unlink()  # the disk has room again
        produce_step(kafka, f"{job}-c", 1, lost=3)
        state = home / "state" / "rules" / f"dispatch-{prefix}.json"
        wait_for(lambda: f"the delivery state {state} is written again" in log.read_text(), 60, "the state", proc, log)
        assert state.is_file() and "retried at each commit" in log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        stop_group(proc)
        hook.close()
