"""Decode ring-buffer records (``struct obs_event`` of obshub/bpf/common.h) into :class:`obshub.core.schema.Event`.

Two paths:

- batch (the agent's hot path): the C extension ``producer._ring`` consumes the ring buffer through its
  own mmap and encodes the records of the kinds in :data:`PACKED_FORMATS` straight into msgpack event
  arrays, a whole drain at a time; Python sees one :class:`PackedRun` per run of such records (the
  batcher splices the bytes into batches, ``Batcher.add_packed``) and never touches single events;
- per record: every other kind (payloads that need tables or formatting: REGISTER, CUDA symbols, TCP
  addresses, drop reasons) is handed over as its raw 176 bytes and decoded here
  by :class:`Decoder`: one ``struct.unpack_from`` and the per-kind payload built from its argument fields
  as documented in docs/AGENT.md "Probes" and ``schema.KIND_INFO``.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from array import array
from collections.abc import Callable, Mapping
from typing import NamedTuple

from obshub.core.schema import KIND_INFO, Event, Kind
from obshub.producer import record

# struct obs_event: one definition, obshub/producer/record.py (the BPF programs' and _ring.c's header follows it)
EVENT_STRUCT = record.RECORD_STRUCT
EVENT_SIZE = record.RECORD_SIZE  # 176


class PackedRun(NamedTuple):
    """Consecutive ring-buffer records already encoded as msgpack event arrays (``schema.EVENT_FIELDS``
    order), exactly the bytes ``msgpack.packb(event)`` gives. ``data``: the arrays back to back;
    ``ends``: ``array('I')``, the end offset in ``data`` of each event (``len(ends)`` events);
    ``kinds``: ``{kind: number of events}``."""

    data: bytes
    ends: array
    kinds: dict

    def __len__(self) -> int:  # events, not fields
        return len(self.ends)


# format codes of obshub/producer/_ring.c: how the C reader encodes each kind's payload (absent: Python decodes)
FMT_PY, FMT_NIL, FMT_PHASE, FMT_COLL, FMT_SCHEDSUM, FMT_SCHEDSTEP, FMT_MEMSTEP, FMT_CUDASTEP = range(8)
PACKED_FORMATS: dict[int, int] = {
    Kind.STEP_BEGIN: FMT_NIL,
    Kind.STEP_END: FMT_NIL,
    Kind.SCHED_RUNQ: FMT_NIL,
    Kind.SCHED_OFFCPU: FMT_NIL,
    Kind.PHASE: FMT_PHASE,
    Kind.COLLECTIVE_BEGIN: FMT_COLL,
    Kind.COLLECTIVE_END: FMT_COLL,
    # the per-step aggregates (one of each per process and step_end): their payloads, histogram text
    # included, are written in C too, so the end of a step reaches the batcher without a Python decode
    Kind.SCHED_STEP_SUM: FMT_SCHEDSTEP,
    Kind.MEM_STEP_SUM: FMT_MEMSTEP,
    Kind.CUDA_STEP_SUM: FMT_CUDASTEP,
}


def format_table(formats: Mapping[int, int]) -> bytes:
    """The 256-byte kind -> format code table ``producer._ring.Ring.drain`` takes."""
    t = bytearray(256)
    for kind, fmt in formats.items():
        t[int(kind)] = fmt
    return bytes(t)


PACKED_TABLE = format_table(PACKED_FORMATS)
DECODE_ALL_TABLE = bytes(256)  # every record handed to Python (BpfEventSource.poll)


def packed_run(item: tuple) -> PackedRun:
    """A :class:`PackedRun` from one ``(data, ends bytes, kinds)`` tuple of ``Ring.drain``."""
    ends = array("I")
    ends.frombytes(item[1])
    return PackedRun(item[0], ends, item[2])


# PCIe AER correctable status bits (PCIe base spec 7.8.4.5)
AER_REPLAY_ROLLOVER_BIT = 1 << 8
AER_REPLAY_TIMEOUT_BIT = 1 << 12
AER_SEVERITY_CORRECTED = 2


_HIST = struct.Struct("<16I")  # the u32[16] histograms of the per-step aggregates (obshub/bpf/common.h)
_U64 = struct.Struct("<Q")


def hist_text(b: bytes) -> str:
    """A 16-bucket histogram (``u32[16]`` little-endian at the start of ``b``) as the payload text:
    comma-separated counts from bucket 0, trailing empty buckets left out ("" when all are empty)."""
    counts = list(_HIST.unpack_from(b))
    while counts and not counts[-1]:
        counts.pop()
    return ",".join(map(str, counts))


def parse_hist(text: str) -> list[int]:
    """The 16 bucket counts of a :func:`hist_text` string. Raises ValueError for text that is not
    comma-separated non-negative integers (at most 16)."""
    counts = [int(x) for x in text.split(",")] if text else []
    if len(counts) > 16 or any(c < 0 for c in counts):
        raise ValueError(f"not a 16-bucket histogram: {text!r}")
    return counts + [0] * (16 - len(counts))


def _s32(v: int) -> int:
    """A u64 record field that holds an int32 probe argument, sign-extended or not, as the int32."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def _cstr(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


def _ipv4(n: int) -> str:
    # the tracepoint copies the address bytes in network order into a u8[4]; read as little-endian u32
    return socket.inet_ntoa(struct.pack("<I", n & 0xFFFFFFFF))


def _sockaddr(b: bytes) -> tuple[str, int]:
    """(address, port) of a struct sockaddr_in / sockaddr_in6 copied from tcp:tcp_probe."""
    family = struct.unpack_from("<H", b, 0)[0]
    port = struct.unpack_from(">H", b, 2)[0]
    if family == socket.AF_INET:
        return socket.inet_ntoa(b[4:8]), port
    if family == socket.AF_INET6:
        return str(ipaddress.IPv6Address(b[8:24])), port
    return "", port


class Decoder:
    """Turns raw records into Events. ``drop_reasons`` maps skb drop reason codes to names (from the
    kfree_skb tracefs format); ``cuda_symbols`` maps symbol index -> name; ``probe_names`` maps probe id
    -> catalogue name. ``on_register`` is called with each REGISTER event's payload dict."""

    def __init__(
        self,
        drop_reasons: Mapping[int, str],
        cuda_symbols: Mapping[int, str],
        on_register: Callable[[dict], None] | None = None,
    ):
        self.drop_reasons = dict(drop_reasons)
        self.cuda_symbols = dict(cuda_symbols)
        self.on_register = on_register
        self.counts: dict[int, int] = {}

    def decode(self, data: bytes | memoryview) -> Event:
        """Decode one record. Raises ``struct.error`` when it is shorter than :data:`EVENT_SIZE`."""
        (ts, dur, tk, step, value, a0, a1, a2, pid, tid, kind, _probe, a3, s0, s1) = EVENT_STRUCT.unpack_from(data)
        payload = self._payload(kind, value, a0, a1, a2, a3, s0, s1, pid)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return Event(kind, ts, dur, tk, step, pid, tid, -1, value, payload)

    def _payload(self, kind, value, a0, a1, a2, a3, s0, s1, pid):
        layout = _LAYOUT_OF_KIND.get(kind)
        return layout(self, value, a0, a1, a2, a3, s0, s1, pid) if layout else None

    # -- one function per record layout (``KindInfo.record``) --------------------------------------------
    def _symbol(self, value, a0, a1, a2, a3, s0, s1, pid):
        return {"symbol": self.cuda_symbols.get(a1, f"sym{a1}"), "rc": a0 & 0xFFFFFFFF}

    def _sched_sum(self, value, a0, a1, a2, a3, s0, s1, pid):
        return {
            "switches": a0,
            "wakeups": a1,
            "runq_max_ns": a2,
            "offcpu_max_ns": _U64.unpack_from(s1)[0],
            "runq_hist_us": hist_text(s0),
        }

    def _mem_step_sum(self, value, a0, a1, a2, a3, s0, s1, pid):
        return {"pages": a0, "stalls": a1, "stall_max_ns": a2, "orders": hist_text(s0)}

    def _cuda_step_sum(self, value, a0, a1, a2, a3, s0, s1, pid):
        return {"max_ns": a0, "hist_us": hist_text(s0)}

    def _phase(self, value, a0, a1, a2, a3, s0, s1, pid):
        return {"phase": _cstr(s0)}

    def _collective(self, value, a0, a1, a2, a3, s0, s1, pid):
        return {"pg": _cstr(s0), "coll_seq": a0, "op": _cstr(s1)}

    def _rdma_cq(self, value, a0, a1, a2, a3, s0, s1, pid):
        return {"qp": a0, "status": a1}

    def _register(self, value, a0, a1, a2, a3, s0, s1, pid):
        # the probe's arguments are int32 (obshub/instrument/_usdt.c), widened to u64 by the BPF record:
        # a local rank of -1 (not known) must not arrive as 2^64 - 1
        p = {"job": _cstr(s0), "world_size": _s32(a0), "host_id": _s32(a1), "local_rank": _s32(a2)}
        if self.on_register:
            self.on_register({**p, "rank": value, "pid": pid})
        return p

    def _tcp_retransmit(self, value, a0, a1, a2, a3, s0, s1, pid):
        family, state = a2 & 0xFFFF, (a2 >> 16) & 0xFFFFFFFF
        if family == socket.AF_INET6:
            saddr, daddr = str(ipaddress.IPv6Address(s0[:16])), str(ipaddress.IPv6Address(s1[:16]))
        else:
            saddr, daddr = _ipv4(a0), _ipv4(a1)
        return {"saddr": saddr, "daddr": daddr, "sport": a3 >> 16, "dport": a3 & 0xFFFF, "state": state}

    def _tcp_rtt(self, value, a0, a1, a2, a3, s0, s1, pid):
        saddr, sport = _sockaddr(s0)
        daddr, dport = _sockaddr(s1)
        return {"saddr": saddr, "daddr": daddr, "sport": sport, "dport": dport}

    def _skb_drop(self, value, a0, a1, a2, a3, s0, s1, pid):
        return {"reason": self.drop_reasons.get(value, str(value))}

    def _reclaim(self, value, a0, a1, a2, a3, s0, s1, pid):
        return {"reclaim": "memcg" if a0 else "direct"}

    def _aer(self, value, a0, a1, a2, a3, s0, s1, pid):
        return aer_payload(_cstr(s0), a0, value)

    def _page_alloc(self, value, a0, a1, a2, a3, s0, s1, pid):
        return {"gfp": a0}


#: kind number -> the Decoder method for its record layout, derived from the kinds table
#: ``schema.KIND_INFO`` (``record``); kinds without a layout carry no payload
_LAYOUT_OF_KIND = {int(kind): getattr(Decoder, f"_{info.record}") for kind, info in KIND_INFO.items() if info.record}


def aer_payload(dev: str, severity: int, status: int) -> dict:
    """The PCIE_AER payload: device, severity, and the replay bits named (only for corrected errors,
    where bits 8 and 12 mean replay-number rollover and replay-timer timeout)."""
    corrected = severity == AER_SEVERITY_CORRECTED
    return {
        "dev": dev,
        "severity": severity,
        "replay_rollover": bool(corrected and status & AER_REPLAY_ROLLOVER_BIT),
        "replay_timeout": bool(corrected and status & AER_REPLAY_TIMEOUT_BIT),
    }
