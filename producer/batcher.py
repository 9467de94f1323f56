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
is sent alone in its batch.
"""

from __future__ import annotations

import time
import uuid
from bisect import bisect_right
from typing import Callable, Iterable, NamedTuple

import msgpack

from obshub.core import schema
from obshub.core.settings import BATCH_MAX_AGE_MS, BATCH_MAX_BYTES

_EVENTS_KEY_AND_HEADER_MAX = 1 + len("events") + 5  # fixstr key + array32 header
_ENVELOPE_SLACK = 160  # ints and the clock map at their largest encodings


class SealedBatch(NamedTuple):
    """One encoded batch ready to publish: ``seq`` (batch number of this agent instance), ``key`` (host
    name, UTF-8), ``value`` (msgpack bytes), ``n_events``, ``first_ts_ns`` (monotonic ns the batch was
    started, for latency metrics)."""

    seq: int
    key: bytes
    value: bytes
    n_events: int
    first_ts_ns: int


class Batcher:
    """Builds batches for one agent instance.

    ``agent_id``: the instance id (default: a fresh UUID4). ``first_seq``: the first sequence number
    (0). ``clock``: returns the ``schema.Clock`` stamped on each batch when it is sealed.
    ``max_bytes``: bound on the encoded message size, bytes. ``max_age_ms``: bound on the age of the
    oldest event in an open batch, ms. Raises ValueError for a bound too small to hold the envelope.

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
        first_seq: int = 0,
    ):
        self.job, self.host, self.host_id = job, host, host_id
        self.agent_id = agent_id or str(uuid.uuid4())
        self.key = host.encode()
        self._clock = clock
        self.max_bytes = max_bytes
        self.max_age_ns = int(max_age_ms * 1_000_000)
        self.next_seq = first_seq
        self._packer = msgpack.Packer(use_bin_type=True)
        overhead = len(self._envelope(2**63 - 1, 2**63 - 1, schema.Clock(-(2**63), 2**63 - 1, -(2**63)), 0))
        self._limit = max_bytes - overhead - _ENVELOPE_SLACK
        if self._limit < 64:
            raise ValueError(f"max_bytes {max_bytes} leaves no room for events after the {overhead} B envelope")
        self._parts: list[bytes] = []  # encoded events, or slices of packed runs (several events each)
        self._n = 0  # events in the open batch
        self._size = 0
        self._first_ns = 0
        self.sealed = 0
        self.events = 0
        self.rejected = 0

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
                self._first_ns = time.monotonic_ns()
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
                self._first_ns = time.monotonic_ns()
            end = ends[j - 1]
            self._parts.append(view[off:end])  # joined into the batch at seal time
            self._size += end - off
            self._n += j - pos
            self.events += j - pos
            pos, off = j, end
            if pos < total:
                sealed.append(self._seal())
        return sealed

    def add(self, event: tuple) -> list[SealedBatch]:
        """Append one event; see :meth:`add_many`."""
        return self.add_many((event,))

    # -- time bound and flush ------------------------------------------------------------------------
    def due(self, now_ns: int | None = None) -> SealedBatch | None:
        """Seal and return the open batch when its first event is ``max_age_ms`` old, else None."""
        if not self._parts:
            return None
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        if now_ns - self._first_ns >= self.max_age_ns:
            return self._seal()
        return None

    def ms_until_due(self, now_ns: int | None = None) -> float | None:
        """Milliseconds until the open batch is due (0 when overdue), None when no batch is open: how
        long the agent may block polling its source."""
        if not self._parts:
            return None
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        return max(0.0, (self._first_ns + self.max_age_ns - now_ns) / 1e6)

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

    def _seal(self) -> SealedBatch:
        parts, n = self._parts, self._n
        head = self._envelope(self.next_seq, time.time_ns(), self._clock(), n)
        value = head + b"".join(parts)
        batch = SealedBatch(self.next_seq, self.key, value, n, self._first_ns)
        self.next_seq += 1
        self.sealed += 1
        self._parts = []
        self._size = 0
        self._n = 0
        return batch
