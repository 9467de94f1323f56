"""The C++ collective kernel (obshub/instrument/_c10d_kernel.cpp) against the Python one, in this process on a
gloo world of one: the same collectives counted, one op sequence shared with the phases, the thread's key
restored after each collective; the switch ``OBSHUB_COLLECTIVE_KERNEL``. The probe arguments it fires are
read by a real tracer in test_instrument_usdt.py and tests/producer/ (the default kernel is this one)."""

from __future__ import annotations

import socket

import pytest

from obshub.core.errors import ConfigError

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _native():
    try:
        from obshub.instrument import _c10d_kernel
    except ImportError:
        pytest.skip("the C++ collective kernel is not built (python -m obshub.instrument.native_build)")
    return _c10d_kernel


@pytest.fixture
def world(monkeypatch):
    import torch.distributed as dist

    from obshub.instrument import hooks

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    yield dist, hooks
    hooks.disable()
    hooks._st.__init__()
    hooks._tls.__dict__.clear()
    if dist.is_initialized():
        dist.destroy_process_group()


def _backend_seq(dist) -> int:
    return dist.group.WORLD._get_backend(torch.device("cpu"))._get_sequence_number_for_group()


@pytest.mark.parametrize("choice", ["native", "python"])
def test_both_kernels_count_every_collective_and_share_the_op_sequence(world, monkeypatch, choice):
    dist, hooks = world
    native = _native()
    monkeypatch.setenv("OBSHUB_COLLECTIVE_KERNEL", choice)
    hooks.enable(job="j", host_id=3)
    dist.init_process_group("gloo", rank=0, world_size=1)
    assert hooks.collective_kernel() == choice
    calls0 = native.calls()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()  # forward + backward phases, one bucket all-reduce
        opt.step()
    before = hooks.current_trace_key()
    dist.all_reduce(torch.ones(4))
    work = dist.all_reduce(torch.ones(4), async_op=True)
    work.wait()
    assert hooks.current_trace_key() == before  # the collective's key was the thread's for its duration only
    seen = native.calls() - calls0
    assert seen == (_backend_seq(dist) if choice == "native" else 0)
    # the data phase of step 2 is open; step 2's ops so far: data (1), two all-reduces (2, 3); the next
    # phase counts after them in both kernels
    with hooks._lock:
        hooks._phase_begin_locked("forward")
        assert (hooks._st.step, hooks._st.op_seq) == (2, 4)
        assert hooks.current_trace_key() == (hooks._key(2, 4), 2)


def test_one_probe_per_collective_while_coll_is_traced(world, monkeypatch):
    """While the ``coll`` site is traced (forced here: ``_force_coll``), the C++ kernel fires one ``coll``
    per collective at its end, carrying what coll_begin and coll_end carried plus the begin time and the
    issuing thread, and no coll_begin, coll_end nor tracekey; untraced, the three as before."""
    import threading

    from obshub.instrument import _usdt

    dist, hooks = world
    _native()
    monkeypatch.setenv("OBSHUB_COLLECTIVE_KERNEL", "native")
    hooks.enable(job="j", host_id=3)
    dist.init_process_group("gloo", rank=0, world_size=1)
    me = threading.get_native_id()
    _usdt._record(True)
    try:
        t0, t1 = _two_traced_collectives(dist, _usdt)
        _usdt._force_coll(False)
        dist.all_reduce(torch.ones(4))
        got = _usdt._recorded()
    finally:
        _usdt._force_coll(False)
        _usdt._record(False)
    probes = [r[0] for r in got]
    assert probes == ["coll", "coll", "coll_begin", "tracekey", "coll_end"], probes
    (_, pg0, seq0, op0, n0, step0, key0, b0, tid0), (_, pg1, seq1, op1, n1, step1, key1, b1, tid1) = got[:2]
    assert (pg0, op0, n0, tid0) == (pg1, op1, 16, me) and (n1, tid1) == (32, me)
    assert seq1 == seq0 + 1 and got[2][2] == seq1 + 1  # one sequence per group, whichever probe
    assert key1 == key0 + 1 and got[2][6] == key1 + 1  # one op sequence (TraceKey) too
    assert t0 <= b0 <= b1 <= t1  # CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns


def _two_traced_collectives(dist, usdt) -> tuple[int, int]:
    """With the `coll` site marked traced: a 16-byte all-reduce, then a 32-byte async one waited for;
    returns CLOCK_MONOTONIC ns before and after both."""
    import time

    usdt._force_coll(True)
    t0 = time.monotonic_ns()
    dist.all_reduce(torch.ones(4))
    dist.all_reduce(torch.ones(8), async_op=True).wait()
    return t0, time.monotonic_ns()


def _reader():
    """The agent's reader of this process's collective ring (obshub/producer/collring.py), opened."""
    import os

    from obshub.core.schema import Kind
    from obshub.producer.collring import CollRings

    rings = CollRings(7, Kind.COLLECTIVE_BEGIN, Kind.COLLECTIVE_END)
    rings.refresh([os.getpid()])
    assert len(rings) == 1, "the kernel made no collective ring (memfd obshub-coll)"
    return rings


def _drained_ring(world, monkeypatch):
    """The native kernel enabled in a 1-rank gloo world and this process's ring opened by the agent's
    reader and emptied (an earlier test's records): ``(dist, native module, rings)``."""
    dist, hooks = world
    native = _native()
    monkeypatch.setenv("OBSHUB_COLLECTIVE_KERNEL", "native")
    hooks.enable(job="j", host_id=3)
    dist.init_process_group("gloo", rank=0, world_size=1)
    rings = _reader()
    _ring_events(rings)
    return dist, native, rings


def _ring_events(rings):
    from obshub.producer.reader import DECODE_ALL_TABLE, PACKED_TABLE, Decoder, packed_run

    items = rings.drain(DECODE_ALL_TABLE, 100_000)
    return [Decoder({}, {}).decode(it) for it in items], PACKED_TABLE, packed_run


def test_collectives_go_through_the_ring_while_a_reader_drains_it(world, monkeypatch):
    """While the agent's reader drains the process's collective ring, the C++ kernel writes each collective's
    COLLECTIVE_BEGIN (begin time, issuing thread) and COLLECTIVE_END (end time, duration) there and fires no
    probe at all, even with ``coll`` traced: the records decode to the events the ``coll`` probe's BPF program
    makes (group, sequence, op, bytes, TraceKey, pid). A reader gone (closed), the ``coll`` trap again. A
    forked child has no ring and the kernel's locks are free in it."""
    import os
    import threading

    from obshub.core.schema import Kind
    from obshub.instrument import _usdt

    dist, hooks = world
    native = _native()
    monkeypatch.setenv("OBSHUB_COLLECTIVE_KERNEL", "native")
    hooks.enable(job="j", host_id=3)
    dist.init_process_group("gloo", rank=0, world_size=1)
    me = threading.get_native_id()
    rings = _reader()
    from obshub.producer.collring import CollRings

    second = CollRings(7, Kind.COLLECTIVE_BEGIN, Kind.COLLECTIVE_END, scan_s=0.0)
    second.refresh([os.getpid()])
    assert len(second) == 0  # one reader per ring (a second agent watching the process leaves it alone)
    _usdt._record(True)
    try:
        t0, t1 = _two_traced_collectives(dist, _usdt)
        trapped = _usdt._recorded()
        events, _, _ = _ring_events(rings)
        rings.close()  # the kernel sees no reader: the trap path
        assert native.ring_info()["live"] is False
        second.refresh([os.getpid()])
        assert len(second) == 1  # the first reader gone, another may take the ring
        second.close()
        dist.all_reduce(torch.ones(4))
        after = _usdt._recorded()
    finally:
        _usdt._force_coll(False)
        _usdt._record(False)
    assert trapped == [], trapped  # no trap at all on the ring path
    assert [e.kind for e in events] == [Kind.COLLECTIVE_BEGIN, Kind.COLLECTIVE_END] * 2, events
    b0, e0, b1, e1 = events
    assert all(e.pid == os.getpid() and e.payload["pg"] == "0" and e.payload["op"] == "all_reduce" for e in events)
    assert (b0.value, b1.value) == (16, 32) and (b0.tid, b1.tid) == (me, me)
    assert b1.payload["coll_seq"] == b0.payload["coll_seq"] + 1 and b1.trace_key == b0.trace_key + 1
    for b, e in ((b0, e0), (b1, e1)):
        assert (e.trace_key, e.step, e.value, e.payload) == (b.trace_key, b.step, b.value, b.payload)
        assert t0 <= b.ts_ns <= e.ts_ns <= t1 and e.duration_ns == e.ts_ns - b.ts_ns and b.duration_ns == 0
    assert [r[0] for r in after] == ["coll"] and after[0][2] == b1.payload["coll_seq"] + 1
    # a forked child (pthread_atfork): no ring of its own parent's to write into, the kernel's locks usable
    child = os.fork()
    if child == 0:
        ok = native.ring_info() is None and native.next_op() > 0
        os._exit(0 if ok else 3)
    assert os.waitpid(child, 0)[1] == 0


def test_a_full_ring_counts_the_drop_and_sends_the_collective_by_trap(world, monkeypatch):
    """A ring the reader does not drain fills up (1 MiB: 2,849 collectives); the rank never waits: each
    collective that does not fit is counted in ``drops`` and fired through the ``coll`` trap instead, and
    every one that fit is drained afterwards."""
    from obshub.instrument import _usdt

    dist, native, rings = _drained_ring(world, monkeypatch)
    info0, read0 = native.ring_info(), rings.read
    n = info0["data_size"] // 184 // 2 + 20
    t = torch.ones(1)
    _usdt._record(True)
    try:
        for _ in range(n):
            dist.all_reduce(t)
        traps = [r[0] for r in _usdt._recorded()]
    finally:
        _usdt._record(False)
    info = native.ring_info()
    drops, written = info["drops"] - info0["drops"], info["written"] - info0["written"]
    events, _, _ = _ring_events(rings)
    # the agent's counters (obshub_agent_coll_ring_records_total / _drops_total), kept past the ring's close
    counted = (rings.read - read0, rings.drops_total())
    rings.close()
    assert drops >= 20 and traps == ["coll"] * drops, (drops, traps[:3])
    assert written == 2 * (n - drops) == len(events), (n, drops, written, len(events))
    assert counted == (len(events), info["drops"]) and rings.drops_total() == info["drops"], (counted, info)


def test_each_group_counts_its_own_sequence_across_groups_made_and_destroyed(world, monkeypatch):
    """The kernel finds a group's sequence counter once per ProcessGroup (by its address, no reference held):
    collectives interleaved on the world and a subgroup count 0, 1, 2... each under its own name; a subgroup
    destroyed and another made (possibly at the same address) counts under the new group's name from 0,
    the world's count goes on."""
    dist, native, rings = _drained_ring(world, monkeypatch)
    t = torch.ones(2)
    sub = dist.new_group([0])
    for _ in range(2):
        dist.all_reduce(t)
        dist.all_reduce(t, group=sub)
    name0 = dist.distributed_c10d._get_process_group_name(sub)
    dist.destroy_process_group(sub)
    del sub
    sub2 = dist.new_group([0])
    name2 = dist.distributed_c10d._get_process_group_name(sub2)
    dist.all_reduce(t, group=sub2)
    dist.all_reduce(t)
    events, _, _ = _ring_events(rings)
    rings.close()
    from obshub.core.schema import Kind

    seen = [(e.payload["pg"], e.payload["coll_seq"]) for e in events if e.kind == Kind.COLLECTIVE_END]
    world_name = dist.distributed_c10d._get_process_group_name(dist.group.WORLD)
    assert name0 != name2 and world_name not in (name0, name2), (world_name, name0, name2)
    w = [q for n, q in seen if n == world_name]
    assert w == list(range(w[0], w[0] + 3)), seen
    assert [q for n, q in seen if n == name0] == [0, 1] and [q for n, q in seen if n == name2] == [0], seen


def _forge(native, kind: int, pid: int) -> None:
    """Write one record into this process's collective ring as a rank could (kind and pid of its choice)."""
    import mmap
    import os
    import struct

    from obshub.producer import record

    info = native.ring_info()
    fd = os.open(f"/proc/self/fd/{info['fd']}", os.O_RDWR)
    page, size = mmap.PAGESIZE, info["data_size"]
    m = mmap.mmap(fd, 2 * page + size)
    os.close(fd)
    prod = struct.unpack_from("<Q", m, page)[0]
    off = prod & (size - 1)
    if off + 184 > size:  # the kernel's rule: a record never wraps (a discarded record fills the end)
        struct.pack_into("<II", m, 2 * page + off, (size - off - 8) | (1 << 30), 0)
        prod, off = prod + size - off, 0
    fields = [1, 0, 0, 0, 0, 0, 0, 0, pid, pid, kind, 7, 0, b"0", b"all_reduce"]
    struct.pack_into("<II", m, 2 * page + off, 176, 0)
    m[2 * page + off + 8 : 2 * page + off + 184] = record.RECORD_STRUCT.pack(*fields)
    struct.pack_into("<Q", m, page, prod + 184)
    m.close()


def test_the_reader_takes_only_collective_records_with_the_rings_own_pid(world, monkeypatch):
    """The ring is written by the watched process itself: a record of another kind is dropped (counted),
    and a collective record carries the pid of the process the ring was found in, not the one it names."""
    import os

    import msgpack

    from obshub.core.schema import Kind
    from obshub.producer.reader import PACKED_TABLE, packed_run

    dist, native, rings = _drained_ring(world, monkeypatch)
    _forge(native, int(Kind.STEP_END), 4242)
    _forge(native, int(Kind.COLLECTIVE_END), 4242)
    items = rings.drain(PACKED_TABLE, 100)
    rings.close()
    (run,) = [packed_run(it) for it in items]
    assert rings.rejected == 1 and run.kinds == {Kind.COLLECTIVE_END: 1}
    ev = msgpack.unpackb(run.data, raw=False)  # one event: [kind, ts, dur, key, step, pid, ...]
    assert ev[0] == Kind.COLLECTIVE_END and ev[5] == os.getpid()


def test_a_collective_still_in_flight_gets_its_begin_from_the_watchdog(world, monkeypatch):
    """On the one-probe path a collective that waits (here: rank 1 joins 0.3 s late) gets its begin from
    the kernel's watchdog after ~100 ms (``coll_late``, the true begin time and issuing thread), so a hang
    still shows who arrived; its ``coll`` then carries the thread negated (the end only). On the ring path
    (a reader, ``coll`` not traced) the watchdog writes the BEGIN record into the ring, the end the END."""
    import os
    import subprocess
    import sys
    import threading
    import time

    from obshub.instrument import _usdt

    dist, hooks = world
    _native()
    monkeypatch.setenv("OBSHUB_COLLECTIVE_KERNEL", "native")
    peer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time, torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo', rank=1, world_size=2)\n"
            "for _ in range(2):\n    time.sleep(0.3)\n    dist.all_reduce(torch.ones(4))\n"
            "dist.destroy_process_group()\n",
        ],
        env={**os.environ, "OBSHUB_INSTRUMENT": "0"},
    )
    try:
        hooks.enable(job="j", host_id=3)
        dist.init_process_group("gloo", rank=0, world_size=2)
        _usdt._record(True)
        _usdt._force_coll(True)
        t0 = time.monotonic_ns()
        dist.all_reduce(torch.ones(4))
        waited = time.monotonic_ns() - t0
        got = _usdt._recorded()
        # the same through the collective ring (a reader drains it, coll not traced): the watchdog's BEGIN
        # and the END are ring records, no trap
        _usdt._force_coll(False)
        rings = _reader()
        _ring_events(rings)
        t1 = time.monotonic_ns()
        dist.all_reduce(torch.ones(4))
        waited_ring = time.monotonic_ns() - t1
        ring_traps = _usdt._recorded()
        events, _, _ = _ring_events(rings)
        rings.close()
    finally:
        _usdt._force_coll(False)
        _usdt._record(False)
        assert peer.wait(60) == 0
    me = threading.get_native_id()
    assert [r[0] for r in got] == ["coll_late", "coll"], got
    late, end = got
    assert late[1:7] == end[1:7] and late[7] == end[7]  # the same collective, the same begin time
    assert late[8] == me and end[8] == -me and waited >= 200_000_000
    assert ring_traps == [] and [e.kind for e in events] == [14, 15], (ring_traps, events)
    begin, end_ev = events
    assert begin.tid == me and begin.payload == end_ev.payload and begin.payload["coll_seq"] == late[2] + 1
    assert t1 <= begin.ts_ns and end_ev.duration_ns == end_ev.ts_ns - begin.ts_ns >= 200_000_000 <= waited_ring


def test_a_bad_kernel_choice_is_a_config_error(monkeypatch):
    from obshub.instrument import hooks

    monkeypatch.setenv("OBSHUB_COLLECTIVE_KERNEL", "fast")
    with pytest.raises(ConfigError, match="OBSHUB_COLLECTIVE_KERNEL='fast'"):
        hooks._load_native()


def test_a_failed_build_says_why_and_does_not_fail_setup(monkeypatch, capsys):
    """`make setup` runs native_build: a compiler error prints its tail and exits 0 (the Python kernel is
    used); --strict exits 1. The built extension, if any, is left as it was."""
    from obshub.instrument import native_build

    before = native_build.target().stat().st_mtime_ns if native_build.target().exists() else None
    monkeypatch.setattr(
        native_build, "command", lambda out: ["sh", "-c", "echo 'fatal error: torch/library.h' >&2; exit 3", str(out)]
    )
    assert native_build.main(["--force"]) == 0
    err = capsys.readouterr().err
    assert "not built, obshub uses its Python kernel" in err and "exit 3" in err and "torch/library.h" in err
    assert native_build.main(["--force", "--strict"]) == 1
    after = native_build.target().stat().st_mtime_ns if native_build.target().exists() else None
    assert after == before


def test_the_build_cache_key_ignores_the_clones_paths_and_follows_the_source(monkeypatch, tmp_path):
    """A fresh clone on the same machine (CI's) finds the extension another clone built: the cache key of
    ``native_build`` leaves out the clone's own paths (its .venv's headers and libraries, the output) but
    changes with the flags and the source."""
    pytest.importorskip("torch")
    from obshub.instrument import native_build as nb

    monkeypatch.setenv("OBSHUB_CACHE", str(tmp_path))
    a = [
        "g++",
        "-O2",
        "-I/clone-a/.venv/include",
        "/clone-a/src.cpp",
        "-o",
        "/clone-a/x.so",
        "-L/clone-a/lib",
        "-Wl,-rpath,/clone-a/lib",
    ]
    b = [
        "g++",
        "-O2",
        "-I/clone-b/.venv/include",
        "/clone-b/src.cpp",
        "-o",
        "/clone-b/x.so",
        "-L/clone-b/lib",
        "-Wl,-rpath,/clone-b/lib",
    ]
    ka, kb = nb._cached(a, nb.Path("/clone-a/x.so")), nb._cached(b, nb.Path("/clone-b/x.so"))
    if ka is None:
        pytest.skip("g++ is not installed")
    assert ka == kb and ka.parent.parent == tmp_path / "native"
    assert nb._cached([*a[:1], "-O0", *a[2:]], nb.Path("/clone-a/x.so")) != ka  # other flags, other build
    src = tmp_path / "k.cpp"
    src.write_text("// another source\n")
    monkeypatch.setattr(nb, "SOURCE", src)
    assert nb._cached(a, nb.Path("/clone-a/x.so")) != ka
