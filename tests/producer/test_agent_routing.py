"""How the agent files events under jobs, without a broker or BPF: REGISTER events teach it each
process's job; events of a registered process go to its job, of any other process to the fallback job
(``--job``); the host's own events (PCIe, NIC, agent loss) to every job with a live registered process;
packed runs from the ring reader are cut by process; a job whose processes are gone is sealed and
forgotten."""

from __future__ import annotations

from array import array

import msgpack
from prometheus_client import generate_latest

from obshub.core import schema
from obshub.core.schema import Event, Kind
from obshub.core.settings import agent_config
from obshub.producer.agent import HOST_KINDS, Agent
from obshub.producer.agent_metrics import make_registry
from obshub.producer.reader import PackedRun
from obshub.producer.synthetic import SyntheticSource

# pids far above any pid_max in use, so they are never alive here
A, B, OTHER = 4_190_001, 4_190_002, 4_190_003


def _ev(kind: Kind, pid: int, payload=None, value: int = 0) -> Event:
    return Event(kind, 1_000, 0, 0, 1, pid, pid, -1, value, payload)


def _reg(pid: int, job: str) -> Event:
    return _ev(Kind.REGISTER, pid, {"job": job, "world_size": 2, "host_id": 1, "local_rank": 0})


def _open(agent: Agent) -> dict[str, int]:
    return {job: b.open_events for job, b in agent.batcher.by_job.items() if b.open_events}


def test_events_are_filed_under_the_job_of_their_process(tmp_path):
    config = agent_config(
        job="fallback",
        host="h-route",
        host_id=1,
        kafka={"bootstrap": "127.0.0.1:9"},  # nothing is delivered in this test
        batch={"max_age_ms": 60_000},
        spool={"dir": tmp_path / "spool"},
    )
    said: list[str] = []
    agent = Agent(config, SyntheticSource(1, total=0), say=said.append)
    try:
        assert Kind.PCIE_AER in HOST_KINDS and Kind.AGENT_LOSS in HOST_KINDS and Kind.SCHED_OFFCPU not in HOST_KINDS
        agent._take_events([_ev(Kind.STEP_BEGIN, A), _ev(Kind.PCIE_AER, 0)])  # nothing registered yet
        assert _open(agent) == {"fallback": 2}
        agent._take_events(
            [
                _reg(A, "job-a"),
                _reg(B, "job-b"),
                _ev(Kind.STEP_BEGIN, A),
                _ev(Kind.STEP_BEGIN, B),
                _ev(Kind.STEP_BEGIN, OTHER),  # a watched process that never registered
                _ev(Kind.PCIE_AER, 0),  # the host's: every job
                _ev(Kind.NIC_COUNTER, A),  # a registered pid wins over the host rule
            ]
        )
        assert agent.job_of_pid == {A: "job-a", B: "job-b"}
        assert _open(agent) == {"fallback": 3, "job-a": 4, "job-b": 3}
        metrics = generate_latest(make_registry(agent)).decode()
        for job in ("job-a", "job-b"):
            assert f'obshub_agent_job_processes{{host="h-route",training_job="{job}"}} 1.0' in metrics

        evs = [_ev(Kind.STEP_END, p) for p in (A, A, B, OTHER, A)]
        packed = [msgpack.packb(list(e)) for e in evs]
        ends = array("I")
        for p in packed:
            ends.append((ends[-1] if ends else 0) + len(p))
        agent._add_packed(PackedRun(b"".join(packed), ends, {int(Kind.STEP_END): len(evs)}))
        assert _open(agent) == {"fallback": 4, "job-a": 7, "job-b": 4}
        last = {job: schema.decode_batch(b.flush().value) for job, b in agent.batcher.by_job.items()}
        assert {job: {e.pid for e in batch.events} for job, batch in last.items()} == {
            "fallback": {A, OTHER, 0},
            "job-a": {A, 0},
            "job-b": {B, 0},
        }
        assert [e.kind for e in last["job-a"].events][-3:] == [Kind.STEP_END] * 3

        agent._take_events([_ev(Kind.STEP_BEGIN, B)])
        agent._prune_jobs()  # gone once: kept (their last events may still be in the ring)
        assert set(agent.job_of_pid) == {A, B}
        sealed = agent.batcher.sealed
        agent._prune_jobs()  # gone twice: forgotten, the open batch of job-b sealed and sent
        assert agent.job_of_pid == {} and set(agent.batcher.by_job) == {"fallback"}
        assert agent.batcher.sealed == sealed + 1
        assert "job job-b: no registered process left on this host" in said
        agent._take_events([_ev(Kind.PCIE_AER, 0)])  # no job left: the host's events go to the fallback
        assert _open(agent) == {"fallback": 1}
    finally:
        agent.transport.close(0)


def test_only_job_drops_the_events_of_other_jobs_processes(tmp_path):
    """``--only-job job-a`` on a node running job-a and job-b: job-b's process is noticed once and its
    events (per record and in packed runs) are dropped; the host's events go to job-a only."""
    config = agent_config(
        job="fallback",
        host="h-only",
        host_id=1,
        kafka={"bootstrap": "127.0.0.1:9"},
        batch={"max_age_ms": 60_000},
        spool={"dir": tmp_path / "spool"},
        only_jobs=("job-a",),
    )
    said: list[str] = []
    agent = Agent(config, SyntheticSource(1, total=0), say=said.append)
    try:
        agent._take_events(
            [
                _reg(A, "job-a"),
                _reg(B, "job-b"),
                _ev(Kind.STEP_BEGIN, A),
                _ev(Kind.STEP_BEGIN, B),
                _ev(Kind.PCIE_AER, 0),
            ]
        )
        assert agent.job_of_pid == {A: "job-a"}
        assert _open(agent) == {"job-a": 3}
        assert any(f"process {B} registered for job job-b" in m and "not served (--only-job)" in m for m in said)
        evs = [_ev(Kind.STEP_END, p) for p in (B, A, B)]
        packed = [msgpack.packb(list(e)) for e in evs]
        ends = array("I")
        for p in packed:
            ends.append((ends[-1] if ends else 0) + len(p))
        agent._add_packed(PackedRun(b"".join(packed), ends, {int(Kind.STEP_END): len(evs)}))
        assert _open(agent) == {"job-a": 4}
        batch = schema.decode_batch(agent.batcher.by_job["job-a"].flush().value)
        assert B not in {e.pid for e in batch.events}
        agent._prune_jobs()
        agent._prune_jobs()  # both gone (the pids are not alive): the ignored pid is forgotten too
        assert agent._ignored == set()
        agent._take_events([_reg(B, "job-a"), _ev(Kind.STEP_BEGIN, B)])  # the pid reused by job-a
        assert agent.job_of_pid == {B: "job-a"}
    finally:
        agent.transport.close(0)
