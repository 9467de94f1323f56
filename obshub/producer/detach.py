"""Free a bcc ``BPF`` object without waiting for the kernel's detach of each probe.

bcc's ``BPF.cleanup()`` closes the perf event of every probe one after the other, and each close waits for
the kernel: a uprobe or a tracepoint perf event runs its unregistration under the kernel's ``event_mutex``
with RCU grace periods (``tracepoint_synchronize_unregister``, the uprobe's own), ~0.1 s each (kernel
6.18: 21 uprobes 2.66 s, 16 tracepoints 1.46 s, no training running; closed from threads at once, a
quarter less: 2.73 vs 3.79 s, measured by stopfast19). An agent stopped by the demo spent 5.7-5.9 s in it
against its 5 s grace, was SIGKILLed and lost its last line and its component record.

:func:`release` hands the slow part to a child process: the child (forked, so it holds its own references
to every probe's perf event, program and map) waits until this process has closed its copies of the
perf event fds, which then costs nothing (the child's references keep the events), and closes its own;
the last close of each event is the kernel's detach, done there, one by one, while this process goes
on. Nothing is left attached: the child closes every probe and exits (``obshub-detach`` in ps, ~4 s for
the demo's probe set); if it is killed meanwhile, its exit closes what is left (the kernel detaches
there too). Probes that bcc made through tracefs (``uprobe_events`` / ``kprobe_events``: kernels
without the perf ``uprobe``/``kprobe`` PMU) need bcc's own removal after the close: then
:func:`release` runs ``BPF.cleanup()`` itself (the old, slow way)."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")


def attach_fds(b) -> tuple[list[int], list[bytes]]:
    """``(fds, tracefs names)``: the fd of every attached probe of bcc BPF object ``b`` (perf events of
    kprobes, uprobes, tracepoints and perf counters; links of raw tracepoints, kfuncs and LSM programs),
    and the names of its kprobe/uprobe events (those bcc may have made in tracefs)."""
    fds: list[int] = []
    for per_fn in b.kprobe_fds.values():
        fds.extend(per_fn.values())
    fds.extend(b.uprobe_fds.values())
    fds.extend(b.tracepoint_fds.values())
    for attr in ("raw_tracepoint_fds", "kfunc_entry_fds", "kfunc_exit_fds", "lsm_fds"):
        fds.extend(getattr(b, attr, {}).values())
    for per_cpu in b.open_perf_events.values():
        fds.extend(per_cpu.values())
    names = [*b.kprobe_fds, *b.uprobe_fds]
    return fds, names


def _in_tracefs(names: list[bytes]) -> bool:
    """Whether any of the kprobe/uprobe event ``names`` is listed in tracefs (made there, not by the PMU)."""
    if not names:
        return False
    listed = b""
    for f in ("uprobe_events", "kprobe_events"):
        for root in (TRACEFS, Path("/sys/kernel/debug/tracing")):
            with contextlib.suppress(OSError):
                listed += (root / f).read_bytes()
                break
    return any(b"/" + n + b" " in listed for n in names)  # "p:uprobes/<name> <path>:<offset>"


def release(b) -> int | None:
    """Detach every probe of bcc BPF object ``b`` and free it (as ``b.cleanup()``), the kernel's part of
    the detach in a child process (module docstring). Returns the child's pid (reaped by a daemon thread
    of this process; :func:`wait` waits for it), or None when everything was done here (nothing attached,
    probes made in tracefs, or a failed fork: then ``b.cleanup()``, which takes ~0.1 s per probe). Raises
    what ``b.cleanup()`` raises."""
    fds, names = attach_fds(b)
    if not fds or _in_tracefs(names):
        b.cleanup()
        return None
    try:
        r, w = os.pipe()
        pid = os.fork()
    except OSError:
        b.cleanup()
        return None
    if pid == 0:  # the child: only fd calls until _exit (this process may have had other threads)
        try:
            os.close(w)
            keep = {*fds, r}
            for name in os.listdir("/proc/self/fd"):
                fd = int(name)
                if fd not in keep:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            with contextlib.suppress(OSError):
                os.read(r, 1)  # EOF: the parent closed its copies (or ended)
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        finally:
            os._exit(0)
    os.close(r)
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    os.close(w)
    # bcc's books: nothing attached any more (its cleanup then only frees the module, maps and programs;
    # the child's references keep those until its closes are done)
    for attr in (
        "kprobe_fds",
        "uprobe_fds",
        "tracepoint_fds",
        "raw_tracepoint_fds",
        "kfunc_entry_fds",
        "kfunc_exit_fds",
        "lsm_fds",
        "open_perf_events",
    ):
        getattr(b, attr, {}).clear()
    try:
        b.cleanup()
    finally:
        _REAPERS[pid] = threading.Thread(target=_reap, args=(pid,), name=f"obshub-detach-{pid}", daemon=True)
        _REAPERS[pid].start()
    return pid


_REAPERS: dict[int, threading.Thread] = {}


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def wait(pid: int | None, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for the detach child ``pid`` of :func:`release` to end (every probe
    detached); True when it has (or ``pid`` is None)."""
    if pid is None:
        return True
    t = _REAPERS.get(pid)
    if t is None:
        return True
    t.join(timeout_s)
    if t.is_alive():
        return False
    _REAPERS.pop(pid, None)
    return True
