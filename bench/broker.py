"""A private obshub stack for one benchmark: a real Apache Kafka broker (``obshub.stack``) on free ports in
a temporary ``$OBSHUB_HOME``, like tests/conftest.py, so a benchmark never touches the operator's broker
and several can run one after the other. Also: process helpers the benchmarks share (CPU time of a pid,
stopping a process group).

    with private_stack() as settings:       # broker up, OBSHUB_HOME/OBSHUB_KAFKA_PORT exported
        ...                                 # obshub subprocesses started here use the same broker
    # broker stopped, temporary home removed, environment restored
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from obshub import stack
from obshub.core.settings import Settings, load_settings

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


free_port_pair = stack.free_port_pair


def free_port() -> int:
    """One free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def private_stack(say=print) -> Iterator[Settings]:
    """Start a broker in a temporary home on free ports; yield its Settings; stop it and remove the home.
    ``OBSHUB_HOME`` and ``OBSHUB_KAFKA_PORT`` are exported while inside (and restored after), so
    ``obshub`` subprocesses reach the same broker. Raises :class:`obshub.core.errors.StackError` when the broker
    does not start (no Java, no cached jars and no network, ...)."""
    home = Path(tempfile.mkdtemp(prefix="obshub-bench-"))
    port = free_port_pair()
    saved = {k: os.environ.get(k) for k in ("OBSHUB_HOME", "OBSHUB_KAFKA_PORT", "OBSHUB_BOOTSTRAP")}
    os.environ["OBSHUB_HOME"] = str(home)
    os.environ["OBSHUB_KAFKA_PORT"] = str(port)
    os.environ.pop("OBSHUB_BOOTSTRAP", None)
    settings = load_settings(home=home, kafka_port=port)
    t0 = time.monotonic()
    try:
        stack.up(settings)
        say(
            f"[dim]  private broker on {settings.bootstrap_servers} ({time.monotonic() - t0:.0f} s to start), "
            f"home {home}[/dim]"
        )
        yield settings
    finally:
        try:
            stack.down(settings)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            shutil.rmtree(home, ignore_errors=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (all its threads), from /proc/<pid>/stat.
    Raises OSError when the process is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15 of proc(5))


def stop_group(proc: subprocess.Popen, timeout_s: float = 20.0) -> int | None:
    """SIGTERM the process group of ``proc`` (started with ``start_new_session=True``), wait, SIGKILL
    after ``timeout_s``. Returns the exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return proc.returncode


def obshub_cmd(*args: str) -> list[str]:
    """The command line of ``obshub ARGS`` with this interpreter (no dependence on PATH)."""
    return [sys.executable, "-m", "obshub.cli", *args]


def bpf_unavailable() -> str:
    """Why this process cannot load BPF programs ('' when it can): not root, or bcc not importable."""
    if os.geteuid() != 0:
        return "BPF needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN)"
    try:
        import bcc  # noqa: F401
    except ImportError as exc:
        return f"bcc is not importable ({exc}); run `make setup`"
    return ""
