"""Test harness around the real Go programs (Prometheus, Alertmanager, helm) that the set-up builds and
caches (tests/support/gobuild.py), and the processes the deployment tests start: each runs in its own session
so it can be stopped as a group, with its output in a log file whose tail goes into every failure."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from obshub.core.settings import load_settings
from tests.support import gobuild

REPO = Path(__file__).resolve().parents[2]


def tool(name: str) -> Path:
    """The cached binary of Go tool ``name``, built now when missing (minutes, once per cache)."""
    return gobuild.ensure(load_settings().cache, name, progress=lambda m: print(m, file=sys.stderr))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """One subprocess in its own session, output appended to ``log``."""

    def __init__(self, cmd: list[str], log: Path, env: dict | None = None, cwd: Path = REPO):
        self.cmd, self.log = cmd, log
        self._fh = open(log, "ab")
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )

    def tail(self, n: int = 3000) -> str:
        """The last ``n`` characters of the log."""
        return self.log.read_text(errors="replace")[-n:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the process group, then SIGKILL when it is still there after ``timeout_s``."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._fh.close()


def wait_http(url: str, proc: Proc, timeout_s: float = 60.0) -> None:
    """Wait until ``url`` answers 200. Raises AssertionError with the process log when it does not."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise AssertionError(f"{proc.cmd[0]} exited with {proc.proc.returncode}:\n{proc.tail()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {timeout_s} s:\n{proc.tail()}")


def wait_until(cond, timeout_s: float, what: str, *logs: Proc):
    """Poll ``cond()`` until it returns something truthy (returned); AssertionError naming ``what``,
    with the tails of ``logs``, after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(0.5)
    tails = "\n".join(f"--- {p.cmd[0]} {p.cmd[1:4]}:\n{p.tail(2000)}" for p in logs)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})\n{tails}")
