"""`obshub rules serve` stops on SIGTERM/SIGINT even while its main thread is blocked (in a Kafka client call
that does not return while the cluster is gone, 2026-12-06: 12 minutes deaf to SIGTERM and SIGINT): after
--stop-timeout seconds, or at a second signal, it exits 1 with every thread's stack on stderr and its
component record removed (obshub.core.stopping). The blocked call is stood in for by an engine loop that
sleeps for an hour; no broker listens on the port (the normal stop without one, exit 0:
tests/apps/test_no_broker.py)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.support.stopping import assert_forced, check_forced_after_the_stop_timeout, ended, start_blocked

pytestmark = pytest.mark.slow  # a rules service in a subprocess, a few seconds each

# the engine loop never returns: the main thread sits in one long C call (time.sleep) as in a blocked
# librdkafka close or commit; a Python signal handler would never get to run
BLOCKED = (
    "import sys, time\n"
    "from obshub.rules import service_engine\n"
    "service_engine.EngineLoop.run_engine = lambda self: time.sleep(3600)\n"
    "from obshub.rules.cli import serve_command\n"
    "serve_command(sys.argv[1:], prog_name='obshub rules serve')\n"
)
RECORD = "rules.json"


def test_a_blocked_stop_is_forced_after_the_stop_timeout_with_the_threads_stacks(tmp_path):
    text = check_forced_after_the_stop_timeout(tmp_path, BLOCKED, [], RECORD, "rules serve")
    assert "SIGTERM: stopping (at most 2 s" in text


def test_a_second_signal_ends_a_blocked_stop_at_once(tmp_path):
    p, home, out = start_blocked(tmp_path, BLOCKED, [], RECORD)  # the default 60 s grace
    os.killpg(p.pid, signal.SIGTERM)
    time.sleep(1)
    os.killpg(p.pid, signal.SIGINT)
    assert_forced(p, home, out, RECORD, "a second signal (SIGINT) arrived while stopping", within_s=20)


SERVE = "import sys\nfrom obshub.rules.cli import serve_command\nserve_command(sys.argv[1:], prog_name='obshub rules serve')\n"


def test_a_signal_sent_to_the_process_and_then_to_its_group_is_one_stop(tmp_path):
    """`timeout -s INT 1h obshub rules serve` (and a wrapper script that forwards the Ctrl-C its process
    group also got) delivers the signal twice, µs to ms apart: the second was taken as "a second signal",
    and the engine was forced out at once, exit 1, every thread's stack on stderr, instead of stopping
    (newuser19). Within SAME_STOP_S it is the same request; a later one still forces (the test above)."""
    p, _home, out = start_blocked(tmp_path, SERVE, [], RECORD)  # no broker: the engine waits for one, and stops
    os.kill(p.pid, signal.SIGINT)
    time.sleep(0.02)  # a forwarding wrapper's delay; `timeout`'s is µs
    os.killpg(p.pid, signal.SIGINT)
    ended(p, 30, out)
    text = out.read_text()
    assert p.returncode == 0, text[-3000:]
    assert "SIGINT: stopping" in text and "SIGINT again" in text and "the same stop request" in text, text[-3000:]
    assert "arrived while stopping" not in text and "Thread 0x" not in text, text[-3000:]


def test_an_alerting_config_without_sinks_says_none(tmp_path):
    """`sinks: []` started with "rules: 24 rule(s), sinks: ; Kafka ...": an empty list where the sinks go,
    easy to read past (newuser19). It says none, and where the alerts still are."""
    cfg = tmp_path / "alerting.yaml"
    cfg.write_text("version: 1\nsinks: []\n")
    p, _home, out = start_blocked(tmp_path, SERVE, ["-c", str(cfg)], RECORD)
    os.killpg(p.pid, signal.SIGTERM)
    ended(p, 30, out)
    text = out.read_text()
    assert "sinks: none (alerts only on the alerts topic: `obshub alerts`); Kafka" in text, text[-3000:]
