"""Probe table on this kernel: tracepoint, USDT and uprobe probes attach, none needs
kprobes; CUDA/NCCL uprobes attach to the libraries of the torch wheel and fire without a GPU; missing
libraries are reported as skipped with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from obshub.core.schema import Kind
from obshub.producer import probes as cat
from obshub.producer.probes import ProbeOptions, Target
from obshub.producer.reader import parse_hist
from tests.support.probes_util import build_so, ctypes_child, drain, event_source, need_bpf

pytestmark = pytest.mark.bpf


def _nvidia_lib(pattern: str) -> Path | None:
    for d in ProbeOptions().lib_dirs:
        hits = sorted(Path(d).glob(pattern))
        if hits:
            return hits[0]
    return None


def test_probe_table_and_cuda_uprobes_fire(tmp_path):
    need_bpf()
    cudart, nccl = _nvidia_lib("libcudart.so*"), _nvidia_lib("libnccl.so*")
    if cudart is None or nccl is None:
        pytest.skip("the torch wheel's libcudart/libnccl are not installed")
    usdt = build_so("fakeusdt", tmp_path)
    body = (
        "C = ctypes.CDLL(%r)\nN = ctypes.CDLL(%r)\nn = ctypes.c_int(0)\n"
        "L.fake_step_begin(ctypes.c_int64(5), ctypes.c_uint64(77))\n"
        "print('count rc', C.cudaGetDeviceCount(ctypes.byref(n)), flush=True)\n"
        "for _ in range(3):\n    C.cudaDeviceSynchronize()\n"
        "C.cudaStreamSynchronize(None)\nC.cudaMemcpy(None, None, ctypes.c_size_t(4096), 0)\n"
        "N.ncclGroupEnd()\n"
        "class dim3(ctypes.Structure):\n"
        "    _fields_ = [('x', ctypes.c_uint), ('y', ctypes.c_uint), ('z', ctypes.c_uint)]\n"
        "C.cudaLaunchKernel.argtypes = [ctypes.c_void_p, dim3, dim3, ctypes.c_void_p, ctypes.c_size_t,"
        " ctypes.c_void_p]\n"
        "for _ in range(4):\n"
        "    C.cudaLaunchKernel(None, dim3(4, 2, 3), dim3(32, 1, 1), None, 0, None)\n"
        "L.fake_step_end(ctypes.c_int64(5), ctypes.c_uint64(77))\n"
        "sys.stdin.readline()\n"  # the single-record threshold is lowered now
        "C.cudaLaunchKernel(None, dim3(4, 2, 3), dim3(32, 1, 1), None, 0, None)\n"
    ) % (str(cudart), str(nccl))
    child = ctypes_child(usdt, body)
    try:
        with event_source(
            tmp_path,
            Target(pids={child.pid}),
            usdt_library=usdt,
            sysfs=True,
            thresholds={"cuda_launch_ns": 10**12},
            deep_dive=(),  # the deep-dive tier attached at start like the rest (`--attach-deep-dive`)
        ) as (src, table):
            by_name = {s.name: s for s in table}
            # every catalogue probe has a row; the attached ones have no reason, the skipped ones have one
            assert set(by_name) == {p.name for p in cat.PROBES}
            for s in table:
                assert s.attached == (s.reason == ""), s
            # no probe of the catalogue needs kprobes (this kernel has none)
            assert {p.mechanism for p in cat.PROBES} <= {"tracepoint", "usdt", "uprobe", "sysfs"}
            for name in (
                "sched",
                "mem_reclaim",
                "mem_compaction",
                "mem_page_alloc",
                "net_sock_state",
                "net_retransmit",
                "net_rtt",
                "net_drop",
                "pytorch_register",
                "pytorch_tracekey",
                "pytorch_step",
                "pytorch_phase",
                "pytorch_collective",
                "cuda_cudaLaunchKernel",
                "cuda_cudaDeviceSynchronize",
                "cuda_cudaMemcpy",
                "cuda_ncclAllReduce",
                "cuda_ncclGroupEnd",
                "sysfs_nic",
                "sysfs_pcie",
            ):
                assert by_name[name].attached, by_name[name]
            aer = by_name["pcie_aer"]
            if not Path("/sys/kernel/tracing/events/ras/aer_event").exists():
                assert not aer.attached and "ras:aer_event" in aer.reason
            if _nvidia_lib("libcuda.so*") is None:  # the driver library is not part of the wheel
                assert not by_name["cuda_cuLaunchKernel"].attached
                assert "libcuda.so" in by_name["cuda_cuLaunchKernel"].reason
            child.go()
            # first the launches of step 5 are counted in the kernel: one CUDA_STEP_SUM at its step_end
            events = drain(src, 20, until=lambda ev: any(e.kind == Kind.CUDA_STEP_SUM for e in ev))
            src.set_threshold("cuda_launch_ns", 0)  # every launch is an outlier now: a single record
            child.go()
            events += drain(src, 20, until=lambda ev: any(e.kind == Kind.CUDA_LAUNCH for e in ev))
            child.wait()
    finally:
        child.kill()
    mine = [e for e in events if e.pid == child.pid]
    syms = [e.payload["symbol"] for e in mine if e.kind in (Kind.CUDA_SYNC, Kind.CUDA_MEMCPY, Kind.NCCL_COLL)]
    assert syms.count("cudaDeviceSynchronize") == 3, syms
    assert "cudaStreamSynchronize" in syms and "ncclGroupEnd" in syms
    memcpy = [e for e in mine if e.kind == Kind.CUDA_MEMCPY]
    assert memcpy and memcpy[0].value == 4096 and memcpy[0].payload["symbol"] == "cudaMemcpy"
    assert all(e.duration_ns > 0 and e.tid for e in mine if e.kind == Kind.CUDA_SYNC)
    # without a GPU the runtime returns an error (35: insufficient driver here), but the probes saw the call
    agg = [e for e in mine if e.kind == Kind.CUDA_STEP_SUM]
    assert len(agg) == 1 and agg[0].step == 5 and agg[0].trace_key == 77 and agg[0].value == 4, agg
    assert sum(parse_hist(agg[0].payload["hist_us"])) == 4
    assert 0 < agg[0].payload["max_ns"] <= agg[0].duration_ns
    launch = [e for e in mine if e.kind == Kind.CUDA_LAUNCH]
    assert len(launch) == 1 and launch[0].value == 4 * 2 * 3, launch  # grid blocks from the dim3 by value
    assert launch[0].payload["symbol"] == "cudaLaunchKernel" and launch[0].payload["rc"] != 0


def test_missing_libraries_are_skipped_with_reason(tmp_path):
    need_bpf()
    missing = tmp_path / "no-such-dir"
    with event_source(
        tmp_path, Target(pids={1}), probes=("cuda", "nccl", "nic"), lib_dirs=(missing,), usdt_library=missing / "x.so"
    ) as (src, table):
        table = [s for s in table if not s.name.startswith("sysfs_")]
        assert table and all(not s.attached for s in table)
        for s in table:
            assert str(missing) in s.reason and "not mapped by the target" in s.reason, s
        assert src.poll(10) == [] and src.lost() == {}


def test_ebpf_debug_source_is_the_compiled_text(tmp_path, capsys):
    need_bpf()
    with event_source(tmp_path, Target(pids={1}), probes=("mem_page_alloc",), debug_ebpf=True) as (src, table):
        assert table[0].attached
    err = capsys.readouterr().err
    assert "// bcc cflags:" in err and "-DOBS_LAYER_MEMORY" in err and "int obs_page_alloc(void *ctx)" in err
    assert "TPOFF_MM_PAGE_ALLOC_ORDER=" in err and src.source_text in err
