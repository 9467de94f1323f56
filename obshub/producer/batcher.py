"""Batch builder: turns a stream of events into sealed ``obshub.events.v1`` messages (msgpack batches of
obshub/core/schema.py), bounded by encoded bytes and by age, numbered per agent instance without gaps.

Hot path: each event (a ``schema.Event`` or any 10-tuple in ``schema.EVENT_FIELDS`` order) is packed once,
by msgpack's C packer, into bytes that are kept until the batch is sealed; the batch is then the envelope
map written around the concatenated event arrays (msgpack is concatenation-friendly), so no per-event
Python object is built and nothing is encoded twice. The bytes are exactly what
``schema.encode_batch`` produces for the same batch (keys in the same order), and
``schema.decode_batch`` reads them.

Events already encoded elsewhere (the C ring-buffer reader, ``producer.reader.PackedRun``: msgpack event
arrays back to back with their end offsets) go in with :meth:`Batcher.add_packed`, which cuts the run at
the bounds with a binary search over the end offsets and keeps whole slices: O(1) Python work per run,
none per event.

Bounds: a batch is sealed *before* adding an event would make its encoded size pass ``max_bytes``, when
it holds ``schema.MAX_EVENTS_PER_BATCH`` events, or when its first event is ``max_age_ms`` old (checked
by :meth:`Batcher.due`, which the agent calls every loop turn). An event that alone passes ``max_bytes``
is sent alone in its batch. A batch's age counts from its first event's ``ts_ns`` (CLOCK_MONOTONIC of this
host, the clock of ``time.monotonic_ns``) when that lies within the last ``max_age_ms``, else from when the
event was added (a timestamp from the future, from another clock, or older than the age bound: the batch
then gets a full ``max_age_ms``, as any batch did when ages counted from the moment of adding); so a batch
is never older than its age bound counted from when its first event was added, and usually from when it
happened.

Step alignment: the agent calls :meth:`Batcher.step_end` after it added the events of a poll turn that
hold the end of a training step (a ``STEP_END``, which the kernel sends with the step's aggregates right
behind it); the open batch is then sealed at once, so one batch carries one step and a step's last
events leave the moment the step ends. Two exceptions keep the message rate bounded: after a batch
sealed at a step end, no step end seals the next batch until ``step_min_age_ms`` have passed since that
seal (steps faster than that share a batch, sealed at the first step end past the minimum, or by age: at
most one step-aligned batch per ``step_min_age_ms`` and job), and ``max_age_ms`` still bounds every batch
(a hung or slow-stepping rank ships within it; the first step end after such an age seal seals at once,
however young the batch).

Because the step minimum counts from the previous seal, not from when the next batch opened, it is known
while no batch is open: :meth:`Batcher.ms_until_step_seal` returns the time left of it right after a step
seal, and the agent sleeps through the step ends until then and drains the records that open the next
batch together with the step end that seals it (one loop turn per sealed batch, not one that only opens
the next batch and one that seals it; docs/AGENT.md).
"""

from __future__ import annotations

import time
import uuid
from bisect import bisect_right
from typing import Callable, Iterable, NamedTuple

import msgpack

from obshub.core import schema
from obshub.core.settings import BATCH_MAX_AGE_MS, BATCH_MAX_BYTES, BATCH_STEP_MIN_AGE_MS

_EVENTS_KEY_AND_HEADER_MAX = 1 + len("events") + 5  # fixstr key + array32 header
_ENVELOPE_SLACK = 160  # ints and the clock map at their largest encodings


class SealedBatch(NamedTuple):
    """One encoded batch ready to publish: ``seq`` (batch number of this agent instance), ``key`` (host
    name, UTF-8), ``value`` (msgpack bytes), ``n_events``, ``first_ts_ns`` (CLOCK_MONOTONIC ns the batch's
    age counts from: its first event's ``ts_ns``, or when it was added, see the module docstring)."""

    seq: int
    key: bytes
    value: bytes
    n_events: int
    first_ts_ns: int


class SeqCounter:
    """The next batch sequence number of one agent instance (``value``), shared by its batchers."""

    __slots__ = ("value",)

    def __init__(self, first: int = 0):
        self.value = first


class Batcher:
    """Builds batches of one job for one agent instance.

    ``agent_id``: the instance id (default: a fresh UUID4). ``first_seq``: the first sequence number
    (0). ``seq``: a :class:`SeqCounter` shared with the other batchers of the same agent instance (one
    per job, :class:`JobBatchers`), so the instance's batches are numbered without gaps whatever job
    they carry (default: a counter of its own starting at ``first_seq``). ``clock``: returns the ``schema.Clock`` stamped on each batch when it is sealed.
    ``max_bytes``: bound on the encoded message size, bytes. ``max_age_ms``: bound on the age of the
    oldest event in an open batch, ms. ``step_min_age_ms``: the time after a seal at a step end during
    which no step end seals the next batch, ms (at most ``max_age_ms``; see the module docstring).
    Raises ValueError for a bound too small to hold the envelope.

    Counters: ``sealed`` (batches), ``events`` (events accepted), ``rejected`` (events msgpack could not
    encode: an int outside 64 bits or a payload value of an unsupported type; they are skipped).
    """

    def __init__(
        self,
        job: str,
        host: str,
        host_id: int,
        *,
        agent_id: str | None = None,
        clock: Callable[[], schema.Clock] = schema.Clock,
        max_bytes: int = BATCH_MAX_BYTES,
        max_age_ms: float = BATCH_MAX_AGE_MS,
        step_min_age_ms: float = BATCH_STEP_MIN_AGE_MS,
        first_seq: int = 0,
        seq: SeqCounter | None = None,
    ):
        self.job, self.host, self.host_id = job, host, host_id
        self._seq = seq if seq is not None else SeqCounter(first_seq)
        self.agent_id = agent_id or str(uuid.uuid4())
        self.key = host.encode()
        self._clock = clock
        self.max_bytes = max_bytes
        self.max_age_ns = int(max_age_ms * 1_000_000)
        self.step_min_age_ns = min(self.max_age_ns, int(step_min_age_ms * 1_000_000))
        self._packer = msgpack.Packer(use_bin_type=True)
        overhead = len(self._envelope(2**63 - 1, 2**63 - 1, schema.Clock(-(2**63), 2**63 - 1, -(2**63)), 0))
        self._limit = max_bytes - overhead - _ENVELOPE_SLACK
        if self._limit < 64:
            raise ValueError(f"max_bytes {max_bytes} leaves no room for events after the {overhead} B envelope")
        self._parts: list[bytes] = []  # encoded events, or slices of packed runs (several events each)
        self._n = 0  # events in the open batch
        self._size = 0
        self._first_ns = 0
        self._sealed_ns = 0  # monotonic ns of the last seal (for the quiet time after a step seal)
        self._seal_now = False  # the open batch holds a step end that seals it (see step_end)
        self._aligned = False  # the previous batch was sealed at a step end
        self._urgent = False  # the open batch holds an event the stream worker must see at once (see seal_next)
        self.sealed = 0
        self.step_sealed = 0
        self.events = 0
        self.rejected = 0

    @property
    def next_seq(self) -> int:
        """The sequence number the next sealed batch gets."""
        return self._seq.value

    # -- hot path ------------------------------------------------------------------------------------
    def add_many(self, events: Iterable[tuple]) -> list[SealedBatch]:
        """Append events (10-tuples in ``schema.EVENT_FIELDS`` order); return the batches sealed because
        they reached their size or count bound (usually none). O(1) Python work per event."""
        sealed: list[SealedBatch] = []
        pack = self._packer.pack
        parts = self._parts
        limit = self._limit
        size = self._size
        cap = schema.MAX_EVENTS_PER_BATCH
        count = self._n
        accepted = 0
        for ev in events:
            try:
                b = pack(ev)
            except (TypeError, ValueError, OverflowError):
                self._packer.reset()
                self.rejected += 1
                continue
            n = len(b)
            if count and (size + n > limit or count >= cap):
                self._size, self._n = size, count
                sealed.append(self._seal())
                parts = self._parts
                size = count = 0
            if not count:
                self._first_ns = self._start_ns(ev[1])
            parts.append(b)
            size += n
            count += 1
            accepted += 1
        self._size, self._n = size, count
        self.events += accepted
        return sealed

    def add_packed(self, data: bytes, ends) -> list[SealedBatch]:
        """Append events already encoded as msgpack arrays: ``data`` holds them back to back, ``ends[i]``
        is the end offset of event i (a sequence of ints, e.g. ``array('I')``; increasing). Same bounds
        as :meth:`add_many`; returns the batches sealed. The caller vouches for the encoding (the C
        reader makes exactly what ``msgpack.packb`` makes); nothing is re-checked here."""
        sealed: list[SealedBatch] = []
        total = len(ends)
        view = memoryview(data)
        pos = off = 0
        cap = schema.MAX_EVENTS_PER_BATCH
        while pos < total:
            room_n = cap - self._n
            # the events that still fit: end offset within the byte room and at most room_n of them
            j = bisect_right(ends, off + self._limit - self._size, pos, min(total, pos + room_n))
            if j == pos:
                if self._n:
                    sealed.append(self._seal())
                    continue
                j = pos + 1  # one event larger than the whole bound goes alone
            if not self._n:
                self._first_ns = self._start_ns(_packed_ts(view[off : ends[pos]]))
            end = ends[j - 1]
            self._parts.append(view[off:end])  # joined into the batch at seal time
            self._size += end - off
            self._n += j - pos
            self.events += j - pos
            pos, off = j, end
            if pos < total:
                sealed.append(self._seal())
        return sealed

    def _start_ns(self, ts) -> int:
        """The moment a batch opened by an event with ``ts_ns`` ``ts`` counts its age from: ``ts`` when it
        is an int within the last ``max_age_ms`` (not in the future), else now (monotonic ns)."""
        now = time.monotonic_ns()
        if type(ts) is int and now - self.max_age_ns < ts <= now:
            return ts
        return now

    def add(self, event: tuple) -> list[SealedBatch]:
        """Append one event; see :meth:`add_many`."""
        return self.add_many((event,))

    # -- step alignment, time bound and flush --------------------------------------------------------
    def step_end(self, now_ns: int | None = None) -> bool:
        """The events added last hold the end of a training step: mark the open batch to be sealed by the
        next :meth:`due` unless it follows a step-aligned batch sealed less than ``step_min_age_ms`` ago.
        Returns whether it was marked (False also when no batch is open)."""
        if not self._parts:
            return False
        if self._aligned:
            now_ns = time.monotonic_ns() if now_ns is None else now_ns
            if now_ns - self._sealed_ns < self.step_min_age_ns:
                return False
        self._seal_now = True
        return True

    def seal_next(self) -> bool:
        """Mark the open batch to be sealed by the next :meth:`due` whatever its age: it holds an event the
        stream worker must see at once (a rank's state change: frozen, stopped, exited), not after the age
        bound. The next step end is judged as after an age seal. Returns whether a batch was open."""
        if not self._parts:
            return False
        self._urgent = True
        return True

    def due(self, now_ns: int | None = None) -> SealedBatch | None:
        """Seal and return the open batch when it holds a step end (:meth:`step_end`), an urgent event
        (:meth:`seal_next`) or its first event is ``max_age_ms`` old, else None."""
        if not self._parts:
            return None
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        if self._urgent and not self._seal_now:
            return self._seal(now_ns=now_ns)
        if self._seal_now:
            self.step_sealed += 1
            return self._seal(aligned=True, now_ns=now_ns)
        if now_ns - self._first_ns >= self.max_age_ns:
            return self._seal(now_ns=now_ns)
        return None

    def ms_until_due(self, now_ns: int | None = None) -> float | None:
        """Milliseconds until the open batch is due (0 when overdue or marked by a step end), None when no
        batch is open: how long the agent may block polling its source."""
        if not self._parts:
            return None
        if self._seal_now or self._urgent:
            return 0.0
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        return max(0.0, (self._first_ns + self.max_age_ns - now_ns) / 1e6)

    def ms_until_step_seal(self, now_ns: int | None = None) -> float:
        """Milliseconds during which a step end cannot seal the open batch, or the next one when none is
        open: the last batch was sealed at a step end less than ``step_min_age_ms`` ago (:meth:`step_end`
        would not mark it). 0 when a step end would seal it now, when it is already marked, and when the
        last batch was sealed by age or at once (:meth:`seal_next`); ``inf`` when no batch is open and none
        was ever sealed at a step end (a job without steps). The agent does not let the end of a step wake
        it during that time (docs/AGENT.md, "Step ends that cannot seal a batch do not turn the loop")."""
        if not self._parts:
            if not self.step_sealed:
                return float("inf")
            if not self._aligned:
                return 0.0
        elif not self._aligned or self._seal_now or self._urgent:
            return 0.0
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        return max(0.0, (self._sealed_ns + self.step_min_age_ns - now_ns) / 1e6)

    def flush(self) -> SealedBatch | None:
        """Seal the open batch whatever its age; None when it is empty."""
        return self._seal() if self._n else None

    @property
    def open_events(self) -> int:
        """Events in the open (not yet sealed) batch."""
        return self._n

    # -- encoding ------------------------------------------------------------------------------------
    def _envelope(self, seq: int, sent_ns: int, clock: schema.Clock, n_events: int) -> bytes:
        p = msgpack.Packer(use_bin_type=True)
        out = [p.pack_map_header(9)]
        for k, v in (
            ("v", schema.SCHEMA_VERSION),
            ("job", self.job),
            ("host", self.host),
            ("host_id", self.host_id),
            ("agent_id", self.agent_id),
            ("seq", seq),
            ("sent_ns", sent_ns),
            (
                "clock",
                {
                    "offset_ns": clock.offset_ns,
                    "uncertainty_ns": clock.uncertainty_ns,
                    "tai_offset_ns": clock.tai_offset_ns,
                },
            ),
        ):
            out.append(p.pack(k))
            out.append(p.pack(v))
        out.append(p.pack("events"))
        out.append(p.pack_array_header(n_events))
        return b"".join(out)

    def _seal(self, aligned: bool = False, now_ns: int | None = None) -> SealedBatch:
        parts, n = self._parts, self._n
        seq = self._seq.value
        self._seq.value = seq + 1
        self._sealed_ns = time.monotonic_ns() if now_ns is None else now_ns
        head = self._envelope(seq, time.time_ns(), self._clock(), n)
        value = head + b"".join(parts)
        batch = SealedBatch(seq, self.key, value, n, self._first_ns)
        self.sealed += 1
        self._parts = []
        self._size = 0
        self._n = 0
        self._seal_now = self._urgent = False
        self._aligned = aligned
        return batch


def _packed_ts(event: bytes | memoryview):
    """The ``ts_ns`` of one event encoded as a msgpack array in ``schema.EVENT_FIELDS`` order (None when
    it is not such an array)."""
    try:
        u = msgpack.Unpacker()
        u.feed(event)
        if u.read_array_header() < 2:
            return None
        u.skip()
        return u.unpack()
    except (ValueError, msgpack.OutOfData):
        return None


class JobBatchers:
    """The batchers of one agent instance, one per job: a batch never mixes jobs (the stream application
    files a batch's events under the batch's ``job``). They share ``agent_id`` and one
    :class:`SeqCounter`, so the instance's sequence stays gapless across jobs (the stream worker counts a
    gap per ``agent_id`` as lost batches). Every batch is keyed by the host name, whatever its job.

    ``fallback_job``: the job of events that no registered process claims (the agent's ``--job``);
    the other arguments are :class:`Batcher`'s, applied to every job's batcher. Raises ValueError as
    :class:`Batcher` does.

    Counters (sums over the jobs): ``sealed``, ``step_sealed`` (of them, sealed at a step end),
    ``events``, ``rejected``, ``open_events``.
    """

    def __init__(
        self,
        fallback_job: str,
        host: str,
        host_id: int,
        *,
        agent_id: str | None = None,
        clock: Callable[[], schema.Clock] = schema.Clock,
        max_bytes: int = BATCH_MAX_BYTES,
        max_age_ms: float = BATCH_MAX_AGE_MS,
        step_min_age_ms: float = BATCH_STEP_MIN_AGE_MS,
        first_seq: int = 0,
    ):
        self.fallback_job, self.host, self.host_id = fallback_job, host, host_id
        self.agent_id = agent_id or str(uuid.uuid4())
        self._clock, self._max_bytes, self._max_age_ms = clock, max_bytes, max_age_ms
        self._step_min_age_ms = step_min_age_ms
        self._seq = SeqCounter(first_seq)
        self.by_job: dict[str, Batcher] = {}
        self._sealed_gone = self._events_gone = self._rejected_gone = self._step_gone = 0  # of batchers forgotten
        self.fallback = self.of(fallback_job)

    def of(self, job: str) -> Batcher:
        """The batcher of ``job`` (made on first use)."""
        b = self.by_job.get(job)
        if b is None:
            b = Batcher(
                job,
                self.host,
                self.host_id,
                agent_id=self.agent_id,
                clock=self._clock,
                max_bytes=self._max_bytes,
                max_age_ms=self._max_age_ms,
                step_min_age_ms=self._step_min_age_ms,
                seq=self._seq,
            )
            self.by_job[job] = b
        return b

    @property
    def next_seq(self) -> int:
        """The sequence number the next sealed batch gets, whatever its job."""
        return self._seq.value

    def due(self, now_ns: int | None = None) -> list[SealedBatch]:
        """Seal and return every open batch that is due (:meth:`Batcher.due`: a step end, or its first
        event ``max_age_ms`` old), oldest first."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        if len(self.by_job) == 1:
            one = self.fallback.due(now_ns)
            return [one] if one is not None else []
        out = []
        for b in sorted(self.by_job.values(), key=lambda b: b._first_ns if b._n else 1 << 63):
            sealed = b.due(now_ns)
            if sealed is not None:
                out.append(sealed)
        return out

    def ms_until_due(self, now_ns: int | None = None) -> float | None:
        """Milliseconds until the first open batch is due (0 when overdue), None when none is open."""
        if len(self.by_job) == 1:
            return self.fallback.ms_until_due(now_ns)
        waits = [w for b in self.by_job.values() if (w := b.ms_until_due(now_ns)) is not None]
        return min(waits) if waits else None

    def ms_until_step_seal(self, now_ns: int | None = None) -> float:
        """Milliseconds during which a step end can seal none of the open batches
        (:meth:`Batcher.ms_until_step_seal`, the least over the jobs; 0 when any job's step end would
        seal its batch now)."""
        if len(self.by_job) == 1:
            return self.fallback.ms_until_step_seal(now_ns)
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        return min(b.ms_until_step_seal(now_ns) for b in self.by_job.values())

    def flush(self) -> list[SealedBatch]:
        """Seal every open batch whatever its age."""
        return [s for b in self.by_job.values() if (s := b.flush()) is not None]

    def forget(self, job: str) -> SealedBatch | None:
        """Drop the batcher of ``job`` (its processes are gone), returning its last batch (None when
        empty). The fallback job's batcher stays."""
        if job == self.fallback_job:
            return None
        b = self.by_job.pop(job, None)
        if b is None:
            return None
        last = b.flush()
        self._sealed_gone += b.sealed
        self._events_gone += b.events
        self._rejected_gone += b.rejected
        self._step_gone += b.step_sealed
        return last

    @property
    def sealed(self) -> int:
        return self._sealed_gone + sum(b.sealed for b in self.by_job.values())

    @property
    def step_sealed(self) -> int:
        return self._step_gone + sum(b.step_sealed for b in self.by_job.values())

    @property
    def events(self) -> int:
        return self._events_gone + sum(b.events for b in self.by_job.values())

    @property
    def rejected(self) -> int:
        return self._rejected_gone + sum(b.rejected for b in self.by_job.values())

    @property
    def open_events(self) -> int:
        return sum(b.open_events for b in self.by_job.values())
