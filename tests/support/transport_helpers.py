"""Helpers of the agent-transport tests (tests/producer/test_agent_*.py, tests/producer/test_transport_*.py): build an
in-process agent, read back the batches one or more agents published."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Callable

from confluent_kafka import Consumer, TopicPartition

from obshub.core import schema
from obshub.core.settings import agent_config
from obshub.producer.agent import Agent
from obshub.producer.synthetic import SyntheticSource


def make_agent(
    tmp_path: Path,
    bootstrap: str,
    *,
    host: str | None = None,
    rate: float = 20_000,
    total: int | None = None,
    kafka: dict | None = None,
    batch: dict | None = None,
    spool: dict | None = None,
    **cfg,
) -> Agent:
    """An Agent with a SyntheticSource, its spool under ``tmp_path``; not registered in any stack."""
    host = host or f"h-{uuid.uuid4().hex[:8]}"
    config = agent_config(
        job=cfg.pop("job", "tjob"),
        host=host,
        host_id=cfg.pop("host_id", 7),
        kafka={"bootstrap": bootstrap, **(kafka or {})},
        batch=batch or {},
        spool={"dir": tmp_path / "spool" / host, **(spool or {})},
        **cfg,
    )
    src = SyntheticSource(rate, total=total, host_id=config.host_id, job=config.job)
    return Agent(config, src, say=lambda _m: None)


class AgentThread:
    """Runs ``agent.run()`` in a thread; ``stop()`` asks it to finish and returns its exit code."""

    def __init__(self, agent: Agent):
        self.agent = agent
        self.rc: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.rc = self.agent.run()
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def stop(self, timeout_s: float = 60.0) -> int:
        self.agent.stop()
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "agent did not stop"
        if self.error is not None:
            raise self.error
        return self.rc


def wait_for(
    cond: Callable[[], bool], timeout_s: float, what: str, step_s: float = 0.05, diag: Callable[[], str] | None = None
) -> None:
    """Poll ``cond`` until true; fail the test saying ``what`` did not happen in time (and ``diag()``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}" + (f": {diag()}" if diag else ""))


def read_batches(
    bootstrap: str,
    agent_ids: set[str] | None = None,
    hosts: set[str] | None = None,
    *,
    until: Callable[[list[schema.Batch]], bool],
    timeout_s: float = 60.0,
) -> list[schema.Batch]:
    """Read ``obshub.events.v1`` from the beginning of every partition, keep the batches of ``agent_ids``
    (or of ``hosts``), in arrival order, until ``until(batches)`` is true. Fails the test on a timeout."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}", "enable.auto.commit": False})
    try:
        md = c.list_topics(schema.TOPIC_EVENTS, timeout=10)
        parts = md.topics[schema.TOPIC_EVENTS].partitions
        c.assign([TopicPartition(schema.TOPIC_EVENTS, p, 0) for p in parts])
        out: list[schema.Batch] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None or m.error():
                if until(out):
                    return out
                continue
            b = schema.decode_batch(m.value())
            assert m.key() == b.host.encode(), "a batch must be keyed by its host name"
            if (agent_ids is None or b.agent_id in agent_ids) and (hosts is None or b.host in hosts):
                out.append(b)
                if until(out):
                    return out
        raise AssertionError(f"timed out: {len(out)} batches, {sum(len(b.events) for b in out)} events read")
    finally:
        c.close()


def events_of(batches: list[schema.Batch], kinds: set[int] | None = None) -> int:
    """Number of events (of ``kinds``) in ``batches``, each ``(agent_id, seq)`` counted once."""
    seen, n = set(), 0
    for b in batches:
        if (b.agent_id, b.seq) in seen:
            continue
        seen.add((b.agent_id, b.seq))
        n += sum(1 for e in b.events if kinds is None or e.kind in kinds)
    return n


def assert_seq_contiguous(batches: list[schema.Batch], agent_id: str) -> list[int]:
    """The agent's batches arrived with seq 0..n-1, each at least once, first arrivals in order."""
    first: list[int] = []
    seen = set()
    for b in batches:
        if b.agent_id == agent_id and b.seq not in seen:
            seen.add(b.seq)
            first.append(b.seq)
    assert first == list(range(len(first))), f"seq not contiguous/in order for {agent_id}: {first[:50]}"
    return first
