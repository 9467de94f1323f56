"""The interface between the agent and what it reads events from: :class:`EventSource`.

Two implementations: :class:`producer.loader.BpfEventSource` (the BPF probes) and
:class:`producer.synthetic.SyntheticSource` (a generated stream, no BPF). docs/AGENT.md "Probes" describes
the interface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from obshub.core.schema import Event
    from obshub.producer.probes import ProbeStatus


class EventSource(Protocol):
    """What the agent reads events from (obshub/producer/loader.py ``BpfEventSource``, obshub/producer/synthetic.py
    ``SyntheticSource``)."""

    def start(self) -> list[ProbeStatus]:
        """Attach what this machine offers; one status per probe, skipped ones with the reason."""

    def poll(self, timeout_ms: int) -> list[Event]:
        """Drain the ring buffer(s), waiting up to ``timeout_ms``; events per obshub.core.schema."""

    def lost(self) -> dict[str, int]:
        """Per-probe ring-buffer reservation failures, counted in the kernel."""

    # Optional: ``poll_packed(timeout_ms) -> list`` as ``poll`` but runs of records may come already
    # encoded (:class:`producer.reader.PackedRun`); the agent uses it when the source has it
    # (obshub/producer/loader.py ``BpfEventSource`` does: the batch reader of the ring buffer). A source whose
    # ``QUIET_POLL`` is true takes ``poll_packed(timeout_ms, quiet_ms)``: for ``quiet_ms`` it may sleep
    # through its own wakeups (the agent passes how long no step end can seal a batch, and a
    # ``timeout_ms`` up to ``agent.QUIET_GRACE_MS`` past it, for the step end that can).

    def set_threshold(self, name: str, value: int) -> None:
        """Change a threshold of :data:`THRESHOLDS` at run time."""

    def registrations(self) -> list[dict]:
        """REGISTER events seen: job, rank, world_size, host_id, local_rank, pid."""

    def close(self) -> None:
        """Detach everything."""
