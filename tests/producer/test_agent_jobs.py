"""One agent per node, several jobs on it: two small trainings on this host, started the zero-code way
(the `obshub run` bootstrap, no `--job`), one as a Slurm job step and one as a torchrun run. Each names
its job from its own environment and the register probe carries it; the real agent (BPF probes, only
`--registered`) publishes to the session's broker. Every batch holds one job and only that job's
processes, the agent's sequence stays gapless across jobs, and the stream worker's logic (ingest +
fold) gives two separate streams of step summaries, one per job, with every step of each."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import defaultdict

import pytest

from obshub.core import schema
from obshub.core.schema import Kind
from obshub.core.settings import agent_config
from obshub.producer.probes import ProbeOptions, Target
from tests.support.probes_util import need_bpf, settings
from tests.support.transport_helpers import AgentThread, assert_seq_contiguous, read_batches, wait_for

pytestmark = [pytest.mark.bpf, pytest.mark.kafka, pytest.mark.torch]
STEPS = 5

TRAIN = f"""
import sys, time, torch
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 8)
sys.stdin.readline()  # torch is imported (the slow part) while the agent compiles its probes
for _ in range({STEPS}):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    time.sleep(0.05)
"""

_WORKLOAD_VARS = ("OBSHUB_JOB", "SLURM_", "TORCHELASTIC_", "MASTER_", "OBSHUB_POD", "RANK", "WORLD_SIZE")


def _env(**extra: str) -> dict[str, str]:
    """This environment without any job identity, the bootstrap on PYTHONPATH, plus ``extra``."""
    from obshub.instrument.run import child_env

    base = {k: v for k, v in os.environ.items() if not k.startswith(_WORKLOAD_VARS)}
    base["OBSHUB_PODINFO_LABELS"] = "/nonexistent"
    return child_env(base, None, None) | extra


def test_two_jobs_on_one_host_give_two_streams_of_summaries(kafka, tmp_path):
    need_bpf()
    pytest.importorskip("torch")
    from obshub.core.usdt import library_path
    from obshub.producer.agent import Agent
    from obshub.producer.loader import BpfEventSource
    from obshub.streams.inproc import InProcess

    if library_path() is None:
        pytest.skip("obshub.instrument._usdt is not built")
    tag = uuid.uuid4().hex[:8]
    slurm_job, run_id = str(int(tag, 16) % 10**7), f"run{tag}"
    want = {"slurm": f"slurm-{slurm_job}.0", "torchrun": f"torchrun-{run_id}"}
    host = f"jobs-{tag}"
    config = agent_config(
        job=f"fallback-{tag}",
        host=host,
        host_id=3,
        kafka={"bootstrap": kafka.bootstrap_servers},
        batch={"max_age_ms": 100},
        spool={"dir": tmp_path / "spool"},
    )
    src = BpfEventSource(
        settings(tmp_path),
        Target(registered=True),
        ProbeOptions(probes=("pytorch",), usdt_library=library_path(), sysfs=False),
    )
    said: list[str] = []
    agent = Agent(config, src, say=said.append)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TRAIN], env=env, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for env in (_env(SLURM_JOB_ID=slurm_job, SLURM_STEP_ID="0"), _env(TORCHELASTIC_RUN_ID=run_id))
    ]
    run = AgentThread(agent)
    try:
        wait_for(lambda: bool(agent.probe_status) or run.error is not None, 60, "the probes to attach")
        assert all(s.attached for s in agent.probe_status), agent.probe_status
        for p in procs:  # both train at once
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-2000:]
            assert "obshub:" not in err, err[-2000:]  # the bootstrap enabled the instrumentation
        wait_for(
            lambda: agent.kind_counts[Kind.STEP_END] >= 2 * STEPS and agent.transport.idle,
            30,
            "the step events of both trainings",
            diag=lambda: f"{dict(agent.kind_counts)}; {said}",
        )
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        rc = run.stop()
    assert rc == 0, said
    pid_job = {p.pid: job for p, job in zip(procs, want.values())}
    for pid, job in pid_job.items():
        assert any(m.startswith(f"process {pid} registered for job {job} ") for m in said), said

    def complete(bs: list[schema.Batch]) -> bool:
        return sum(1 for b in bs for e in b.events if e.kind == Kind.STEP_END and e.pid in pid_job) >= 2 * STEPS

    batches = read_batches(kafka.bootstrap_servers, {agent.agent_id}, until=complete)
    assert_seq_contiguous(batches, agent.agent_id)
    # one job per batch: a batch of one of the two jobs holds only that job's process, and the events of
    # the two processes are in no other batch (other tests' trainings on this machine register too, and
    # this agent serves them as well, under their own jobs)
    for b in batches:
        pids = {e.pid for e in b.events}
        if b.job in want.values():
            assert pids <= {pid for pid, j in pid_job.items() if j == b.job}, b.job
        else:
            assert not pids & set(pid_job), b.job
    regs = {e.pid: e.payload["job"] for b in batches for e in b.events if e.kind == Kind.REGISTER}
    assert {pid: regs.get(pid) for pid in pid_job} == pid_job

    pipe = InProcess()
    for b in batches:
        pipe.feed(schema.encode_batch(b))
    pipe.close_all()
    steps_of: dict[str, set[int]] = defaultdict(set)
    for s in pipe.summaries:
        steps_of[s["job"]].add(s["step"])
        assert s["hosts"] == [host], s["hosts"]
    for job in want.values():
        assert set(range(STEPS)) <= steps_of[job], (job, dict(steps_of))
