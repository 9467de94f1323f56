"""obshub.producer.btf: member offsets from BTF, on a blob built here (anonymous members, typedefs, bit fields)
and on the running kernel's (the sk_buff offsets net.c hard-codes)."""

from __future__ import annotations

import struct

import pytest

from obshub.producer.btf import VMLINUX, Btf, BtfError, kernel_offsets


def _blob(types: list[tuple[str, int, int, int, list[tuple[str, int, int]]]]) -> bytes:
    """A BTF blob of ``types``: (name, kind, kind_flag, size_or_type, members (name, type, bit offset))."""
    strs = bytearray(b"\0")

    def name(s: str) -> int:
        if not s:
            return 0
        off = len(strs)
        strs.extend(s.encode() + b"\0")
        return off

    body = bytearray()
    for tname, kind, kflag, size, members in types:
        info = (kflag << 31) | (kind << 24) | len(members)
        body += struct.pack("<3I", name(tname), info, size)
        if kind == 1:
            body += struct.pack("<I", 32)  # INT: encoding, offset, bits
        for mname, mtype, moff in members:
            body += struct.pack("<3I", name(mname), mtype, moff)
    hdr = struct.pack("<HBB5I", 0xEB9F, 1, 0, 24, 0, len(body), len(body), len(strs))
    return hdr + bytes(body) + bytes(strs)


BLOB = _blob(
    [
        ("int", 1, 0, 4, []),  # 1
        ("", 4, 0, 8, [("b", 1, 32)]),  # 2: anonymous struct, b at byte 4
        ("inner", 4, 0, 8, [("net", 1, 0), ("late", 1, 32)]),  # 3
        ("inner_t", 8, 0, 3, []),  # 4: typedef struct inner inner_t
        ("outer", 4, 0, 32, [("a", 1, 0), ("", 2, 64), ("nd", 4, 128)]),  # 5
        ("bits", 4, 1, 4, [("lo", 1, (3 << 24) | 0), ("hi", 1, (5 << 24) | 3), ("w", 1, 8)]),  # 6: bit fields
    ]
)


def test_member_offsets_through_anonymous_members_and_typedefs():
    btf = Btf(BLOB)
    assert btf.offset("outer", "a") == 0
    assert btf.offset("outer", "b") == 12  # anonymous struct at byte 8, b at 4 in it
    assert btf.offset("outer", "nd.late") == 20  # typedef -> struct inner at byte 16
    assert btf.offset("bits", "w") == 1  # kind_flag: the low 24 bits are the offset
    assert btf.offset("bits", "hi") is None  # a bit field off a byte boundary
    assert btf.offset("outer", "missing") is None
    assert btf.offset("nosuch", "a") is None


def test_not_btf_is_refused():
    with pytest.raises(BtfError, match="magic"):
        Btf(b"\0" * 32)
    with pytest.raises(BtfError, match="truncated"):
        Btf(BLOB[:24] + BLOB[24:30])  # header says more types than there are


def test_running_kernel_offsets():
    if not VMLINUX.exists():
        pytest.skip("no /sys/kernel/btf/vmlinux")
    btf = Btf(VMLINUX.read_bytes())
    # net.c hard-codes these (OBS_SKB_DEV_OFF, OBS_SKB_SK_OFF, OBS_SKB_TSTAMP_OFF)
    assert (btf.offset("sk_buff", "dev"), btf.offset("sk_buff", "sk"), btf.offset("sk_buff", "tstamp")) == (16, 24, 32)
    offs = kernel_offsets()
    assert set(offs) == {
        "task_nsproxy",
        "nsproxy_net",
        "netdev_net",
        "task_exit_code",
        "task_signal",
        "signal_flags",
        "signal_group_exit_code",
    }, offs
    assert all(v > 0 for v in offs.values()), offs
