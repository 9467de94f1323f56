"""The root of obshub's errors. Each package defines its own errors under :class:`ObshubError`; the CLI
prints ``error: <message>`` and ``hint: <remedy>`` and exits 1 for any of them, never a traceback."""

from __future__ import annotations


class ObshubError(Exception):
    """An error an operator can act on. ``hint`` says what to do about it; ``exit_code`` is the process's
    exit status when the CLI ends on it (1; `obshub run` uses the shell's 126/127 for a command that cannot
    be run / is not found)."""

    def __init__(self, message: str, hint: str | None = None, exit_code: int = 1):
        super().__init__(message)
        self.hint = hint
        self.exit_code = exit_code


class StackError(ObshubError):
    """The local Kafka stack could not be installed, started, reached or stopped."""


class ConfigError(ObshubError):
    """A setting or input file is invalid."""
