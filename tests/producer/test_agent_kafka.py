"""The agent against the session's real broker: exact delivery, several agents side by side, queue-full
back-pressure, loss reports, metrics, and the `obshub agent` process (SIGTERM, undelivered data, restart
with replay of the spool)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from obshub.core import registry, schema
from obshub.core.schema import Kind
from tests.conftest import REPO, free_port_pair
from tests.support.transport_helpers import (
    AgentThread,
    assert_seq_contiguous,
    events_of,
    make_agent,
    read_batches,
    wait_for,
)

pytestmark = pytest.mark.kafka
DATA_KINDS = {k for k in Kind if k != Kind.AGENT_LOSS}


def test_two_agents_deliver_every_event_exactly(kafka, tmp_path):
    bootstrap = kafka.bootstrap_servers
    agents = [
        make_agent(
            tmp_path,
            bootstrap,
            rate=40_000,
            total=30_000,
            host_id=i + 1,
            metrics_port=0,
            batch={"max_bytes": 32 * 1024},
        )
        for i in range(2)
    ]
    runs = [AgentThread(a) for a in agents]
    for a in agents:
        wait_for(lambda a=a: a.source.produced == 30_000, 30, "the synthetic events")
    agents[0].source.add_loss(17, "sched")
    wait_for(lambda: agents[0].lost_totals.get("sched") == 17, 10, "the loss report")
    wait_for(lambda: agents[0].transport.idle and agents[0].batcher.open_events == 0, 20, "delivery")
    body = httpx.get(f"http://127.0.0.1:{agents[0].metrics_port}/metrics", timeout=10).text
    assert re.search(r'obshub_agent_events_total\{host="[^"]+",kind="STEP_BEGIN",training_job="tjob"\} (\d+)', body)
    assert re.search(r'obshub_agent_lost_events_total\{[^}]*probe="sched"[^}]*\} 17\.0', body)
    assert re.search(r"obshub_agent_batches_delivered_total\{[^}]*\} [1-9]", body)
    for name in ("obshub_agent_spool_bytes", "obshub_agent_clock_offset_seconds", "obshub_agent_delivery_errors_total"):
        assert name in body
    assert [r.stop() for r in runs] == [0, 0]

    ids = {a.agent_id for a in agents}
    total_batches = {a.agent_id: a.batcher.sealed for a in agents}
    got = read_batches(
        bootstrap, ids, until=lambda bs: len({(b.agent_id, b.seq) for b in bs}) == sum(total_batches.values())
    )
    for a in agents:
        mine = [b for b in got if b.agent_id == a.agent_id]
        assert assert_seq_contiguous(got, a.agent_id) == list(range(a.batcher.sealed))
        assert events_of(mine, DATA_KINDS) == 30_000
        assert {b.host for b in mine} == {a.config.host} and {b.host_id for b in mine} == {a.config.host_id}
        assert all(0 < b.clock.uncertainty_ns < 10_000_000 for b in mine)
        assert a.transport.spooled == 0 and a.transport.publisher.delivery_errors == 0
    loss = [e for b in got if b.agent_id == agents[0].agent_id for e in b.events if e.kind == Kind.AGENT_LOSS]
    assert [(e.value, e.payload["probe"]) for e in loss] == [(17, "sched")]


def test_batches_are_sealed_at_step_ends(kafka, tmp_path):
    # steps of 64 events at 96 events/s: 0.67 s each, longer than the step minimum (0.5 s) and shorter
    # than the age bound (1 s): one batch per step, sealed at its STEP_END
    bootstrap = kafka.bootstrap_servers
    agent = make_agent(tmp_path, bootstrap, rate=96, total=4 * 64, metrics_port=None)
    run = AgentThread(agent)
    wait_for(lambda: agent.source.produced == 4 * 64, 30, "the synthetic events")
    wait_for(lambda: agent.transport.idle and agent.batcher.open_events == 0, 20, "delivery")
    assert run.stop() == 0
    got = read_batches(bootstrap, {agent.agent_id}, until=lambda bs: len(bs) >= agent.batcher.sealed)
    data = [[e for e in b.events if e.kind != Kind.AGENT_LOSS] for b in got]
    assert [sum(e.kind == Kind.STEP_END for e in evs) for evs in data] == [1, 1, 1, 1]
    assert agent.batcher.step_sealed == 4


def test_queue_full_back_pressure_loses_nothing(kafka, tmp_path):
    a = make_agent(
        tmp_path,
        kafka.bootstrap_servers,
        rate=200_000,
        total=20_000,
        kafka={"queue_max_messages": 1, "linger_ms": 0, "max_block_ms": 30_000},
        batch={"max_bytes": 2048},
    )
    run = AgentThread(a)
    wait_for(lambda: a.source.produced == 20_000, 60, "the synthetic events")
    wait_for(lambda: a.transport.idle and a.batcher.open_events == 0, 60, "delivery")
    assert run.stop() == 0
    pub = a.transport.publisher
    assert pub.backpressure_waits > 0, "a one-message queue must have pushed back"
    assert a.transport.spooled == 0 and pub.delivery_errors == 0
    assert pub.delivered == a.batcher.sealed > 100
    got = read_batches(
        kafka.bootstrap_servers, {a.agent_id}, until=lambda bs: len({b.seq for b in bs}) == a.batcher.sealed
    )
    assert_seq_contiguous(got, a.agent_id)
    assert events_of(got, DATA_KINDS) == 20_000


def _agent_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "obshub.cli", "agent", "--source", "synthetic", *args]


def _env(home) -> dict:
    return {**os.environ, "OBSHUB_HOME": str(home), "PYTHONPATH": str(REPO)}


def test_sigterm_flushes_and_exits_zero(kafka, tmp_path, unique):
    host = f"sig-{unique}"
    home = tmp_path / "home"
    settings = kafka.model_copy(update={"home": home})
    proc = subprocess.Popen(
        _agent_cmd(
            "--host", host, "--rate", "5000", "--batch-max-age-ms", "60000", "--bootstrap", kafka.bootstrap_servers
        ),
        env=_env(home),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "attached" in proc.stdout.readline() + proc.stdout.readline()
        wait_for(
            lambda: any(c["name"] == f"agent-{host}" and c["running"] for c in registry.components(settings)),
            20,
            "the agent's component record",
        )
        time.sleep(1.5)  # the open batch is young: only the SIGTERM flush can deliver it
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    m = re.search(r"stopped: (\d+) batches, (\d+) events, all delivered", err)
    assert m, err
    n_batches, n_events = int(m[1]), int(m[2])
    assert n_events > 1000
    got = read_batches(kafka.bootstrap_servers, hosts={host}, until=lambda bs: len(bs) >= n_batches)
    assert events_of(got, DATA_KINDS) == n_events
    assert_seq_contiguous(got, got[0].agent_id)
    assert not any(c["name"] == f"agent-{host}" for c in registry.components(settings)), "record removed at exit"


def test_undelivered_data_exits_nonzero_and_is_replayed_by_the_next_start(kafka, tmp_path, unique):
    host = f"und-{unique}"
    home = tmp_path / "home"
    dead = f"127.0.0.1:{free_port_pair()}"
    first = subprocess.run(
        _agent_cmd(
            "--host",
            host,
            "--rate",
            "20000",
            "--synthetic-events",
            "3000",
            "--duration",
            "1.5",
            "--flush-timeout",
            "1",
            "--delivery-timeout-ms",
            "1000",
            "--bootstrap",
            dead,
        ),
        env=_env(home),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert first.returncode == 3, first.stderr
    m = re.search(r"(\d+) batches \((\d+) B\) were not delivered to Kafka", first.stderr)
    assert m and int(m[1]) > 0, first.stderr
    assert str(home / "spool" / host) in first.stderr
    assert "Traceback" not in first.stderr

    second = subprocess.run(
        _agent_cmd(
            "--host",
            host,
            "--rate",
            "20000",
            "--synthetic-events",
            "1000",  # no --duration: the last event ends the agent (it once ran on until killed)
            "--bootstrap",
            kafka.bootstrap_servers,
        ),
        env=_env(home),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert second.returncode == 0, second.stderr
    assert "from a previous run wait in the spool" in second.stderr
    got = read_batches(
        kafka.bootstrap_servers,
        hosts={host},
        until=lambda bs: events_of(bs, DATA_KINDS) >= 4000 and len({b.agent_id for b in bs}) == 2,
    )
    by_agent: dict[str, list[schema.Batch]] = {}
    for b in got:
        by_agent.setdefault(b.agent_id, []).append(b)
    counts = sorted(events_of(bs, DATA_KINDS) for bs in by_agent.values())
    assert counts == [1000, 3000]
    old = next(i for i, bs in by_agent.items() if events_of(bs, DATA_KINDS) == 3000)
    assert len(assert_seq_contiguous(got, old)) == int(m[1]), "every spooled batch arrived, in order"


def test_full_spool_drops_the_oldest_batches_counted_exactly(kafka, tmp_path, unique):
    host = f"full-{unique}"
    dead = f"127.0.0.1:{free_port_pair()}"
    small = {"max_bytes": 64 * 1024, "segment_bytes": 16 * 1024}
    a = make_agent(
        tmp_path,
        dead,
        host=host,
        rate=50_000,
        total=20_000,
        flush_timeout_s=0.5,
        kafka={"delivery_timeout_ms": 1_000},
        batch={"max_bytes": 2048},
        spool=small,
    )
    run = AgentThread(a)
    wait_for(lambda: a.source.produced == 20_000, 30, "the synthetic events")
    assert run.stop() == 3
    sp = a.transport.spool
    sealed, dropped = a.batcher.sealed, sp.dropped_batches
    assert dropped > 0 and sp.dropped_bytes > 0
    assert dropped + sp.pending_batches == sealed, "every batch is either kept or counted as dropped"

    b = make_agent(tmp_path, kafka.bootstrap_servers, host=host, rate=1_000, total=10, spool=small)
    run = AgentThread(b)
    wait_for(lambda: b.transport.spool.pending_batches == 0 and b.source.produced == 10, 60, "the replay")
    assert run.stop() == 0
    assert b.transport.replayed == (sealed - dropped) + b.transport.spooled  # its own batch queues behind
    got = read_batches(kafka.bootstrap_servers, {a.agent_id}, until=lambda bs: len(bs) >= sealed - dropped)
    assert [x.seq for x in got] == list(range(dropped, sealed)), "the newest batches survive, in order"
