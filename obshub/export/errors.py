"""Errors of the export package (under :class:`obshub.core.errors.ObshubError`)."""

from __future__ import annotations

from obshub.core.errors import ObshubError


class ExportError(ObshubError):
    """A timeline could not be exported: bad step range, nothing found for the job, broker unreachable."""
