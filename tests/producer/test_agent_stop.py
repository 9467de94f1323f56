"""`obshub agent` stops on SIGTERM/SIGINT even while its main thread is blocked (a Kafka client call that
does not return while the cluster is gone: seen in `rules serve`, 2026-12-06, 12 minutes deaf to both):
after --stop-timeout seconds, or at a third signal, it exits 1 with every thread's stack on stderr and its
component record removed (obshub.core.stopping, as tests/rules/test_rules_stop.py for the rule engine).
The second signal keeps its documented meaning (docs/AGENT.md "Shutdown": stop waiting for Kafka, the rest
stays in the spool). The blocked call is stood in for by an agent loop that sleeps for an hour; no broker
listens on the port. The normal stop without a broker (about 2 s, exit 3) is
tests/producer/test_agent_no_broker.py's and tests/apps/test_no_broker.py's."""

from __future__ import annotations

import os
import signal
import time

import pytest

from obshub.core import stopping
from tests.support.stopping import assert_forced, check_forced_after_the_stop_timeout, start_blocked

pytestmark = pytest.mark.slow  # an agent in a subprocess, a few seconds each

BLOCKED = """\
import sys, time
from obshub.producer import agent
agent.Agent._loop = lambda self: time.sleep(3600)
from obshub.producer.cli import agent_command
agent_command(sys.argv[1:], prog_name='obshub agent')
"""
ARGS = ["--source", "synthetic", "--rate", "200", "--host", "stopme"]
RECORD = "agent-stopme.json"  # registered: next is the (blocked) loop


def test_a_blocked_agent_is_forced_out_after_the_stop_timeout_with_the_threads_stacks(tmp_path):
    check_forced_after_the_stop_timeout(tmp_path, BLOCKED, ARGS, RECORD, "agent")  # deaf for the hour before


def test_the_second_signal_stops_waiting_for_kafka_and_a_third_ends_a_blocked_agent_at_once(tmp_path):
    p, home, out = start_blocked(tmp_path, BLOCKED, ARGS, RECORD)  # the default grace: --flush-timeout + 45 s
    os.killpg(p.pid, signal.SIGTERM)
    time.sleep(0.5)
    os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while "second SIGTERM: stop waiting for Kafka, keep the rest in the spool" not in out.read_text():
        assert time.monotonic() < deadline, out.read_text()[-3000:]
        time.sleep(0.1)
    assert p.poll() is None, out.read_text()[-3000:]  # the second signal forces nothing
    time.sleep(stopping.SAME_STOP_S)  # a signal sooner than this after the second is that one again
    os.killpg(p.pid, signal.SIGINT)
    assert_forced(p, home, out, RECORD, "a third signal (SIGINT) arrived while stopping", within_s=20)
