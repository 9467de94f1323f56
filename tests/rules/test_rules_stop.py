"""`obshub rules serve` stops on SIGTERM/SIGINT even while its main thread is blocked (in a Kafka client call
that does not return while the cluster is gone, 2026-12-06: 12 minutes deaf to SIGTERM and SIGINT): after
--stop-timeout seconds, or at a second signal, it exits 1 with every thread's stack on stderr and its
component record removed (obshub.core.stopping). The blocked call is stood in for by an engine loop that
sleeps for an hour; no broker listens on the port (the normal stop without one, exit 0:
tests/apps/test_no_broker.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.apps.test_no_broker import closed_port

pytestmark = pytest.mark.slow  # a rules service in a subprocess, a few seconds each

REPO = Path(__file__).resolve().parents[2]
# the engine loop never returns: the main thread sits in one long C call (time.sleep) as in a blocked
# librdkafka close or commit; a Python signal handler would never get to run
BLOCKED = (
    "import sys, time\n"
    "from obshub.rules import service_engine\n"
    "service_engine.EngineLoop.run_engine = lambda self: time.sleep(3600)\n"
    "from obshub.rules.cli import serve_command\n"
    "serve_command(sys.argv[1:], prog_name='obshub rules serve')\n"
)


def _serve(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path, Path]:
    home = tmp_path / "home"
    env = {**os.environ, "OBSHUB_HOME": str(home), "OBSHUB_KAFKA_PORT": str(closed_port()), "PYTHONUNBUFFERED": "1"}
    env.pop("OBSHUB_BOOTSTRAP", None)
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as f:
        p = subprocess.Popen(
            [sys.executable, "-c", BLOCKED, *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=f,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while not list(home.glob("**/rules.json")):  # registered: serve() is past its signal set-up
        assert p.poll() is None, err.read_text()[-3000:]
        assert time.monotonic() < deadline, "rules serve did not register within 60 s"
        time.sleep(0.1)
    time.sleep(0.5)  # into the blocked engine loop
    return p, home, err


def _ended(p: subprocess.Popen, within_s: float, err: Path) -> float:
    t = time.monotonic()
    try:
        p.wait(within_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        pytest.fail(f"still running {within_s} s after the signal:\n{err.read_text()[-3000:]}")
    return time.monotonic() - t


def test_a_blocked_stop_is_forced_after_the_stop_timeout_with_the_threads_stacks(tmp_path):
    p, home, err = _serve(tmp_path, "--stop-timeout", "2")
    os.killpg(p.pid, signal.SIGTERM)
    took = _ended(p, 30, err)
    text = err.read_text()
    assert p.returncode == 1, text[-3000:]
    assert took >= 1.5, f"forced after {took:.1f} s, before its 2 s"
    assert "SIGTERM: stopping (at most 2 s" in text, text[-3000:]
    assert "the stop did not finish within 2 s of SIGTERM: exiting now (exit 1)" in text, text[-3000:]
    assert "Current thread" in text or "Thread 0x" in text, text[-3000:]  # faulthandler's stacks
    assert "time.sleep" in text or "<lambda>" in text, text[-3000:]  # the blocked main thread is shown
    assert not list(home.glob("**/rules.json")), "the component record outlived the forced exit"


def test_a_second_signal_ends_a_blocked_stop_at_once(tmp_path):
    p, home, err = _serve(tmp_path)  # the default 60 s grace
    os.killpg(p.pid, signal.SIGTERM)
    time.sleep(1)
    os.killpg(p.pid, signal.SIGINT)
    took = _ended(p, 20, err)
    text = err.read_text()
    assert p.returncode == 1, text[-3000:]
    assert took < 20
    assert "a second signal (SIGINT) arrived while stopping: exiting now (exit 1)" in text, text[-3000:]
    assert not list(home.glob("**/rules.json"))
