"""No silent skips: find the offsets the Faust consumer passed over and process them before going on.

Why it is needed: Faust's consumer (faust-streaming 0.15.3) treats a forward jump of its read position as
a gap that needs no processing. When a record arrives more than one offset past the last one it read,
``Consumer._drain_messages`` registers the offsets between as a gap and ``Consumer._new_offset`` counts a
gap as acknowledged, so the next commit covers it (meant for compacted topics and transaction markers).
Anything that moves the read position forward over records nobody processed therefore ends with those
records committed and never seen by the agent: a record fetched before a rebalance and delivered after
the seek to the committed offset (its offset becomes the read position, and the records fetched again
below it are dropped as already read), or a previous owner that committed across such a gap before the
partition moved. The worker cannot prevent it inside Faust, so it checks every record it is given.

:class:`OffsetGuard` knows, per partition, the next offset the worker must process:

- at the first record of a partition in a consumer generation, from ``start(partition)`` when given: for
  the input topic :func:`next_input_offset`, the changelog-backed record of what any worker of the app
  processed (so a commit that passed unprocessed records is caught after a rebalance too);
- for the internal topic, the ``folded`` table (per partition, the offset after the last record the
  fold processed); for a partition without that record yet, :func:`track_seeks`: the committed offset
  the consumer sought to in this generation when that seek came before the record;
- within a generation, the previous record's offset + 1.

A record beyond that reveals a skipped range ``[expected, offset)``; the agent reads it again with
:func:`read_range` (a plain consumer outside the group, committing nothing) and processes it before the
record, so Faust's commit that covers the record also covers the range only after it was processed.
Re-reading what was in fact processed is harmless: the ingest recognises replayed input offsets and
sequences, the fold ignores batch ids it already merged (docs/STREAMS.md, "Guarantees").
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Mapping

from obshub.core import kafka

log = logging.getLogger("obshub.streams")

REREAD_TIMEOUT_S = 60.0  # a range the broker does not serve within this long is logged as lost


def next_input_offset(agents: Mapping[str, Any], inputs: Mapping[str, Any], partition: int) -> int | None:
    """The next input offset of ``partition`` to process: one past the highest offset any worker of the
    app processed there, from the ``agents`` table (``{partition, offset}`` of each agent instance's last
    batch) and the ``inputs`` table (key ``str(partition)``, value the offset after the last record that
    went to the dead-letter topic). None when neither holds one: no worker of the app processed anything
    of the partition yet (a new app starts where its group's committed offset or ``auto_offset_reset``
    puts it, and that is not a skip). Cost: one pass over the ``agents`` table (called once per
    partition and consumer generation)."""
    dead = inputs.get(str(partition))
    best = int(dead) if dead is not None else None
    for st in agents.values():
        if isinstance(st, dict) and st.get("partition") == partition:
            nxt = int(st.get("offset", -1)) + 1
            best = nxt if best is None else max(best, nxt)
    return best


def track_seeks(app: Any) -> Callable[[Any], int | None]:
    """A function ``TP -> offset | None``: the committed offset Faust's consumer sought ``TP`` to in the
    current consumer generation (Faust seeks every assigned partition to its committed offset after each
    assignment, normally before delivering a record of the new generation); None when that seek has not
    happened yet in this generation or the partition has no committed offset. Faust exposes no hook for
    it: the consumer's ``perform_seek`` is wrapped at the first assignment (``app.on_partitions_assigned``)
    and its ``_committed_offset`` mapping read right after, tagged with the generation. One tracker per
    app: a second call returns the first one's function."""
    have = getattr(app, "_obshub_committed_at_seek", None)
    if have is not None:
        return have
    seeks: dict = {}  # TP -> (offset, generation)

    async def on_assigned(sender: Any, *args: Any, **kwargs: Any) -> None:
        consumer = app.consumer
        if getattr(consumer, "_obshub_seeks", None) is seeks:
            return
        seek = consumer.perform_seek

        async def perform_seek() -> None:
            await seek()
            gen = app.consumer_generation_id
            seeks.update((tp, (off, gen)) for tp, off in consumer._committed_offset.items() if off is not None)

        consumer.perform_seek = perform_seek
        consumer._obshub_seeks = seeks

    app.on_partitions_assigned.connect(on_assigned)  # a strong reference (mode's default)

    def committed_at_seek(tp: Any) -> int | None:
        off, gen = seeks.get(tp, (None, None))
        return off if gen == app.consumer_generation_id else None

    app._obshub_committed_at_seek = committed_at_seek
    return committed_at_seek


class OffsetGuard:
    """Per partition of one topic, the next offset this worker must process; :meth:`check` tells when a
    record given to the agent lies beyond it. ``on_skip(n)`` is called with the count of skipped offsets
    (the worker counts them in ``obshub_streams_consumer_skips_total``). ``start(partition)``: the next
    offset at the first record of a partition in a consumer generation (None: accept that record).
    ``on_error()`` is called when ``start`` raised (the worker counts it in
    ``obshub_streams_housekeeping_errors_total{task="offset_check"}``)."""

    def __init__(
        self,
        name: str,
        on_skip: Callable[[int], None],
        start: Callable[[int], int | None] | None = None,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.name, self.on_skip, self.start, self.on_error = name, on_skip, start, on_error
        self.expected: dict[Any, tuple[int, Any]] = {}  # TP -> (next offset, consumer generation)

    def check(self, tp: Any, offset: int, generation: Any) -> tuple[int, int] | None:
        """Record that the record at ``tp@offset`` of consumer generation ``generation`` is being processed.
        Returns the skipped offsets ``(first, end)`` (end exclusive) when the record lies beyond the next
        expected offset (logged as a warning and counted), else None (in order, or a replay of offsets
        already processed). Never raises."""
        known = self.expected.get(tp)
        if known is not None and known[1] == generation:
            nxt: int | None = known[0]
        elif self.start is not None:
            try:
                nxt = self.start(tp.partition)
            except Exception:  # noqa: BLE001 - a table (its store, a damaged value) not readable: no check for
                # this record, the next ones are checked; logged and counted (on_error)
                if self.on_error is not None:
                    self.on_error()
                log.exception("%s: next offset of %s[%d] unknown", self.name, tp.topic, tp.partition)
                nxt = None
        else:
            nxt = None
        self.expected[tp] = (max(offset + 1, known[0] if known and known[1] == generation else 0), generation)
        if nxt is None or offset <= nxt:
            return None
        self.on_skip(offset - nxt)
        log.warning(
            "%s: the consumer skipped offsets %d..%d of %s[%d]; reading them again before offset %d",
            self.name,
            nxt,
            offset - 1,
            tp.topic,
            tp.partition,
            offset,
        )
        return nxt, offset


async def read_range(
    conn: kafka.KafkaConnection, topic: str, partition: int, first: int, end: int, timeout_s: float = REREAD_TIMEOUT_S
) -> list:
    """The records at offsets ``first`` .. ``end - 1`` of ``topic[partition]`` (aiokafka ``ConsumerRecord``
    objects, raw key and value bytes, in offset order), read by a short-lived consumer outside any group
    (it commits nothing). Offsets without a record (transaction markers, records removed by retention:
    the read then starts at the log start) are passed over. When the broker does not serve the range
    within ``timeout_s``, returns what was read and logs an error naming the offsets that stay unread."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    if first >= end:
        return []
    c = AIOKafkaConsumer(
        **kafka.aiokafka_kwargs(conn),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=16 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    tp = TopicPartition(topic, partition)
    out: list = []
    pos = first
    await c.start()
    try:
        c.assign([tp])
        c.seek(tp, first)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pos = await c.position(tp)
            if pos >= end:
                break
            got = await c.getmany(tp, timeout_ms=500)
            out.extend(r for r in got.get(tp, ()) if first <= r.offset < end)
    finally:
        try:
            await c.stop()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this task is being cancelled (the worker stops)
            # else aiokafka's own: stop() can re-raise the cancellation of its internal no-group task
    if pos < end:
        log.error(
            "could not read offsets %d..%d of %s[%d] again within %.0f s: they stay unprocessed",
            max(pos, out[-1].offset + 1 if out else first),
            end - 1,
            topic,
            partition,
            timeout_s,
        )
    log.info("read %d records of %s[%d] again (offsets %d..%d)", len(out), topic, partition, first, end - 1)
    return out
