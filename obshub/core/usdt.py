"""The USDT probe contract between the in-process instrumentation (:mod:`obshub.instrument`, which fires
the probes) and the node agent (``producer/``, which attaches to them), and where the agent finds the file
that holds them, without importing the instrumentation package.

Provider ``obshub``; probe arguments, in order (units: ``step`` a training step number, -1 outside a
step; ``trace_key`` the 64-bit TraceKey of :func:`obshub.core.schema.make_trace_key`; ``bytes`` bytes):

==============  ====================================================================================
register        job: str, rank: int32, world_size: int32, host_id: int32, local_rank: int32
tracekey        trace_key: uint64, step: int64   (the calling thread's current TraceKey changed)
step_begin      step: int64, trace_key: uint64
step_end        step: int64, trace_key: uint64
phase_begin     phase: str (forward|backward|optimizer|data), step: int64, trace_key: uint64
phase_end       same as phase_begin
coll_begin      pg: str, coll_seq: uint64, op: str, bytes: uint64, step: int64, trace_key: uint64
coll_end        same as coll_begin
coll            pg, coll_seq, op, bytes, step, trace_key as coll_begin, then begin_ns: uint64 (CLOCK_MONOTONIC
                ns at the begin), begin_tid: int32 (the issuing thread); one collective at its end, fired
                by the C++ collective kernel instead of coll_begin + tracekey + coll_end while traced;
                begin_tid < 0: coll_late sent its begin already (-begin_tid: the issuing thread)
coll_late       same as coll: a collective of that path still in flight after 100 ms (its begin)
caught          where: str (the instrumentation caught an exception there and went on: hook, closure,
                collective, collective_end, load_state_dict, enable, sitecustomize); fired on that path only
phase_next      old_phase: str, new_phase: str, step: int64, old_key: uint64, new_key: uint64
                (phase_end of the open phase and phase_begin of the next at one instant)
step_next       step: int64, trace_key: uint64, next_key: uint64, old_phase: str, old_key: uint64,
                new_phase: str, new_key: uint64 (at a step boundary: phase_end(old_phase), step_end(step),
                step_begin(step + 1, next_key), phase_begin(new_phase) at one instant)
==============  ====================================================================================

The instrumentation fires ``phase_next``, ``step_next`` and ``coll`` instead of the separate probes only while a
tracer is attached to them (it reads the probe site, ``obshub.instrument.usdt.site_traced``): one uprobe
trap and one program run instead of two or four, and a tracer that knows only the separate probes still
sees them.

The probes are defined in the C extension ``obshub.instrument._usdt`` (``obshub/instrument/_usdt.c``);
obshub/bpf/pytorch.c reads the arguments in this order.
"""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

PROVIDER = "obshub"
PROBES = (
    "register",
    "tracekey",
    "step_begin",
    "step_end",
    "phase_begin",
    "phase_end",
    "coll_begin",
    "coll_end",
    "phase_next",
    "step_next",
    "coll",
    "caught",
    "coll_late",
)

#: the folder of the instrumentation package, where the built extension lies
INSTRUMENT_DIR = Path(__file__).resolve().parent.parent / "instrument"
EXTENSION_NAME = "_usdt"


def library_path() -> Path | None:
    """Absolute path of the built ``obshub.instrument._usdt`` shared object (the file a tracer attaches
    the ``obshub:*`` USDT probes to), found on disk without importing it; None when it is not built."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = INSTRUMENT_DIR / f"{EXTENSION_NAME}{suffix}"
        if candidate.is_file():
            return candidate.resolve()
    return None
