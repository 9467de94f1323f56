"""Batcher (one job and one per job), clock and synthetic source: no broker needed."""

from __future__ import annotations

import time
from array import array

import msgpack
import pytest

from obshub.core import schema
from obshub.core.schema import Event, Kind
from obshub.producer.batcher import Batcher, JobBatchers
from obshub.producer.clock import ClockTracker, measure, tai_offset_ns
from obshub.producer.synthetic import SyntheticSource


def _events(n: int, start: int = 0) -> list[Event]:
    return [
        Event(Kind.SCHED_RUNQ, 1_000 + i, 5_000 + i, (7 << 48) | i, i // 100, 10, 11, -1, i, None)
        for i in range(start, start + n)
    ]


def test_batches_bounded_by_size_seq_contiguous_and_lossless():
    b = Batcher("job", "host-a", 7, max_bytes=16 * 1024, max_age_ms=10_000)
    evs = _events(20_000)
    sealed = b.add_many(evs[:7_000]) + b.add_many(evs[7_000:])
    last = b.flush()
    assert last is not None and b.flush() is None
    sealed.append(last)
    assert len(sealed) > 10
    assert [s.seq for s in sealed] == list(range(len(sealed)))
    got = []
    one_event = len(__import__("msgpack").packb(list(evs[-1])))
    for s in sealed:
        assert len(s.value) <= 16 * 1024
        d = schema.decode_batch(s.value)
        assert (d.job, d.host, d.host_id, d.agent_id, d.seq) == ("job", "host-a", 7, b.agent_id, s.seq)
        assert s.key == b"host-a" and s.n_events == len(d.events)
        got.extend(d.events)
    for s in sealed[:-1]:  # full batches: one more event would not have fitted
        assert len(s.value) + one_event > 16 * 1024 - 400
    assert got == evs
    assert b.sealed == len(sealed) and b.events == 20_000 and b.rejected == 0


def test_batch_bounded_by_age():
    b = Batcher("job", "h", 1, max_bytes=256 * 1024, max_age_ms=200)
    assert b.due() is None and b.ms_until_due() is None
    b.add_many(_events(3))
    t0 = b._first_ns
    assert b.due(now_ns=t0 + 199_000_000) is None
    assert b.ms_until_due(now_ns=t0 + 150_000_000) == pytest.approx(50.0)
    s = b.due(now_ns=t0 + 200_000_000)
    assert s is not None and s.n_events == 3 and s.seq == 0
    assert b.due(now_ns=t0 + 10**12) is None
    b.add_many(_events(1))
    time.sleep(0.25)
    assert b.due().seq == 1


def test_step_end_seals_the_batch_a_fast_step_shares_one_and_age_still_bounds():
    ms = 1_000_000
    b = Batcher("job", "h", 1, max_age_ms=1_000, step_min_age_ms=500)
    assert b.step_end() is False  # no open batch
    b.add_many(_events(3))
    t0 = b._first_ns
    assert b.due(now_ns=t0 + 100 * ms) is None
    assert b.step_end(now_ns=t0 + 100 * ms) is True  # the first batch: any step end seals it
    assert b.ms_until_due(now_ns=t0 + 100 * ms) == 0.0
    s = b.due(now_ns=t0 + 100 * ms)
    assert s is not None and s.n_events == 3 and b.step_sealed == 1
    # after a step-aligned batch: a step end 200 ms after that seal (a fast step) leaves the next batch
    # open, one 600 ms after it seals
    t1 = t0 + 100 * ms
    b.add_many(_events(2))
    assert b.step_end(now_ns=t1 + 200 * ms) is False and b.due(now_ns=t1 + 200 * ms) is None
    b.add_many(_events(2))
    assert b.step_end(now_ns=t1 + 600 * ms) is True
    assert b.due(now_ns=t1 + 600 * ms).n_events == 4 and b.step_sealed == 2
    # a step longer than the age bound: sealed by age, then its end seals the (young) rest at once
    b.add_many(_events(1))
    t2 = b._first_ns
    assert b.ms_until_due(now_ns=t2 + 400 * ms) == pytest.approx(600.0)
    assert b.due(now_ns=t2 + 1_000 * ms).n_events == 1 and b.step_sealed == 2
    b.add_many(_events(1))
    assert b.step_end(now_ns=b._first_ns + 10 * ms) is True
    assert b.due(now_ns=b._first_ns + 10 * ms).n_events == 1 and b.step_sealed == 3
    assert b.sealed == 4


def test_ms_until_step_seal_is_the_time_no_step_end_can_seal_the_batch():
    """How long the agent may sleep through the kernel's step-end wakeups: while less than the step minimum
    passed since a step-aligned seal, whether the next batch is open yet or not; never while a step end
    would seal it."""
    ms = 1_000_000
    b = Batcher("job", "h", 1, max_age_ms=1_000, step_min_age_ms=500)
    assert b.ms_until_step_seal() == float("inf")  # no steps yet and nothing open: no bound from this job
    b.add_many(_events(2))
    t0 = b._first_ns
    assert b.ms_until_step_seal(now_ns=t0 + 10 * ms) == 0.0  # the first step end seals at once
    assert b.step_end(now_ns=t0 + 10 * ms) and b.due(now_ns=t0 + 10 * ms) is not None
    t1 = t0 + 10 * ms  # the step seal: the step minimum counts from here, before the next batch opens
    assert b.ms_until_step_seal(now_ns=t1) == pytest.approx(500.0)  # nothing open, no step end can seal
    assert b.ms_until_step_seal(now_ns=t1 + 100 * ms) == pytest.approx(400.0)
    assert b.ms_until_step_seal(now_ns=t1 + 700 * ms) == 0.0
    b.add_many(_events(1))
    assert b.ms_until_step_seal(now_ns=t1 + 200 * ms) == pytest.approx(300.0)
    assert b.step_end(now_ns=t1 + 200 * ms) is False  # as promised: that step end did not seal it
    assert b.ms_until_step_seal(now_ns=t1 + 600 * ms) == 0.0
    assert b.seal_next() and b.ms_until_step_seal(now_ns=t1 + 200 * ms) == 0.0  # urgent: no quiet time
    jb = JobBatchers("fallback", "host-a", 7, max_age_ms=1_000, step_min_age_ms=500)
    a = jb.of("a")
    a.add_many(_events(1))
    a.step_end()
    jb.due()
    a.add_many(_events(1))
    assert 0 < jb.ms_until_step_seal() <= 500  # the fallback job (no steps, nothing open) does not bound it
    jb.of("b").add_many(_events(1))
    assert jb.ms_until_step_seal() == 0.0  # job b's first step end would seal its batch now


def test_seal_next_sends_an_urgent_event_at_once_and_not_as_a_step_boundary():
    ms = 1_000_000
    b = Batcher("job", "h", 1, max_age_ms=1_000, step_min_age_ms=500)
    assert b.seal_next() is False  # no open batch
    b.add_many(_events(2))
    t0 = b._first_ns
    assert b.due(now_ns=t0 + 10 * ms) is None
    assert b.seal_next() is True and b.ms_until_due(now_ns=t0 + 10 * ms) == 0.0
    s = b.due(now_ns=t0 + 10 * ms)
    assert s is not None and s.n_events == 2 and b.step_sealed == 0
    # the flag went with that batch: the next one waits for its age bound again
    b.add_many(_events(1))
    assert b.due(now_ns=b._first_ns + 10 * ms) is None
    # a step end after an urgent seal seals at once (judged as after an age seal)
    assert b.step_end(now_ns=b._first_ns + 10 * ms) is True


def test_job_batchers_seal_step_ends_per_job():
    jb = JobBatchers("fallback", "host-a", 7, max_age_ms=1_000, step_min_age_ms=500)
    jb.of("a").add_many(_events(2))
    jb.of("b").add_many(_events(3))
    jb.of("a").step_end()
    sealed = jb.due()
    assert [schema.decode_batch(s.value).job for s in sealed] == ["a"] and jb.open_events == 3
    assert jb.step_sealed == 1 and jb.sealed == 1


def test_encoding_is_byte_identical_to_the_schema_codec():
    clock = schema.Clock(123, 45, 37_000_000_000)
    b = Batcher("j", "h", 3, clock=lambda: clock)
    evs = _events(5) + [Event(Kind.PHASE, 9, 1, 2, 3, 4, 5, 0, 0, {"phase": "forward"})]
    b.add_many(evs)
    s = b.flush()
    d = schema.decode_batch(s.value)
    assert d.clock == clock
    again = schema.encode_batch(schema.Batch("j", "h", 3, b.agent_id, 0, evs, clock, d.sent_ns))
    assert again == s.value
    assert abs(d.sent_ns - time.time_ns()) < 10 * 10**9


def test_unencodable_events_are_skipped_and_counted():
    b = Batcher("j", "h", 3)
    bad = [Event(Kind.PHASE, 1, 0, 0, 0, 0, 0, -1, 2**70, None), Event(Kind.PHASE, 1, payload={"x": object()})]
    b.add_many(_events(2) + bad + _events(2, 2))
    d = schema.decode_batch(b.flush().value)
    assert len(d.events) == 4 and b.rejected == 2 and b.events == 4


def test_clock_offset_and_uncertainty():
    c = measure(16)
    direct = time.time_ns() - time.monotonic_ns()
    assert abs(c.offset_ns - direct) < 5_000_000  # both read the same two clocks, ms apart at most
    assert 0 < c.uncertainty_ns < 5_000_000
    assert c.tai_offset_ns % 1_000_000_000 == 0 and c.tai_offset_ns == tai_offset_ns()
    now = [0.0]
    t = ClockTracker(refresh_s=10, now=lambda: now[0])
    assert t.refreshes == 1
    t.current()
    now[0] = 9.9
    t.current()
    assert t.refreshes == 1
    now[0] = 10.0
    t.current()
    assert t.refreshes == 2
    with pytest.raises(ValueError):
        measure(0)


def test_synthetic_source_stream_is_valid_and_bounded():
    src = SyntheticSource(1_000_000, total=5_000, host_id=9, events_per_step=20)
    st = src.start()
    assert st[0].attached
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 5_000 and time.monotonic() < deadline:
        got.extend(src.poll(20))
    assert len(got) == 5_000 and src.poll(0) == [] and src.produced == 5_000
    for e in got:
        schema.validate_event(list(e))
    kinds = [e.kind for e in got]
    assert kinds.count(Kind.STEP_BEGIN) == kinds.count(Kind.STEP_END) == 250
    ends = [e for e in got if e.kind == Kind.COLLECTIVE_END]
    assert [e.payload["coll_seq"] for e in ends] == list(range(250))
    for e in got:
        parts = schema.parse_trace_key(e.trace_key)
        assert parts.host_id == 9 and parts.step16 == e.step & 0xFFFF
    src.add_loss(5, "sched")
    assert src.lost()["sched"] == 5


def _packed(evs) -> tuple[bytes, array]:
    import msgpack

    data, ends = b"", array("I")
    for e in evs:
        data += msgpack.packb(list(e), use_bin_type=True)
        ends.append(len(data))
    return data, ends


def test_packed_runs_give_the_same_batches_as_single_events():
    """add_packed (the C reader's runs) cuts at the same bounds as add_many and makes identical bytes."""
    clock = schema.Clock(5, 6, 7)
    evs = _events(9_000) + [Event(Kind.PHASE, 9, 1, 2, 3, 4, 5, -1, 0, {"phase": "x" * 40})] + _events(3_000, 9_000)
    one = Batcher("j", "h", 3, agent_id="a", clock=lambda: clock, max_bytes=16 * 1024)
    two = Batcher("j", "h", 3, agent_id="a", clock=lambda: clock, max_bytes=16 * 1024)
    singles = one.add_many(evs[:5_000]) + one.add_many(evs[5_000:]) + [one.flush()]
    d1, e1 = _packed(evs[:5_000])
    d2, e2 = _packed(evs[5_000:])
    runs = two.add_packed(d1, e1) + two.add_packed(d2, e2) + [two.flush()]
    assert len(runs) == len(singles) > 10 and two.events == one.events == len(evs)
    for a, b in zip(singles, runs):
        assert (a.seq, a.n_events) == (b.seq, b.n_events)
        da, db = schema.decode_batch(a.value), schema.decode_batch(b.value)
        assert da.events == db.events and len(b.value) <= 16 * 1024
        assert a.value[-2000:] == b.value[-2000:]  # the event bytes (the envelope differs only in sent_ns)


def test_packed_event_larger_than_the_bound_goes_alone():
    big = Event(Kind.PHASE, 1, 0, 0, 0, 0, 0, -1, 0, {"phase": "p" * 3000})
    b = Batcher("j", "h", 3, max_bytes=2048)
    data, ends = _packed(_events(2) + [big] + _events(2, 2))
    sealed = b.add_packed(data, ends) + [b.flush()]
    assert [s.n_events for s in sealed] == [2, 1, 2]
    assert [e.payload for e in schema.decode_batch(sealed[1].value).events] == [big.payload]


def test_job_batchers_one_job_per_batch_one_gapless_sequence():
    jb = JobBatchers("fallback", "host-a", 7, max_bytes=8 * 1024, max_age_ms=50)
    evs = _events(3_000)
    sealed = []
    for i in range(0, 3_000, 500):  # interleaved jobs
        sealed += jb.of("a" if i % 1000 else "b").add_many(evs[i : i + 500])
    sealed += jb.fallback.add_many(evs[:10])
    assert jb.ms_until_due() is not None and jb.open_events > 0
    sealed += jb.due(time.monotonic_ns() + 10**9)  # all three open batches are due
    assert jb.open_events == 0 and jb.flush() == []
    assert sorted(s.seq for s in sealed) == list(range(len(sealed))) and jb.next_seq == len(sealed)
    per_job: dict[str, int] = {}
    for s in sealed:
        d = schema.decode_batch(s.value)
        assert d.agent_id == jb.agent_id and s.key == b"host-a"
        per_job[d.job] = per_job.get(d.job, 0) + len(d.events)
    assert per_job == {"a": 1_500, "b": 1_500, "fallback": 10}
    events, batches = jb.events, jb.sealed
    jb.of("a").add_many(evs[:3])
    last = jb.forget("a")  # its processes are gone: the last batch is sealed, the counters kept
    assert last is not None and last.seq == len(sealed) and schema.decode_batch(last.value).job == "a"
    assert (jb.events, jb.sealed) == (events + 3, batches + 1) and "a" not in jb.by_job
    assert jb.forget("fallback") is None and "fallback" in jb.by_job


def test_a_batch_ages_from_its_first_events_own_time_when_that_is_recent():
    """The age bound counts from the first event's ts_ns (CLOCK_MONOTONIC, as the kernel stamps it) when
    it lies within the last max_age_ms, the same for single events and packed runs; a timestamp from the
    future or older than the bound counts from when the event was added."""
    ms = 1_000_000
    for packed in (False, True):
        b = Batcher("job", "h", 1, max_age_ms=60_000, step_min_age_ms=500)
        ts = time.monotonic_ns() - 300 * ms  # happened 300 ms ago
        evs = [Event(Kind.PHASE, ts + i, 1, 2, 3, 4, 5, -1, 0, {"phase": "p"}) for i in range(3)]
        if packed:
            data = [msgpack.packb(list(e)) for e in evs]
            b.add_packed(b"".join(data), array("I", [sum(map(len, data[: i + 1])) for i in range(3)]))
        else:
            b.add_many(evs)
        assert b._first_ns == ts
        assert b.ms_until_due(now_ns=ts + 1_000 * ms) == pytest.approx(59_000.0)
        assert b.due(now_ns=ts + 60_000 * ms - 1) is None
        s = b.due(now_ns=ts + 60_000 * ms)
        assert s is not None and s.first_ts_ns == ts and s.n_events == 3
        for odd in (time.monotonic_ns() + 10_000 * ms, time.monotonic_ns() - 120_000 * ms, 0):
            before = time.monotonic_ns()
            b.add(Event(Kind.PHASE, odd, 1, 2, 3, 4, 5, -1, 0, None))
            assert before <= b._first_ns <= time.monotonic_ns()
            assert b.flush() is not None
