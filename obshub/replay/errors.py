"""Errors of the replay package (all under :class:`obshub.core.errors.ObshubError`)."""

from __future__ import annotations

from obshub.core.errors import ObshubError


class ReplayError(ObshubError):
    """A replay could not be set up: no trace files, ranks that cannot be told apart, a broker error."""


class TraceFormatError(ReplayError):
    """A trace file is unreadable: not gzip/JSON, truncated, or not a Chrome trace at all. The message
    names the file and how far reading got."""


class NotAKinetoTraceError(TraceFormatError):
    """Valid JSON without trace events: an execution trace (``is_execution_trace``) or some other file."""

    def __init__(self, message: str, hint: str | None = None, *, is_execution_trace: bool = False):
        super().__init__(message, hint)
        self.is_execution_trace = is_execution_trace
