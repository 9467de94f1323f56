"""USDT probes of obshub's in-process PyTorch instrumentation (provider ``obshub``).

The probes live in the C extension ``obshub.instrument._usdt`` (source: ``obshub/instrument/_usdt.c``, built by
``pip install -e .`` through setup.py). A tracer attaches to the shared object returned by
:func:`library_path`; with none attached each probe site is one NOP instruction.

The probe names and their arguments are the contract of :mod:`obshub.core.usdt`.

The wrappers re-exported here are the C functions themselves (no Python layer in between): they raise
``TypeError`` for a wrong type or argument count and ``OverflowError`` for an integer that does not fit
the probe argument.
"""

from __future__ import annotations

from pathlib import Path

from obshub.core.errors import ObshubError

try:
    from obshub.instrument import _usdt
except ImportError as exc:  # pragma: no cover - only when the package was not built
    raise ObshubError(
        f"the USDT extension obshub.instrument._usdt is not built ({exc})",
        hint="run `make setup` (or `.venv/bin/pip install -e .`) in the checkout; it needs gcc and "
        "sys/sdt.h from the Debian package systemtap-sdt-dev",
    ) from exc

from obshub.core.usdt import PROBES, PROVIDER  # noqa: E402  (the contract, after the extension check)

__all__ = [
    "PROBES",
    "PROVIDER",
    "coll_begin",
    "coll_end",
    "library_path",
    "phase_begin",
    "phase_end",
    "register",
    "step_begin",
    "step_end",
    "tracekey",
]

register = _usdt.register
tracekey = _usdt.tracekey
step_begin = _usdt.step_begin
step_end = _usdt.step_end
phase_begin = _usdt.phase_begin
phase_end = _usdt.phase_end
coll_begin = _usdt.coll_begin
coll_end = _usdt.coll_end


def library_path() -> str:
    """Absolute path of the built ``obshub.instrument._usdt`` shared object: the file a tracer attaches the
    ``obshub:*`` USDT probes to (e.g. ``bcc.USDT(path=library_path())``)."""
    return str(Path(_usdt.__file__).resolve())
