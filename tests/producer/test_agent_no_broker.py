"""An agent whose broker never answers stops promptly: on stop (SIGINT/SIGTERM) it waits for Kafka only
while Kafka takes batches, keeps the rest in its spool and says so. No broker: a closed port on
127.0.0.1 (connection refused)."""

from __future__ import annotations

import socket
import time

from obshub.producer.agent import EXIT_UNDELIVERED
from obshub.producer.transport import SHUTDOWN_STALL_S, SPOOLING
from tests.support.transport_helpers import AgentThread, make_agent, wait_for


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_agent_without_a_broker_stops_within_seconds_and_says_what_stays_in_the_spool(tmp_path):
    """Before: the whole --flush-timeout (15 s) went by waiting for a broker known to be down."""
    agent = make_agent(tmp_path, f"127.0.0.1:{closed_port()}", rate=200, flush_timeout_s=15.0)
    said: list[str] = []
    agent.say = said.append
    run = AgentThread(agent)
    wait_for(lambda: agent.transport.state == SPOOLING, 30, "the agent to find the broker down and spool")
    t0 = time.monotonic()
    rc = run.stop()
    took = time.monotonic() - t0
    assert took < SHUTDOWN_STALL_S + 3, f"stopping took {took:.1f} s"  # 15 s before
    assert rc == EXIT_UNDELIVERED
    assert agent.transport.gave_up_after_s is not None and agent.transport.gave_up_after_s >= SHUTDOWN_STALL_S
    (last,) = [m for m in said if "were not delivered" in m]
    # the seconds actually waited (2.0 s, or a little more on a loaded machine: 2.1 s was seen in CI)
    waited = agent.transport.gave_up_after_s
    assert f"it took none for {waited:.1f} s" in last and "kept in the spool" in last, last
