"""Decode ring-buffer records (``struct obs_event`` of bpf/common.h) into :class:`obshub.core.schema.Event`.

The record layout is mirrored by one precompiled :class:`struct.Struct` (little-endian, 176 bytes); each
record is unpacked with a single ``unpack_from`` and the per-kind payload is built from its argument
fields as documented in docs/AGENT.md "Probes" and ``schema.KIND_INFO``.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Callable, Mapping

from obshub.core.schema import KIND_INFO, Event

# struct obs_event (bpf/common.h): 8 x u64/s64, 2 x u32, 2 x u16, u32, char[64], char[32]
EVENT_STRUCT = struct.Struct("<QQQqqQQQIIHHI64s32s")
EVENT_SIZE = EVENT_STRUCT.size  # 176

# PCIe AER correctable status bits (PCIe base spec 7.8.4.5)
AER_REPLAY_ROLLOVER_BIT = 1 << 8
AER_REPLAY_TIMEOUT_BIT = 1 << 12
AER_SEVERITY_CORRECTED = 2


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

    def __init__(self, drop_reasons: Mapping[int, str], cuda_symbols: Mapping[int, str],
                 on_register: Callable[[dict], None] | None = None):
        self.drop_reasons = dict(drop_reasons)
        self.cuda_symbols = dict(cuda_symbols)
        self.on_register = on_register
        self.counts: dict[int, int] = {}

    def decode(self, data: bytes | memoryview) -> Event:
        """Decode one record. Raises ``struct.error`` when it is shorter than :data:`EVENT_SIZE`."""
        (ts, dur, tk, step, value, a0, a1, a2, pid, tid, kind, _probe, a3, s0, s1) = \
            EVENT_STRUCT.unpack_from(data)
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
        return {"switches": a0, "wakeups": a1}

    def _phase(self, value, a0, a1, a2, a3, s0, s1, pid):
        return {"phase": _cstr(s0)}

    def _collective(self, value, a0, a1, a2, a3, s0, s1, pid):
        return {"pg": _cstr(s0), "coll_seq": a0, "op": _cstr(s1)}

    def _rdma_cq(self, value, a0, a1, a2, a3, s0, s1, pid):
        return {"qp": a0, "status": a1}

    def _register(self, value, a0, a1, a2, a3, s0, s1, pid):
        p = {"job": _cstr(s0), "world_size": a0, "host_id": a1, "local_rank": a2}
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
_LAYOUT_OF_KIND = {int(kind): getattr(Decoder, f"_{info.record}")
                   for kind, info in KIND_INFO.items() if info.record}


def aer_payload(dev: str, severity: int, status: int) -> dict:
    """The PCIE_AER payload: device, severity, and the replay bits named (only for corrected errors,
    where bits 8 and 12 mean replay-number rollover and replay-timer timeout)."""
    corrected = severity == AER_SEVERITY_CORRECTED
    return {"dev": dev, "severity": severity,
            "replay_rollover": bool(corrected and status & AER_REPLAY_ROLLOVER_BIT),
            "replay_timeout": bool(corrected and status & AER_REPLAY_TIMEOUT_BIT)}
