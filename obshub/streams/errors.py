"""Errors of the streams stage, all under :class:`obshub.core.errors.ObshubError` (the CLI prints the message
and the hint, never a traceback)."""

from __future__ import annotations

from obshub.core.errors import ObshubError


class StreamsError(ObshubError):
    """The stream worker cannot start or run: a missing topic, a bad option, a broker it cannot reach."""


class TopicMissingError(StreamsError):
    """An input topic the worker must read does not exist on the broker."""
