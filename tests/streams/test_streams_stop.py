"""`obshub streams worker` stops on SIGTERM/SIGINT even while its main thread is blocked (a Kafka client
call that does not return while the cluster is gone: seen in `rules serve`, 2026-12-06, 12 minutes deaf to
both): after --stop-timeout seconds, or at a second signal, it exits 1 with every thread's stack on stderr
and its component record removed (obshub.core.stopping, as tests/rules/test_rules_stop.py for the rule
engine). The blocked call is stood in for by a Faust worker that sleeps for an hour in its main thread; no
broker is needed (the topic steps are stood in for too). A stop handed to Faust's own event loop, the
normal case, is tests/streams/test_streams_worker.py's (with Kafka)."""

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

pytestmark = pytest.mark.slow  # a worker in a subprocess, a few seconds each

REPO = Path(__file__).resolve().parents[2]
BLOCKED = (
    "import sys, time\n"
    "import faust\n"
    "from obshub.streams import cli, topics\n"
    "cli._wait_for_broker = lambda *a: None\n"
    "cli._topic_partitions = lambda *a: (1, None)\n"
    "topics.ensure_internal_topics = lambda *a, **k: None\n"
    "faust.Worker.execute_from_commandline = lambda self: time.sleep(3600)\n"
    "cli.worker_command(sys.argv[1:], prog_name='obshub streams worker')\n"
)


def _worker(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path, Path]:
    home = tmp_path / "home"
    env = {**os.environ, "OBSHUB_HOME": str(home), "OBSHUB_KAFKA_PORT": str(closed_port()), "PYTHONUNBUFFERED": "1"}
    env.pop("OBSHUB_BOOTSTRAP", None)
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as f:
        p = subprocess.Popen(
            [sys.executable, "-c", BLOCKED, "--metrics-port", "0", "--app-id", "stoptest", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=f,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while not list(home.glob("**/streams-*.json")):  # registered: next is the (blocked) Faust worker
        assert p.poll() is None, err.read_text()[-3000:]
        assert time.monotonic() < deadline, "the worker did not register within 60 s"
        time.sleep(0.1)
    time.sleep(0.5)  # into the blocked call
    return p, home, err


def test_a_blocked_worker_is_forced_out_after_the_stop_timeout_with_the_threads_stacks(tmp_path):
    p, home, err = _worker(tmp_path, "--stop-timeout", "2")
    os.killpg(p.pid, signal.SIGTERM)
    took = _ended(p, 30, err)
    text = err.read_text()
    assert p.returncode == 1, text[-3000:]  # it ran on for the hour, deaf to SIGTERM, before
    assert took >= 1.5, f"forced after {took:.1f} s, before its 2 s"
    assert "streams worker: the stop did not finish within 2 s of SIGTERM: exiting now (exit 1)" in text, text[-3000:]
    assert "Current thread" in text or "Thread 0x" in text, text[-3000:]  # faulthandler's stacks
    assert "<lambda>" in text, text[-3000:]  # the blocked main thread is shown
    assert not list(home.glob("**/streams-*.json")), "the component record outlived the forced exit"


def test_a_second_signal_ends_a_blocked_worker_at_once(tmp_path):
    p, home, err = _worker(tmp_path)  # the default 60 s grace
    os.killpg(p.pid, signal.SIGINT)
    time.sleep(1)
    assert p.poll() is None, err.read_text()[-3000:]
    os.killpg(p.pid, signal.SIGTERM)
    took = _ended(p, 20, err)
    text = err.read_text()
    assert p.returncode == 1 and took < 20, text[-3000:]
    assert "a second signal (SIGTERM) arrived while stopping: exiting now (exit 1)" in text, text[-3000:]
    assert not list(home.glob("**/streams-*.json"))


def test_the_stop_timeout_is_finite_and_at_most_a_day():
    """`sigtimedwait` overflows past time_t: a grace of 1e12 s killed the stop-watch thread at the first
    signal and left the process deaf to both; nan and inf are no durations. A usage error (exit 2)."""
    for value in ("1e12", "inf", "nan", "0"):
        r = subprocess.run(
            [sys.executable, "-m", "obshub.cli", "streams", "worker", "--stop-timeout", value],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        assert r.returncode == 2 and "'--stop-timeout'" in r.stderr and "Traceback" not in r.stderr, r.stderr
