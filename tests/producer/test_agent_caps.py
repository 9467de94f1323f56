"""`obshub agent` needs no more privilege than its probes (docs/AGENT.md "Running the agent: privileges").

The agent runs as an unprivileged user (nobody) holding only the documented capabilities, set with
setpriv(1) from util-linux; its real BPF probes attach, a one-rank DDP training started under
`obshub run` is registered and its steps reach Kafka, and SIGTERM ends the agent with everything
delivered. Without CAP_SYS_ADMIN the uprobe/USDT probes are listed as skipped (with the reason) while the
tracepoint probes still attach."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from obshub.core.schema import Kind
from obshub.core.settings import load_settings
from tests.conftest import REPO, free_port_pair
from tests.support.transport_helpers import assert_seq_contiguous, read_batches

pytestmark = [pytest.mark.kafka, pytest.mark.bpf]

CAP_BITS = {"dac_read_search": 2, "sys_ptrace": 19, "sys_admin": 21, "perfmon": 38, "bpf": 39}
NOBODY = 65534
STEPS = 6


def _have_bcc() -> bool:
    try:
        import bcc  # noqa: F401
    except Exception:
        return False
    return True


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not _have_bcc(),
    reason="needs root (to drop to nobody), setpriv and bcc",
)


@pytest.fixture
def world_home():
    """An $OBSHUB_HOME that user nobody can write (pytest's tmp dirs are root-only)."""
    d = tempfile.mkdtemp(prefix="obshub-caps-")
    os.chmod(d, 0o777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class CappedAgent:
    """`obshub agent --registered` run as nobody with exactly ``caps``; ``cap_eff`` is the CapEff mask
    read from /proc once setpriv has exec'd the agent, ``table`` the probe table (name -> status)."""

    def __init__(self, caps: list[str], home: str, kafka, host: str, job: str, probes: str):
        capset = ",".join(["-all"] + ["+" + c for c in caps])
        cmd = [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            f"--inh-caps={capset}",
            f"--ambient-caps={capset}",
            f"--bounding-set={capset}",
            "--",
            sys.executable,
            "-m",
            "obshub.cli",
            "agent",
            "--registered",
            "--probes",
            probes,
            "--host",
            host,
            "--job",
            job,
            "--bootstrap",
            kafka.bootstrap_servers,
        ]
        self.env = {
            **os.environ,
            "OBSHUB_HOME": home,
            "OBSHUB_CACHE": str(load_settings().cache),
            "PYTHONPATH": str(REPO),
        }
        self.proc = subprocess.Popen(
            cmd, env=self.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.cap_eff = self._cap_eff()
        self.table: dict[str, str] = {}
        self.n_rows = len([p for p in probes.split(",") if p])

    def _cap_eff(self) -> int:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and self.proc.poll() is None:  # setpriv execs python: same pid
            try:
                argv = open(f"/proc/{self.proc.pid}/cmdline").read().split("\0")
                if argv[0] == sys.executable and "obshub.cli" in argv:
                    status = open(f"/proc/{self.proc.pid}/status").read()
                    return int(status.split("CapEff:")[1].split()[0], 16)
            except OSError:
                break
            time.sleep(0.02)
        return -1

    def read_table(self, rows: set[str]) -> dict[str, str]:
        """Read the probe table until every name of ``rows`` is listed."""
        while not rows <= self.table.keys():
            line = self.proc.stdout.readline()
            assert line, f"agent exited early: {self.proc.stderr.read()}"
            parts = line.split()
            if len(parts) >= 3 and parts[2] in ("attached", "skipped"):
                self.table[parts[0]] = parts[2]
        return self.table

    def stop(self) -> tuple[int, str]:
        """SIGTERM; returns (exit code, stderr)."""
        try:
            self.proc.send_signal(signal.SIGTERM)
            _out, err = self.proc.communicate(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode, err


def _mask(caps: list[str]) -> int:
    return sum(1 << CAP_BITS[c] for c in caps)


@needs_root
def test_agent_with_only_the_documented_capabilities_delivers_a_trainings_steps(kafka, world_home, unique):
    caps = ["bpf", "perfmon", "sys_admin", "dac_read_search"]
    host, job = f"caps-{unique}", f"job-{unique}"
    agent = CappedAgent(caps, world_home, kafka, host, job, "pytorch,sched")
    try:
        assert agent.cap_eff == _mask(caps), f"CapEff {agent.cap_eff:#x}"
        table = agent.read_table(
            {"pytorch_register", "pytorch_tracekey", "pytorch_step", "pytorch_phase", "pytorch_collective", "sched"}
        )
        assert set(table.values()) == {"attached"}, table
        wl_env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port_pair()),
        }
        wl = subprocess.run(
            [
                sys.executable,
                "-m",
                "obshub.cli",
                "run",
                "--job",
                job,
                "--",
                sys.executable,
                "-m",
                "obshub.workloads.ddp_train",
                "--steps",
                str(STEPS),
            ],
            env=wl_env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert wl.returncode == 0, wl.stderr[-2000:]
    finally:
        rc, err = agent.stop()
    assert rc == 0, err
    m = re.search(r"stopped: (\d+) batches, (\d+) events, all delivered", err)
    assert m and int(m[2]) > 0, err
    got = read_batches(kafka.bootstrap_servers, hosts={host}, until=lambda bs: len(bs) >= int(m[1]))
    assert_seq_contiguous(got, got[0].agent_id)
    events = [e for b in got for e in b.events]
    assert len(events) == int(m[2]) and all(b.job == job for b in got)
    # --registered watches every registering process of the machine: keep our job's
    regs = [e for e in events if e.kind == Kind.REGISTER and e.payload["job"] == job]
    assert len(regs) == 1, regs
    mine = [e for e in events if e.pid == regs[0].pid]
    begun = sorted({e.step for e in mine if e.kind == Kind.STEP_BEGIN})
    ended = sorted({e.step for e in mine if e.kind == Kind.STEP_END})
    assert begun[:STEPS] == ended == list(range(STEPS)), (begun, ended)
    assert any(e.kind == Kind.SCHED_STEP_SUM for e in mine) or any(e.kind == Kind.SCHED_OFFCPU for e in mine)


@needs_root
def test_without_cap_sys_admin_uprobes_are_skipped_not_fatal(kafka, world_home, unique):
    caps = ["bpf", "perfmon", "dac_read_search"]
    agent = CappedAgent(caps, world_home, kafka, f"nocap-{unique}", "j", "pytorch,sched")
    try:
        assert agent.cap_eff == _mask(caps), f"CapEff {agent.cap_eff:#x}"
        table = agent.read_table({"pytorch_register", "sched"})
    finally:
        rc, err = agent.stop()
    assert rc == 0, err
    assert table["sched"] == "attached" and table["pytorch_register"] == "skipped", table
