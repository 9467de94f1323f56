"""Errors of the producer package (node agent: probes, loader, reader, transport). All derive from
:class:`ProducerError` under :class:`obshub.core.errors.ObshubError`, so the CLI prints ``error:``/``hint:``."""

from __future__ import annotations

from obshub.core.errors import ObshubError


class ProducerError(ObshubError):
    """The node agent could not do something an operator asked for."""


class ProbeError(ProducerError):
    """A probe could not be compiled, loaded or configured (never raised for a probe merely missing on
    this kernel: those are skipped with a reason)."""


class TargetError(ProducerError):
    """The processes to watch could not be resolved (a cgroup path that does not exist, no pids...)."""


class SpoolError(ProducerError):
    """The on-disk spool could not be opened, written or read (a full disk, a folder without write
    permission, a spool held by another running agent of the same host)."""


class TransportError(ProducerError):
    """The Kafka producer could not be created or configured (bad librdkafka setting, missing SSL file)."""


class SourceError(ProducerError):
    """The agent's event source could not be created (for example the BPF source is not available)."""
