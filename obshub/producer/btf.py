"""Byte offsets of kernel struct members, read from the running kernel's BTF (``/sys/kernel/btf/vmlinux``).

bcc compiles the probes against whatever headers it finds (often an older distribution's, see kheaders.py), so
a probe that must follow a kernel pointer whose member moves between versions (``task_struct.nsproxy``) gets the
member's offset from here, as a ``-D`` flag, instead of from the headers. Only the parts of BTF that name struct
and union members are read (format: the kernel's Documentation/bpf/btf.rst); nothing is compiled or loaded.
"""

from __future__ import annotations

import functools
import struct
from pathlib import Path

VMLINUX = Path("/sys/kernel/btf/vmlinux")

_MAGIC = 0xEB9F
_STRUCT, _UNION, _TYPEDEF, _CONST, _VOLATILE, _RESTRICT, _TYPE_TAG = 4, 5, 8, 10, 9, 11, 18
# bytes after the 12-byte common header, per kind: fixed part and part per vlen entry
_EXTRA = {1: (4, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 13: (0, 8), 14: (4, 0), 15: (0, 12), 17: (4, 0),
          19: (0, 12)}  # fmt: skip
_ALIASES = {_TYPEDEF, _CONST, _VOLATILE, _RESTRICT, _TYPE_TAG}


class BtfError(ValueError):
    """The BTF blob is not one this reader understands (bad magic, truncated)."""


class Btf:
    """The struct/union members of one BTF blob (``data``: the bytes of e.g. /sys/kernel/btf/vmlinux).

    Raises :class:`BtfError` when the header is not BTF's (magic 0xeB9F, little-endian) or a type runs past
    the type section."""

    def __init__(self, data: bytes):
        if len(data) < 24 or struct.unpack_from("<H", data, 0)[0] != _MAGIC:
            raise BtfError("not little-endian BTF (magic 0xeB9F)")
        hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<5I", data, 4)
        types = data[hdr_len + type_off : hdr_len + type_off + type_len]
        self._strs = data[hdr_len + str_off : hdr_len + str_off + str_len]
        self._kind: list[int] = [0]  # type id -> kind (id 0: void)
        self._ref: list[int] = [0]  # aliases: the type they name
        self._members: dict[int, list[tuple[int, int, int]]] = {}  # struct/union id -> (name_off, type, bit offset)
        self._by_name: dict[str, list[int]] = {}  # struct/union name -> ids
        pos = 0
        while pos < len(types):
            if pos + 12 > len(types):
                raise BtfError(f"type {len(self._kind)} truncated at byte {pos}")
            name_off, info, size_type = struct.unpack_from("<3I", types, pos)
            kind, vlen, kflag = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
            tid = len(self._kind)
            self._kind.append(kind)
            self._ref.append(size_type)
            pos += 12
            if kind in (_STRUCT, _UNION):
                mem = []
                for i in range(vlen):
                    m_name, m_type, m_off = struct.unpack_from("<3I", types, pos + 12 * i)
                    mem.append((m_name, m_type, m_off & 0xFFFFFF if kflag else m_off))
                self._members[tid] = mem
                if name_off:
                    self._by_name.setdefault(self._str(name_off), []).append(tid)
            fixed, per = _EXTRA.get(kind, (0, 0))
            pos += fixed + per * vlen

    def _str(self, off: int) -> str:
        end = self._strs.index(b"\0", off)
        return self._strs[off:end].decode()

    def _resolve(self, tid: int) -> int:
        for _ in range(32):
            if tid >= len(self._kind) or self._kind[tid] not in _ALIASES:
                return tid
            tid = self._ref[tid]
        return tid

    def _find(self, tid: int, name: str) -> tuple[int, int] | None:
        """(bit offset, type id) of member ``name`` of struct/union ``tid``, looking into anonymous members."""
        for m_name, m_type, m_off in self._members.get(tid, ()):
            if m_name and self._str(m_name) == name:
                return m_off, m_type
            if not m_name:
                inner = self._find(self._resolve(m_type), name)
                if inner is not None:
                    return m_off + inner[0], inner[1]
        return None

    def offset(self, struct_name: str, path: str) -> int | None:
        """Byte offset of ``path`` (members joined by dots, e.g. ``nd_net.net``) in ``struct struct_name``;
        None when the struct or a member is missing or the member is a bit field not on a byte boundary."""
        for tid in self._by_name.get(struct_name, ()):
            bits, cur = 0, tid
            for part in path.split("."):
                hit = self._find(self._resolve(cur), part)
                if hit is None:
                    break
                bits, cur = bits + hit[0], hit[1]
            else:
                if bits % 8 == 0:
                    return bits // 8
        return None


@functools.cache
def kernel_offsets(path: Path = VMLINUX) -> dict[str, int]:
    """The member offsets the probes need (bytes): for net.c ``task_nsproxy`` (task_struct.nsproxy),
    ``nsproxy_net`` (nsproxy.net_ns), ``netdev_net`` (net_device.nd_net.net); for sched.c's exit status
    ``task_exit_code`` (task_struct.exit_code), ``task_signal`` (task_struct.signal), ``signal_flags``
    (signal_struct.flags), ``signal_group_exit_code`` (signal_struct.group_exit_code). A name is absent when
    the kernel has no BTF at ``path``, the BTF cannot be read, or the member is missing (e.g. a kernel
    without CONFIG_NET_NS)."""
    try:
        btf = Btf(path.read_bytes())
    except (OSError, BtfError):
        return {}
    want = {
        "task_nsproxy": ("task_struct", "nsproxy"),
        "nsproxy_net": ("nsproxy", "net_ns"),
        "netdev_net": ("net_device", "nd_net.net"),
        "task_exit_code": ("task_struct", "exit_code"),
        "task_signal": ("task_struct", "signal"),
        "signal_flags": ("signal_struct", "flags"),
        "signal_group_exit_code": ("signal_struct", "group_exit_code"),
    }
    out = {}
    for key, (name, member) in want.items():
        off = btf.offset(name, member)
        if off is not None:
            out[key] = off
    return out
