"""Memory layer: transparent huge pages faulted in by a watched process are order-9 page allocations
(PAGE_ALLOC above the order threshold) attributed to that process; order-0 pages are not reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.probes_util import Child, drain, event_source, need_bpf
from obshub.schema import Kind
from producer.probes import Target

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
        with event_source(tmp_path, Target(pids={child.pid}), probes=("memory",),
                          thresholds={"page_order": 9}) as (src, table):
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
