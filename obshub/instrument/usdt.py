"""USDT probes of obshub's in-process PyTorch instrumentation (provider ``obshub``).

The probes live in the C extension ``producer._usdt`` (source: ``producer/usdt/_usdt.c``, built by
``pip install -e .`` through setup.py). A tracer attaches to the shared object returned by
:func:`library_path`; with none attached each probe site is one NOP instruction.

Probe arguments, in order (units: ``step`` a training step number, -1 outside a step; ``trace_key`` the
64-bit TraceKey of :func:`obshub.schema.make_trace_key`; ``bytes`` bytes):

==============  ====================================================================================
register        job: str, rank: int32, world_size: int32, host_id: int32, local_rank: int32
tracekey        trace_key: uint64, step: int64   (the calling thread's current TraceKey changed)
step_begin      step: int64, trace_key: uint64
step_end        step: int64, trace_key: uint64
phase_begin     phase: str (forward|backward|optimizer|data), step: int64, trace_key: uint64
phase_end       same as phase_begin
coll_begin      pg: str, coll_seq: uint64, op: str, bytes: uint64, step: int64, trace_key: uint64
coll_end        same as coll_begin
==============  ====================================================================================

The wrappers re-exported here are the C functions themselves (no Python layer in between): they raise
``TypeError`` for a wrong type or argument count and ``OverflowError`` for an integer that does not fit
the probe argument.
"""

from __future__ import annotations

from pathlib import Path

from obshub.errors import ObshubError

try:
    from producer import _usdt
except ImportError as exc:  # pragma: no cover - only when the package was not built
    raise ObshubError(
        f"the USDT extension producer._usdt is not built ({exc})",
        hint="run `make setup` (or `.venv/bin/pip install -e .`) in the checkout; it needs gcc and "
        "sys/sdt.h from the Debian package systemtap-sdt-dev",
    ) from exc

PROVIDER = "obshub"
PROBES = ("register", "tracekey", "step_begin", "step_end", "phase_begin", "phase_end", "coll_begin",
          "coll_end")

register = _usdt.register
tracekey = _usdt.tracekey
step_begin = _usdt.step_begin
step_end = _usdt.step_end
phase_begin = _usdt.phase_begin
phase_end = _usdt.phase_end
coll_begin = _usdt.coll_begin
coll_end = _usdt.coll_end


def library_path() -> str:
    """Absolute path of the built ``producer._usdt`` shared object: the file a tracer attaches the
    ``obshub:*`` USDT probes to (e.g. ``bcc.USDT(path=library_path())``)."""
    return str(Path(_usdt.__file__).resolve())
