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
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.apps.test_no_broker import closed_port
from tests.rules.test_rules_stop import _ended

pytestmark = pytest.mark.slow  # an agent in a subprocess, a few seconds each

REPO = Path(__file__).resolve().parents[2]
BLOCKED = (
    "import sys, time\n"
    "from obshub.producer import agent\n"
    "agent.Agent._loop = lambda self: time.sleep(3600)\n"
    "from obshub.producer.cli import agent_command\n"
    "agent_command(sys.argv[1:], prog_name='obshub agent')\n"
)


def _agent(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path, Path]:
    home = tmp_path / "home"
    env = {**os.environ, "OBSHUB_HOME": str(home), "OBSHUB_KAFKA_PORT": str(closed_port()), "PYTHONUNBUFFERED": "1"}
    env.pop("OBSHUB_BOOTSTRAP", None)
    out = tmp_path / "out.txt"
    with open(out, "wb") as f:
        p = subprocess.Popen(
            [sys.executable, "-c", BLOCKED, "--source", "synthetic", "--rate", "200", "--host", "stopme", *args],
            cwd=REPO,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while not list(home.glob("**/agent-stopme.json")):  # registered: next is the (blocked) loop
        assert p.poll() is None, out.read_text()[-3000:]
        assert time.monotonic() < deadline, "the agent did not register within 60 s"
        time.sleep(0.1)
    time.sleep(0.5)  # into the blocked loop
    return p, home, out


def test_a_blocked_agent_is_forced_out_after_the_stop_timeout_with_the_threads_stacks(tmp_path):
    p, home, out = _agent(tmp_path, "--stop-timeout", "2")
    os.killpg(p.pid, signal.SIGTERM)
    took = _ended(p, 30, out)
    text = out.read_text()
    assert p.returncode == 1, text[-3000:]  # it ran on for the hour, deaf to SIGTERM, before
    assert took >= 1.5, f"forced after {took:.1f} s, before its 2 s"
    assert "agent: the stop did not finish within 2 s of SIGTERM: exiting now (exit 1)" in text, text[-3000:]
    assert "Current thread" in text or "Thread 0x" in text, text[-3000:]  # faulthandler's stacks
    assert "<lambda>" in text, text[-3000:]  # the blocked main thread is shown
    assert not list(home.glob("**/agent-stopme.json")), "the component record outlived the forced exit"


def test_the_second_signal_stops_waiting_for_kafka_and_a_third_ends_a_blocked_agent_at_once(tmp_path):
    p, home, out = _agent(tmp_path)  # the default grace: --flush-timeout + 45 s
    os.killpg(p.pid, signal.SIGTERM)
    time.sleep(0.5)
    os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while "second SIGTERM: stop waiting for Kafka, keep the rest in the spool" not in out.read_text():
        assert time.monotonic() < deadline, out.read_text()[-3000:]
        time.sleep(0.1)
    assert p.poll() is None, out.read_text()[-3000:]  # the second signal forces nothing
    os.killpg(p.pid, signal.SIGINT)
    took = _ended(p, 20, out)
    text = out.read_text()
    assert p.returncode == 1 and took < 20, text[-3000:]
    assert "a third signal (SIGINT) arrived while stopping: exiting now (exit 1)" in text, text[-3000:]
    assert not list(home.glob("**/agent-stopme.json"))
