"""Find the files the probes attach to as each traced process sees them, in whatever mount namespace (a
container) it runs, and name them by the real file the kernel's uprobes attach to.

A path in ``/proc/<pid>/maps`` is a path inside that process's mount namespace: the agent opens it as
``/proc/<pid>/root<path>`` (:func:`agent_path`) when the namespace is not its own. Two paths are the same
file for uprobes when their mappings show the same device and inode (the ``dev``/``inode`` columns of
``/proc/<pid>/maps``, which name the real file also under overlayfs), so :class:`LibraryScanner`
identifies files by those columns (:func:`file_identity` reads them for a file the agent itself opens)
and reports each one once.

The scanner looks at young processes (started less than ``young_s`` ago) at every scan from the second
scan that sees them on (a short-lived command, most of the processes a busy host starts, is gone by then
and never costs a maps read; the processes running at the first scan are looked at in it) and at every
process every ``old_every``-th scan, until one maps the file it looks for, and reads the maps of those
whose address space changed size since their maps were last read (the size field of
``/proc/<pid>/statm``, ``vsize`` in pages: a ``dlopen`` or ``mmap`` grows it; a process that maps a file and unmaps as much between two scans is
missed until its size changes again). A process whose maps were read and held nothing new is read again
only after a gap that doubles with each such read, up to ``max_gap`` scans (gaps of 1, 2, 4, then 8
scans while its size keeps changing; a read that finds a new file starts over): a process that keeps growing its address space
(a JVM's heap, a compiler, a Python process importing) costs one maps read per 8 scans instead of one
per scan, and a file it maps late is found within ``max_gap`` scans instead of one; the size of a process
inside such a gap is not read either. Costs per scan: one read of ``/proc/loadavg`` (its last field, the last pid given out, tells
whether any task was created since the last listing) and, only then or on the slow turn, one
``listdir(/proc)``; one ``/proc/<pid>/stat``
read per process not seen before (its start time), one ``pread`` of the ``statm`` kept open of each young
process outside its gap (~1 µs; ``stat`` sums the times of every thread, ``statm`` does not), on the
slow turn a ``statm`` read per process, and one maps read per process whose size changed (~0.4-0.7 ms for a Python process with torch loaded, the kernel
formats ~50 KB; a JVM's maps several times that); the text is searched for the patterns' literal parts
first, so only lines of processes that map a candidate are parsed.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

#: (device as "major:minor" in hex, inode): a file as /proc/<pid>/maps names it
Identity = tuple[str, int]


def mount_ns(pid: int | str = "self") -> str:
    """The mount namespace of ``pid`` (``"mnt:[<inode>]"``); "" when it cannot be read (gone, no
    permission)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


def agent_path(pid: int, path: str, own_ns: str | None = None) -> Path:
    """The path under which the agent opens ``path`` as process ``pid`` sees it: ``path`` itself in the
    agent's own mount namespace, else ``/proc/<pid>/root<path>`` (the process's root, valid while it
    lives). ``own_ns``: the agent's :func:`mount_ns` (read when None)."""
    own = mount_ns() if own_ns is None else own_ns
    theirs = mount_ns(pid)
    if theirs and theirs != own:
        return Path(f"/proc/{pid}/root{path}")
    return Path(path)


@dataclass(frozen=True)
class Mapped:
    """One file mapped by process ``pid``: ``path`` in its mount namespace, ``host_path`` where the agent
    opens it (:func:`agent_path`), ``identity`` the real file (:data:`Identity`)."""

    pid: int
    path: str
    host_path: Path
    identity: Identity


def file_identity(path: str | os.PathLike) -> Identity | None:
    """The :data:`Identity` of a file the agent can open: it maps one page of it privately and reads the
    mapping's ``dev``/``inode`` from ``/proc/self/maps`` (what another process's maps show for the same
    file, overlayfs included). None when the file cannot be opened or is empty."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if not size:
                return None
            with mmap.mmap(fh.fileno(), min(size, mmap.PAGESIZE), access=mmap.ACCESS_COPY) as m:
                buf = ctypes.c_char.from_buffer(m)
                want = f"{ctypes.addressof(buf):x}-"
                del buf  # the mapping closes only without exported buffers
                with open("/proc/self/maps") as maps:
                    for line in maps:
                        if line.startswith(want):
                            parts = line.split(None, 5)
                            return (parts[3], int(parts[4]))
    except (OSError, ValueError):
        return None
    return None


def _stat_fields(pid: int) -> tuple[int, int] | None:
    """(start time in clock ticks after boot, address-space size in bytes) of ``pid``: fields 22 and 23
    (``starttime``, ``vsize``) of /proc/<pid>/stat; None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        return int(fields[19]), int(fields[20])
    except (OSError, ValueError, IndexError):
        return None


def _size_pages(fd: int) -> int | None:
    """The address-space size in pages (the first field of ``/proc/<pid>/statm``, ``vsize`` / page size)
    read from ``fd``, an open ``statm`` file, at offset 0; None when the process is gone. Cheaper than
    ``/proc/<pid>/stat``, whose text sums the times of every thread of the process."""
    try:
        return int(os.pread(fd, 64, 0).split(None, 1)[0])
    except (OSError, ValueError, IndexError):
        return None


def _start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks after boot (field 22 of /proc/<pid>/stat)."""
    f = _stat_fields(pid)
    return None if f is None else f[0]


def _uptime_ticks() -> float:
    """Clock ticks since boot, the clock of a process's ``starttime`` (CLOCK_BOOTTIME, what
    ``/proc/uptime`` reads, without opening it)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) * _CLK_TCK


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _last_pid(fd: int) -> int | None:
    """The pid the kernel gave out last, to a process or a thread (the last field of ``/proc/loadavg``,
    read from ``fd``, that file kept open, at offset 0): while it does not change, no task was created,
    so a list of the processes can only have shrunk. None when it cannot be read."""
    try:
        return int(os.pread(fd, 128, 0).rsplit(None, 1)[-1])
    except (OSError, ValueError, IndexError):
        return None


def _glob(pattern: str) -> str:
    """A base-name glob (``*`` and literal text only) as a regular expression: ``*`` stops at ``/`` and
    white space."""
    return r"[^/\s]*".join(re.escape(part) for part in pattern.split("*"))


class LibraryScanner:
    """Finds files mapped by processes that match ``patterns`` (key -> basename globs, e.g. ``{"usdt":
    ("_usdt.cpython-*.so",)}``) and were not reported before. ``known``: identities already attached (the
    agent's own copies). ``pids``: a callable giving the processes to look at (default: every process);
    ``young_s``/``old_every``/``max_gap``: the module's rescan policy. A process is no longer read once it
    maps a file of ``settle_key``.

    :meth:`scan` returns ``[(key, Mapped)]`` for each newly seen file (the first process seen with it).
    Never raises for processes that vanish or cannot be read."""

    def __init__(
        self,
        patterns: dict[str, tuple[str, ...]],
        known: Iterable[Identity] = (),
        *,
        pids=None,
        young_s: float = 120.0,
        old_every: int = 15,
        max_gap: int = 8,
        settle_key: str | None = None,
    ):
        self.patterns = patterns
        self._keys = {k: re.compile("|".join(f"(?:{_glob(p)})" for p in pats) + "$") for k, pats in patterns.items()}
        # a maps line whose file's base name matches a pattern: dev, inode, path, base name (one C-level
        # pass over the text; the other lines cost nothing in Python)
        bases = "|".join(f"(?:{_glob(p)})" for pats in patterns.values() for p in pats)
        self._literals = {max(p.split("*"), key=len).encode() for pats in patterns.values() for p in pats}
        self._line = re.compile(rb"^\S+ \S+ \S+ (\S+) (\d+) +(/[^\n]*/(%s))$" % bases.encode(), re.M)
        self.seen: set[Identity] = set(known)
        self.pids = pids
        self.young_ticks = young_s * os.sysconf("SC_CLK_TCK")
        self.old_every = max(1, old_every)
        self.settle_key = settle_key
        self.own_ns = mount_ns()
        self.scans = 0
        self._settled: set[int] = set()
        self._started: dict[int, int | None] = {}
        self._vsize: dict[int, int | None] = {}  # pid -> address-space pages when its maps were last read
        self._statm: dict[int, int] = {}  # pid -> open /proc/<pid>/statm of a young process (re-read with pread)
        self.max_gap = max(1, max_gap)
        self._idle: dict[int, int] = {}  # pid -> maps reads in a row that found nothing new
        self._read_at: dict[int, int] = {}  # pid -> the scan of its last maps read
        self.maps_reads = 0  # maps read since start (all processes)
        self._self = os.getpid()
        self._listed: list[int] | None = None  # the last listdir(/proc), sorted pids
        self._listed_at: int | None = None  # the last pid given out when it was made (_last_pid)
        self._loadavg: int | None = None  # /proc/loadavg kept open (-1: cannot be opened)

    def _candidates(self, full: bool) -> list[int]:
        """The processes to look at. Every process: ``listdir(/proc)`` (a few hundred µs on a VM, the
        kernel makes a dentry per pid) only when a task was created since the last listing (the last pid
        given out changed) or on a slow turn (``full``); otherwise the last listing, whose exited
        processes cost a failed read until the next listing drops them."""
        if self.pids is not None:
            return sorted(self.pids())
        if self._loadavg is None:
            try:
                self._loadavg = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._loadavg = -1
        last = _last_pid(self._loadavg) if self._loadavg >= 0 else None
        if not full and last is not None and last == self._listed_at and self._listed is not None:
            return self._listed
        try:
            self._listed = sorted(int(d) for d in os.listdir("/proc") if d.isdigit())
            self._listed_at = last
            return self._listed
        except OSError:
            self._listed = self._listed_at = None
            return []

    def scan(self) -> list[tuple[str, Mapped]]:
        """One pass (see the class)."""
        self.scans += 1
        slow_turn = self.scans % self.old_every == 1 or self.old_every == 1
        now = _uptime_ticks()
        live = self._candidates(slow_turn)
        alive = set(live)
        self._settled &= alive
        for gone in set(self._started) - alive:
            del self._started[gone]
            self._vsize.pop(gone, None)
            self._idle.pop(gone, None)
            self._read_at.pop(gone, None)
            self._close_statm(gone)
        for pid in self._settled & self._statm.keys():
            self._close_statm(pid)
        found: list[tuple[str, Mapped]] = []
        for pid in live:
            if pid == self._self or pid in self._settled:
                continue
            if pid not in self._started:
                self._started[pid] = _start_ticks(pid)
                if self.scans > 1:
                    continue  # born since the last scan: looked at from the next one on, if it still lives
            start = self._started[pid]
            young = start is not None and now - start < self.young_ticks
            if not young:
                if pid in self._statm:
                    self._close_statm(pid)
                if not slow_turn and self.scans > 1:
                    continue
            idle = self._idle.get(pid, 0)
            if idle and self.scans - self._read_at[pid] < min(self.max_gap, 1 << (idle - 1)):
                continue  # read lately and nothing new then: a size change waits for its turn
            # a mapping added since the last read (a dlopen, an mmap) grows the address space: a process
            # whose size is unchanged since its maps were last read is not read again, young or old
            size = self._size(pid, young)
            if size is not None and self._vsize.get(pid) == size:
                continue
            self._vsize[pid] = size
            self._read_at[pid] = self.scans
            self._idle[pid] = idle + 1
            self.maps_reads += 1
            try:
                with open(f"/proc/{pid}/maps", "rb") as fh:
                    text = fh.read()
            except OSError:
                continue
            if not any(lit in text for lit in self._literals):
                continue
            for m in self._line.finditer(text):
                path = m.group(3).decode("utf-8", "replace")
                key = next(k for k, rx in self._keys.items() if rx.match(m.group(4).decode("utf-8", "replace")))
                if key == self.settle_key:
                    self._settled.add(pid)
                ident = (m.group(1).decode(), int(m.group(2)))
                if ident not in self.seen:
                    self.seen.add(ident)
                    self._idle[pid] = 0
                    found.append((key, Mapped(pid, path, agent_path(pid, path, self.own_ns), ident)))
        return found

    def _size(self, pid: int, young: bool) -> int | None:
        """The address-space size of ``pid`` in pages (None when it cannot be read). A young process's
        ``statm`` is kept open and re-read with ``pread`` (one system call per scan instead of open, read
        and close); an fd on ``/proc/<pid>/statm`` stays bound to that process and fails once it is gone."""
        fd = self._statm.get(pid)
        if fd is None:
            try:
                fd = os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            if not young:
                try:
                    return _size_pages(fd)
                finally:
                    os.close(fd)
            self._statm[pid] = fd
        size = _size_pages(fd)
        if size is None:
            self._close_statm(pid)
        return size

    def _close_statm(self, pid: int) -> None:
        fd = self._statm.pop(pid, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Close the ``statm`` files kept open (the scanner can still be used: they are opened again)."""
        for pid in list(self._statm):
            self._close_statm(pid)
        if self._loadavg is not None and self._loadavg >= 0:
            os.close(self._loadavg)
        self._loadavg = None
