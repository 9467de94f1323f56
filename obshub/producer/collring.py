"""The agent's reader of the ranks' collective rings (issue #34: no trap per collective on the common path).

The C++ collective kernel (obshub/instrument/_c10d_kernel.cpp) writes each collective's two records
(COLLECTIVE_BEGIN at its begin time on the issuing thread, COLLECTIVE_END at its end on the completing
thread, with the duration: exactly the ``struct obs_event`` records obshub/bpf/pytorch.c ``obs_coll_one``
makes from the ``coll`` probe) into a per-process ring in shared memory, a memfd named ``obshub-coll``,
while a reader drains it. The ring has the layout of a BPF ring buffer, so :class:`producer._ring.Ring`
drains it with the same code and encoding as the agent's BPF ring (``events=False``: no epoll).

This module finds those rings (``/proc/<pid>/fd/N`` -> ``/memfd:obshub-coll``) of the processes the agent
watches or that registered, tells each ring's kernel what to stamp on its records (the probe id, the two
kinds, the pid as the agent sees it) and, at each drain, that a reader is live (``reader_ns``,
CLOCK_MONOTONIC ns: a ring not drained for 2 s makes the kernel go back to the USDT ``coll`` trap, so an
agent that stops loses nothing). One ring per memfd inode: a forked child that inherited its parent's fd
is not a second reader of it, and an exclusive ``flock`` on the agent's own open of the memfd (held while it
reads, released when it closes or dies) leaves a ring another agent already reads to that agent.

Header (page 0 of the memfd, after the consumer position at offset 0), little-endian, at offset 64:
u64 magic ``BOSCOLL1``, u32 version (1), u32 pid (the maker's own, in its pid namespace), u64 data_size
(bytes), u64 drops (collectives the kernel sent by trap because the ring was full), u64 written (records),
then the reader's: u32 probe, u16 kind_begin, u16 kind_end, u32 host_pid, u32 pad, u64 reader_ns.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger(__name__)

MEMFD_NAME = "/memfd:obshub-coll"  # what readlink(/proc/<pid>/fd/N) gives for the ring (+ " (deleted)")
MAGIC = 0x314C4C4F43534F42  # b"BOSCOLL1" read little-endian
HDR = 64  # offset of the header in page 0
_HEAD = struct.Struct("<QIIQQQ")  # magic, version, pid, data_size, drops, written
_AGENT = struct.Struct("<IHHII")  # probe, kind_begin, kind_end, host_pid, pad (at HDR + 40)
_READER_NS = struct.Struct("<Q")  # at HDR + 56
_AGENT_OFF = HDR + _HEAD.size  # 104
_PID, _PID_OFF = struct.Struct("<I"), 64  # struct obs_event (producer/record.py): pid at 64, kind at 72
_KIND, _KIND_OFF = struct.Struct("<H"), 72
_READER_OFF = _AGENT_OFF + _AGENT.size  # 120


@dataclass
class _Open:
    pid: int  # the process the agent found it in (host pid namespace)
    ino: tuple[int, int]  # (st_dev, st_ino) of the memfd
    hdr: mmap.mmap  # page 0
    ring: object  # producer._ring.Ring over the memfd
    fd: int  # the agent's own open of the memfd, holding the reader's lock (flock) until closed


def find_ring_fds(pid: int) -> list[int]:
    """The fd numbers of ``pid`` that are a collective ring (``/memfd:obshub-coll``); [] when the process is
    gone or its fds cannot be read."""
    out = []
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for name in names:
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}").startswith(MEMFD_NAME):
                out.append(int(name))
        except (OSError, ValueError):
            continue
    return out


class CollRings:
    """The collective rings of the watched processes, drained at each turn of the agent's poll.

    ``CollRings(probe_id, kind_begin, kind_end)``; :meth:`refresh` (pids) opens the rings of new processes
    (each process's fds are scanned at most every ``scan_s`` seconds until its ring is found) and closes
    those of processes gone; :meth:`drain` (table, max_records) returns what ``Ring.drain`` returns for each
    ring (bytes of FMT_PY records, tuples of packed runs) and marks every ring read now. Not thread-safe."""

    def __init__(self, probe_id: int, kind_begin: int, kind_end: int, scan_s: float = 1.0):
        self.probe_id, self.kind_begin, self.kind_end = int(probe_id), int(kind_begin), int(kind_end)
        self.scan_s = scan_s
        self._open: dict[tuple[int, int], _Open] = {}
        self._pids: dict[int, set[tuple[int, int]]] = {}  # pid -> inodes of rings opened through it
        self._next_scan: dict[int, float] = {}  # pid with no ring yet -> when to look again
        self.errors = 0  # rings that could not be opened (logged once each)
        self.rejected = 0  # records of other kinds than the two collective ones (dropped)
        self.read = 0  # records taken from every ring since start (obshub_agent_coll_ring_records_total)
        self._closed_drops = 0  # the drops of rings closed since (their counter stays in the total)
        self._table_in: bytes = b""
        self._table: bytes = b""

    def __len__(self) -> int:
        return len(self._open)

    def refresh(self, pids: Iterable[int]) -> None:
        """Open the rings of ``pids`` not opened yet (scan due), close those whose process is gone."""
        want = set(pids)
        now = time.monotonic()
        for pid in want:
            if pid in self._pids or self._next_scan.get(pid, 0.0) > now:
                continue
            self._next_scan[pid] = now + self.scan_s
            for fd in find_ring_fds(pid):
                self._open_fd(pid, fd)
        for pid in list(self._pids):
            if pid not in want and not os.path.exists(f"/proc/{pid}"):
                for ino in self._pids.pop(pid):
                    self._close(ino)
        for pid in list(self._next_scan):
            if pid not in want:
                del self._next_scan[pid]

    def _open_fd(self, pid: int, fd_num: int) -> None:
        from obshub.producer import _ring

        path = f"/proc/{pid}/fd/{fd_num}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            self.errors += 1
            log.warning("collective ring %s: cannot open it (%s); its collectives come by the coll trap", path, exc)
            return
        keep = False
        try:
            st = os.fstat(fd)
            ino = (st.st_dev, st.st_ino)
            if ino in self._open:  # the same memfd through another process (a forked child)
                return
            try:  # one reader per ring: a second agent watching the process leaves it to the first
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("collective ring %s is read by another agent: not read here", path)
                return
            page = mmap.PAGESIZE
            hdr = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            magic, version, _own_pid, size, _drops, _written = _HEAD.unpack_from(hdr, HDR)
            if magic != MAGIC or version != 1 or size <= 0 or size & (size - 1) or size % page:
                hdr.close()
                self.errors += 1
                log.warning("collective ring %s: not a version-1 ring (magic %#x, version %d)", path, magic, version)
                return
            ring = _ring.Ring(fd, size, False)
            _AGENT.pack_into(hdr, _AGENT_OFF, self.probe_id, self.kind_begin, self.kind_end, pid, 0)
            _READER_NS.pack_into(hdr, _READER_OFF, time.monotonic_ns())  # last: the kernel starts writing
            keep = True
        except (OSError, ValueError) as exc:
            self.errors += 1
            log.warning("collective ring %s: %s; its collectives come by the coll trap", path, exc)
            return
        finally:
            if not keep:
                os.close(fd)
        self._open[ino] = _Open(pid, ino, hdr, ring, fd)
        self._pids.setdefault(pid, set()).add(ino)
        log.info("reading the collective ring of pid %d (%d KiB)", pid, size // 1024)

    def _close(self, ino: tuple[int, int]) -> None:
        o = self._open.pop(ino, None)
        if o is None:
            return
        with contextlib.suppress(Exception):
            self._closed_drops += _HEAD.unpack_from(o.hdr, HDR)[4]
        with contextlib.suppress(Exception):
            _READER_NS.pack_into(o.hdr, _READER_OFF, 0)  # the kernel takes the trap path at once
        o.ring.close()  # type: ignore[attr-defined]
        o.hdr.close()
        os.close(o.fd)  # releases the reader's lock

    def drain(self, table: bytes, max_records: int) -> list:
        """Every ring's records (``Ring.drain`` items, ring after ring), each ring then marked read now
        (``reader_ns``). The ring is written by the watched process itself, so nothing in it is taken on
        trust beyond what the ``coll`` probe's arguments were: only COLLECTIVE_BEGIN/END records are kept
        (others counted in :attr:`rejected`, dropped), and each carries the pid of the process the ring was
        found in, whatever the record says. ``table``: the caller's format codes (``producer.reader``); any
        other kind is handed back raw, then dropped here."""
        out: list = []
        if not self._open:
            return out
        now = time.monotonic_ns()
        keep = (self.kind_begin, self.kind_end)
        fmt = bytes(table[k] if k in keep else 0 for k in range(256)) if table != self._table_in else self._table
        self._table_in, self._table = table, fmt
        for o in self._open.values():
            before = o.ring.consumed  # type: ignore[attr-defined]
            items = o.ring.drain(fmt, max_records, o.pid)  # type: ignore[attr-defined]
            self.read += o.ring.consumed - before  # type: ignore[attr-defined]
            for it in items:
                if type(it) is bytes:  # handed back raw: the Python decoder's, or another kind
                    kind = _KIND.unpack_from(it, _KIND_OFF)[0]
                    if kind not in keep:
                        self.rejected += 1
                        continue
                    it = it[:_PID_OFF] + _PID.pack(o.pid) + it[_PID_OFF + 4 :]
                out.append(it)
            _READER_NS.pack_into(o.hdr, _READER_OFF, now)
        return out

    def stats(self) -> dict[int, dict[str, int]]:
        """Per pid: ``drops`` (collectives the kernel sent by trap, the ring full) and ``written`` (records)."""
        out: dict[int, dict[str, int]] = {}
        for o in self._open.values():
            _m, _v, _p, _s, drops, written = _HEAD.unpack_from(o.hdr, HDR)
            d = out.setdefault(o.pid, {"drops": 0, "written": 0})
            d["drops"] += drops
            d["written"] += written
        return out

    def drops_total(self) -> int:
        """Collectives the kernels of the rings read could not write into them (the ring was full: each went
        by the ``coll`` trap instead; counted since each ring was made), rings closed since included: the
        ``obshub_agent_coll_ring_drops_total`` counter."""
        total = self._closed_drops
        for o in self._open.values():
            total += _HEAD.unpack_from(o.hdr, HDR)[4]
        return total

    def close(self) -> None:
        """Mark every ring unread (its kernel goes back to the trap) and unmap it. Idempotent."""
        for ino in list(self._open):
            self._close(ino)
        self._pids.clear()
        self._next_scan.clear()
