"""Liveness of the registered training processes, read from /proc and the cgroup filesystem.

A rank that is frozen, stopped or gone produces no event, so the stream worker can only infer it from
silence. The agent runs outside the rank's cgroup and still runs when the rank does not: every
``interval_ns`` (0.25 s) :class:`RankWatch` reads, for each registered pid,

- its exit: a pidfd (``pidfd_open``) per pid, watched by a thread that notes the CLOCK_MONOTONIC time it
  became readable (the process ended), so an *exited* event carries when it ended, not when it was read;
  without pidfds (Linux < 5.3), a pid missing from /proc or in state ``Z``/``X``; and how it ended (the
  signal or exit code), recorded by the kernel at the exit when the agent's scheduler probe runs
  (:attr:`RankWatch.kernel_status`), else read from the zombie's ``/proc/<pid>/stat`` (a race with the
  parent's reap);
- ``/proc/<pid>/stat`` (its state letter): ``T`` or ``t`` -> *stopped* (SIGSTOP, a ptrace stop);
- *frozen*: ``frozen 1`` in the ``cgroup.events`` of its cgroup v2, or ``FROZEN`` in the ``freezer.state``
  of its v1 freezer cgroup, when those are mounted where the agent runs; else (an agent started with
  ``ip netns exec`` sees no cgroup mount) a task asleep (``S``/``D``) in the freezer's trap, read from
  ``/proc/<pid>/wchan``: ``do_freezer_trap`` (cgroup v2; ``get_signal`` where it is inlined, the only
  interruptible sleep there: a job-control stop is ``T``) or ``__refrigerator`` (v1);
- otherwise *running*,

and returns one ``RANK_STATE`` event (value = state code, payload ``state``) per pid whose state changed
since the previous read; a pid first seen running sends nothing. Cost: one or two small file reads per
registered pid per read (its main thread's ``/proc/<pid>/task/<pid>/stat``, which does not sum the times
of every thread as ``/proc/<pid>/stat`` does) and one per cgroup file however many of the pids share it,
each a ``pread`` of a file kept open (see :meth:`RankWatch._pread`). Docs: docs/AGENT.md ("Rank liveness").
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable

from obshub.core.schema import Event, Kind

RUNNING, FROZEN, STOPPED, EXITED = 0, 1, 2, 3
#: kernel functions a frozen task sleeps in (``/proc/<pid>/wchan``)
FREEZER_WCHAN = ("do_freezer_trap", "get_signal", "__refrigerator")
STATE_NAMES = {RUNNING: "running", FROZEN: "frozen", STOPPED: "stopped", EXITED: "exited"}


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(65536).decode(errors="replace")
    except OSError:
        return None


def cgroup_mounts(mountinfo: str | None = None) -> tuple[str | None, str | None]:
    """The mount points of the cgroup v2 hierarchy and of the v1 freezer hierarchy (None when not
    mounted), from ``/proc/self/mountinfo`` (or its text ``mountinfo``)."""
    text = _read("/proc/self/mountinfo") if mountinfo is None else mountinfo
    v2 = v1 = None
    for line in (text or "").splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 1:
            continue
        mnt, fstype = fields[4], rest[0]
        if fstype == "cgroup2" and v2 is None:
            v2 = mnt
        elif fstype == "cgroup" and v1 is None and "freezer" in (rest[2] if len(rest) > 2 else "").split(","):
            v1 = mnt
    return v2, v1


def wait_status(stat: str | None) -> int | None:
    """The exit status of a zombie from the text of its ``/proc/<pid>/stat`` (field 52, ``exit_code``:
    the ``waitpid(2)`` form, a signal in its low 7 bits, an exit code in bits 8-15), or None: no text,
    not a zombie (state ``Z``), or a kernel without the field."""
    fields = (stat or "").rpartition(")")[2].split()
    if len(fields) < 50 or fields[0] != "Z":
        return None
    try:
        return int(fields[49])
    except ValueError:
        return None


def exit_payload(status: int | None) -> dict:
    """The payload keys an *exited* RANK_STATE adds for wait status ``status``: ``{"signal": n}`` when a
    signal ended the process, ``{"exit_code": n}`` when it exited, ``{}`` when unknown."""
    if status is None:
        return {}
    sig = status & 0x7F
    return {"signal": sig} if sig else {"exit_code": (status >> 8) & 0xFF}


class ExitWatch:
    """Notes when watched processes end: one pidfd per pid, polled by a daemon thread (woken through a
    pipe when a pid is added). :meth:`exited` returns the CLOCK_MONOTONIC ns of a pid's end, or None.
    ``available`` is False where pidfds are not supported (then nothing is watched)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._fds: dict[int, int] = {}  # fd -> pid
        self._pids: dict[int, int] = {}  # pid -> fd
        self._ended: dict[int, int] = {}  # pid -> monotonic ns it ended
        self._status: dict[int, int] = {}  # pid -> its wait status (waitpid(2) form), when it could be read
        self.available = hasattr(os, "pidfd_open")
        self._thread: threading.Thread | None = None
        self._poller = select.poll()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._poller.register(self._wake_r, select.POLLIN)

    def add(self, pid: int) -> None:
        """Watch ``pid`` (a no-op when it is watched or ended already)."""
        if not self.available:
            return
        with self._lock:
            if pid in self._pids or pid in self._ended:
                return
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                self._ended[pid] = time.monotonic_ns()
                return
            except OSError:
                self.available = False
                return
            self._pids[pid], self._fds[fd] = fd, pid
            self._poller.register(fd, select.POLLIN)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="obshub-exit-watch", daemon=True)
            self._thread.start()
        os.write(self._wake_w, b"x")

    def exited(self, pid: int) -> int | None:
        """CLOCK_MONOTONIC ns when ``pid`` ended, or None (running, or not watched)."""
        with self._lock:
            return self._ended.get(pid)

    def status(self, pid: int) -> int | None:
        """The wait status (the ``waitpid(2)`` form) ``pid`` ended with, or None: not ended, or reaped by
        its parent before it could be read (see :func:`wait_status`)."""
        with self._lock:
            return self._status.get(pid)

    def forget(self, pid: int) -> None:
        """Stop watching ``pid`` and drop what is known of it."""
        with self._lock:
            self._ended.pop(pid, None)
            self._status.pop(pid, None)
            fd = self._pids.pop(pid, None)
            if fd is not None:
                self._fds.pop(fd, None)
                self._poller.unregister(fd)
                os.close(fd)

    def _run(self) -> None:
        while True:
            for fd, _ev in self._poller.poll():
                now = time.monotonic_ns()
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                    continue
                with self._lock:
                    pid = self._fds.pop(fd, None)
                    if pid is None:
                        continue
                    self._pids.pop(pid, None)
                    self._ended[pid] = now
                    # a pidfd is readable once the process is a zombie: its exit status is still in its
                    # stat until the parent reaps it (torchrun polls its workers every 0.1-5 s)
                    status = wait_status(_read(f"/proc/{pid}/stat"))
                    if status is not None:
                        self._status[pid] = status
                    self._poller.unregister(fd)
                    os.close(fd)


class RankWatch:
    """Reads the state of registered pids at most every ``interval_ns``; :meth:`poll` returns Events.
    ``proc`` is the procfs root (tests may point it elsewhere); ``mounts`` the cgroup v2 and v1 freezer
    mount points (None: looked up in ``/proc/self/mountinfo``; ``(None, None)``: none, wchan only).

    ``kernel_status``: how a process ended as the kernel recorded it at its exit, ``pid -> (ts_ns, status)``
    or None (the agent sets the BPF source's :meth:`~obshub.producer.loader.BpfEventSource.exit_status`):
    ``ts_ns`` CLOCK_MONOTONIC ns of the exit, ``status`` the ``waitpid(2)`` form. It wins over the zombie's
    ``/proc/<pid>/stat``, which the parent's reap can take away first; a record older than the pid's first
    read (a former process with the same pid number) is ignored."""

    def __init__(
        self,
        interval_ns: int = 250_000_000,
        proc: str = "/proc",
        mounts: tuple[str | None, str | None] | None = None,
    ):
        self.interval_ns = interval_ns
        self.proc = proc
        self.v2, self.v1 = cgroup_mounts() if mounts is None else mounts
        self._last_ns = 0
        self._state: dict[int, int] = {}  # pid -> last state read
        self._cg: dict[int, tuple[str | None, str | None]] = {}  # pid -> (v2 events file, v1 state file)
        self._fds: dict[str, int] = {}  # path -> fd kept open, re-read with pread (see _pread)
        self._paths: dict[int, list[str]] = {}  # pid -> the paths of _fds read for it
        self._round: dict[str, str | None] | None = None  # cgroup file -> its text, within one poll
        self.exits = ExitWatch()
        self._zombie: dict[int, int] = {}  # pid -> wait status read from its stat as a zombie (no pidfd)
        self._since: dict[int, int] = {}  # pid -> monotonic ns of its first read (older kernel records: not it)
        self.kernel_status: Callable[[int], tuple[int, int] | None] | None = None

    def _pread(self, pid: int, path: str) -> str | None:
        """The text of ``path`` now (None when it does not exist or cannot be read). The file is opened
        once and re-read with ``pread`` at offset 0 (procfs, cgroupfs and sysfs generate the text anew on
        every read from offset 0): one system call per read instead of open, read and close. An fd on
        ``/proc/<pid>/stat`` stays bound to that process: it fails once the process is gone (never reads a
        later process with the same pid); an fd whose read fails is closed, and the next read opens the
        path again."""
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            self._fds[path] = fd
            self._paths.setdefault(pid, []).append(path)
        try:
            return os.pread(fd, 65536, 0).decode(errors="replace")
        except OSError:
            os.close(self._fds.pop(path))
            return None

    def _shared(self, pid: int, path: str) -> str | None:
        """:meth:`_pread` of a cgroup file, read once per :meth:`poll` however many of the pids read live
        in that cgroup (the ranks of a job usually share one)."""
        cache = self._round
        if cache is None:  # a state() outside poll(): read now
            return self._pread(pid, path)
        if path not in cache:
            cache[path] = self._pread(pid, path)
        return cache[path]

    def _close(self, pid: int) -> None:
        for path in self._paths.pop(pid, ()):
            fd = self._fds.pop(path, None)
            if fd is not None:
                os.close(fd)

    def close(self) -> None:
        """Close the files kept open (the watch can still be used: they are opened again)."""
        for pid in list(self._paths):
            self._close(pid)

    def _cgroup_files(self, pid: int) -> tuple[str | None, str | None]:
        files = self._cg.get(pid)
        if files is None:
            ev = fz = None
            for line in (_read(f"{self.proc}/{pid}/cgroup") or "").splitlines():
                hid, _, rest = line.partition(":")
                ctrls, _, path = rest.partition(":")
                if hid == "0" and ctrls == "" and self.v2:
                    ev = os.path.join(self.v2, path.lstrip("/"), "cgroup.events")
                elif "freezer" in ctrls.split(",") and self.v1:
                    fz = os.path.join(self.v1, path.lstrip("/"), "freezer.state")
            files = self._cg[pid] = (ev, fz)
        return files

    def state(self, pid: int) -> int:
        """The state code of ``pid`` now (RUNNING, FROZEN, STOPPED or EXITED)."""
        if self.exits.exited(pid) is not None:
            return EXITED
        # the main thread's own stat: the same state letter as /proc/<pid>/stat (which reports the main
        # thread's state) without summing the times of every thread of the process
        stat = self._pread(pid, f"{self.proc}/{pid}/task/{pid}/stat")
        if not stat:
            return EXITED
        letter = (stat.rpartition(")")[2].split() or ["?"])[0]
        if letter in ("Z", "X"):
            status = wait_status(stat)
            if status is not None:
                self._zombie[pid] = status
            return EXITED
        if letter in ("T", "t"):
            return STOPPED
        ev, fz = self._cgroup_files(pid)
        if ev is not None or fz is not None:
            ev_text = self._shared(pid, ev) if ev is not None else None
            if ev_text is not None and any(ln.split() == ["frozen", "1"] for ln in ev_text.splitlines()):
                return FROZEN
            fz_text = self._shared(pid, fz) if fz is not None else None
            if fz_text is not None and fz_text.strip() == "FROZEN":
                return FROZEN
            if (ev is None or ev_text is not None) and (fz is None or fz_text is not None):
                return RUNNING
        if letter in ("S", "D") and (_read(f"{self.proc}/{pid}/wchan") or "").strip() in FREEZER_WCHAN:
            return FROZEN
        return RUNNING

    def _kernel(self, pid: int) -> tuple[int, int] | None:
        """The kernel's record of how ``pid`` ended (see ``kernel_status``), or None: none asked, none
        recorded, or one older than this pid's first read."""
        if self.kernel_status is None:
            return None
        rec = self.kernel_status(pid)
        if rec is None or rec[0] < self._since.get(pid, 0):
            return None
        return rec

    def poll(self, pids, now_ns: int | None = None) -> list[Event]:
        """Read the state of every pid in ``pids`` (an iterable of ints) when ``interval_ns`` has passed
        since the previous read; returns a ``RANK_STATE`` Event (``ts_ns`` CLOCK_MONOTONIC ns, ``pid``,
        ``value`` = state code, payload ``{"state": name}``, for an exit also ``signal`` (the signal that
        ended it) or ``exit_code`` when its status is known: the kernel's record, else the zombie's stat,
        :func:`exit_payload`) per pid whose state changed ([] otherwise).
        Pids no longer listed are forgotten."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        if self._last_ns and now - self._last_ns < self.interval_ns:
            return []
        self._last_ns = now
        out = []
        live = set(pids)
        self._round = {}
        for pid in sorted(live):
            if pid not in self._state:
                self._since.setdefault(pid, time.monotonic_ns())
                self.exits.add(pid)
            s = self.state(pid)
            prev = self._state.get(pid, RUNNING)
            self._state[pid] = s
            if s != prev:
                ts = now
                payload: dict = {"state": STATE_NAMES[s]}
                if s == EXITED:
                    kernel = self._kernel(pid)
                    ts = self.exits.exited(pid) or (kernel[0] if kernel else now)
                    st = kernel[1] if kernel else self.exits.status(pid)
                    payload.update(exit_payload(st if st is not None else self._zombie.get(pid)))
                out.append(Event(Kind.RANK_STATE, ts, pid=pid, tid=pid, value=s, payload=payload))
        self._round = None
        for pid in set(self._state) - live:
            del self._state[pid]
            self._zombie.pop(pid, None)
            self._since.pop(pid, None)
            self._cg.pop(pid, None)
            self._close(pid)
            self.exits.forget(pid)
        return out
