"""The agent's broad catches are counted (issue #29 item 5): a source that fails its last poll at
shutdown is reported and counted in ``obshub_agent_caught_errors_total{where="drain"}``; the event
source's own counts (``BpfEventSource.caught``: bcc's bare Exception on attach or compile) are summed
into the same metric, every ``where`` exported from the start at 0."""

from __future__ import annotations

import collections
import re

from prometheus_client import generate_latest

from obshub.core.settings import agent_config
from obshub.producer.agent import Agent
from obshub.producer.agent_metrics import make_registry
from obshub.producer.synthetic import SyntheticSource


class _BrokenSource(SyntheticSource):
    """A synthetic source whose poll fails (a broken ring buffer), with a count of its own as a
    ``BpfEventSource`` keeps one."""

    def __init__(self):
        super().__init__(1, total=0)
        self.caught = collections.Counter({"attach": 2})

    def poll(self, timeout_ms: int = 0):
        raise OSError("ring buffer gone")


def _value(metrics: str, where: str) -> float:
    m = re.search(r'obshub_agent_caught_errors_total\{[^}]*where="%s"[^}]*\} ([0-9.]+)' % where, metrics)
    assert m, metrics
    return float(m.group(1))


def test_a_failed_drain_and_the_sources_failures_are_counted(tmp_path):
    config = agent_config(
        job="j",
        host="h-caught",
        host_id=1,
        kafka={"bootstrap": "127.0.0.1:9"},  # nothing is delivered in this test
        spool={"dir": tmp_path / "spool"},
    )
    said: list[str] = []
    agent = Agent(config, _BrokenSource(), say=said.append)
    registry = make_registry(agent)
    before = generate_latest(registry).decode()
    assert [_value(before, w) for w in ("compile", "drain", "deep_dive")] == [0.0, 0.0, 0.0]
    assert _value(before, "attach") == 2.0
    agent._shutdown(drain=True)
    assert any("Failed to drain the event source at shutdown: ring buffer gone" in s for s in said)
    assert _value(generate_latest(registry).decode(), "drain") == 1.0
