"""How the agent's loop waits for step ends, without a broker or BPF: after a batch sealed at a step end
it tells a source that can sleep through the kernel's wakeups (``QUIET_POLL``) how long no step end can
seal the next batch, before that batch is open, so the records that open it and the step end that seals
it come in one turn; a batch with a rank-state change or a first step still leaves at once."""

from __future__ import annotations

import time

from obshub.core.schema import Event, Kind
from obshub.core.settings import agent_config
from obshub.producer.agent import QUIET_GRACE_MS, Agent

PID = 4_190_011  # far above any pid_max in use: never alive here


class _StepSource:
    """Returns one training step's records (a STEP_BEGIN, a PHASE, a STEP_END) per poll, ``steps`` polls,
    then asks the agent to stop; records every poll's ``(timeout_ms, quiet_ms)``."""

    QUIET_POLL = True

    def __init__(self, steps: int):
        self.steps, self.calls, self.agent = steps, [], None

    def start(self):
        return []

    def set_threshold(self, name, value):
        pass

    def lost(self):
        return {}

    def close(self):
        pass

    def poll(self, timeout_ms: int) -> list:
        return self.poll_packed(timeout_ms)

    def poll_packed(self, timeout_ms: int, quiet_ms: int = 0) -> list:
        self.calls.append((timeout_ms, quiet_ms))
        if len(self.calls) >= self.steps:
            self.agent.stop()
        now = time.monotonic_ns()
        return [
            Event(Kind.STEP_BEGIN, now - 3, 0, 0, len(self.calls), PID, PID, -1, 0, None),
            Event(Kind.PHASE, now - 2, 1, 0, len(self.calls), PID, PID, -1, 0, {"phase": "forward"}),
            Event(Kind.STEP_END, now - 1, 3, 0, len(self.calls), PID, PID, -1, 0, None),
        ]


def test_after_a_step_seal_the_poll_sleeps_through_step_ends_before_the_next_batch_opens(tmp_path):
    config = agent_config(
        job="j",
        host="h-quiet",
        host_id=1,
        kafka={"bootstrap": "127.0.0.1:9"},  # nothing is delivered in this test
        batch={"max_age_ms": 60_000, "step_min_age_ms": 30_000},
        spool={"dir": tmp_path / "spool"},
    )
    source = _StepSource(steps=4)
    agent = Agent(config, source, say=lambda _msg: None)
    source.agent = agent
    try:
        agent._loop()
        # the first poll's step end sealed the first batch at once (nothing sealed before it)
        assert agent.batcher.step_sealed == 1
        # every later poll: the step minimum (30 s) runs from that seal, whether or not the next batch is
        # open, so the source may sleep through the step ends until then (the poll's own timeout reaches
        # past it by the grace time); before, the poll right after a seal got no quiet time and the next
        # step end turned the loop only to open the next batch
        for timeout_ms, quiet_ms in source.calls[1:]:
            assert 29_000 < quiet_ms <= 30_000
            assert timeout_ms >= quiet_ms + QUIET_GRACE_MS - 1
        assert agent.batcher.sealed == 1 and agent.batcher.open_events == 9  # three fast steps share a batch
        # a rank-state change still leaves at once: seal_next ends the quiet time
        agent.batcher.fallback.seal_next()
        assert agent.batcher.ms_until_step_seal() == 0.0
    finally:
        agent.transport.close(0)
