"""Errors of ``obshub demo``. Every one is an :class:`obshub.core.errors.ObshubError`, so the CLI prints
``error:`` and ``hint:`` lines and exits 1 instead of a traceback."""

from __future__ import annotations

from obshub.core.errors import ObshubError


class DemoError(ObshubError):
    """Root of the demo's errors."""


class ClusterError(DemoError):
    """A namespace, link, cgroup or process of the simulated cluster could not be created or removed.
    The message quotes the command that failed and its stderr."""


class FaultError(DemoError):
    """A fault could not be injected, verified or removed."""


class PartMissingError(DemoError):
    """A part of obshub that the demo integrates (agent, stream worker, rule engine, training workload)
    is not available in this checkout yet. The demo never fakes a missing part."""


class DemoBusyError(DemoError):
    """Another ``obshub demo`` holds the cluster lock (the namespaces are global to the machine)."""
