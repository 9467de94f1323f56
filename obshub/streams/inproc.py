"""The worker's ingest and fold logic in one process, without Kafka: the agents' exact code over dict
tables that encode every write with the worker's codec, like Faust writes a changelog record.

Used by the fold benchmark (bench/fold_width.py: CPU and changelog bytes per step against the number of
hosts) and by the unit tests of the state layout (tests/streams/test_streams_fold.py: replays, recovery from the
changelog, late data). What it leaves out: the transport (consumer, producer, commits), the window timer.

    pipe = InProcess(partitions=4)
    for key, value in messages:              # agent batches as (key, msgpack bytes)
        pipe.feed(value)
    pipe.feed_round(values)                  # several at once, as one round of the worker's agents
    pipe.summaries                           # [summary dict], in close order
    pipe.running                             # [running record], as the fold emitted them on new parts
    pipe.changelog_bytes                     # bytes of every table write so far (keys + values)
"""

from __future__ import annotations

from typing import Any, Iterator

from faust.serializers import codecs

from obshub.streams import analysis, wire
from obshub.streams.fold import Fold
from obshub.streams.ingest import Ingest
from obshub.streams.topics import TABLES, partition_of

_KEY = codecs.get_codec(wire.CHANGELOG_JSON)
_VALUE = codecs.get_codec(wire.CHANGELOG)


class ChangelogDict(dict):
    """A table: a dict whose writes and deletes are encoded as changelog records with the worker's codecs
    (``wire.CHANGELOG`` values, ``wire.CHANGELOG_JSON`` keys, ``None`` value = tombstone); ``records`` and
    ``nbytes`` count them. ``recovered()`` is the table a restarted worker would rebuild from those
    records (values decoded from their last record)."""

    def __init__(self) -> None:
        super().__init__()
        self.records = 0
        self.nbytes = 0
        self.log: dict[str, bytes | None] = {}

    def __setitem__(self, key: str, value: Any) -> None:
        blob = _VALUE.dumps(value)
        self.records += 1
        self.nbytes += len(_KEY.dumps(key)) + len(blob)
        self.log[key] = blob
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.records += 1
        self.nbytes += len(_KEY.dumps(key))
        self.log[key] = None
        super().__delitem__(key)

    def recovered(self) -> "ChangelogDict":
        """A new table holding what the compacted changelog holds."""
        out = ChangelogDict()
        for k, blob in self.log.items():
            if blob is not None:
                dict.__setitem__(out, k, _VALUE.loads(blob))
        out.log = dict(self.log)
        return out


class InProcess:
    """Ingest + fold of one worker that owns every partition. ``partitions``: of the internal topic (a
    part goes to ``streams.topics.partition_of`` its key, as in the worker; the input is one partition). ``clock``: ns."""

    def __init__(
        self,
        partitions: int = 4,
        th: analysis.Thresholds = analysis.Thresholds(),
        window_ns: int = 10**10,
        clock=None,
        tables: dict[str, ChangelogDict] | None = None,
    ):
        self.partitions = partitions
        self.tables = tables or {name: ChangelogDict() for name in TABLES}
        kw = {"clock": clock} if clock is not None else {}
        self.fold = Fold(self.tables, window_ns=window_ns, th=th, **kw)
        self.ingest = Ingest(self.tables["agents"])
        self.summaries: list[dict] = []
        self.running: list[dict] = []  # running records the fold emitted on new parts (Fold.running_arrived)
        self.offset = 0
        self.internal = 0  # messages on the internal topic

    @property
    def changelog_bytes(self) -> int:
        return sum(t.nbytes for t in self.tables.values())

    def restarted(self) -> "InProcess":
        """A new worker whose tables are recovered from this one's changelogs (input offsets kept)."""
        new = InProcess(
            self.partitions,
            self.fold.th,
            self.fold.window_ns,
            tables={k: t.recovered() for k, t in self.tables.items()},
        )
        new.offset = self.offset
        return new

    def _apply(self, value: dict, p: int) -> None:
        self.internal += 1
        self.apply_unit([value], p)

    def apply_unit(self, values: list, p: int) -> None:
        """Apply the internal messages ``values`` (decoded) of partition ``p`` as one unit of the fold
        (``Fold.apply_round``); summaries are kept, broadcasts applied to every partition."""
        for what, _job, v in self.fold.apply_round(values, p):
            if what == "summary":
                self.summaries.append(v)
            elif what == "running":
                self.running.append(v)
            else:
                for q in range(self.partitions):
                    self._apply(v, q)

    def parts_of(self, value: bytes, offset: int | None = None) -> Iterator[tuple[dict, int]]:
        """The internal messages ingest makes of one input message, with their partitions."""
        r = self.ingest.handle(value, "in", 0, self.offset if offset is None else offset)
        if offset is None:
            self.offset += 1
        for what, key, v in r.sends:
            if what == "broadcast":
                for q in range(self.partitions):
                    yield v, q
            else:
                yield v, partition_of(key.encode(), self.partitions)

    def feed(self, value: bytes, offset: int | None = None) -> None:
        """Ingest one input message (at the next offset, or ``offset`` for a replay) and fold its parts."""
        for v, p in list(self.parts_of(value, offset)):
            self._apply(v, p)

    def feed_round(self, values: list[bytes]) -> None:
        """Ingest several input messages (at the next offsets) as one round of the worker's agents: their
        internal messages leave as one ``batch`` message per partition (``Fold.apply_batch``)."""
        per: dict[int, list[bytes]] = {}
        for value in values:
            for v, p in list(self.parts_of(value)):
                per.setdefault(p, []).append(wire.packb(v))
        for p, msgs in sorted(per.items()):
            self._apply({"t": "batch", "msgs": msgs}, p)

    def close_all(self) -> None:
        """Close every open step (as the window would)."""
        for key, st in self.fold.open_steps():
            self.summaries.extend(v for what, _j, v in self.fold.close(key, st, st["p"], "window") if what == "summary")
