"""`obshub agent` needs no more privilege than its probes (docs/AGENT.md "Running the agent: privileges"):
run it as an unprivileged user (nobody) holding only the documented capabilities, with setpriv(1) from
util-linux, and see the real BPF probes attach; without CAP_SYS_ADMIN the uprobe/USDT probes are listed
as skipped (with the reason) and the tracepoint probes still attach."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from obshub.config import load_settings
from tests.conftest import REPO

pytestmark = [pytest.mark.kafka, pytest.mark.bpf]

CAP_BITS = {"dac_read_search": 2, "sys_ptrace": 19, "sys_admin": 21, "perfmon": 38, "bpf": 39}
NOBODY = 65534


def _have_bcc() -> bool:
    try:
        import bcc  # noqa: F401
    except Exception:
        return False
    return True


needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not _have_bcc(),
                                reason="needs root (to drop to nobody), setpriv and bcc")


@pytest.fixture
def world_home():
    """An $OBSHUB_HOME that user nobody can write (pytest's tmp dirs are root-only)."""
    d = tempfile.mkdtemp(prefix="obshub-caps-")
    os.chmod(d, 0o777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _run_with_caps(caps: list[str], home: str, kafka, host: str) -> tuple[int, str, str, int]:
    """Run the agent as nobody with exactly ``caps``; returns (rc, stdout, stderr, CapEff seen)."""
    capset = ",".join(["-all"] + ["+" + c for c in caps])
    cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", f"--inh-caps={capset}",
           f"--ambient-caps={capset}", f"--bounding-set={capset}", "--",
           sys.executable, "-m", "obshub.cli", "agent", "--registered", "--probes", "pytorch,sched",
           "--host", host, "--duration", "1", "--bootstrap", kafka.bootstrap_servers]
    env = {**os.environ, "OBSHUB_HOME": home, "OBSHUB_CACHE": str(load_settings().cache), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cap_eff = -1
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:  # setpriv execs python: same pid
            try:
                argv = open(f"/proc/{proc.pid}/cmdline").read().split("\0")
                if argv[0] == sys.executable and "obshub.cli" in argv:  # setpriv exec'd the agent
                    status = open(f"/proc/{proc.pid}/status").read()
                    cap_eff = int(status.split("CapEff:")[1].split()[0], 16)
                    break
            except OSError:
                break
            time.sleep(0.05)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err, cap_eff


def _table(out: str) -> dict[str, str]:
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] in ("attached", "skipped"):
            rows[parts[0]] = parts[2]
    return rows


@needs_root
def test_agent_attaches_probes_with_only_the_documented_capabilities(kafka, world_home, unique):
    caps = ["bpf", "perfmon", "sys_admin", "dac_read_search"]
    rc, out, err, cap_eff = _run_with_caps(caps, world_home, kafka, f"caps-{unique}")
    assert cap_eff == sum(1 << CAP_BITS[c] for c in caps), f"CapEff {cap_eff:#x}"
    assert rc == 0, err
    rows = _table(out)
    assert rows.get("sched") == "attached", out
    assert all(rows.get(p) == "attached" for p in ("pytorch_register", "pytorch_tracekey", "pytorch_step")), out
    assert "all delivered" in err


@needs_root
def test_without_cap_sys_admin_uprobes_are_skipped_not_fatal(kafka, world_home, unique):
    caps = ["bpf", "perfmon", "dac_read_search"]
    rc, out, err, cap_eff = _run_with_caps(caps, world_home, kafka, f"nocap-{unique}")
    assert cap_eff == sum(1 << CAP_BITS[c] for c in caps), f"CapEff {cap_eff:#x}"
    assert rc == 0, err
    rows = _table(out)
    assert rows.get("sched") == "attached", out
    assert rows.get("pytorch_register") == "skipped", out
