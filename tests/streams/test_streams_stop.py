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

from tests.support.stopping import REPO, assert_forced, check_forced_after_the_stop_timeout, start_blocked

pytestmark = pytest.mark.slow  # a worker in a subprocess, a few seconds each

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
ARGS = ["--metrics-port", "0", "--app-id", "stoptest"]
RECORD = "streams-*.json"  # registered: next is the (blocked) Faust worker


def test_a_blocked_worker_is_forced_out_after_the_stop_timeout_with_the_threads_stacks(tmp_path):
    check_forced_after_the_stop_timeout(tmp_path, BLOCKED, ARGS, RECORD, "streams worker")  # deaf for the hour before


def test_a_second_signal_ends_a_blocked_worker_at_once(tmp_path):
    p, home, out = start_blocked(tmp_path, BLOCKED, ARGS, RECORD)  # the default 60 s grace
    os.killpg(p.pid, signal.SIGINT)
    time.sleep(1)
    assert p.poll() is None, out.read_text()[-3000:]
    os.killpg(p.pid, signal.SIGTERM)
    assert_forced(p, home, out, RECORD, "a second signal (SIGTERM) arrived while stopping", within_s=20)


@pytest.mark.parametrize("value", ["1e12", "inf", "nan", "0"])
def test_the_stop_timeout_is_finite_and_at_most_a_day(value):
    """`sigtimedwait` overflows past time_t: a grace of 1e12 s killed the stop-watch thread at the first
    signal and left the process deaf to both; nan and inf are no durations. A usage error (exit 2)."""
    cmd = [sys.executable, "-m", "obshub.cli", "streams", "worker", "--stop-timeout", value]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 2 and "'--stop-timeout'" in r.stderr and "Traceback" not in r.stderr, r.stderr


def _blocked_signals(status: str) -> set[int]:
    """The signals blocked by a process, from its /proc/<pid>/status text (``SigBlk``, a hex bit mask)."""
    line = next(x for x in status.splitlines() if x.startswith("SigBlk:"))
    mask = int(line.split()[1], 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def test_the_children_a_worker_starts_while_it_starts_do_not_inherit_its_blocked_signals(tmp_path):
    """The worker blocks SIGTERM/SIGINT for its stop-watch thread (obshub/core/stopping.py); a child it
    started after that inherited the blocked mask and ignored both. croniter, imported with the Faust app,
    runs ``file -b <python>`` (``platform.architecture``): that child ran with both blocked. A ``file`` of
    this test's, first on PATH, writes its own blocked signals; the real worker (no broker: it waits for
    one until the SIGTERM) must have started it with SIGTERM and SIGINT deliverable."""
    from tests.apps.test_no_broker import closed_port

    shim, seen = tmp_path / "bin", tmp_path / "file-sigblk.txt"
    shim.mkdir()
    (shim / "file").write_text(  # not a shell script: dash unblocks every signal as it starts
        f"#!{sys.executable}\n"
        "import sys\n"
        f"with open('/proc/self/status') as st, open({str(seen)!r}, 'a') as out:\n"
        "    out.writelines(x for x in st if x.startswith('SigBlk:'))\n"
        "print('ELF 64-bit LSB pie executable, x86-64')\n"
    )
    (shim / "file").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{shim}{os.pathsep}{os.environ.get('PATH', '')}",
        "OBSHUB_HOME": str(tmp_path / "home"),
        "OBSHUB_KAFKA_PORT": str(closed_port()),
    }
    env.pop("OBSHUB_BOOTSTRAP", None)
    p = subprocess.Popen(
        [sys.executable, "-m", "obshub.cli", "streams", "worker", *ARGS],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def blocking() -> bool:  # the worker is past its own block (a SIGTERM before it kills it outright)
            return {signal.SIGTERM, signal.SIGINT} <= _blocked_signals(Path(f"/proc/{p.pid}/status").read_text())

        deadline = time.monotonic() + 60
        while not (seen.exists() and blocking()) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert seen.exists(), "the worker started no `file` (croniter no longer asks platform.architecture?)"
        assert blocking()  # the worker itself still blocks both for its stop-watch thread
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        out = p.communicate(timeout=60)[0].decode(errors="replace")
    assert p.returncode == 0, out[-3000:]  # it was waiting for a broker: a clean stop
    masks = [_blocked_signals(x) for x in seen.read_text().splitlines()]
    assert masks and all(not {signal.SIGTERM, signal.SIGINT} & m for m in masks), (masks, out[-3000:])
