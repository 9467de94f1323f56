"""Collectives from PyTorch execution traces (ET, "Chakra input format", schema 1.0.x).

An execution trace is ``{"schema", "pid", "time", "start_ts", "finish_ts", "nodes": [...]}``; each node
is one recorded operator. c10d records every collective as a ``record_param_comms`` node whose
``inputs`` follow ``RECORD_PARAM_COMMS_DATA`` (pytorch ``torch/csrc/distributed/c10d/ParamCommsUtils.hpp``)::

    [input_tensors, seq, process_group_ptr, rank, collective_name, in_split_sizes, out_split_sizes, ...]

or, without data (``RECORD_PARAM_COMMS``, e.g. ``wait``)::

    [seq, process_group_ptr, rank, collective_name, in_split_sizes, out_split_sizes]

``seq`` is the process group's collective sequence number: the same on every rank for the same
collective, which is exactly obshub's ``coll_seq`` join key. A tensor input is
``[tensor_id, storage_id, offset, numel, elem_bytes, device]``. The process group appears only as a
pointer, different on every rank; groups are therefore named by order of first use on each rank
("0" for the first, normally the default group).

Only the ``record_param_comms`` nodes are kept; the file is streamed with ijson.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ijson

from obshub.replay.errors import TraceFormatError
from obshub.replay.kineto import CHUNK_BYTES, is_int, open_bytes

NON_COLLECTIVES = frozenset({"wait", "barrier_wait", ""})


@dataclass(frozen=True)
class EtCollective:
    """One collective as the execution trace recorded it: ``seq`` (process-group sequence number),
    ``op`` (c10d name: allreduce, all_to_allv, ...), ``pg`` (group name by order of first use),
    ``bytes`` (input bytes, 0 when unknown), ``rf_id`` (record-function id; issue order)."""

    seq: int
    op: str
    pg: str
    bytes: int
    rf_id: int


@dataclass
class EtFile:
    """The collectives of one execution trace, in issue order, and the recording process ``pid``."""

    path: Path
    pid: int | None
    collectives: list[EtCollective]


def _tensor_bytes(t: Any) -> int:
    """Bytes of an ET tensor input ``[id, storage, offset, numel, elem_bytes, device]`` or a list of
    them; 0 when the shape is not that."""
    if isinstance(t, list) and len(t) == 6 and is_int(t[3]) and is_int(t[4]):
        return max(t[3], 0) * max(t[4], 0)
    if isinstance(t, list) and t and all(isinstance(x, list) for x in t):
        return sum(_tensor_bytes(x) for x in t)
    return 0


def parse_comms_inputs(inputs: Any) -> tuple[int, Any, str, int] | None:
    """``(seq, pg_ptr, op, bytes)`` from a ``record_param_comms`` node's ``inputs``, or None when the
    layout is not one of the two documented above."""
    if not isinstance(inputs, list) or len(inputs) < 4:
        return None
    if is_int(inputs[0]) and isinstance(inputs[3], str):  # RECORD_PARAM_COMMS
        return inputs[0], inputs[1], inputs[3], 0
    if len(inputs) >= 5 and is_int(inputs[1]) and isinstance(inputs[4], str):  # ..._DATA
        return inputs[1], inputs[2], inputs[4], _tensor_bytes(inputs[0])
    return None


def read_et(path: Path) -> EtFile:
    """Read the collectives of one execution trace. Raises TraceFormatError for a file that is not an
    execution trace (no ``nodes``) or not valid JSON."""
    pid: int | None = None
    nodes: list[tuple[int, int, Any, str, int]] = []
    out_nodes, out_pid, out_schema = ijson.sendable_list(), ijson.sendable_list(), ijson.sendable_list()
    coros = [ijson.items_coro(out_nodes, "nodes.item", use_float=True)]
    side = [(out_pid, ijson.items_coro(out_pid, "pid")), (out_schema, ijson.items_coro(out_schema, "schema"))]
    n_nodes = 0
    try:
        with open_bytes(path) as f:
            while chunk := f.read(CHUNK_BYTES):
                for c in coros:
                    c.send(chunk)
                side = [(t, c) for t, c in side if not t]
                for _, c in side:
                    c.send(chunk)
                n_nodes += len(out_nodes)
                for node in out_nodes:
                    if isinstance(node, dict) and node.get("name") == "record_param_comms":
                        parsed = parse_comms_inputs(node.get("inputs"))
                        if parsed is None or parsed[2] in NON_COLLECTIVES:
                            continue
                        seq, pg_ptr, op, nbytes = parsed
                        rf = node.get("rf_id", node.get("id", 0))
                        nodes.append((seq, rf if is_int(rf) else 0, pg_ptr, op, nbytes))
                del out_nodes[:]
            for c in coros:
                c.close()
    except ijson.JSONError as exc:
        raise TraceFormatError(
            f"Failed to parse execution trace {path}: {str(exc).strip()}",
            hint="the file is truncated or not JSON; pass the .json(.gz) that ExecutionTraceObserver wrote",
        ) from None
    except (EOFError, OSError, zlib.error) as exc:
        raise TraceFormatError(
            f"Failed to read execution trace {path}: {exc}", hint="the file is truncated or corrupt"
        ) from None
    if out_pid and is_int(out_pid[0]):
        pid = out_pid[0]
    if n_nodes == 0 and not out_schema:
        raise TraceFormatError(
            f"{path} is not a PyTorch execution trace (no 'nodes' array)",
            hint="pass Kineto traces as arguments and execution traces with --et",
        )
    nodes.sort(key=lambda n: (n[1], n[0]))
    pg_names: dict[Any, str] = {}
    out = []
    for seq, rf, pg_ptr, op, nbytes in nodes:
        pg = pg_names.setdefault(pg_ptr, str(len(pg_names)))
        out.append(EtCollective(seq, op, pg, nbytes, rf))
    return EtFile(path, pid, out)
