"""obshub wire schema, version 1: the TraceKey, event kinds, the batch envelope and its msgpack codec.

This is the one module every stage agrees on (agent, stream workers, rule engine, replay). docs/SCHEMA.md
documents every field with its unit; this module is the executable version of that page.

Shapes
------
A **batch** is one Kafka message on ``obshub.events.v1`` (key = host name). It is a msgpack map::

    {"v": 1, "job": str, "host": str, "host_id": int, "agent_id": str, "seq": int,
     "sent_ns": int, "clock": {"offset_ns": int, "uncertainty_ns": int, "tai_offset_ns": int},
     "events": [event, ...]}

An **event** is a msgpack array of ``len(EVENT_FIELDS)`` positional fields, cheap to encode in the agent's
hot path::

    [kind, ts_ns, duration_ns, trace_key, step, pid, tid, gpu, value, payload]

``ts_ns`` is CLOCK_MONOTONIC of the emitting host (``bpf_ktime_get_ns``); add ``clock.offset_ns`` to get
CLOCK_REALTIME ns (see ``to_realtime_ns``).

Errors
------
``decode_batch`` raises only :class:`SchemaError` (a ``ValueError``), whatever the bytes: truncated,
wrong types, an unknown version, oversized lengths. The error names the field that was wrong.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack

SCHEMA_VERSION = 1

# ---------------------------------------------------------------------------------------------------------
# Topics (docs/SCHEMA.md)
# ---------------------------------------------------------------------------------------------------------
TOPIC_EVENTS = "obshub.events.v1"
TOPIC_STEPS = "obshub.steps.v1"
TOPIC_ALERTS = "obshub.alerts.v1"
TOPIC_DLQ = "obshub.dlq.v1"

# ---------------------------------------------------------------------------------------------------------
# TraceKey (docs/SCHEMA.md "TraceKey")
# ---------------------------------------------------------------------------------------------------------
HOST_ID_MAX = 0xFFFF
STEP16_MASK = 0xFFFF
OP_SEQ_MAX = 0xFFFF_FFFF
U64_MAX = 0xFFFF_FFFF_FFFF_FFFF


class TraceKeyParts(NamedTuple):
    """The three fields packed into a TraceKey: ``host_id`` (16 bit), ``step16`` (step mod 2**16) and
    ``op_seq`` (32 bit operation sequence number within the step)."""

    host_id: int
    step16: int
    op_seq: int


def make_trace_key(host_id: int, step: int, op_seq: int) -> int:
    """Pack a TraceKey: ``(host_id << 48) | ((step & 0xFFFF) << 32) | op_seq`` as an unsigned 64-bit int.

    ``step`` may be any non-negative integer; only its low 16 bits are kept (the full step travels in the
    event's ``step`` field). Raises ``ValueError`` for a host id outside 0..65535, an op sequence outside
    0..2**32-1, a negative step, or a non-integer argument.
    """
    for name, val in (("host_id", host_id), ("step", step), ("op_seq", op_seq)):
        if not isinstance(val, int) or isinstance(val, bool):
            raise ValueError(f"{name} must be an int, got {type(val).__name__}")
    if not 0 <= host_id <= HOST_ID_MAX:
        raise ValueError(f"host_id {host_id} outside 0..{HOST_ID_MAX}")
    if step < 0:
        raise ValueError(f"step {step} is negative")
    if not 0 <= op_seq <= OP_SEQ_MAX:
        raise ValueError(f"op_seq {op_seq} outside 0..{OP_SEQ_MAX}")
    return (host_id << 48) | ((step & STEP16_MASK) << 32) | op_seq


def parse_trace_key(key: int) -> TraceKeyParts:
    """Unpack a TraceKey into ``TraceKeyParts(host_id, step16, op_seq)``.

    Raises ``ValueError`` when ``key`` is not an int in 0..2**64-1.
    """
    if not isinstance(key, int) or isinstance(key, bool) or not 0 <= key <= U64_MAX:
        raise ValueError(f"trace_key {key!r} is not an unsigned 64-bit integer")
    return TraceKeyParts(key >> 48, (key >> 32) & STEP16_MASK, key & OP_SEQ_MAX)


# ---------------------------------------------------------------------------------------------------------
# Event kinds and layers
# ---------------------------------------------------------------------------------------------------------
class Layer(str, enum.Enum):
    """The layers of the training stack an event belongs to; the unit of the stream application's blame."""

    PYTORCH = "pytorch"
    CUDA = "cuda"
    NCCL = "nccl"
    SCHED = "sched"
    MEMORY = "memory"
    NETWORK = "network"
    PCIE = "pcie"
    NIC = "nic"
    AGENT = "agent"


class Kind(enum.IntEnum):
    """Event kinds. Values 1-5 are the five first kinds (their numbers are fixed); the rest follow
    :class:`Layer`.

    The meaning of ``duration_ns``, ``value`` and ``payload`` per kind is in ``KIND_INFO`` and
    docs/SCHEMA.md.
    """

    # the five first kinds; their numbers are part of the wire format
    PYTORCH_OP = 1
    CUDA_LAUNCH = 2
    PAGE_ALLOC = 3
    RDMA_WQE_POST = 4
    RDMA_CQ_DONE = 5
    # PyTorch layer (USDT)
    REGISTER = 10
    STEP_BEGIN = 11
    STEP_END = 12
    PHASE = 13
    COLLECTIVE_BEGIN = 14
    COLLECTIVE_END = 15
    RANK_STATE = 16
    # kernel scheduler
    SCHED_OFFCPU = 20
    SCHED_RUNQ = 21
    SCHED_STEP_SUM = 22
    # kernel memory
    MEM_RECLAIM = 30
    MEM_COMPACTION = 31
    PAGE_FAULT = 32
    MEM_STEP_SUM = 33
    # kernel network
    TCP_RETRANSMIT = 40
    TCP_RTT = 41
    SKB_DROP = 42
    TCP_QUEUE = 43
    # PCIe
    PCIE_AER = 50
    PCIE_LINK = 51
    # CUDA runtime/driver
    CUDA_SYNC = 60
    CUDA_MEMCPY = 61
    CUDA_STEP_SUM = 62
    # NCCL
    NCCL_COLL = 70
    # NIC
    NIC_COUNTER = 80
    # obshub's own health
    AGENT_LOSS = 90


@dataclass(frozen=True)
class KindInfo:
    """Everything a stage needs to know about one kind (the one table of kinds; the agent's reader, the
    stream accumulator and the probe catalogue derive from it, docs/SCHEMA.md documents it):

    - ``layer``: the layer it belongs to (a probe emitting it belongs to the same layer);
    - ``duration`` / ``value``: what ``duration_ns`` and ``value`` mean;
    - ``payload``: the payload keys (name -> python type) it may carry;
    - ``step``: how one event counts in its layer's per-step summary, as (time_ns, count, peak) rule
      names of :data:`STEP_RULES`; None for the structural kinds (step and collective boundaries,
      registrations, agent loss) that the accumulator handles apart;
    - ``record``: which layout of the agent's raw BPF record carries its payload ("" = no payload).
    """

    layer: Layer
    duration: str
    value: str
    payload: dict[str, type] = field(default_factory=dict)
    step: tuple[str, str, str] | None = None
    record: str = ""


#: names a kind's ``step`` rules may use: ``zero``, ``one``, ``duration`` (duration_ns), ``value``
#: (max(0, value)), ``retransmits`` (max(1, value)), ``preempted`` (duration_ns when value == 0, i.e. the
#: task was preempted while runnable; voluntary sleeps are not the host's fault); for the kernel's per-step
#: aggregates: ``mem_step_count`` (allocations + the short stalls summed with them), ``mem_step_max``
#: (payload ``stall_max_ns``), ``cuda_step_max`` (payload ``max_ns``)
STEP_RULES = (
    "zero",
    "one",
    "duration",
    "value",
    "retransmits",
    "preempted",
    "mem_step_count",
    "mem_step_max",
    "cuda_step_max",
)


KIND_INFO: dict[Kind, KindInfo] = {
    Kind.PYTORCH_OP: KindInfo(
        Layer.PYTORCH, "op wall time, ns", "unused (0)", {"op": str}, step=("zero", "one", "duration")
    ),
    Kind.CUDA_LAUNCH: KindInfo(
        Layer.CUDA,
        "launch call time, ns",
        "grid size (blocks), 0 if unknown",
        {"symbol": str},
        step=("duration", "one", "duration"),
        record="symbol",
    ),
    Kind.PAGE_ALLOC: KindInfo(
        Layer.MEMORY,
        "0",
        "allocation order (pages = 2**order)",
        {"gfp": int},
        step=("zero", "one", "zero"),
        record="page_alloc",
    ),
    Kind.RDMA_WQE_POST: KindInfo(
        Layer.NIC, "post call time, ns", "work request id", {"qp": int}, step=("duration", "one", "duration")
    ),
    Kind.RDMA_CQ_DONE: KindInfo(
        Layer.NIC,
        "post -> completion latency, ns",
        "work request id",
        {"qp": int, "status": int},
        step=("duration", "one", "duration"),
        record="rdma_cq",
    ),
    Kind.REGISTER: KindInfo(
        Layer.PYTORCH,
        "0",
        "rank",
        {"world_size": int, "job": str, "host_id": int, "local_rank": int},
        record="register",
    ),
    Kind.STEP_BEGIN: KindInfo(Layer.PYTORCH, "0", "step number (also in `step`)", {}),
    Kind.STEP_END: KindInfo(Layer.PYTORCH, "step wall time, ns", "step number (also in `step`)", {}),
    Kind.PHASE: KindInfo(
        Layer.PYTORCH, "phase wall time, ns", "0", {"phase": str}, step=("zero", "one", "duration"), record="phase"
    ),
    Kind.RANK_STATE: KindInfo(
        Layer.PYTORCH,
        "0",
        "state of the registered process: 0 running, 1 frozen (cgroup freezer), 2 stopped (SIGSTOP, ptrace), 3 exited",
        {"state": str, "signal": int, "exit_code": int},
    ),
    Kind.COLLECTIVE_BEGIN: KindInfo(
        Layer.PYTORCH, "0", "bytes", {"pg": str, "coll_seq": int, "op": str}, record="collective"
    ),
    Kind.COLLECTIVE_END: KindInfo(
        Layer.PYTORCH, "collective wall time, ns", "bytes", {"pg": str, "coll_seq": int, "op": str}, record="collective"
    ),
    Kind.SCHED_OFFCPU: KindInfo(
        Layer.SCHED, "time off CPU, ns", "previous state (0 = preempted)", {}, step=("preempted", "one", "preempted")
    ),
    Kind.SCHED_RUNQ: KindInfo(
        Layer.SCHED,
        "run-queue latency (wakeup -> on CPU), ns",
        "cpu (-1: the sum of the waits in the step of the process's threads without a TraceKey that no single carried)",
        {},
        step=("duration", "one", "duration"),
    ),
    Kind.SCHED_STEP_SUM: KindInfo(
        Layer.SCHED,
        "sum of off-CPU time in the step, ns",
        "sum of run-queue latency in the step, ns",
        {"switches": int, "wakeups": int, "runq_max_ns": int, "offcpu_max_ns": int, "runq_hist_us": str},
        step=("value", "one", "value"),
        record="sched_sum",
    ),
    Kind.MEM_STEP_SUM: KindInfo(
        Layer.MEMORY,
        "reclaim + compaction stall time not sent as single records, ns",
        "page allocations (order >= page_order) not sent as PAGE_ALLOC",
        {"pages": int, "stalls": int, "stall_max_ns": int, "orders": str},
        step=("duration", "mem_step_count", "mem_step_max"),
        record="mem_step_sum",
    ),
    Kind.CUDA_STEP_SUM: KindInfo(
        Layer.CUDA,
        "kernel-launch call time summed, ns",
        "kernel launches not sent as single CUDA_LAUNCH records",
        {"max_ns": int, "hist_us": str},
        step=("duration", "value", "cuda_step_max"),
        record="cuda_step_sum",
    ),
    Kind.MEM_RECLAIM: KindInfo(
        Layer.MEMORY,
        "reclaim stall (direct or memory-cgroup limit), ns",
        "pages reclaimed",
        {"reclaim": str},
        step=("duration", "one", "duration"),
        record="reclaim",
    ),
    Kind.MEM_COMPACTION: KindInfo(
        Layer.MEMORY, "compaction stall, ns", "compaction result", {}, step=("duration", "one", "duration")
    ),
    Kind.PAGE_FAULT: KindInfo(Layer.MEMORY, "0", "faulting address", {"error_code": int}, step=("zero", "one", "zero")),
    Kind.TCP_RETRANSMIT: KindInfo(
        Layer.NETWORK,
        "0",
        "1 per retransmitted segment",
        {"saddr": str, "daddr": str, "sport": int, "dport": int, "state": int},
        step=("zero", "retransmits", "zero"),
        record="tcp_retransmit",
    ),
    Kind.TCP_RTT: KindInfo(
        Layer.NETWORK,
        "smoothed RTT, ns",
        "rtt variance, ns",
        {"saddr": str, "daddr": str, "sport": int, "dport": int},
        step=("zero", "zero", "duration"),
        record="tcp_rtt",
    ),
    Kind.SKB_DROP: KindInfo(
        Layer.NETWORK, "0", "drop reason code", {"reason": str}, step=("zero", "one", "zero"), record="skb_drop"
    ),
    Kind.TCP_QUEUE: KindInfo(
        Layer.NETWORK,
        "longest wait of a watched socket's segment in its own host's egress qdisc since the socket's "
        "previous TCP_QUEUE, ns",
        "ifindex of the device",
        {},
        step=("zero", "zero", "zero"),
    ),
    Kind.PCIE_AER: KindInfo(
        Layer.PCIE,
        "0",
        "status bits",
        {"dev": str, "severity": int, "replay_rollover": bool, "replay_timeout": bool},
        step=("zero", "one", "zero"),
        record="aer",
    ),
    Kind.PCIE_LINK: KindInfo(
        Layer.PCIE,
        "0",
        "1 when the link is downtrained",
        {"dev": str, "speed": str, "max_speed": str, "width": int, "max_width": int},
        step=("zero", "value", "zero"),
    ),
    Kind.CUDA_SYNC: KindInfo(
        Layer.CUDA,
        "synchronize call time, ns",
        "0",
        {"symbol": str},
        step=("duration", "one", "duration"),
        record="symbol",
    ),
    Kind.CUDA_MEMCPY: KindInfo(
        Layer.CUDA,
        "copy call time, ns",
        "bytes",
        {"symbol": str},
        step=("duration", "one", "duration"),
        record="symbol",
    ),
    Kind.NCCL_COLL: KindInfo(
        Layer.NCCL,
        "enqueue call time, ns",
        "element count",
        {"symbol": str},
        step=("duration", "one", "duration"),
        record="symbol",
    ),
    Kind.NIC_COUNTER: KindInfo(
        Layer.NIC,
        "counter interval, ns",
        "counter delta over the interval",
        {"dev": str, "port": int, "counter": str},
        step=("zero", "value", "zero"),
    ),
    Kind.AGENT_LOSS: KindInfo(Layer.AGENT, "0", "events lost since the previous report", {"probe": str}),
}

PHASES = ("forward", "backward", "optimizer", "data", "step")

# ---------------------------------------------------------------------------------------------------------
# Event and batch
# ---------------------------------------------------------------------------------------------------------
EVENT_FIELDS = ("kind", "ts_ns", "duration_ns", "trace_key", "step", "pid", "tid", "gpu", "value", "payload")
_N_FIELDS = len(EVENT_FIELDS)

# Hard bounds that keep a hostile message from exhausting memory in a decoder.
MAX_BATCH_BYTES = 8 * 1024 * 1024
MAX_EVENTS_PER_BATCH = 200_000
MAX_STR_LEN = 4096
MAX_PAYLOAD_KEYS = 32


class SchemaError(ValueError):
    """A batch or event does not conform to the wire schema. ``field`` names the offending field
    (``events[3].trace_key``, ``v``, ...); ``reason`` says what was wrong."""

    def __init__(self, field: str, reason: str):
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}" if field else reason)


class Event(NamedTuple):
    """One observation. Units: ``ts_ns`` CLOCK_MONOTONIC ns of the emitting host, ``duration_ns`` ns;
    ``step`` the full step number (-1 when not within a step); ``gpu`` -1 when not tied to a GPU;
    ``value`` and ``payload`` as documented per kind in ``KIND_INFO``."""

    kind: int
    ts_ns: int
    duration_ns: int = 0
    trace_key: int = 0
    step: int = -1
    pid: int = 0
    tid: int = 0
    gpu: int = -1
    value: int = 0
    payload: dict | None = None


# What a valid event is, stated once: the inclusive range of each integer field (the payload is a map of
# at most MAX_PAYLOAD_KEYS string keys to str (<= MAX_STR_LEN), int, float, bool or nil, or nil).
# validate_event below and the msgspec decoders (obshub.core.wiretypes, used by obshub.streams.wire and
# obshub.rules.intake) are built from it; a new field is a field of Event plus, if an integer, its range.
EVENT_INT_RANGES: dict[str, tuple[int, int]] = {
    "kind": (0, 255),  # and a member of Kind
    "ts_ns": (0, 2**63 - 1),
    "duration_ns": (0, 2**63 - 1),
    "trace_key": (0, U64_MAX),
    "step": (-1, 2**63 - 1),
    "pid": (0, 2**32 - 1),
    "tid": (0, 2**32 - 1),
    "gpu": (-1, 65535),
    "value": (-(2**63), 2**63 - 1),
}
assert EVENT_FIELDS == Event._fields and set(EVENT_INT_RANGES) == set(EVENT_FIELDS) - {"payload"}


@dataclass
class Clock:
    """The agent's clock relation: ``realtime_ns = monotonic_ns + offset_ns`` within ``± uncertainty_ns``;
    ``tai_offset_ns`` is TAI - UTC in ns (37 s since 2017) when the host knows it, else 0."""

    offset_ns: int = 0
    uncertainty_ns: int = 0
    tai_offset_ns: int = 0


@dataclass
class Batch:
    """One Kafka message from one agent. ``seq`` counts batches of one ``agent_id`` from 0 without gaps;
    a gap downstream means lost batches."""

    job: str
    host: str
    host_id: int
    agent_id: str
    seq: int
    events: list[Event]
    clock: Clock = field(default_factory=Clock)
    sent_ns: int = 0
    v: int = SCHEMA_VERSION


def to_realtime_ns(ts_ns: int, clock: Clock) -> int:
    """Convert a monotonic timestamp of the batch's host to CLOCK_REALTIME ns."""
    return ts_ns + clock.offset_ns


def encode_batch(batch: Batch) -> bytes:
    """Encode a batch to msgpack bytes (the Kafka message value). Does not validate: call
    ``validate_batch`` first where the input is untrusted."""
    return msgpack.packb(
        {
            "v": batch.v,
            "job": batch.job,
            "host": batch.host,
            "host_id": batch.host_id,
            "agent_id": batch.agent_id,
            "seq": batch.seq,
            "sent_ns": batch.sent_ns,
            "clock": {
                "offset_ns": batch.clock.offset_ns,
                "uncertainty_ns": batch.clock.uncertainty_ns,
                "tai_offset_ns": batch.clock.tai_offset_ns,
            },
            "events": [list(e) for e in batch.events],
        },
        use_bin_type=True,
    )


def _check_int(name: str, v: Any, lo: int, hi: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise SchemaError(name, f"expected an integer, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise SchemaError(name, f"{v} outside {lo}..{hi}")
    return v


def _check_str(name: str, v: Any, *, empty_ok: bool = False) -> str:
    if not isinstance(v, str):
        raise SchemaError(name, f"expected a string, got {type(v).__name__}")
    if not v and not empty_ok:
        raise SchemaError(name, "must not be empty")
    if len(v) > MAX_STR_LEN:
        raise SchemaError(name, f"string of {len(v)} characters exceeds {MAX_STR_LEN}")
    return v


_I64 = (-(2**63), 2**63 - 1)

#: the inclusive range of each integer field of a batch's envelope (validate_batch)
BATCH_INT_RANGES: dict[str, tuple[int, int]] = {
    "host_id": (0, HOST_ID_MAX),
    "seq": (0, _I64[1]),
    "sent_ns": (0, _I64[1]),
}


def check_event_int(name: str, v: Any, where: str = "") -> int:
    """``v`` if it is a valid value of integer field ``name`` of an event (a field of ``EVENT_INT_RANGES``)
    or of the envelope of the batch it comes in (``BATCH_INT_RANGES``: ``host_id``, ``seq``, ``sent_ns``),
    the same check ``validate_event`` and ``validate_batch`` apply. Raises SchemaError naming
    ``where`` (default ``name``) with the field's inclusive range (``-5 outside 0..9223372036854775807``);
    KeyError for a name that is no integer field of either."""
    lo, hi = EVENT_INT_RANGES[name] if name in EVENT_INT_RANGES else BATCH_INT_RANGES[name]
    return _check_int(where or name, v, lo, hi)


def validate_event(raw: Any, where: str = "event") -> Event:
    """Validate one decoded event array and return it as an :class:`Event`. Raises SchemaError naming
    the field (``events[i].kind``...). Unknown kinds are rejected: a producer newer than this schema must
    bump the version."""
    if not isinstance(raw, (list, tuple)):
        raise SchemaError(where, f"expected an array of {_N_FIELDS} fields, got {type(raw).__name__}")
    if len(raw) != _N_FIELDS:
        raise SchemaError(where, f"expected {_N_FIELDS} fields {EVENT_FIELDS}, got {len(raw)}")
    for name, v in zip(EVENT_FIELDS, raw):
        if name != "payload":
            check_event_int(name, v, f"{where}.{name}")
        if name == "kind":
            try:
                Kind(v)
            except ValueError:
                raise SchemaError(f"{where}.kind", f"unknown event kind {v}") from None
    payload = raw[-1]
    if payload is not None:
        if not isinstance(payload, dict):
            raise SchemaError(f"{where}.payload", f"expected a map or nil, got {type(payload).__name__}")
        if len(payload) > MAX_PAYLOAD_KEYS:
            raise SchemaError(f"{where}.payload", f"{len(payload)} keys exceed {MAX_PAYLOAD_KEYS}")
        for k, v in payload.items():
            if not isinstance(k, str):
                raise SchemaError(f"{where}.payload", f"key {k!r} is not a string")
            if isinstance(v, str) and len(v) > MAX_STR_LEN:
                raise SchemaError(f"{where}.payload.{k}", f"string exceeds {MAX_STR_LEN} characters")
            if not isinstance(v, (str, int, float, bool)) and v is not None:
                raise SchemaError(f"{where}.payload.{k}", f"unsupported value type {type(v).__name__}")
            if type(v) is int and not _I64_MIN <= v <= _I64_MAX:
                raise SchemaError(f"{where}.payload.{k}", f"integer {v} outside the signed 64-bit range")
        bad = payload_type_error(raw[0], payload)
        if bad is not None:
            raise SchemaError(f"{where}.payload.{bad[0]}", bad[1])
    return Event(*raw)


def payload_type_error(kind: int, payload: dict) -> tuple[str, str] | None:
    """Check the values of the payload keys ``KIND_INFO[kind].payload`` declares: an ``int`` key holds an
    integer (not a bool) within the signed 64-bit range, a ``float`` key a number, a ``str`` key a string; nil is allowed everywhere (not
    known), undeclared keys are not checked. Returns ``(key, reason)`` for the first key of the wrong type,
    None when all are right (or ``kind`` is unknown)."""
    want = _PAYLOAD_TYPES.get(kind)
    if not want:
        return None
    for k, t in want.items():
        v = payload.get(k)
        if v is None:
            continue
        if t is int:
            ok = type(v) is int and _I64_MIN <= v <= _I64_MAX
            if type(v) is int and not ok:
                return k, f"integer {v} outside the signed 64-bit range"
        elif t is float:
            ok = type(v) is float or type(v) is int
        else:
            ok = isinstance(v, t)
        if not ok:
            return k, f"expected {_TYPE_WORDS.get(t, t.__name__)} for a {Kind(kind).name} event, got {type(v).__name__}"
    return None


def payloads_typed(events: Any) -> bool:
    """True when every event of ``events`` (``Event``-shaped tuples: kind first, payload last) passes
    :func:`payload_type_error`: the fast check of the stream worker's decoder (about 200 ns per event with a
    payload on the project's VM), which leaves the naming to the reference when it fails."""
    types = _PAYLOAD_ITEMS
    for e in events:
        p = e[9]
        if p:
            want = types.get(e[0])
            if want:
                for k, t in want:
                    v = p.get(k)
                    if v is not None and type(v) is not t:
                        if (t is float and type(v) is int) or (t is str and isinstance(v, str)):
                            continue
                        return False
                    if t is int and isinstance(v, int) and not _I64_MIN <= v <= _I64_MAX:
                        return False
    return True


_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1  # msgpack carries uint64; summaries and rules read int64

_PAYLOAD_TYPES: dict[int, dict[str, type]] = {int(k): dict(info.payload) for k, info in KIND_INFO.items()}
_PAYLOAD_ITEMS: dict[int, tuple[tuple[str, type], ...]] = {k: tuple(v.items()) for k, v in _PAYLOAD_TYPES.items() if v}
_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "a boolean"}

_ENVELOPE_KEYS = {"v", "job", "host", "host_id", "agent_id", "seq", "sent_ns", "clock", "events"}


def validate_batch(raw: Any) -> Batch:
    """Validate a decoded msgpack object as a version-1 batch. Raises SchemaError naming the field."""
    if not isinstance(raw, dict):
        raise SchemaError("batch", f"expected a map, got {type(raw).__name__}")
    if "v" not in raw:
        raise SchemaError("v", "missing schema version")
    v = raw["v"]
    if v != SCHEMA_VERSION or isinstance(v, bool):
        raise SchemaError("v", f"unsupported schema version {v!r} (this build reads {SCHEMA_VERSION})")
    for k in raw:
        if not isinstance(k, str):
            raise SchemaError("batch", f"map key {k!r} is {type(k).__name__}, not a string")
    missing = sorted(_ENVELOPE_KEYS - raw.keys())
    if missing:
        raise SchemaError(missing[0], "missing field")
    extra = sorted(str(k) for k in raw.keys() - _ENVELOPE_KEYS)
    if extra:
        raise SchemaError(extra[0], "unknown field")
    job = _check_str("job", raw["job"])
    host = _check_str("host", raw["host"])
    host_id = check_event_int("host_id", raw["host_id"])
    agent_id = _check_str("agent_id", raw["agent_id"])
    seq = check_event_int("seq", raw["seq"])
    sent_ns = check_event_int("sent_ns", raw["sent_ns"])
    c = raw["clock"]
    if not isinstance(c, dict):
        raise SchemaError("clock", f"expected a map, got {type(c).__name__}")
    for k in c:
        if not isinstance(k, str):
            raise SchemaError("clock", f"map key {k!r} is {type(k).__name__}, not a string")
    for k in ("offset_ns", "uncertainty_ns"):
        if k not in c:
            raise SchemaError(f"clock.{k}", "missing field")
    clock = Clock(
        _check_int("clock.offset_ns", c["offset_ns"], *_I64),
        _check_int("clock.uncertainty_ns", c["uncertainty_ns"], 0, _I64[1]),
        _check_int("clock.tai_offset_ns", c.get("tai_offset_ns", 0), *_I64),
    )
    evs = raw["events"]
    if not isinstance(evs, list):
        raise SchemaError("events", f"expected an array, got {type(evs).__name__}")
    if len(evs) > MAX_EVENTS_PER_BATCH:
        raise SchemaError("events", f"{len(evs)} events exceed {MAX_EVENTS_PER_BATCH}")
    events = [validate_event(e, f"events[{i}]") for i, e in enumerate(evs)]
    return Batch(job, host, host_id, agent_id, seq, events, clock, sent_ns, v)


def decode_batch(data: bytes | None) -> Batch:
    """Decode and validate one Kafka message value (None: a tombstone). Raises only :class:`SchemaError`,
    for any input; no value or an empty one is ``message: empty message (a tombstone or a message without a
    value)``, the reason every consumer's dead-letter record gives for it.

    Length limits are applied while unpacking (``MAX_BATCH_BYTES``, ``MAX_EVENTS_PER_BATCH``,
    ``MAX_STR_LEN``) so a hostile length prefix cannot allocate gigabytes.
    """
    if data is None or (isinstance(data, (bytes, bytearray, memoryview)) and len(data) == 0):
        raise SchemaError("message", "empty message (a tombstone or a message without a value)")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SchemaError("message", f"expected bytes, got {type(data).__name__}")
    if len(data) > MAX_BATCH_BYTES:
        raise SchemaError("message", f"{len(data)} bytes exceed {MAX_BATCH_BYTES}")
    try:
        raw = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,  # non-string keys are reported by validate_batch, naming the map
            max_str_len=MAX_STR_LEN,
            max_bin_len=MAX_STR_LEN,
            max_array_len=MAX_EVENTS_PER_BATCH,
            max_map_len=1024,
            max_ext_len=0,
        )
    except msgpack.ExtraData as exc:
        raise SchemaError("message", _extra_data_reason(data, exc)) from None
    except msgpack.StackError:
        raise SchemaError("message", f"not a batch: msgpack nested deeper than {MSGPACK_MAX_DEPTH} levels") from None
    except msgpack.FormatError:
        raise SchemaError("message", f"not valid msgpack: reserved format byte 0xc1 ({len(data)} bytes)") from None
    except TypeError as exc:
        if "unhashable" in str(exc):
            raise SchemaError("message", "a map key is an array or a map (map keys must be strings)") from None
        raise SchemaError("message", f"not valid msgpack: {type(exc).__name__}: {exc}") from None
    except (ValueError, msgpack.UnpackException, RecursionError, OverflowError) as exc:
        if isinstance(exc, ValueError) and "exceeds max_" in str(exc):
            _name_the_long_field(data, exc)
        raise SchemaError("message", f"not valid msgpack: {_describe(exc)}") from None
    except Exception as exc:  # msgpack may raise other errors on hostile input; never let them escape
        raise SchemaError("message", f"not valid msgpack: {_describe(exc)}") from None
    return validate_batch(raw)


def _name_the_long_field(data: bytes, exc: ValueError) -> None:
    """A well-formed message over one of the unpacker's length limits (a string of more than
    ``MAX_STR_LEN`` bytes, a map or array too long): unpack it again with the limits at the message's own
    length (no length prefix can claim more than the bytes present) so :func:`validate_batch` names the
    field; raises that SchemaError, or one saying which limit the message exceeds."""
    n = len(data)
    try:
        raw = msgpack.unpackb(
            data, raw=False, strict_map_key=False, max_str_len=n, max_bin_len=n, max_array_len=n, max_map_len=n
        )
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError, OverflowError):
        return  # not well-formed after all: the caller's reason stands
    validate_batch(raw)  # raises, naming the field, in the usual case
    raise SchemaError(
        "message", f"a string, map or array over the unpacker's limits ({exc}; strings: {MAX_STR_LEN} UTF-8 bytes)"
    )


MSGPACK_MAX_DEPTH = 1024  # msgpack's C unpacker refuses deeper nesting (StackError)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _extra_data_reason(data: bytes, exc: msgpack.ExtraData) -> str:
    """Why a message is not one msgpack value: JSON, or foreign bytes whose first byte happens to be a
    complete msgpack value (a random byte usually is: any byte below 0x80 is a small integer)."""
    head = bytes(data[:1])
    if head in (b"{", b"["):
        try:
            json.loads(bytes(data))
            return "the message is JSON, not a msgpack batch (this topic carries msgpack)"
        except (ValueError, RecursionError):
            pass
    if isinstance(exc.unpacked, dict):
        return f"{len(exc.extra)} trailing byte(s) after the batch map"
    first = type(exc.unpacked).__name__ if exc.unpacked is not None else "nil"
    return (
        f"not a msgpack batch: the first {len(data) - len(exc.extra)} byte(s) decode as a msgpack {first}, "
        f"followed by {len(exc.extra)} byte(s) that are not part of it (random or foreign data?)"
    )


def event_layer(kind: int) -> Layer:
    """The layer a kind belongs to. Raises ValueError for an unknown kind."""
    return KIND_INFO[Kind(kind)].layer


# ---------------------------------------------------------------------------------------------------------
# Step summaries (topic obshub.steps.v1) and DLQ records: JSON, so operators can read them with any tool.
# ---------------------------------------------------------------------------------------------------------
NET_VIEWS = {
    "rx": "its fewest retransmits over its busy connections in the step (net_stats)",
    "rtt": "its lowest mean RTT over its busy connections in the step",
    "window": "its fewest retransmits over its busy connections with the recent steps' (a slowed step)",
    "toward": "the retransmits the other hosts sent toward it (a slowed step)",
    "sender_queue": "the toward view's retransmits, charged to the host that sent most of them, whose own egress "
    "queue held a watched socket's segment for at least net_queue_min_ns (queue_max_ns)",
    "drops": "its own watched sockets' segments dropped on their way (netfilter, a qdisc, the device; not a receiving "
    "socket's discards) in the step, against the other hosts' and its own recent steps' (a slowed step)",
}
"""The views of a host's connections that give its network evidence (``analysis.NetEvidence.view``; the step
summary's ``evidence.net_view`` and a network culprit's ``net_view``; docs/ANALYSIS.md "Evidence per (host,
layer)")."""


STEP_SUMMARY_FIELDS: dict[str, str] = {
    "v": "schema version (int, 1)",
    "job": "job name",
    "step": "full step number",
    "closed_by": "'complete' (every known host reported its end), 'window' (the window expired), 'hang' "
    "(the step is still open and hangs: a repeated interim record, see hang) or 'running' (the step is still "
    "open and runs far longer than usual: a repeated interim record whose evidence and blame name the hosts "
    "with slow connections) or 'restart' (the job started a new life while the step was open: summarised with "
    'what arrived; docs/STREAMS.md "Restarts, resumes and world-size changes")',
    "life": "life of the job the step belongs to: 0 for its first run, +1 each time its ranks register again as "
    "new processes (a torchrun restart, a resume under the same name, an elastic world-size change); steps are "
    "numbered within a life",
    "closed_at_ns": "CLOCK_REALTIME ns when the worker closed the step",
    "hosts": "hosts that reported any event for this step (list of host names)",
    "expected_hosts": "hosts the job is known to have (from registrations)",
    "missing_hosts": "expected hosts that reported nothing for this step",
    "world_size": "ranks of the job (registered world size; the expected hosts when none registered)",
    "step_time_ns": "map host -> step wall time ns (STEP_END duration)",
    "step_time_max_ns": "largest step time over hosts, ns; in a running record, how long the open step has run so far",
    "straggler": "null, or {host, rank, local_rank, gpu, score, excess_ns, reason, group}: the host that kept the "
    "others waiting and its rank that did (null when unknown; gpu -1); group = [{host, rank, late_ns}] every rank "
    "as late at its collective (the late group)",
    "blame": "list of {host, rank, layer, excess_ns, straggler_ns, peer_median_ns, count, max_ns}, largest first "
    "(rank null for the network layer, a host's link, and when unknown)",
    "collectives": "list of {pg, coll_seq, op, skew_ns, uncertainty_ns, last_host} (pairing-consistent ones)",
    "inconsistent": "list of {pg, coll_seq, op, why}: collectives whose pairing fails the check (never blamed)",
    "late_max_ns": "the largest lateness of any host in the step, ns (arrival minus the median arrival)",
    "net_directed": "whether the step's retransmits meet the directed view's condition (some host has at least "
    "net_count_min of them on every busy connection in one direction); the worker then reads the job's network "
    'evidence in the directed view for its next steps too (docs/ANALYSIS.md "Network blame by connection")',
    "evidence": "{spread_ns, hosts: {host: {layer: z}}, ranks: {host: rank}[, net_view: {host: view}]}: per-step "
    "evidence for the sequential rules; ranks names the rank of each host the evidence comes from (where known); "
    "net_view, per host whose evidence is network, the view of its connections that gave it: rx or rtt (its busy "
    "connections' fewest retransmits or lowest mean RTT in the step), window (their retransmits with the recent "
    "steps'), toward (the retransmits the other hosts sent toward it), sender_queue (those charged to the host that "
    "sent most of them, its own egress queue having held a segment for net_queue_min_ns), drops (its own "
    "segments dropped on their way, against the other hosts' and its recent steps'); absent without any",
    "culprit": "null, or {host, rank, layer, evidence, source, why[, starved][, starved_rank][, burst, burst_ns][, net_view][, runq_veto]}: the host (and its rank, null when "
    "unknown or for the network layer; a host that runs one rank names it whatever the source) and layer the step is charged to (the single-step stall rules'). Sources: "
    "'stopped' (a rank stopped for a large part of the step, layer process), 'hang' (the rank a "
    "hang record named: network when unreachable, else process), 'evidence' (the largest per-step evidence; layer "
    "pytorch named 'process'; on a tie a named layer wins over lateness), 'memlimit' (in a step that lost time, the "
    "host whose memory cgroup hit its limit, over lateness and noise, never over memory, a directed network or "
    "another host that is starved or has 3 spreads or more), 'persistent' and 'running' (a victim of a persistent "
    "fault or of a running record charged to its cause), 'blame' (the straggler and its first blamed layer, "
    "evidence 0), 'burst' (a rank's run-queue time, a host's in a job of one rank per host, rose over its own recent "
    "steps at least twice every other's rise and by 60 % of the loss more, or every rank of a host of 3 or more rose "
    "alike, twice any rank of another host: layer sched, evidence 0, when the step's own "
    "culprit was no specific evidence of another kind), 'layers' (no straggler: the host whose own sched or memory time over its peers' median explains "
    "a quarter of the loss); null when none applies. A sched culprit of source evidence or layers carries "
    "starved (of source blame only when true; true when its run-queue waits explain most of the step's loss and stand far above every peer's), and "
    "starved_rank (true when one rank of a host of several rose over its own recent steps far above every other "
    "rank's rise: that rank is its rank); a sched culprit so named by its run-queue rise (source burst, or its own "
    "sched culprit of that host) carries burst (true) and burst_ns (the rise over its own recent median, ns; of a host whose ranks "
    "rose alike, its least-risen rank's) and its rank (null then); a network culprit of source evidence carries net_view (evidence.net_view's, where the summary has it); "
    "a network culprit of source evidence under 3 spreads, or of net_view toward or drops, carries runq_veto (true when another host's run-queue "
    "time is at least 1.5 times every other host's and over its peers' median by a quarter of the loss, or when its own host is one of "
    "at most half of the hosts whose run-queue times stand 1.5 times over the rest's, the least of them over the rest's median by a "
    "quarter of the loss); any network culprit "
    "of source evidence carries runq_veto true when every host's run-queue time rose over its own recent median by at least "
    "the loss (the machine starved of CPU as a whole); "
    "interim records carry null "
    '(docs/SCHEMA.md, docs/ANALYSIS.md "Culprit of a step")',
    "ambiguous": "hosts that stood out alike in a slowed step that names no culprit (each with lateness-based "
    "evidence above half the best one's), the best first; absent otherwise (rules see []). The step is held until a later step "
    'names one of them (docs/ANALYSIS.md "Culprit of a step")',
    "unexplained_before": "null, or {step, hosts, stall_ratio, step_time_max_ns, median_ns, baseline_n, after}: a "
    "held step with ambiguous hosts that this step (not slowed, or the second after it) left unexplained "
    "(ns; after: the later steps that named none of its hosts before this one); absent otherwise (rules see null)",
    "memory_episode": "null, or {host, rank, first_step, steps, lost_ns, reclaim_ns, peer_reclaim_ns}: a memory "
    "stall that this step, charged to the host's memory or with the host still at its memory cgroup's limit, "
    "continues: its first step was charged so after MEMORY_QUIET_STEPS (16) closed steps without such a "
    "charge (an onset), with at most MEMORY_GAP_STEPS (2) steps in a row neither charged nor at the limit "
    "since; steps: its steps so far, this one included; lost_ns: what its charged steps lost over the "
    "baseline median (ns); reclaim_ns: the host's memory time in its steps, peer_reclaim_ns: the busiest "
    "other host's in each of them, summed (ns; absent in older records); absent "
    'otherwise (rules see null; docs/ANALYSIS.md "A memory episode")',
    "hang": "null, or {pg, coll_seq, op, hosts: [{host, rank, last_step, last_phase, silent_ns, state[, toward]}], "
    "waiting, waiting_ranks, waited_ns, after_ns}: ranks that never arrived at a collective the others wait at; "
    "state: frozen, stopped, exited, silent, or unreachable (silent while its peers sent it toward retransmits in "
    "the step); waiting: the hosts that wait, waiting_ranks: how many ranks wait (absent in older records)",
    "layers": "map host -> layer -> {time_ns, count, max_ns}: every host of a step of at most 64 hosts; in a "
    "wider step only the outlier hosts (straggler and late group, blame and evidence hosts, last arrivals, the 8 "
    "largest per layer time, per layer count and by step time; layers_omitted counts the others)",
    "ranks": "map host -> global rank -> {local_rank, pid, gpu, step_ns, late_ns, last_n, layers}: one row per rank "
    "of a host of two or more known ranks (late_ns: its largest arrival after the median arrival of all ranks; "
    "last_n: collectives it was last at); kept for the hosts layers keeps",
    "layer_stats": "map layer -> {hosts, time_p50_ns, time_p90_ns, time_p99_ns, time_max_ns, max_host, count_p50, "
    "count_p90, count_p99, count_max}: nearest-rank quantiles over every host that reported the layer",
    "layers_omitted": "hosts whose row layers leaves out (0 in a step of at most 64 hosts)",
    "baseline": "{median_ns, p99_ns, n, spread_ns}: the job's recent step-time history before this step",
    "stall": "true when step_time_max_ns exceeds the baseline p99 (and the baseline has enough steps)",
    "stall_ratio": "step_time_max_ns / baseline median_ns (0 when no baseline)",
    "stopped": "map host -> {ns, rank}: the longest time a thread of one of its ranks was stopped or traced "
    "(SIGSTOP, a debugger: SCHED_OFFCPU of state T/t) in the step, ns, and that rank (global; null when "
    'unknown); only hosts with a stop (docs/ANALYSIS.md "Culprit of a step")',
    "quality": "{lost_batches, duplicate_batches, late_events, ringbuf_lost}: data-quality counters",
}

STEP_HELD_FIELDS = frozenset({"ambiguous", "unexplained_before", "memory_episode"})
"""Step-summary fields the worker adds after the close only when they say something (a step held for hosts
that stood out alike, ``analysis.hold_ambiguous``; a step of a memory episode, ``analysis.memory_episode``):
absent from every other summary, whose bytes stay as
they were; the rules see their defaults ([] and null) there."""

DLQ_HEADERS = (
    "obshub.reason",
    "obshub.field",
    "obshub.source.topic",
    "obshub.source.partition",
    "obshub.source.offset",
    "obshub.consumer",
)
"""A DLQ record keeps the original message value and key unchanged and adds these Kafka headers
(UTF-8 strings): the error text, the offending field, where the message came from, and the consumer
group that could not use it (one message unusable by two consumers is in the DLQ once per consumer)."""

#: a DLQ record keeps the original value up to this many bytes (below the broker's default
#: max.message.bytes, 1 MB, with room for headers); a longer one is cut and gets the header
#: ``obshub.truncated`` with its full length, so a huge message cannot block the DLQ
DLQ_MAX_BYTES = 900_000


# ---------------------------------------------------------------------------------------------------------
# Checking JSON records (step summaries, alert changes): every problem a SchemaError naming the field.
# Accepted: numbers finite and within the signed 64-bit range (integers where an integer is documented:
# a float with no fraction counts as one), map keys strings, strings at most MAX_STR_LEN characters,
# nesting at most MAX_JSON_DEPTH levels below a field, at most MAX_JSON_ITEMS items per list or map.
# ---------------------------------------------------------------------------------------------------------
MAX_JSON_BYTES = MAX_BATCH_BYTES
MAX_JSON_DEPTH = 6
MAX_JSON_ITEMS = 65_536
I64_MIN, I64_MAX = -(2**63), 2**63 - 1

# documented shape of each step-summary field: int, number, str, bool, [str], {str: int}, map, [map] ...
_STEP_SHAPE: dict[str, str] = {
    "v": "int",
    "job": "str",
    "step": "int",
    "closed_by": "str",
    "life": "int",
    "closed_at_ns": "int",
    "hosts": "list[str]",
    "expected_hosts": "list[str]",
    "missing_hosts": "list[str]",
    "step_time_ns": "map[int]",
    "step_time_max_ns": "int",
    "straggler": "map?",
    "blame": "list[map]",
    "collectives": "list[map]",
    "layers": "map[map]",
    "layer_stats": "map[map]",
    "ranks": "map[map]",
    "layers_omitted": "int",
    "baseline": "map",
    "stall": "bool",
    "stall_ratio": "number",
    "stopped": "map[map]",
    "quality": "map",
    "world_size": "int",
    "inconsistent": "list[map]",
    "late_max_ns": "int",
    "net_directed": "bool",
    "evidence": "map",
    "hang": "map?",
    "culprit": "map?",
    "ambiguous": "list[str]",
    "unexplained_before": "map?",
    "memory_episode": "map?",
}
_NONNEG = {"closed_at_ns", "step_time_max_ns"}
STEP_REQUIRED = ("job", "step")  # a summary without them belongs to no step


def _type(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _number(where: str, v: Any) -> int | float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SchemaError(where, f"expected a number, got {_type(v)} {_short(v)}")
    if isinstance(v, float) and not math.isfinite(v):
        raise SchemaError(where, f"number {v} is not finite")
    if not I64_MIN <= v <= I64_MAX:
        raise SchemaError(where, f"number {_short(v)} outside the signed 64-bit range")
    return v


def _int(where: str, v: Any, lo: int = I64_MIN) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SchemaError(where, f"expected an integer, got {_type(v)} {_short(v)}")
    if isinstance(v, float):
        if not math.isfinite(v):
            raise SchemaError(where, f"expected an integer, got {v}")
        if not v.is_integer():
            raise SchemaError(where, f"expected an integer, got {v}")
    if not lo <= v <= I64_MAX:
        raise SchemaError(where, f"{_short(v)} outside {lo}..{I64_MAX}")
    return int(v)


def check_json_str(where: str, v: Any) -> str:
    """``v`` as a string of at most MAX_STR_LEN characters; SchemaError naming ``where`` otherwise."""
    if not isinstance(v, str):
        raise SchemaError(where, f"expected a string, got {_type(v)} {_short(v)}")
    if len(v) > MAX_STR_LEN:
        raise SchemaError(where, f"string of {len(v)} characters exceeds {MAX_STR_LEN}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SchemaError(
            where, f"not valid Unicode: lone surrogate {v[exc.start]!r} at character {exc.start}"
        ) from None
    return v


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _value(where: str, v: Any, depth: int) -> Any:
    """Any JSON value below a documented field: bounded depth, string keys, finite in-range numbers."""
    if depth > MAX_JSON_DEPTH:
        raise SchemaError(where, f"nested deeper than {MAX_JSON_DEPTH} levels")
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return _number(where, v)
    if isinstance(v, str):
        return check_json_str(where, v)
    if isinstance(v, list):
        if len(v) > MAX_JSON_ITEMS:
            raise SchemaError(where, f"list of {len(v)} items exceeds {MAX_JSON_ITEMS}")
        return [_value(f"{where}[{i}]", x, depth + 1) for i, x in enumerate(v)]
    if isinstance(v, dict):
        if len(v) > MAX_JSON_ITEMS:
            raise SchemaError(where, f"map of {len(v)} keys exceeds {MAX_JSON_ITEMS}")
        for k, x in v.items():
            if not isinstance(k, str):
                raise SchemaError(where, f"map key {_short(k)} is {_type(k)}, not a string")
            check_json_str(f"{where} (key)", k)
            _value(f"{where}.{k}", x, depth + 1)
        return v
    raise SchemaError(where, f"unsupported value type {_type(v)}")


def check_shape(name: str, shape: str, v: Any) -> Any:
    """Check the JSON value ``v`` of field ``name`` against ``shape``: ``int``, ``number``, ``str``,
    ``bool``, ``map``, ``list[str]``, ``list[map]``, ``map[int]``, ``map[map]``, with a trailing ``?``
    for "or null". Returns ``v`` (an integral float as an int). Raises SchemaError naming the field."""
    if shape.endswith("?"):
        if v is None:
            return None
        shape = shape[:-1]
    if shape == "int":
        return _int(name, v, 0 if name in _NONNEG else (-1 if name == "step" else I64_MIN))
    if shape == "number":
        return _number(name, v)
    if shape == "str":
        return check_json_str(name, v)
    if shape == "bool":
        if not isinstance(v, bool):
            raise SchemaError(name, f"expected true or false, got {_type(v)} {_short(v)}")
        return v
    outer, _, inner = shape.partition("[")
    inner = inner.rstrip("]")
    if outer == "list":
        if not isinstance(v, list):
            raise SchemaError(name, f"expected a list, got {_type(v)} {_short(v)}")
        if len(v) > MAX_JSON_ITEMS:
            raise SchemaError(name, f"list of {len(v)} items exceeds {MAX_JSON_ITEMS}")
        items = v
        keys = [f"{name}[{i}]" for i in range(len(v))]
    else:
        if not isinstance(v, dict):
            raise SchemaError(name, f"expected a map, got {_type(v)} {_short(v)}")
        _value(name, v, 0)  # keys, depth, numbers of the whole map
        items = list(v.values())
        keys = [f"{name}.{k}" for k in v]
    for where, x in zip(keys, items):
        if inner == "str":
            check_json_str(where, x)
        elif inner == "int":
            _int(where, x)
        elif inner == "map":
            if not isinstance(x, dict):
                raise SchemaError(where, f"expected a map, got {_type(x)} {_short(x)}")
            _value(where, x, 1)
    return v


def decode_json(value: bytes | None, what: str) -> Any:
    """Parse one JSON message value; SchemaError names what was wrong (not JSON, not UTF-8, too deep)."""
    if value is None or len(value) == 0:
        raise SchemaError("message", "empty message (a tombstone or a message without a value)")
    if len(value) > MAX_JSON_BYTES:
        raise SchemaError("message", f"{len(value)} bytes exceed {MAX_JSON_BYTES}")
    first = value[0]
    try:
        text = bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        hint = (
            " (it looks like msgpack; this topic carries JSON)"
            if 0x80 <= first <= 0x8F or first in (0xDE, 0xDF)
            else ""
        )
        raise SchemaError(
            "message", f"not UTF-8 text: byte 0x{value[exc.start]:02x} at offset {exc.start}{hint}"
        ) from None

    def constant(name: str) -> float:
        raise SchemaError("message", f"{name} is not a JSON number")

    try:
        return json.loads(text, parse_constant=constant)
    except SchemaError:
        raise
    except RecursionError:
        raise SchemaError("message", f"{what} nested too deeply for the JSON parser") from None
    except json.JSONDecodeError as exc:
        raise SchemaError("message", f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # e.g. an integer literal of more than 4300 digits
        raise SchemaError("message", f"not usable JSON: {exc}") from None


def decode_step_summary(value: bytes | None) -> dict:
    """Decode and check one ``obshub.steps.v1`` message value (JSON). Returns the summary as a dict whose
    documented fields (``STEP_SUMMARY_FIELDS``) have their documented shape and ``STEP_REQUIRED`` are
    present; undocumented fields are left as they are; a ``v`` other than ``SCHEMA_VERSION`` is refused (a
    summary without one is read as version 1). Raises only :class:`SchemaError` (field, reason), for any input."""
    data = decode_json(value, "step summary")
    if not isinstance(data, dict):
        raise SchemaError("message", f"a step summary is a JSON object, got {_type(data)}")
    for name in STEP_REQUIRED:
        if name not in data:
            raise SchemaError(name, "missing field")
    for name, shape in _STEP_SHAPE.items():
        if name in data:
            data[name] = check_shape(name, shape, data[name])
    if "v" in data and data["v"] != SCHEMA_VERSION:  # absent: a summary of an older worker (no version yet)
        raise SchemaError("v", f"unsupported schema version {data['v']!r} (this build reads {SCHEMA_VERSION})")
    if "job" in data and not data["job"]:
        raise SchemaError("job", "must not be empty")
    return data
