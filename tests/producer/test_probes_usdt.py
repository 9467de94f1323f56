"""USDT handling against tests/fixtures/fakeusdt.c, a library with the same
`obshub` probes as obshub.instrument._usdt: every PyTorch-layer event is decoded with its payload; scheduler events
of a thread inside a step carry that step's TraceKey (all of them); an undersized ring buffer under a
burst counts exactly what it could not deliver."""

from __future__ import annotations

import pytest

from obshub.core.schema import Kind, parse_trace_key, validate_event
from obshub.producer.probes import Target
from obshub.producer.reader import parse_hist
from tests.support.probes_util import build_so, ctypes_child, drain, event_source, need_bpf

pytestmark = pytest.mark.bpf

HOST = 7
FIRST, STEPS, SLEEPS, SLEEP_US = 100, 5, 4, 2000


def test_usdt_events_and_sched_tracekey(tmp_path):
    need_bpf()
    lib = build_so("fakeusdt", tmp_path)
    body = (
        "L.fake_register(b'jobx', 3, 8, %d, 1)\n"
        "L.fake_phase(b'forward', ctypes.c_int64(99), ctypes.c_uint64(5), 0)\n"
        "L.fake_phase(b'forward', ctypes.c_int64(99), ctypes.c_uint64(5), 1)\n"
        "L.fake_coll(b'0', ctypes.c_uint64(42), b'all_reduce', ctypes.c_uint64(4096), ctypes.c_int64(99),"
        " ctypes.c_uint64(6), 0)\n"
        "L.fake_coll(b'0', ctypes.c_uint64(42), b'all_reduce', ctypes.c_uint64(4096), ctypes.c_int64(99),"
        " ctypes.c_uint64(6), 1)\n"
        "L.fake_steps(%d, ctypes.c_int64(%d), %d, %d, %d)\n"
    ) % (HOST, HOST, FIRST, STEPS, SLEEPS, SLEEP_US)
    child = ctypes_child(lib, body)
    try:
        # registered mode: the register probe itself puts the process under watch, in the kernel
        with event_source(
            tmp_path,
            Target(registered=True),
            probes=("pytorch", "sched"),
            usdt_library=lib,
            thresholds={"offcpu_ns": 200_000, "runq_ns": 0, "sched_singles": 1000},
        ) as (src, table):
            assert all(s.attached for s in table), table
            child.go()
            child.wait()
            events = drain(src, 1.0)
            regs = src.registrations()
            misses = src.misses().get("sched", 0)  # runs the kernel's recursion guard skipped
    finally:
        child.kill()
    mine = [e for e in events if e.pid == child.pid]
    for e in mine:
        validate_event(list(e))  # every decoded event conforms to the wire schema
    assert regs == [{"job": "jobx", "world_size": 8, "host_id": HOST, "local_rank": 1, "rank": 3, "pid": child.pid}]
    phase = [e for e in mine if e.kind == Kind.PHASE]
    assert len(phase) == 1 and phase[0].payload == {"phase": "forward"} and phase[0].step == 99
    assert phase[0].trace_key == 5 and phase[0].duration_ns > 0
    coll = [e for e in mine if e.kind in (Kind.COLLECTIVE_BEGIN, Kind.COLLECTIVE_END)]
    assert [e.kind for e in coll] == [Kind.COLLECTIVE_BEGIN, Kind.COLLECTIVE_END]
    assert all(e.payload == {"pg": "0", "coll_seq": 42, "op": "all_reduce"} and e.value == 4096 for e in coll)

    begins = {e.step: e for e in mine if e.kind == Kind.STEP_BEGIN}
    ends = {e.step: e for e in mine if e.kind == Kind.STEP_END}
    assert sorted(begins) == sorted(ends) == list(range(FIRST, FIRST + STEPS))
    main_tid = begins[FIRST].tid
    sched = [e for e in mine if e.kind in (Kind.SCHED_OFFCPU, Kind.SCHED_RUNQ) and e.tid == main_tid]
    inside = missing = 0
    for s in range(FIRST, FIRST + STEPS):
        lo, hi = begins[s].ts_ns, ends[s].ts_ns
        assert ends[s].duration_ns == hi - lo >= SLEEPS * SLEEP_US * 1000
        in_step = [e for e in sched if lo <= e.ts_ns <= hi]
        offcpu = [e for e in in_step if e.kind == Kind.SCHED_OFFCPU]
        # each sleep is one off-CPU period >= 200 us; a tracepoint program is skipped when it fires while
        # another BPF program runs on that CPU (kernel recursion guard, counted in misses), so allow one
        # miss per step plus those the kernel counted (more BPF programs on a busy machine: more of them)
        missing += max(0, SLEEPS - len(offcpu))
        assert len(offcpu) >= 1, (s, in_step)
        for e in in_step:  # 100%: every one carries this step's TraceKey
            assert e.step == s, e
            assert parse_trace_key(e.trace_key)[:2] == (HOST, s & 0xFFFF), e
            # op 0 is the step itself (between step_begin and the first operation's key), 1.. the sleeps
            assert 0 <= parse_trace_key(e.trace_key).op_seq <= SLEEPS, e
        inside += len(in_step)
    assert missing <= STEPS + misses, (missing, misses)
    assert inside >= STEPS * SLEEPS - misses
    sums = {e.step: e for e in mine if e.kind == Kind.SCHED_STEP_SUM}
    assert sorted(sums) == list(range(FIRST, FIRST + STEPS))
    for s, e in sums.items():
        assert e.duration_ns >= (SLEEPS - 1) * SLEEP_US * 1000, e  # off-CPU sum covers the sleeps
        assert e.payload["switches"] >= SLEEPS - 1 and e.payload["wakeups"] >= SLEEPS - 1, e
        assert e.duration_ns <= ends[s].duration_ns
        # maxima and the run-queue histogram (log2 µs): every wait after a wakeup is binned, none is
        # longer than the maximum, the maximum is part of the sum
        hist = parse_hist(e.payload["runq_hist_us"])
        assert SLEEPS - 1 <= sum(hist) <= e.payload["wakeups"] + e.payload["switches"], e
        assert 0 < e.payload["runq_max_ns"] <= e.value, e
        top = max(i for i, n in enumerate(hist) if n)
        assert (1 << top) * 1000 <= max(e.payload["runq_max_ns"], 1000) < (2 << top) * 1000 or top == 15, e
        assert SLEEP_US * 1000 <= e.payload["offcpu_max_ns"] <= e.duration_ns, e


def test_undersized_ring_buffer_counts_every_lost_event(tmp_path):
    need_bpf()
    lib = build_so("fakeusdt", tmp_path)
    produced = 5000
    child = ctypes_child(lib, f"L.fake_burst(ctypes.c_int64({produced}))")
    try:
        with event_source(
            tmp_path, Target(pids={child.pid}), probes=("pytorch_step",), usdt_library=lib, ringbuf_pages=1
        ) as (src, table):
            assert table[0].attached
            child.go()
            child.wait()  # the whole burst happens while nobody reads the ring buffer
            events = drain(src, 0.5)
            lost = src.lost()["pytorch_step"]
    finally:
        child.kill()
    delivered = sum(1 for e in events if e.kind == Kind.STEP_BEGIN and e.pid == child.pid)
    assert lost > 0 and delivered > 0
    assert lost == produced - delivered, (produced, delivered, lost)
    # the delivered ones are the first of the burst, in order (a full ring drops the newest)
    assert [e.step for e in events if e.kind == Kind.STEP_BEGIN][:5] == [0, 1, 2, 3, 4]


def _real_library_events(tmp_path, calls: str, probes: tuple[str, ...], caught: dict | None = None) -> list:
    """The events of a child that runs ``calls`` (Python lines over ``u``, the real instrumentation
    library's probe functions) while the agent's handlers are attached with ``probes`` (registered
    processes watched); skips when the library is not built. ``caught``: filled with the source's
    ``caught`` counts after the run."""
    need_bpf()
    try:
        from obshub.instrument import usdt
    except Exception as exc:  # the extension is built by another part of the project
        pytest.skip(f"obshub.instrument._usdt not built: {exc}")
    from tests.support.probes_util import Child

    child = Child(
        "import sys, time\nfrom obshub.instrument import usdt as u\nsys.stdin.readline()\n"
        + calls
        + "print('done', flush=True)\n"
    )
    try:
        with event_source(tmp_path, Target(registered=True), probes=probes, usdt_library=usdt.library_path()) as (
            src,
            table,
        ):
            assert all(s.attached for s in table), table
            child.go()
            child.wait()
            events = [e for e in drain(src, 0.5) if e.pid == child.pid]
            if caught is not None:
                caught.update(src.caught)
            return events
    finally:
        child.kill()


def test_real_producer_usdt_library(tmp_path):
    """The handlers decode the real instrumentation library's probes (argument types and order); the
    instrumentation's caught exceptions (``caught``) are counted by where, as the agent's metric reads them."""
    caught: dict = {}
    events = _real_library_events(
        tmp_path,
        "u.register('real', 1, 2, 9, 0)\nu.tracekey(77, 5)\nu.step_begin(5, 77)\n"
        "u.phase_begin('backward', 5, 78)\nu.phase_end('backward', 5, 78)\n"
        "u.coll_begin('0', 3, 'all_reduce', 1024, 5, 79)\nu.coll_end('0', 3, 'all_reduce', 1024, 5, 79)\n"
        "import threading\nt0 = time.monotonic_ns()\ntime.sleep(0.01)\n"
        "u.coll('0', 4, 'all_gather', 2048, 5, 80, t0, threading.get_native_id() + 1)\n"
        "u.coll_late('0', 5, 'broadcast', 8, 5, 81, t0, threading.get_native_id() + 2)\n"
        "u.coll('0', 5, 'broadcast', 8, 5, 81, t0, -(threading.get_native_id() + 2))\n"
        "u.step_end(5, 77)\nu.caught('hook')\nu.caught('hook')\nu.caught('load_state_dict')\n",
        ("pytorch",),
        caught,
    )
    assert {k: v for k, v in caught.items() if k.startswith("instrument_")} == {
        "instrument_hook": 2,
        "instrument_load_state_dict": 1,
    }, caught
    kinds = [e.kind for e in events]
    assert kinds == [
        Kind.REGISTER,
        Kind.STEP_BEGIN,
        Kind.PHASE,
        Kind.COLLECTIVE_BEGIN,
        Kind.COLLECTIVE_END,
        Kind.COLLECTIVE_BEGIN,
        Kind.COLLECTIVE_END,
        Kind.COLLECTIVE_BEGIN,
        Kind.COLLECTIVE_END,
        Kind.STEP_END,
    ], kinds
    reg, begin, phase, cb, ce, cb1, ce1, cb2, ce2, end = events
    # one `coll` hit (the C++ kernel's one trap per collective) makes the pair's two records: the begin at
    # the time and on the thread it carries, the end now on the firing thread with the duration
    assert cb1.payload == ce1.payload == {"pg": "0", "coll_seq": 4, "op": "all_gather"}
    assert cb1.value == ce1.value == 2048 and (cb1.step, cb1.trace_key, ce1.step, ce1.trace_key) == (5, 80, 5, 80)
    assert ce1.duration_ns == ce1.ts_ns - cb1.ts_ns and ce1.duration_ns >= 10_000_000
    assert cb1.ts_ns >= ce.ts_ns and cb1.tid == ce1.tid + 1
    # a collective still in flight: coll_late gives its begin (the watchdog's), its coll (thread negated)
    # the end alone
    assert cb2.payload == ce2.payload == {"pg": "0", "coll_seq": 5, "op": "broadcast"}
    assert cb2.ts_ns == cb1.ts_ns and cb2.tid == ce2.tid + 2 and ce2.duration_ns == ce2.ts_ns - cb2.ts_ns
    assert reg.value == 1 and reg.payload == {"job": "real", "world_size": 2, "host_id": 9, "local_rank": 0}
    assert (begin.step, begin.trace_key, end.step, end.trace_key) == (5, 77, 5, 77)
    assert end.duration_ns == end.ts_ns - begin.ts_ns
    assert phase.payload == {"phase": "backward"} and phase.trace_key == 78 and phase.step == 5
    assert cb.payload == ce.payload == {"pg": "0", "coll_seq": 3, "op": "all_reduce"}
    assert cb.value == ce.value == 1024 and ce.duration_ns == ce.ts_ns - cb.ts_ns


def test_merged_probes_of_the_real_library(tmp_path):
    """phase_next and step_next of the real instrumentation library give what the separate probes give:
    the ended phase's PHASE with its wall time, STEP_END with the step's, the step's scheduler sums,
    STEP_BEGIN of the next step, and the next phase's PHASE at its end; one timestamp per merged hit."""
    events = _real_library_events(
        tmp_path,
        "u.register('merged', 0, 1, 4, 0)\nu.step_begin(5, 50)\nu.phase_begin('forward', 5, 51)\n"
        "time.sleep(0.01)\nu.phase_next('forward', 'backward', 5, 51, 52)\ntime.sleep(0.01)\n"
        "u.phase_end('backward', 5, 52)\nu.phase_begin('optimizer', 5, 53)\n"
        "u.step_next(5, 50, 60, 'optimizer', 53, 'data', 61)\ntime.sleep(0.01)\n"
        "u.phase_next('data', 'forward', 6, 61, 62)\nu.phase_end('forward', 6, 62)\nu.step_end(6, 60)\n",
        ("pytorch", "sched"),
    )
    got = [
        (Kind(e.kind).name, e.step, e.trace_key, (e.payload or {}).get("phase"))
        for e in events
        if e.kind in (Kind.REGISTER, Kind.STEP_BEGIN, Kind.STEP_END, Kind.PHASE)
    ]
    assert got == [
        ("REGISTER", -1, 0, None),
        ("STEP_BEGIN", 5, 50, None),
        ("PHASE", 5, 51, "forward"),
        ("PHASE", 5, 52, "backward"),
        ("PHASE", 5, 53, "optimizer"),
        ("STEP_END", 5, 50, None),
        ("STEP_BEGIN", 6, 60, None),
        ("PHASE", 6, 61, "data"),
        ("PHASE", 6, 62, "forward"),
        ("STEP_END", 6, 60, None),
    ], got
    by = {(e.kind, e.step, (e.payload or {}).get("phase")): e for e in events}
    fwd, bwd = by[(Kind.PHASE, 5, "forward")], by[(Kind.PHASE, 5, "backward")]
    opt, end5, begin6 = by[(Kind.PHASE, 5, "optimizer")], by[(Kind.STEP_END, 5, None)], by[(Kind.STEP_BEGIN, 6, None)]
    data = by[(Kind.PHASE, 6, "data")]
    assert fwd.duration_ns >= 10_000_000 and bwd.duration_ns >= 10_000_000
    assert bwd.ts_ns - bwd.duration_ns == fwd.ts_ns  # backward began at forward's end, one instant
    assert opt.ts_ns == end5.ts_ns == begin6.ts_ns  # one step_next: one timestamp
    assert end5.duration_ns == end5.ts_ns - by[(Kind.STEP_BEGIN, 5, None)].ts_ns
    assert data.ts_ns - data.duration_ns == begin6.ts_ns and data.duration_ns >= 10_000_000
    sums = [e for e in events if e.kind == Kind.SCHED_STEP_SUM]
    assert [e.step for e in sums] == [5, 6]  # the step's scheduler sums ship at each step end (the sleeps)


def test_step_next_without_the_phase_probe_gives_only_the_steps(tmp_path):
    """With pytorch_step attached and pytorch_phase not, step_next's program is built without its phase
    parts: the step boundary's STEP_END and STEP_BEGIN, no PHASE."""
    events = _real_library_events(
        tmp_path,
        "u.register('steps', 0, 1, 4, 0)\nu.step_begin(5, 50)\nu.phase_begin('optimizer', 5, 53)\n"
        "u.step_next(5, 50, 60, 'optimizer', 53, 'data', 61)\nu.phase_next('data', 'forward', 6, 61, 62)\n"
        "u.step_end(6, 60)\n",
        ("pytorch_register", "pytorch_step"),
    )
    got = [(Kind(e.kind).name, e.step, e.trace_key) for e in events]
    assert got == [
        ("REGISTER", -1, 0),
        ("STEP_BEGIN", 5, 50),
        ("STEP_END", 5, 50),
        ("STEP_BEGIN", 6, 60),
        ("STEP_END", 6, 60),
    ], got


def _unpacked(items) -> list:
    """Events of a poll_packed() result: PackedRun s unpacked (each event's bytes re-packed must be
    identical: the C encoder writes what msgpack writes), Events as they are."""
    import msgpack

    from obshub.core.schema import Event
    from obshub.producer.reader import PackedRun

    out = []
    for it in items:
        if isinstance(it, PackedRun):
            start = 0
            for end in it.ends:
                raw = bytes(it.data[start:end])
                fields = msgpack.unpackb(raw, raw=False)
                assert msgpack.packb(fields, use_bin_type=True) == raw, fields
                out.append(Event(*fields))
                start = end
            assert sum(it.kinds.values()) == len(it.ends)
        else:
            out.append(it)
    return out


def test_batch_reader_encodes_like_the_decoder(tmp_path):
    """The C batch reader (poll_packed) yields the same events as the per-record decoder, in order:
    ASCII phases and collectives packed in C, a non-ASCII phase and REGISTER decoded in Python."""
    need_bpf()
    lib = build_so("fakeusdt", tmp_path)
    body = (
        "L.fake_register(b'jobx', 3, 8, 7, 1)\n"
        "for ph in (b'forward', 'vorw\\u00e4rts'.encode(), b'backward'):\n"
        "    L.fake_phase(ph, ctypes.c_int64(99), ctypes.c_uint64(5), 0)\n"
        "    L.fake_phase(ph, ctypes.c_int64(99), ctypes.c_uint64(5), 1)\n"
        "L.fake_coll(b'0', ctypes.c_uint64(42), b'all_reduce', ctypes.c_uint64(1 << 40), ctypes.c_int64(99),"
        " ctypes.c_uint64(6), 0)\n"
        "L.fake_coll(b'0', ctypes.c_uint64(42), b'all_reduce', ctypes.c_uint64(1 << 40), ctypes.c_int64(99),"
        " ctypes.c_uint64(6), 1)\n"
        "L.fake_steps(7, ctypes.c_int64(2**40), 3, 0, 0)\n"
    )
    child = ctypes_child(lib, body)
    items = []
    try:
        with event_source(tmp_path, Target(registered=True), probes=("pytorch",), usdt_library=lib) as (src, _t):
            child.go()
            child.wait()
            deadline = __import__("time").monotonic() + 1.0
            while __import__("time").monotonic() < deadline:
                items += src.poll_packed(50)
            items += src.poll_packed(0)
            consumed = src.consumed()
    finally:
        child.kill()
    evs = [e for e in _unpacked(items) if e.pid == child.pid]
    for e in evs:
        validate_event(list(e))
    assert [e.kind for e in evs] == (
        [Kind.REGISTER]
        + [Kind.PHASE] * 3
        + [Kind.COLLECTIVE_BEGIN, Kind.COLLECTIVE_END]
        + [Kind.STEP_BEGIN, Kind.STEP_END] * 3
    )
    assert [e.payload for e in evs[1:4]] == [{"phase": "forward"}, {"phase": "vorwärts"}, {"phase": "backward"}]
    assert evs[4].payload == {"pg": "0", "coll_seq": 42, "op": "all_reduce"} and evs[4].value == 1 << 40
    assert [e.step for e in evs[6:]] == [2**40, 2**40, 2**40 + 1, 2**40 + 1, 2**40 + 2, 2**40 + 2]
    assert all(e.gpu == -1 and e.tid > 0 for e in evs)
    assert consumed >= len(evs)
    from obshub.producer.reader import PackedRun

    assert sum(len(it.ends) for it in items if isinstance(it, PackedRun)) >= 8  # most of them went the C way


def test_batch_reader_encodes_the_step_aggregates_like_the_decoder(tmp_path):
    """SCHED_STEP_SUM and MEM_STEP_SUM (histogram text included) are encoded in C by the batch reader:
    they come in PackedRun s, each event's bytes equal msgpack's, and each payload equals what the
    per-record decoder makes of the same record fields."""
    need_bpf()
    from obshub.producer.reader import EVENT_STRUCT, Decoder, PackedRun

    lib = build_so("fakeusdt", tmp_path)
    body = (
        "import mmap, time\n"
        "for s in range(3):\n"
        "    L.fake_tracekey(ctypes.c_uint64(1000 + s), ctypes.c_int64(s))\n"
        "    L.fake_step_begin(ctypes.c_int64(s), ctypes.c_uint64(1000 + s))\n"
        "    m = mmap.mmap(-1, 4 << 20)\n"  # fresh pages faulted in: allocations inside the step
        "    for i in range(0, 4 << 20, 4096):\n"
        "        m[i] = 1\n"
        "    for _ in range(4):\n"
        "        time.sleep(0.002)\n"  # switches and wakeups of the training thread
        "    m.close()\n"
        "    L.fake_step_end(ctypes.c_int64(s), ctypes.c_uint64(1000 + s))\n"
    )
    child = ctypes_child(lib, body)
    items = []
    try:
        with event_source(
            tmp_path,
            Target(pids={child.pid}),
            probes=("pytorch_step", "pytorch_tracekey", "sched", "mem_page_alloc"),
            usdt_library=lib,
            thresholds={"page_order": 0},
        ) as (src, _t):
            child.go()
            child.wait()
            deadline = __import__("time").monotonic() + 1.0
            while __import__("time").monotonic() < deadline:
                items += src.poll_packed(50)
            items += src.poll_packed(0)
    finally:
        child.kill()
    packed_kinds: dict = {}
    for it in items:
        if isinstance(it, PackedRun):
            for k, n in it.kinds.items():
                packed_kinds[k] = packed_kinds.get(k, 0) + n
    evs = [e for e in _unpacked(items) if e.pid == child.pid]
    sums = [e for e in evs if e.kind in (Kind.SCHED_STEP_SUM, Kind.MEM_STEP_SUM)]
    assert sorted((e.kind, e.step) for e in sums) == sorted(
        [(Kind.SCHED_STEP_SUM, s) for s in range(3)] + [(Kind.MEM_STEP_SUM, s) for s in range(3)]
    )
    assert packed_kinds.get(Kind.SCHED_STEP_SUM, 0) >= 3 and packed_kinds.get(Kind.MEM_STEP_SUM, 0) >= 3
    dec = Decoder({}, {})
    for e in sums:
        validate_event(list(e))
        p = e.payload
        if e.kind == Kind.SCHED_STEP_SUM:
            a0, a1, a2 = p["switches"], p["wakeups"], p["runq_max_ns"]
            hist, s1 = parse_hist(p["runq_hist_us"]), p["offcpu_max_ns"].to_bytes(8, "little") + bytes(24)
            # four sleeps, but a sleep whose timer fires before its thread reaches schedule() (a vCPU
            # paused in between) switches nothing, and a program the kernel's recursion guard skipped
            # counts nothing: this test checks the encoding, so any counted switch will do
            assert a0 >= 1 and sum(hist) >= 1
        else:
            a0, a1, a2 = p["pages"], p["stalls"], p["stall_max_ns"]
            hist, s1 = parse_hist(p["orders"]), bytes(32)
            assert e.value == sum(hist) > 0 and a0 == sum(n << i for i, n in enumerate(hist))
        s0 = b"".join(c.to_bytes(4, "little") for c in hist) + bytes(64 - 4 * len(hist))
        raw = EVENT_STRUCT.pack(
            e.ts_ns, e.duration_ns, e.trace_key, e.step, e.value, a0, a1, a2, e.pid, e.tid, e.kind, 0, 0, s0, s1
        )
        decoded = dec.decode(raw).payload
        assert decoded == p and list(decoded) == list(p)  # same keys in the same order: the same bytes


def test_batch_reader_loss_accounting_is_exact(tmp_path):
    """Through the batch reader too: lost (kernel counter) == produced - delivered == produced - consumed."""
    need_bpf()
    lib = build_so("fakeusdt", tmp_path)
    produced = 5000
    child = ctypes_child(lib, f"L.fake_burst(ctypes.c_int64({produced}))")
    try:
        with event_source(
            tmp_path, Target(pids={child.pid}), probes=("pytorch_step",), usdt_library=lib, ringbuf_pages=1
        ) as (src, table):
            assert table[0].attached
            child.go()
            child.wait()
            items = []
            for _ in range(5):
                items += src.poll_packed(50)
            lost = src.lost()["pytorch_step"]
            consumed = src.consumed()
    finally:
        child.kill()
    evs = _unpacked(items)
    delivered = sum(1 for e in evs if e.kind == Kind.STEP_BEGIN and e.pid == child.pid)
    assert lost > 0 and delivered > 0
    assert lost == produced - delivered == produced - consumed, (produced, delivered, consumed, lost)
    assert [e.step for e in evs][:5] == [0, 1, 2, 3, 4]


def test_scheduler_singles_are_capped_per_step_and_the_sums_keep_everything(tmp_path):
    """With sched_singles=2 at most two SCHED_RUNQ/SCHED_OFFCPU records flow per process and step, and past
    them only a wait twice the longest sent (a CI run under load sent 3: 7.9 µs, ..., 2.7 ms), while
    SCHED_STEP_SUM still sums every switch and wait of the step."""
    need_bpf()
    lib = build_so("fakeusdt", tmp_path)
    child = ctypes_child(lib, "L.fake_steps(7, ctypes.c_int64(0), 4, 6, 1000)")
    try:
        with event_source(
            tmp_path,
            Target(pids={child.pid}),
            probes=("pytorch_step", "pytorch_tracekey", "sched"),
            usdt_library=lib,
            thresholds={"offcpu_ns": 0, "runq_ns": 0, "sched_singles": 2},
        ) as (src, _t):
            child.go()
            child.wait()
            events = drain(src, 1.0)
    finally:
        child.kill()
    mine = [e for e in events if e.pid == child.pid]
    begins = {e.step: e.ts_ns for e in mine if e.kind == Kind.STEP_BEGIN}
    ends = {e.step: e.ts_ns for e in mine if e.kind == Kind.STEP_END}
    sums = {e.step: e for e in mine if e.kind == Kind.SCHED_STEP_SUM}
    assert sorted(begins) == sorted(ends) == sorted(sums) == [0, 1, 2, 3]
    for s in range(4):
        singles = [e for e in mine if e.kind in (Kind.SCHED_RUNQ, Kind.SCHED_OFFCPU) and begins[s] < e.ts_ns <= ends[s]]
        assert len(singles) >= 1, (s, singles)
        # past the cap of 2, a single flows only when it is at least twice the step's longest sent before
        # it (obshub/bpf/sched.c obs_sched_single_ok: a burst late in a step still arrives)
        longest = 0
        for i, e in enumerate(sorted(singles, key=lambda e: e.ts_ns)):
            assert i < 2 or e.duration_ns >= 2 * longest, (s, i, singles)
            longest = max(longest, e.duration_ns)
        # six sleeps (a few may switch nothing, see above): more than two singles' worth
        assert sums[s].payload["switches"] >= 3, sums[s]


def test_a_step_end_wakes_the_reader_only_from_the_time_wake_req_names(tmp_path):
    """``wake_req`` (obshub/bpf/common.h) names the earliest CLOCK_MONOTONIC time at which a step end may wake the
    reader: a step end before it is submitted without a wakeup and leaves the time in place; the first
    step end at or after it wakes the reader and clears it. Every STEP_END reaches the ring either way."""
    need_bpf()
    import time

    lib = build_so("fakeusdt", tmp_path)
    body = "for line in sys.stdin:\n    L.fake_step_end(ctypes.c_int64(int(line)), ctypes.c_uint64(1))\n    print(line.strip(), flush=True)\n"
    child = ctypes_child(lib, body)
    items = []
    try:
        with event_source(tmp_path, Target(pids={child.pid}), probes=("pytorch_step",), usdt_library=lib) as (src, _t):
            ring, wake_req = src._ring, src._bpf[b"wake_req"]
            child.go()

            def step_end(step: int) -> None:
                child.go(str(step))
                assert child.proc.stdout.readline().strip() == str(step)

            items += src.poll_packed(0)
            later = time.monotonic_ns() + 3600 * 10**9
            src._want_wake(later)
            ring.wait(0)  # clear any earlier edge
            step_end(1)
            assert ring.wait(0) == 0, "a step end before the named time must not wake the reader"
            assert wake_req[0].value == later
            src._want_wake(time.monotonic_ns())  # a time already passed
            step_end(2)
            assert ring.wait(10_000) > 0, "the first step end at or after the named time wakes the reader"
            assert wake_req[0].value == 0
            step_end(3)
            assert ring.wait(0) == 0, "only one step end wakes the reader until the next drain"
            src._want_wake()  # after a drain: the next step end
            step_end(4)
            assert ring.wait(10_000) > 0
            items += src.poll_packed(0)
            child.wait()  # closes its stdin: the child's loop ends
    finally:
        child.kill()
    ends = sorted(e.step for e in _unpacked(items) if e.kind == Kind.STEP_END and e.pid == child.pid)
    assert ends == [1, 2, 3, 4]
