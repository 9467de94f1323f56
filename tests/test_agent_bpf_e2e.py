"""`obshub agent --registered` with the real BPF probes: a one-rank DDP training started under `obshub run`
is registered, its steps reach Kafka as batches of the agent's host, and SIGTERM ends the agent with
everything delivered."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from obshub.schema import Kind
from tests.conftest import REPO, free_port_pair
from tests.test_agent_caps import needs_root
from tests.transport_helpers import assert_seq_contiguous, read_batches

pytestmark = [pytest.mark.kafka, pytest.mark.bpf, pytest.mark.torch]
STEPS = 6


@needs_root
def test_registered_training_steps_reach_kafka(kafka, tmp_path, unique):
    host, job = f"bpf-{unique}", f"job-{unique}"
    env = {**os.environ, "OBSHUB_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    agent = subprocess.Popen([sys.executable, "-m", "obshub.cli", "agent", "--registered", "--probes", "pytorch",
                              "--host", host, "--job", job, "--bootstrap", kafka.bootstrap_servers],
                             env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        table = []
        while sum(t.startswith("pytorch_") for t in table) < 5:
            line = agent.stdout.readline()
            assert line, f"agent exited early: {agent.stderr.read()}"
            table.append(line)
        assert all(" attached" in t for t in table if t.startswith("pytorch_")), "".join(table)
        wl_env = {**env, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(free_port_pair())}
        wl = subprocess.run([sys.executable, "-m", "obshub.cli", "run", "--job", job, "--", sys.executable, "-m",
                             "obshub.workloads.ddp_train", "--steps", str(STEPS)],
                            env=wl_env, cwd=REPO, capture_output=True, text=True, timeout=180)
        assert wl.returncode == 0, wl.stderr[-2000:]
        agent.send_signal(signal.SIGTERM)
        _out, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert agent.returncode == 0, err
    m = re.search(r"stopped: (\d+) batches, (\d+) events, all delivered", err)
    assert m and int(m[2]) > 0, err
    got = read_batches(kafka.bootstrap_servers, hosts={host}, until=lambda bs: len(bs) >= int(m[1]))
    assert_seq_contiguous(got, got[0].agent_id)
    events = [e for b in got for e in b.events]
    assert len(events) == int(m[2])
    # --registered watches every registering process of the machine: keep our job's
    regs = [e for e in events if e.kind == Kind.REGISTER and e.payload["job"] == job]
    assert len(regs) == 1, regs
    mine = [e for e in events if e.pid == regs[0].pid]
    begun = sorted({e.step for e in mine if e.kind == Kind.STEP_BEGIN})
    ended = sorted({e.step for e in mine if e.kind == Kind.STEP_END})
    assert begun[:STEPS] == ended == list(range(STEPS)), (begun, ended)
    assert all(b.job == job and b.host == host for b in got)
