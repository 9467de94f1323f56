"""Broker outage: a second broker of the test's own (free ports, temporary home) is stopped for ~10 s while
an agent publishes to it, then started again with the same home. Every batch must arrive, in seq order,
with exactly the events the source produced."""

from __future__ import annotations

import time

import pytest

from obshub import stack
from obshub.core.schema import Kind
from obshub.core.settings import load_settings
from obshub.producer.transport import DIRECT, SPOOLING
from tests.conftest import free_port_pair
from tests.support.transport_helpers import (
    AgentThread,
    assert_seq_contiguous,
    events_of,
    make_agent,
    read_batches,
    wait_for,
)

pytestmark = pytest.mark.kafka
OUTAGE_S = 10.0  # several delivery timeouts (3 s) and growing probe backoffs (0.5 s, 1 s, 2 s) long


def _diag(a) -> str:
    t, p = a.transport, a.transport.publisher
    return (
        f"state={t.state} outstanding={p.outstanding} replay={[(r.pos, r.ok) for r in t._replay][:5]} "
        f"replay_failed={t._replay_failed} window={t._window} spool={t.spool.pending_batches} "
        f"last_error={p.last_error!r} fatal={p.fatal} stats={a.stats()}"
    )


@pytest.fixture
def own_broker(tmp_path_factory):
    """A broker this test may stop and start: Settings of its own home and ports."""
    settings = load_settings(home=tmp_path_factory.mktemp("outage-broker"), kafka_port=free_port_pair())
    stack.up(settings)
    try:
        yield settings
    finally:
        stack.down(settings)


def test_broker_outage_spools_and_replays_everything_in_order(own_broker, tmp_path):
    bootstrap = own_broker.bootstrap_servers
    a = make_agent(
        tmp_path, bootstrap, rate=3_000, kafka={"delivery_timeout_ms": 3_000}, batch={"max_bytes": 16 * 1024}
    )
    run = AgentThread(a)
    try:
        wait_for(lambda: a.transport.publisher.delivered >= 5, 30, "the first deliveries")
        down_at = time.monotonic()
        stack.down(own_broker)
        wait_for(
            lambda: a.transport.state == SPOOLING and a.transport.spool.pending_batches > 0, 30, "the agent to spool"
        )
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        assert a.transport.state == SPOOLING
        spooled_during_outage = a.transport.spool.pending_batches
        stack.up(own_broker)
        wait_for(
            lambda: a.transport.state == DIRECT and a.transport.spool.pending_batches == 0,
            150,
            "the spool to be replayed",
            diag=lambda: _diag(a),
        )
    finally:
        rc = run.stop()
    assert rc == 0
    t = a.transport
    assert spooled_during_outage > 20 and t.replayed >= spooled_during_outage
    assert t.spool.dropped_batches == 0
    produced = a.source.produced
    got = read_batches(
        bootstrap, {a.agent_id}, until=lambda bs: len({b.seq for b in bs}) == a.batcher.sealed, timeout_s=60
    )
    assert_seq_contiguous(got, a.agent_id)
    print(
        "outage stats:", a.stats(), "duplicates:", len(got) - len({b.seq for b in got}), "fatal resets:", t.fatal_resets
    )
    assert events_of(got, {k for k in Kind if k != Kind.AGENT_LOSS}) == produced
