"""Finding copies of a library in other processes (obshub/producer/discovery.py), without BPF: a file's identity
as the agent reads it equals what another process's maps show for it; the scanner reports a copy once,
not the file it already knows, and stops reading a process that maps the instrumentation; a path in the
agent's own mount namespace stays as it is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from obshub.core.usdt import library_path
from obshub.producer.discovery import LibraryScanner, agent_path, file_identity, mount_ns

LOADER = "import ctypes, sys; ctypes.CDLL(sys.argv[1]); print('ok', flush=True); sys.stdin.readline()"


def test_scanner_reports_each_copy_once(tmp_path):
    lib = library_path()
    if lib is None:
        pytest.skip("obshub.instrument._usdt is not built")
    copy = tmp_path / lib.name
    shutil.copy(lib, copy)
    known = file_identity(lib)
    assert known is not None and known != file_identity(copy)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", LOADER, str(p)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for p in (lib, copy)
    ]
    try:
        assert [p.stdout.readline().strip() for p in procs] == ["ok", "ok"]
        pids = {p.pid for p in procs}
        scanner = LibraryScanner({"usdt": ("_usdt*.so",)}, [known], pids=lambda: pids, settle_key="usdt")
        found = scanner.scan()
        assert [(k, m.pid, m.path, m.identity) for k, m in found] == [
            ("usdt", procs[1].pid, str(copy), file_identity(copy))
        ]
        assert found[0][1].host_path == copy  # the agent's own mount namespace: the path as it is
        assert scanner.scan() == [] and scanner._settled == pids  # reported once; both processes settled
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_paths_in_the_agents_own_namespace():
    assert mount_ns() == mount_ns(os.getpid()) != "" and mount_ns(2**22 + 7) == ""
    assert agent_path(os.getpid(), "/usr/lib/x.so") == Path("/usr/lib/x.so")
    assert file_identity("/nonexistent/file") is None


GROWER = """
import ctypes, mmap, sys
keep = []
for line in sys.stdin:
    if line.strip() == "grow":
        keep.append(mmap.mmap(-1, 1 << 20))  # a new anonymous mapping: the address space grows
    else:
        keep.append(ctypes.CDLL(line.strip()))
    print("ok", flush=True)
"""


def test_a_process_that_keeps_growing_is_read_less_often_and_a_late_copy_is_still_found(tmp_path):
    """A process whose address space changes at every scan has its maps read with doubling gaps (1, 2, 4,
    then ``max_gap`` scans) while they hold nothing new, not at every scan; a copy it maps later is found
    within ``max_gap`` scans."""
    lib = library_path()
    if lib is None:
        pytest.skip("obshub.instrument._usdt is not built")
    copy = tmp_path / lib.name
    shutil.copy(lib, copy)
    proc = subprocess.Popen([sys.executable, "-c", GROWER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def say(line: str) -> None:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "ok"

    try:
        scanner = LibraryScanner(
            {"usdt": ("_usdt*.so",)}, [file_identity(lib)], pids=lambda: {proc.pid}, max_gap=4, settle_key="usdt"
        )
        assert scanner.scan() == [] and scanner.maps_reads == 1
        reads = []
        for _ in range(11):  # scans 2-12, the process grew before each
            say("grow")
            assert scanner.scan() == []
            reads.append(scanner.maps_reads)
        # read at scans 1, 2, 4, 8, 12 (gaps 1, 2, 4, 4): 5 reads in 12 scans instead of 12
        assert reads == [2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5]
        say(str(copy))  # maps the copy right after a read: found at the latest max_gap scans later
        found, scans = [], 0
        while not found and scans < 4:
            found = scanner.scan()
            scans += 1
        assert [(k, m.pid, m.identity) for k, m in found] == [("usdt", proc.pid, file_identity(copy))]
        assert proc.pid in scanner._settled
    finally:
        proc.kill()
        proc.wait()


def test_scanner_of_every_process_lists_proc_only_after_a_task_was_created(tmp_path, monkeypatch):
    """Without a pid source the scanner looks at every process: it lists /proc when the last pid given out
    changed since its last listing (or on its slow turn), else it reuses that listing. A process started
    since the listing is found once the last pid moves. It looks at every process of the machine, so it
    judges only what this test owns (its process): another process that maps a copy of the library (a demo
    or another checkout's test beside this one) is reported too and is no part of the check."""
    import obshub.producer.discovery as discovery

    lib = library_path()
    if lib is None:
        pytest.skip("obshub.instrument._usdt is not built")
    copy = tmp_path / lib.name
    shutil.copy(lib, copy)
    listed, last = [], [1000]
    real = os.listdir
    monkeypatch.setattr(discovery.os, "listdir", lambda p: listed.append(p) or real(p))
    monkeypatch.setattr(discovery, "_last_pid", lambda fd: last[0])
    scanner = LibraryScanner({"usdt": ("_usdt*.so",)}, [file_identity(lib)], old_every=5)
    proc = None

    def mine(found) -> list[tuple]:  # what the scan reported of this test's process
        return [(k, m.pid, m.identity) for k, m in found if proc is not None and m.pid == proc.pid]

    try:
        scanner.scan()
        assert listed == ["/proc"]  # the first scan lists
        proc = subprocess.Popen(
            [sys.executable, "-c", LOADER, str(copy)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout.readline().strip() == "ok"
        assert mine(scanner.scan()) == [] and len(listed) == 1  # the last pid did not move: the old listing
        assert proc.pid not in scanner._started
        last[0] = 1001
        assert mine(scanner.scan()) == [] and len(listed) == 2  # it moved: listed, the new process noted
        assert proc.pid in scanner._started
        found = scanner.scan()  # looked at from the scan after the one that first saw it
        assert mine(found) == [("usdt", proc.pid, file_identity(copy))]
        assert len(listed) == 2
        scanner.scan()
        assert len(listed) == 2
        scanner.scan()  # scan 6, the slow turn (old_every 5): lists whatever the last pid says
        assert len(listed) == 3
    finally:
        scanner.close()
        if proc is not None:
            proc.kill()
            proc.wait()
