"""The probe catalogue, tracefs format parsing, record decoding and the sysfs poller (no probes
attached; one compile-only check of the PCIe program, whose tracepoint this kernel lacks)."""

from __future__ import annotations

import re
import struct

import pytest

from obshub.core.schema import KIND_INFO, Kind, validate_event
from obshub.producer import probes as cat
from obshub.producer.errors import ProbeError
from obshub.producer.loader import _Plan, cflags, render_source
from obshub.producer.probes import ProbeOptions, Target, Tracepoint, Uprobe, Usdt
from obshub.producer.reader import EVENT_SIZE, EVENT_STRUCT, Decoder
from obshub.producer.sysfs_poller import SysfsPoller

AER_FORMAT = """name: aer_event
ID: 1234
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:__data_loc char[] dev_name;\toffset:8;\tsize:4;\tsigned:0;
\tfield:u32 status;\toffset:12;\tsize:4;\tsigned:0;
\tfield:u8 severity;\toffset:16;\tsize:1;\tsigned:0;
\tfield:u8 tlp_header_valid;\toffset:17;\tsize:1;\tsigned:0;
\tfield:u32 tlp_header[4];\toffset:20;\tsize:16;\tsigned:0;

print fmt: "%s PCIe Bus Error: severity=%s", __get_str(dev_name), __print_symbolic(REC->severity, \
{ 0, "Uncorrected, non-fatal" }, { 1, "Fatal" }, { 2, "Corrected" })
"""


def test_catalogue_is_consistent():
    ids = [p.id for p in cat.PROBES]
    assert ids == list(range(len(ids)))
    assert len({p.name for p in cat.PROBES}) == len(cat.PROBES)
    for p in cat.PROBES:
        assert p.requires and p.cost and p.layer
        assert set(p.kinds) <= set(KIND_INFO)
        if p.mechanism == "sysfs":
            continue
        c_text = (cat.BPF_DIR / p.c_file).read_text()
        assert p.c_layer in cat.C_LAYERS
        assert f"OBS_LAYER_{p.c_layer}" in (cat.BPF_DIR / "obshub.c").read_text()
        for ap in p.attach:
            assert isinstance(ap, (Tracepoint, Usdt, Uprobe))
            if isinstance(ap, Uprobe) and ap.fn.startswith("obs_cuda_"):
                assert int(ap.fn.rsplit("_", 1)[1]) < cat.CUDA_MAX_SYMBOLS
                continue
            assert re.search(rf"\bint {ap.fn}\(", c_text), f"{ap.fn} not defined in obshub/bpf/{p.c_file}"
            if isinstance(ap, Tracepoint):
                for fld in ap.fields + ap.optional:
                    assert ap.offset_macro(fld) in c_text, (p.name, fld)
    # every OBS_PROBE_* the C code uses is defined by the catalogue
    used = set(re.findall(r"OBS_PROBE_([A-Z_]+)", "".join(f.read_text() for f in cat.BPF_DIR.glob("*.c"))))
    assert used - {"CUDA_BASE"} <= {p.name.upper() for p in cat.PROBES}
    assert len(cat.CUDA_SYMBOLS) <= cat.CUDA_MAX_SYMBOLS
    assert cat.THRESHOLDS["rdma_latency_ns"][1] == 20_000  # the 20 us default


def test_parse_format_fields_and_symbols():
    fmt = cat.parse_format(AER_FORMAT)
    assert fmt.fields["dev_name"] == (8, 4) and fmt.fields["tlp_header"] == (20, 16)
    assert fmt.fields["severity"] == (16, 1)
    assert fmt.symbols == {1: "Fatal", 2: "Corrected"}  # identifier-like names only (drop reasons are)


# the gfp flags of kmem:mm_page_alloc as two kernel generations print them: bits as shifts (6.x, ahead of
# it a composite flag that must not be taken for one bit) and as hex constants (older kernels)
GFP_NEW = (
    'print fmt: "order=%d gfp_flags=%s", REC->order, (REC->gfp_flags) ? __print_flags(REC->gfp_flags, "|", '
    '{( unsigned long)(( gfp_t)(((((1UL))) << (10))|((((1UL))) << (11)))), "__GFP_RECLAIM"}, '
    '{( unsigned long)(( gfp_t)((((1UL))) << (10))), "__GFP_DIRECT_RECLAIM"}, '
    '{( unsigned long)(( gfp_t)((((1UL))) << (16))), "__GFP_NORETRY"}) : "none"'
)
GFP_OLD = (
    'print fmt: "gfp_flags=%s", (REC->gfp_flags) ? __print_flags(REC->gfp_flags, "|", '
    '{(unsigned long)((( gfp_t)0x400u)|(( gfp_t)0x800u)), "__GFP_RECLAIM"}, '
    '{(unsigned long)(( gfp_t)0x400u), "__GFP_DIRECT_RECLAIM"}, {(unsigned long)(( gfp_t)0x10000u), "__GFP_NORETRY"}'
    ') : "none"'
)


@pytest.mark.parametrize("text", [GFP_NEW, GFP_OLD], ids=["shifts", "constants"])
def test_parse_format_single_bit_flags(text):
    flags = cat.parse_format(text).flags
    assert flags == {"__GFP_DIRECT_RECLAIM": 0x400, "__GFP_NORETRY": 0x10000}  # composites left out


def test_page_alloc_gfp_bit_reaches_the_compile_flags():
    pl = _Plan()
    flags = cflags(pl, ProbeOptions(), Target(pids={1}), {"MEMORY"})
    assert f"-DOBS_GFP_DIRECT_RECLAIM={cat.GFP_DIRECT_RECLAIM_DEFAULT:#x}" in flags  # the format unknown
    pl.tp_formats["kmem:mm_page_alloc"] = cat.parse_format(GFP_NEW.replace("<< (10)", "<< (12)"))
    assert "-DOBS_GFP_DIRECT_RECLAIM=0x1000" in cflags(pl, ProbeOptions(), Target(pids={1}), {"MEMORY"})


def test_kfree_skb_reasons_from_this_kernel():
    from obshub.producer.kheaders import tracefs_mount

    tracefs = tracefs_mount()
    if tracefs is None:
        pytest.skip("tracefs not mounted")
    fmt = cat.tracepoint_format(tracefs, "skb", "kfree_skb")
    if fmt is None or "reason" not in fmt.fields:
        pytest.skip("skb:kfree_skb has no reason field on this kernel")
    assert "NETFILTER_DROP" in fmt.symbols.values() and "NOT_SPECIFIED" in fmt.symbols.values()


def test_options_validation():
    with pytest.raises(ProbeError, match="power of two"):
        ProbeOptions(ringbuf_pages=3)
    with pytest.raises(ProbeError, match="unknown threshold"):
        ProbeOptions(thresholds={"nope": 1})
    assert Target().watch_all and not Target(pids={1}).watch_all and not Target(registered=True).watch_all


def test_decoder_builds_schema_events():
    dec = Decoder({77: "NETFILTER_DROP"}, {3: "cudaDeviceSynchronize"})

    def rec(kind, value=0, a=(0, 0, 0), a3=0, s0=b"", s1=b"", dur=0, tk=0, step=-1):
        return EVENT_STRUCT.pack(1000, dur, tk, step, value, *a, 42, 43, kind, 0, a3, s0, s1)

    assert EVENT_SIZE == 176
    e = dec.decode(rec(Kind.TCP_RETRANSMIT, 1, (0x0100007F, 0x0200007F, 2 | (4 << 16)), (5000 << 16) | 80))
    assert e.payload == {"saddr": "127.0.0.1", "daddr": "127.0.0.2", "sport": 5000, "dport": 80, "state": 4}
    e = dec.decode(rec(Kind.SKB_DROP, 77))
    assert e.payload == {"reason": "NETFILTER_DROP"}
    e = dec.decode(rec(Kind.CUDA_SYNC, 0, (0xFFFFFFFF00000023, 3, 0), dur=5))
    assert e.payload == {"symbol": "cudaDeviceSynchronize", "rc": 35}
    e = dec.decode(rec(Kind.PCIE_AER, (1 << 8) | (1 << 12), (2, 0, 0), s0=b"0000:3b:00.0"))
    assert e.payload == {"dev": "0000:3b:00.0", "severity": 2, "replay_rollover": True, "replay_timeout": True}
    e = dec.decode(rec(Kind.PCIE_AER, 1 << 8, (1, 0, 0), s0=b"0000:3b:00.0"))  # fatal: bits mean other things
    assert e.payload["replay_rollover"] is False
    sa = struct.pack("<H", 2) + struct.pack(">H", 1234) + bytes([10, 0, 0, 1]) + bytes(20)
    e = dec.decode(rec(Kind.TCP_RTT, s0=sa, s1=sa[:28] + bytes(4), dur=1_000))
    assert e.payload == {"saddr": "10.0.0.1", "daddr": "10.0.0.1", "sport": 1234, "dport": 1234}
    e = dec.decode(rec(Kind.RDMA_CQ_DONE, 9, (12, 0, 0), dur=25_000, tk=5, step=3))
    assert (e.value, e.payload, e.duration_ns, e.trace_key, e.step) == (9, {"qp": 12, "status": 0}, 25_000, 5, 3)
    assert (e.pid, e.tid, e.gpu) == (42, 43, -1)
    validate_event(list(e))


def test_sysfs_poller_on_a_fake_tree(tmp_path):
    port = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
    (port / "counters").mkdir(parents=True)
    (port / "hw_counters").mkdir()
    (port / "counters/port_xmit_wait").write_text("100\n")
    (port / "hw_counters/out_of_sequence").write_text("0\n")
    dev = tmp_path / "sys/bus/pci/devices/0000:3b:00.0"
    dev.mkdir(parents=True)
    for name, val in (
        ("current_link_speed", "16.0 GT/s PCIe"),
        ("max_link_speed", "16.0 GT/s PCIe"),
        ("current_link_width", "16"),
        ("max_link_width", "16"),
    ):
        (dev / name).write_text(val + "\n")
    (dev / "aer_dev_correctable").write_text("RxErr 0\nBadTLP 0\nRollover 0\nTimeout 0\nTOTAL_ERR_COR 0\n")
    poller = SysfsPoller(tmp_path, interval_ns=1_000)
    assert poller.poll(now_ns=10_000) == []  # baseline; a healthy link says nothing
    assert poller.poll(now_ns=10_500) == []  # within the interval: not read
    (port / "counters/port_xmit_wait").write_text("250\n")
    (port / "hw_counters/out_of_sequence").write_text("3\n")
    (dev / "current_link_width").write_text("8\n")
    (dev / "aer_dev_correctable").write_text("RxErr 0\nBadTLP 2\nRollover 1\nTimeout 4\nTOTAL_ERR_COR 7\n")
    events = poller.poll(now_ns=12_000)
    by = {(e.kind, (e.payload or {}).get("counter")): e for e in events}
    xw = by[(Kind.NIC_COUNTER, "port_xmit_wait")]
    assert (xw.value, xw.duration_ns, xw.payload["dev"], xw.payload["port"]) == (150, 2_000, "mlx5_0", 1)
    assert by[(Kind.NIC_COUNTER, "out_of_sequence")].value == 3
    link = by[(Kind.PCIE_LINK, None)]
    assert link.value == 1 and link.payload["width"] == 8 and link.payload["max_width"] == 16
    aer = by[(Kind.PCIE_AER, None)]
    assert aer.value == (1 << 6) | (1 << 8) | (1 << 12)
    assert aer.payload == {
        "dev": "0000:3b:00.0",
        "severity": 2,
        "replay_rollover": True,
        "replay_timeout": True,
        "count": 7,
    }
    for e in events:
        validate_event(list(e))
    (dev / "current_link_width").write_text("16\n")  # back to full width: one event, value 0
    assert [(e.kind, e.value) for e in poller.poll(now_ns=14_000)] == [(Kind.PCIE_LINK, 0)]


def test_pcie_program_compiles_with_offsets_of_a_kernel_that_has_aer(tmp_path):
    """This kernel lacks ras:aer_event, so compile pcie.c against the offsets of the format above."""
    from tests.support.probes_util import need_bpf

    need_bpf()
    from bcc import BPF

    from obshub.core.settings import load_settings
    from obshub.producer import kheaders

    kheaders.apply_env(load_settings())
    pl = _Plan()
    pl.tp_formats["ras:aer_event"] = cat.parse_format(AER_FORMAT)
    flags = cflags(pl, ProbeOptions(), Target(pids={1}), {"PCIE"})
    assert "-DTPOFF_AER_EVENT_DEV_NAME=8" in flags and "-DTPOFF_AER_EVENT_TLP_HEADER_VALID=17" in flags
    b = BPF(text=render_source(flags).encode(), cflags=flags)
    try:
        b.load_func(b"obs_aer_event", BPF.TRACEPOINT)  # passes the verifier
    finally:
        b.cleanup()


def test_event_source_with_only_the_sysfs_poller(tmp_path):
    """No BPF program is built when only sysfs probes are selected; poll() returns the poller's events."""
    from obshub.core.settings import load_settings
    from obshub.producer.loader import BpfEventSource

    port = tmp_path / "sys/class/infiniband/efa_0/ports/1/hw_counters"
    port.mkdir(parents=True)
    (port / "retrans_pkts").write_text("5\n")
    src = BpfEventSource(
        load_settings(), Target(pids={1}), ProbeOptions(probes=("sysfs_nic",), sysfs_root=tmp_path, sysfs_interval_ms=1)
    )
    try:
        table = src.start()
        assert [(s.name, s.attached) for s in table] == [("sysfs_nic", True)]
        assert src.poll(5) == [] and src.lost() == {}
        (port / "retrans_pkts").write_text("9\n")
        events = src.poll(5)
        assert [(e.kind, e.value, e.payload["counter"]) for e in events] == [(Kind.NIC_COUNTER, 4, "retrans_pkts")]
        with pytest.raises(ProbeError, match="no BPF program"):
            src.set_threshold("runq_ns", 5)
        with pytest.raises(ProbeError, match="unknown"):
            src.set_threshold("nope", 5)
    finally:
        src.close()


def test_target_cgroup_must_exist(tmp_path):
    from obshub.core.settings import load_settings
    from obshub.producer.errors import TargetError
    from obshub.producer.loader import BpfEventSource

    with pytest.raises(TargetError, match="no-such-cgroup") as info:
        BpfEventSource(load_settings(), Target(cgroup=tmp_path / "no-such-cgroup"), ProbeOptions()).start()
    assert "/sys/fs/cgroup" in info.value.hint
    (tmp_path / "cg" / "child").mkdir(parents=True)  # a cgroup-like tree: procs of children count too
    (tmp_path / "cg" / "cgroup.procs").write_text("11\n12\n")
    (tmp_path / "cg" / "child" / "cgroup.procs").write_text("13\n")
    assert cat.cgroup_procs(tmp_path / "cg") == {11, 12, 13}


def test_probes_cli_table_and_thresholds():
    import json

    from click.testing import CliRunner

    from obshub.cli import cli

    runner = CliRunner()
    res = runner.invoke(cli, ["probes", "--json", "--probes", "network,pcie"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.output)}
    assert set(rows) == {p.name for p in cat.PROBES if p.layer.value in ("network", "pcie")}
    assert all(r["available"] == (r["reason"].startswith("available")) for r in rows.values())
    assert not any(r["attached"] for r in rows.values())  # nothing was loaded without --load
    res = runner.invoke(cli, ["probes", "--thresholds", "--json"])
    assert {r["name"]: r["default"] for r in json.loads(res.output)}["rdma_latency_ns"] == 20_000
    res = runner.invoke(cli, ["probes", "--probes", "nope"])  # a usage error naming the valid names (width21)
    assert res.exit_code == 2 and "unknown probe or layer name(s) 'nope'" in res.output, res.output
    assert "obshub probes --load" in runner.invoke(cli, ["probes", "--help"]).output
