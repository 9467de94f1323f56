"""Memory layer: transparent huge pages faulted in by a watched process are order-9 page allocations,
counted per step in the kernel (one MEM_STEP_SUM at the process's step_end) or, above the single-record
order, sent one by one (PAGE_ALLOC) attributed to that process; order-0 pages are not reported."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from obshub.core.schema import Kind
from obshub.producer.probes import Target
from obshub.producer.reader import parse_hist
from tests.support.probes_util import Child, build_so, drain, event_source, need_bpf

pytestmark = pytest.mark.bpf

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
TOUCH = """
import mmap, sys
sys.stdin.readline()
m = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m.madvise(mmap.MADV_HUGEPAGE)
for i in range(0, 16 << 20, 4096):
    m[i] = 1
huge = [l for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHugePages")][0].split()[1]
print(int(huge) // 2048, flush=True)
"""


def test_huge_page_faults_are_high_order_allocations(tmp_path):
    need_bpf()
    if not THP.exists() or "[never]" in THP.read_text():
        pytest.skip("transparent huge pages are disabled")
    child = Child(TOUCH)
    try:
        with event_source(
            tmp_path,
            Target(pids={child.pid}),
            probes=("memory",),
            # every huge page, whether the kernel's THP defrag setting lets the fault reclaim or not
            thresholds={"page_order": 9, "page_order_single": 9, "page_may_block": 0},
        ) as (src, table):
            assert all(s.attached for s in table), table
            child.go()
            huge_pages = int(child.wait())
            events = drain(src, 0.5)
    finally:
        child.kill()
    if huge_pages == 0:
        pytest.skip("the kernel gave no huge page (memory fragmented or THP defrag off)")
    allocs = [e for e in events if e.kind == Kind.PAGE_ALLOC]
    assert allocs and {e.pid for e in allocs} == {child.pid}
    assert all(e.value >= 9 for e in allocs)  # the order threshold holds in the kernel
    assert sum(1 for e in allocs if e.value == 9) >= huge_pages, (huge_pages, len(allocs))
    assert all(isinstance(e.payload["gfp"], int) and e.tid == child.pid for e in allocs)


def test_page_allocations_are_aggregated_per_step_in_the_kernel(tmp_path):
    """Default thresholds: no PAGE_ALLOC record; the step's allocations arrive as one MEM_STEP_SUM at the
    step_end of the process, with the order histogram (the huge pages in bucket 9)."""
    need_bpf()
    if not THP.exists() or "[never]" in THP.read_text():
        pytest.skip("transparent huge pages are disabled")
    lib = build_so("fakeusdt", tmp_path)
    code = TOUCH.replace(
        "sys.stdin.readline()\n",
        f"sys.stdin.readline()\nimport ctypes\nL = ctypes.CDLL({str(lib)!r})\n"
        "L.fake_step_begin(ctypes.c_int64(41), ctypes.c_uint64(9))\n",
        1,
    )
    code = code.replace("print(int(huge)", "L.fake_step_end(ctypes.c_int64(41), ctypes.c_uint64(9))\nprint(int(huge)")
    child = Child(code)
    try:
        with event_source(
            tmp_path,
            Target(pids={child.pid}),
            probes=("memory", "pytorch_step"),
            usdt_library=lib,
            thresholds={"page_order": 9, "page_may_block": 0},
        ) as (src, table):
            assert all(s.attached for s in table), table
            child.go()
            huge_pages = int(child.wait())
            events = drain(src, 0.5)
    finally:
        child.kill()
    if huge_pages == 0:
        pytest.skip("the kernel gave no huge page (memory fragmented or THP defrag off)")
    assert not [e for e in events if e.kind == Kind.PAGE_ALLOC]
    sums = [e for e in events if e.kind == Kind.MEM_STEP_SUM]
    assert len(sums) == 1, sums
    agg = sums[0]
    assert agg.pid == child.pid and agg.step == 41 and agg.trace_key == 9
    orders = parse_hist(agg.payload["orders"])
    assert agg.value == sum(orders) >= huge_pages and orders[9] >= huge_pages and sum(orders[:9]) == 0
    assert agg.payload["pages"] == sum(n << i for i, n in enumerate(orders))
    end = [e for e in events if e.kind == Kind.STEP_END]
    assert len(end) == 1 and end[0].ts_ns == agg.ts_ns  # shipped by the step_end handler


# 16 MiB sent over loopback TCP per step: the sender's socket fills 32 KiB fragment pages, order-3
# allocations the network stack makes without direct reclaim (GFP_NOWAIT | __GFP_NORETRY)
SEND = """
import ctypes, socket, sys, threading
L = ctypes.CDLL(sys.argv[1])
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
s, _ = srv.accept()
def sink():
    while s.recv(1 << 20):
        pass
threading.Thread(target=sink, daemon=True).start()
buf = b"x" * (1 << 16)
for step in (1, 2):
    sys.stdin.readline()
    L.fake_step_begin(ctypes.c_int64(step), ctypes.c_uint64(step))
    for _ in range(256):
        c.sendall(buf)
    L.fake_step_end(ctypes.c_int64(step), ctypes.c_uint64(step))
    print(step, flush=True)
"""


def test_allocations_that_cannot_block_are_not_counted_unless_asked(tmp_path):
    """Default (page_may_block 1): the order-3 fragment pages of a TCP sender, allocated without direct
    reclaim, stay out of MEM_STEP_SUM; with page_may_block set to 0 at run time the next step counts
    them."""
    need_bpf()
    lib = build_so("fakeusdt", tmp_path)
    child = Child(SEND.replace("sys.argv[1]", repr(str(lib))))
    orders: dict[int, list[int]] = {}
    try:
        with event_source(tmp_path, Target(pids={child.pid}), probes=("memory", "pytorch_step"), usdt_library=lib) as (
            src,
            table,
        ):
            assert all(s.attached for s in table), table
            events = []
            for step in (1, 2):
                if step == 2:
                    src.set_threshold("page_may_block", 0)
                child.go()
                assert child.proc.stdout.readline().strip() == str(step)
                events += drain(
                    src, 2.0, until=lambda evs, n=step: any(e.kind == Kind.STEP_END and e.step == n for e in evs)
                )
    finally:
        child.kill()
    for e in events:
        if e.kind == Kind.MEM_STEP_SUM and e.pid == child.pid:
            orders[e.step] = parse_hist(e.payload["orders"])
    counted = {step: (orders.get(step) or [0] * 4 + [0])[3] for step in (1, 2)}
    assert counted[2] >= 64, (counted, orders)  # 512 fragment refills of 32 KiB; some may fall back
    assert counted[1] * 4 <= counted[2], (counted, orders)


CGROUP_V1_MEM = Path("/sys/fs/cgroup/memory")
FILL = """
import os, sys
path = sys.argv[1]
sys.stdin.readline()
# Read a file twice the cgroup's limit: its page cache is charged to the cgroup, so once the limit is
# reached every new page must first be reclaimed from the cgroup (clean file pages: no swap needed).
for _ in range(2):
    with open(path, "rb", buffering=0) as f:
        while f.read(1 << 20):
            pass
print("done", flush=True)
"""


def test_memory_cgroup_limit_reclaim_is_seen(tmp_path):
    """A process whose memory cgroup hits its limit stalls in memcg reclaim (not direct reclaim): the
    mem_memcg_reclaim probe reports it as MEM_RECLAIM with payload reclaim=memcg, for that process only."""
    need_bpf()
    if not (CGROUP_V1_MEM / "memory.limit_in_bytes").exists():
        pytest.skip("no cgroup v1 memory controller at /sys/fs/cgroup/memory")
    cg = CGROUP_V1_MEM / f"obshub-t-memcg-{os.getpid()}"
    cg.mkdir()
    try:
        (cg / "memory.limit_in_bytes").write_text(str(48 << 20))
        swap = cg / "memory.memsw.limit_in_bytes"
        data = tmp_path / "data.bin"
        with open(data, "wb") as f:
            for _ in range(96):
                f.write(os.urandom(1 << 20))
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(data, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # drop it from the cache: reads must charge
        os.close(fd)
        child = Child(FILL.replace("sys.argv[1]", repr(str(data))), env={**os.environ})
        (cg / "cgroup.procs").write_text(str(child.pid))
        try:
            with event_source(
                tmp_path, Target(pids={child.pid}), probes=("mem_memcg_reclaim",), thresholds={"reclaim_ns": 0}
            ) as (src, table):
                assert all(s.attached for s in table), table
                child.go()
                child.wait()
                events = drain(src, 0.5)
        finally:
            child.kill()
        failcnt = int((cg / "memory.failcnt").read_text())
    finally:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                import time

                time.sleep(0.1)
    assert failcnt > 0, "the cgroup never hit its limit"
    stalls = [e for e in events if e.kind == Kind.MEM_RECLAIM]
    assert stalls, f"no MEM_RECLAIM although the cgroup hit its limit {failcnt} times"
    assert {e.pid for e in stalls} == {child.pid}
    assert all(e.payload == {"reclaim": "memcg"} and e.duration_ns > 0 for e in stalls)
    assert swap  # noqa: B018 - documents that swap limits are left alone (no swap on test machines)
