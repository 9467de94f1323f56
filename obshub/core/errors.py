"""The root of obshub's errors. Each package defines its own errors under :class:`ObshubError`; the CLI
prints ``error: <message>`` and ``hint: <remedy>`` and exits 1 for any of them, never a traceback."""

from __future__ import annotations


class ObshubError(Exception):
    """An error an operator can act on. ``hint`` says what to do about it."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class StackError(ObshubError):
    """The local Kafka stack could not be installed, started, reached or stopped."""


class ConfigError(ObshubError):
    """A setting or input file is invalid."""
